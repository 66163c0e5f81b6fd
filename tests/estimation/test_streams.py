"""The streaming passes with districts at the scale of a state (issue 58): the burn cut to a
window, the check's population counted per (district, map, CDL) in one look-up a pixel, and
the design's drawn ranks found for many strata at once, each set against a whole-array count
of its own (no chunk, no cut, no local ids)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyogrio.raw
import pytest
import shapely
from affine import Affine
from pyproj import Transformer
from rasterio.features import rasterize
from rasterio.transform import from_origin
from rasterio.windows import Window
from test_design import write_map

from emb.classes import N_L3, ClassMap
from emb.estimation.design import allocate, draw_points
from emb.estimation.districts import (
    Districts,
    district_burn,
    district_ids,
    on_map,
    read_districts,
)
from emb.estimation.holdout_counts import AreaCheckError, read_population
from emb.estimation.population import level_names, level_table

ORIGIN = (400_000.0, 4_500_000.0)  # the maps' corner (UTM 15N, 10 m pixels)


def wavy_districts(path: Path, side: int, span: float, seed: int) -> Path:
    """``side`` x ``side`` districts over a square of ``span`` m from ORIGIN, their shared
    edges jagged (random vertices every 40 m, slanted between them), written in WGS84, so
    each map moves them into UTM and cuts them to each window."""
    rng = np.random.default_rng(seed)
    x0, y1 = ORIGIN
    cuts = np.linspace(0, span, side + 1)
    t = np.unique(np.concatenate([np.arange(0, span, 40.0), cuts]))  # the corners are vertices
    taper = np.clip(np.abs(t[:, None] - cuts[None, :]).min(1) / 200.0, 0, 1)  # 0 at a corner

    def wiggle(edge: int) -> np.ndarray:
        outer = edge in (0, side)  # the outer border straight
        return np.zeros(len(t)) if outer else rng.uniform(-60, 60, len(t)) * taper

    # column edge i: x = x0 + cuts[i] + wiggle(y); row edge j: y = y1 - cuts[j] - wiggle(x)
    wiggle_x = [wiggle(i) for i in range(side + 1)]
    wiggle_y = [wiggle(j) for j in range(side + 1)]
    to_wgs84 = Transformer.from_crs(32615, 4326, always_xy=True)
    geoms, names = [], []
    for j in range(side):
        for i in range(side):
            inside = (t >= cuts[i]) & (t <= cuts[i + 1])
            down = (t >= cuts[j]) & (t <= cuts[j + 1])
            top = [
                (x0 + u, y1 - cuts[j] - w)
                for u, w in zip(t[inside], wiggle_y[j][inside], strict=True)
            ]
            right = [
                (x0 + cuts[i + 1] + w, y1 - v)
                for v, w in zip(t[down], wiggle_x[i + 1][down], strict=True)
            ]
            bottom = [
                (x0 + u, y1 - cuts[j + 1] - w)
                for u, w in zip(t[inside], wiggle_y[j + 1][inside], strict=True)
            ][::-1]
            left = [
                (x0 + cuts[i] + w, y1 - v) for v, w in zip(t[down], wiggle_x[i][down], strict=True)
            ][::-1]
            ring = np.array(top + right + bottom + left)
            lon, lat = to_wgs84.transform(ring[:, 0], ring[:, 1])
            geoms.append(shapely.Polygon(np.column_stack([lon, lat])))
            names.append(f"d{j}{i}")
    pyogrio.raw.write(str(path), shapely.to_wkb(geoms), [np.array(names, object)], ["name"],
                      driver="GeoJSON", crs="EPSG:4326", geometry_type="Polygon")  # fmt: skip
    return path


def whole_burn(
    districts: Districts, crs: str, transform: Affine, shape: tuple[int, int]
) -> np.ndarray:
    """(H, W) uint16 the district of each pixel centre of a whole map: every polygon as it is
    (not cut), burned in one go, the first district last (it wins a centre two claim)."""
    shapes = on_map(districts, crs)
    burns = [(g, i + 1) for i, g in enumerate(shapes.geometries)][::-1]
    return rasterize(burns, out_shape=shape, transform=transform, fill=0, all_touched=False,
                     dtype="uint16")  # fmt: skip


@pytest.fixture
def districts(tmp_path: Path) -> Districts:
    return read_districts(wavy_districts(tmp_path / "districts.geojson", 3, 5000.0, 1), "name")


def test_a_burn_cut_to_its_window_is_the_whole_burn_there(districts: Districts) -> None:
    """Windows across edges, inside one district (filled, not burned), across the map's edge
    and beyond every district: the same ids as the whole polygons burned over the map."""
    transform = from_origin(*ORIGIN, 10.0, 10.0)
    want = whole_burn(districts, "EPSG:32615", transform, (520, 520))
    shapes = on_map(districts, "EPSG:32615")
    windows = (
        Window(0, 0, 520, 520),
        Window(150, 140, 60, 90),
        Window(5, 5, 40, 40),
        Window(60, 300, 301, 7),
        Window(490, 490, 30, 30),
        Window(0, 511, 520, 1),
    )
    for win in windows:
        got = district_ids(shapes, transform, win)
        rows, cols = win.toslices()
        assert got.dtype == np.uint16
        assert np.array_equal(got, want[rows, cols]), win
    local, ids = district_burn(shapes, transform, Window(5, 5, 40, 40))
    assert ids.tolist()[:1] == [0] and np.unique(ids[local]).tolist() == [1]  # one district whole


def write_region(
    folder: Path, name: str, mapped: np.ndarray, labels: np.ndarray,
    origin: tuple[float, float], tiles: list[tuple[int, int]],
) -> tuple[Path, Path, Path]:  # fmt: skip
    """A region's map, aligned labels and index.json of 64 px test tiles at ``tiles``."""
    folder.mkdir()
    map_path = write_map(folder / f"{name}.tif", mapped, origin=origin)
    label_path = write_map(folder / "labels.tif", labels, origin=origin)
    blocks = {f"{name}_{r}_{c}": f"{name}:{r},{c}" for r, c in tiles}
    index = folder / "index.json"
    index.write_text(json.dumps({"region": name, "tile_size": 64,
                                 "splits": {"test": {"blocks": blocks}}}))  # fmt: skip
    return map_path, label_path, index


Regions = tuple[dict[str, Path], dict[str, Path], dict[str, Path]]


def regions_and_their_count(
    folder: Path, districts: Districts, seed: int, second: tuple[float, float],
    tiles: list[tuple[int, int]],
) -> tuple[Regions, np.ndarray]:  # fmt: skip
    """Two 256 px regions (the second's corner at ``second``) of random maps and labels (255
    in a band of each) with test tiles at ``tiles``, and the (domain, map, CDL) count of their
    test pixels that a whole-array burn and ``np.add.at`` give: each test pixel once."""
    rng = np.random.default_rng(seed)
    maps, labels, indexes, want = {}, {}, {}, np.zeros((10, N_L3, N_L3), np.int64)
    for k, origin in enumerate((ORIGIN, second)):
        mapped = rng.integers(0, N_L3, (256, 256), dtype=np.uint8)
        truth = np.where(rng.random((256, 256)) < 0.7, mapped, rng.integers(0, N_L3, (256, 256)))
        mapped[:10], truth[:, :7] = 255, 255
        name = f"r{k}"
        maps[name], labels[name], indexes[name] = write_region(
            folder / name, name, mapped, truth.astype(np.uint8), origin, tiles)  # fmt: skip
        inside = np.zeros((256, 256), bool)
        for r, c in tiles:
            inside[r : r + 64, c : c + 64] = True
        ids = whole_burn(districts, "EPSG:32615", from_origin(*origin, 10.0, 10.0), (256, 256))
        ok = inside & (mapped < N_L3) & (truth < N_L3)
        np.add.at(want, (ids[ok], mapped[ok], truth[ok]), 1)
    return (maps, labels, indexes), want


@pytest.mark.parametrize("threads", [1, 2])
def test_the_population_by_district_is_a_whole_array_count(
    tmp_path: Path, districts: Districts, threads: int
) -> None:
    """Two regions side by side under jagged districts, overlapping test tiles: per (domain,
    map, CDL) the pixels a whole-array count gives, each test pixel once, 255 left out; the
    regions counted here or each in a forked worker (2 threads), their counts added."""
    tiles = [(0, 0), (0, 64), (32, 32), (128, 192), (192, 0), (192, 64)]
    (maps, labels, indexes), want = regions_and_their_count(
        tmp_path, districts, 4, (ORIGIN[0] + 2560.0, ORIGIN[1]), tiles)  # fmt: skip
    population = read_population(maps, labels, indexes, districts, threads=threads)
    assert population.domains is not None and (want.sum((1, 2)) > 0).sum() >= 4
    assert np.array_equal(population.domains, want)
    assert np.array_equal(population.joint, want.sum(0))
    assert population.domain_names == ("outside", *districts.names)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_foreign_value_is_refused_by_district_naming_it(
    tmp_path: Path, districts: Districts, threads: int
) -> None:
    """The region with a value no class has is named, the first such of the regions in their
    order, whether they are counted here or in forked workers (2 threads: one a region)."""
    files = {}
    for name, bad in (("q", None), ("r", 200), ("s", 201)):
        mapped = np.full((128, 128), 3, np.uint8)
        if bad is not None:
            mapped[70, 70] = bad
        files[name] = write_region(tmp_path / name, name, mapped, mapped.copy(), ORIGIN,
                                   [(64, 64)])  # fmt: skip
    maps, labels, indexes = ({k: v[i] for k, v in files.items()} for i in range(3))
    with pytest.raises(AreaCheckError, match=r"r\.tif or its labels .*: map values \[200\]"):
        read_population(maps, labels, indexes, districts, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_design_by_district_takes_the_drawn_ranks_of_a_whole_array_scan(
    tmp_path: Path, districts: Districts, class_map: ClassMap, threads: int
) -> None:
    """Maps larger than a chunk under 9 jagged districts, a sample of thousands of units in
    every (district, class) stratum: the points are the pixels whose rank in their stratum
    (maps in order, each row-major) the seed drew, found by a scan of whole arrays; the maps
    scanned here or each in a forked worker (2 threads: the second map's scan started where
    the first pass put it)."""
    rng = np.random.default_rng(8)
    level, seed, minimum = 2, 5, 30
    table, k = level_table(level, class_map), len(level_names(level, class_map))
    maps, strata = [], []
    for name, origin in (("a", ORIGIN), ("b", (ORIGIN[0], ORIGIN[1] - 5200.0))):
        values = rng.integers(0, N_L3, (560, 520), dtype=np.uint8)
        values[rng.random(values.shape) < 0.1] = 255
        transform = from_origin(*origin, 10.0, 10.0)
        maps.append(write_map(tmp_path / f"{name}.tif", values, origin=origin))
        ids = whole_burn(districts, "EPSG:32615", transform, values.shape).astype(np.int64)
        strata.append(np.where(values == 255, -1, ids * k + table[values]).ravel())
    h = (len(districts.names) + 1) * k
    sizes = np.bincount(np.concatenate(strata)[np.concatenate(strata) >= 0], minlength=h)
    n = int(sizes.astype(bool).sum()) * minimum + 4000
    design = draw_points(maps, level, class_map, n, minimum, seed, districts=districts,
                         threads=threads)  # fmt: skip
    allocation = allocate(sizes, n, minimum)
    draw = np.random.default_rng(seed)
    ranks = [np.sort(draw.choice(int(px), int(c), replace=False)) for px, c in
             zip(sizes, allocation, strict=True)]  # fmt: skip
    scan = np.concatenate(strata)
    want = []
    for stratum, drawn in enumerate(ranks):
        at = np.flatnonzero(scan == stratum)[drawn]
        want += [(int(i), stratum) for i in at]
    cells = 560 * 520
    got = []
    for m, (region, x, y, d, c) in enumerate(zip(design.points.region, design.points.x,
                                                 design.points.y, design.district,
                                                 design.map_class, strict=True)):  # fmt: skip
        base = cells * (region == "b")
        col, row = ~from_origin(*(ORIGIN if region == "a" else (ORIGIN[0], ORIGIN[1] - 5200.0)),
                                10.0, 10.0) * (x, y)  # fmt: skip
        got.append((int(base + int(row) * 520 + int(col)), int(d * k + c)))
        assert m < n
    assert sorted(got) == sorted(want)
    assert len(got) == n and design.record.strata_px.tolist() == sizes.tolist()
