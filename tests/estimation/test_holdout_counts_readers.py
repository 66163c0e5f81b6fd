"""The test split's population read by several reader threads, a region each in turn
(issue 58, item 5): the counts, the regions' order and a bad region's refusal are those one
thread gives; each reader's GDAL block cache kept."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import rasterio
from test_streams import ORIGIN, wavy_districts, write_region

from emb.classes import N_L3
from emb.estimation import holdout_counts
from emb.estimation.districts import Districts, read_districts
from emb.estimation.holdout_counts import AreaCheckError, _region_reads, read_population
from emb.estimation.population import PlaneRing, cache_bytes

TILES = [(0, 0), (0, 64), (32, 32), (64, 128), (128, 0)]


@pytest.fixture
def districts(tmp_path: Path) -> Districts:
    return read_districts(wavy_districts(tmp_path / "districts.geojson", 3, 5000.0, 1), "name")


def five_regions(folder: Path) -> tuple[dict, dict, dict]:
    """Five 192 px regions of random maps and labels side by side, tiles at ``TILES``."""
    rng = np.random.default_rng(12)
    maps, labels, indexes = {}, {}, {}
    for k in range(5):
        mapped = rng.integers(0, N_L3, (192, 192), dtype=np.uint8)
        truth = np.where(rng.random(mapped.shape) < 0.6, mapped, 255).astype(np.uint8)
        origin = (ORIGIN[0] + 1920.0 * k, ORIGIN[1] - 700.0 * k)
        name = f"r{k}"
        maps[name], labels[name], indexes[name] = write_region(
            folder / name, name, mapped, truth, origin, TILES)  # fmt: skip
    return maps, labels, indexes


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_readers_side_by_side_count_what_one_thread_counts(
    tmp_path: Path, districts: Districts, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Five regions, thin strips (buffers reused in each reader's ring): the same domains,
    joint and regions (in their order) as one thread."""
    monkeypatch.setattr(holdout_counts, "STRIP_BYTES", 11 * 192 * holdout_counts.PLANE_BYTES)
    regions = five_regions(tmp_path)
    one = read_population(*regions, districts, threads=1)
    many = read_population(*regions, districts, threads=threads)
    assert one.pixels > 0 and (one.domains.sum((1, 2)) > 0).sum() >= 3
    assert np.array_equal(many.domains, one.domains) and np.array_equal(many.joint, one.joint)
    assert many.regions == one.regions == ("r0", "r1", "r2", "r3", "r4")


@pytest.mark.parametrize("threads", [1, 2])
def test_the_first_bad_region_in_order_is_refused(tmp_path: Path, threads: int) -> None:
    """r1's map off its labels' grid, r2's labels missing (the other reader's, found sooner):
    r1 is named, as one thread names it."""
    maps, labels, indexes = five_regions(tmp_path)
    with rasterio.open(maps["r1"], "r+") as dst:
        dst.transform = dst.transform * dst.transform.translation(3, 0)
    labels["r2"] = tmp_path / "nowhere.tif"
    with pytest.raises(AreaCheckError, match=r"r1\.tif: expected the grid of its labels"):
        read_population(maps, labels, indexes, threads=threads)


def test_each_reader_has_its_block_cache(tmp_path: Path) -> None:
    """Read by three readers, a region's strips are read under a GDAL block cache three
    times one reader's (GDAL's cache is one for the process)."""
    maps, labels, indexes = five_regions(tmp_path)
    reads = _region_reads("r0", maps["r0"], labels["r0"], indexes["r0"], PlaneRing(1, 2),
                          readers=3)  # fmt: skip
    with rasterio.Env():
        assert next(reads)[0] == "grid"
        assert next(reads)[0] == "strip"
        with rasterio.open(maps["r0"]) as mp, rasterio.open(labels["r0"]) as lab:
            want = 3 * (cache_bytes(mp) + cache_bytes(lab))
        assert rasterio.env.getenv()["GDAL_CACHEMAX"] == want
        reads.close()


def test_readers_side_by_side_burn_one_at_a_time(
    tmp_path: Path, districts: Districts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three readers: no two district burns (nor placements) at once, on shared polygons
    that GEOS and PROJ cannot use from two threads at once (each burn held a while)."""
    monkeypatch.setattr(holdout_counts, "STRIP_BYTES", 40 * 192 * holdout_counts.PLANE_BYTES)
    busy, most, guard = [0], [0], threading.Lock()

    def counted(burn):  # noqa: ANN001, ANN202 - a wrapper of district_burn or on_map_once
        def held(*args):  # noqa: ANN002, ANN202
            with guard:
                busy[0] += 1
                most[0] = max(most[0], busy[0])
            time.sleep(0.005)  # lets go of the GIL: another reader would burn meanwhile
            try:
                return burn(*args)
            finally:
                with guard:
                    busy[0] -= 1

        return held

    for name in ("district_burn", "on_map_once"):
        monkeypatch.setattr(holdout_counts, name, counted(getattr(holdout_counts, name)))
    read_population(*five_regions(tmp_path), districts, threads=3)
    assert most == [1]


def test_each_reader_counts_its_regions_without_waiting_on_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two readers, regions of many strips (each counted a while): the second region's
    strips are counted, by another thread, before the first's are all counted (a reader
    handing its strips to one counting thread would wait a few strips in)."""
    monkeypatch.setattr(holdout_counts, "STRIP_BYTES", 8 * 192 * holdout_counts.PLANE_BYTES)
    counted: list[tuple[int, int]] = []

    def slow(cells, *args):  # noqa: ANN001, ANN002, ANN202 - a wrapper of _add_cells
        time.sleep(0.002)
        counted.append((id(cells), threading.get_ident()))
        return add_cells(cells, *args)

    add_cells = holdout_counts._add_cells
    monkeypatch.setattr(holdout_counts, "_add_cells", slow)
    maps, labels, indexes = five_regions(tmp_path)
    first_two = {k: {r: v[r] for r in ("r0", "r1")} for k, v in
                 (("maps", maps), ("labels", labels), ("indexes", indexes))}  # fmt: skip
    read_population(first_two["maps"], first_two["labels"], first_two["indexes"], threads=2)
    firsts = [i for i, (cells, _) in enumerate(counted) if cells == counted[0][0]]
    seconds = [i for i, (cells, _) in enumerate(counted) if cells != counted[0][0]]
    assert len(firsts) > 5 and len(seconds) > 5
    assert seconds[0] < firsts[-1]
    assert {t for _, t in counted} & {threading.get_ident()} == set()
    assert len({t for _, t in counted}) == 2
