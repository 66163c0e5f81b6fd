"""A stratified random sample of map pixels for reference labelling (Olofsson et al. 2014,
RSE 148, section 5.1): strata are the map's classes at a level, each stratum gets a minimum
number of units and the rest of n goes by area, and within a stratum the units are pixels drawn
uniformly without replacement. Given districts, a stratum is a (district, map class) pair
(district 0, the pixels no district holds, a domain of its own): every district gets the minimum
in each of its classes, so each district's areas are estimated within its own strata, and the
strata of all districts together are one stratified sample of the whole.

Reproducible from the seed: the strata are counted by streaming the maps, each stratum's drawn
ranks come from one generator in class order, and a second streaming pass picks the pixels of
those ranks in a fixed scan order (maps in the order given, each row-major). The first pass keeps
each strip's counts per stratum (K per strip of a few MB, (D + 1) x K with districts: about
50 MB a Gpx with 100 districts at L3), so the second reads only the strips that hold a drawn
rank: n units touch at most n strips (a design by district, whose minimums make n large,
touches nearly all). Both passes burn the districts per strip, cut to it, and count a strip
per (district near it, map value): their cost against one read of the maps is measured by
``bench/state_scale.py``. Memory stays flat in the maps' size but for those counts. The
points go out as a CSV to fill in (``reference``), a GeoPackage of the same points, and a JSON
record of the design beside them, which the estimate needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from pyproj import CRS
from rasterio.windows import Window

from emb import geo
from emb.classes import IGNORE, N_L3, ClassMap
from emb.estimation.districts import Districts, MapDistricts, district_burn, on_map
from emb.estimation.population import (
    CHUNK,
    Points,
    collapse_counts,
    count_l3_strips,
    crs_text,
    histogram,
    level_names,
    level_table,
    map_pixel_ha,
    refuse_foreign,
    streaming,
    strips,
)
from emb.estimation.sample_record import MapRecord, SampleRecord, StrataDistricts
from emb.estimation.sample_size import SampleSize
from emb.provenance import digest_file

log = logging.getLogger(__name__)
# pixels searched at once for drawn ranks: a chunk sorts the pixels of the strata drawn in it,
# so a smaller one sorts fewer (a few strata of the strip's), a larger one costs fewer calls
RANK_CHUNK = 1 << 16
SENTINEL = np.iinfo(np.int64).max  # a stratum's next drawn rank when all are found
PIXEL_AREA_RTOL = 1e-6  # maps' pixel areas that differ by less are one pixel size


class SampleDesignError(ValueError):
    """A design that cannot be drawn as asked (n, minimums, maps)."""


@dataclass(frozen=True)
class Design:
    """A drawn sample: its ``record`` (strata, allocation, maps: what ``sample.json`` holds),
    ``points`` with (m,) ``lon``, ``lat`` float64 (WGS84), ``map_class`` int64 (the class at
    the level) and ``district`` int64 (0 the outside; all 0 in a design without districts),
    m = record.n_drawn; a unit's stratum is ``district * K + map_class``."""

    record: SampleRecord
    points: Points
    lon: np.ndarray
    lat: np.ndarray
    map_class: np.ndarray
    district: np.ndarray


def allocate(strata_px: np.ndarray, n: int, min_per_class: int) -> np.ndarray:
    """(K,) int64 units per stratum: each stratum with pixels gets min(min_per_class, N_h), the
    rest of ``n`` goes in proportion to N_h (largest remainder; ties to the larger stratum,
    then the lower id), none above N_h. Sums to n, or to sum(N_h) when n exceeds it."""
    sizes = np.asarray(strata_px)
    if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 0).any():
        raise SampleDesignError(f"strata sizes must be non-negative integers, found {sizes}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise SampleDesignError(f"sample size n must be an integer >= 1, found {n!r}")
    if (
        isinstance(min_per_class, bool)
        or not isinstance(min_per_class, (int, np.integer))
        or min_per_class < 0
    ):
        raise SampleDesignError(f"min_per_class must be an integer >= 0, found {min_per_class!r}")
    px = [int(v) for v in sizes]
    total = sum(px)
    if total == 0:
        raise SampleDesignError("no mapped pixels: every stratum is empty (all nodata)")
    base = [min(min_per_class, v) for v in px]
    if n < sum(base):
        strata = sum(v > 0 for v in px)
        raise SampleDesignError(
            f"n = {n} is below the {sum(base)} units the minimums need ({strata} strata with "
            f"pixels, min_per_class {min_per_class}); n = {sum(base)} or more would do, or a "
            f"smaller min_per_class"
        )
    alloc = list(base)
    room = [v - b for v, b in zip(px, base, strict=True)]
    active = [h for h in range(len(px)) if room[h] > 0]
    rest = n - sum(base)
    while rest > 0 and active:  # n beyond the pixels: every stratum ends full
        extra = _largest_remainder(rest, [px[h] for h in active])
        over = [h for h, e in zip(active, extra, strict=True) if e > room[h]]
        if not over:
            for h, e in zip(active, extra, strict=True):
                alloc[h] += e
            break
        for h in over:  # full strata take all they have; the rest is shared again
            alloc[h] += room[h]
            rest -= room[h]
            room[h] = 0
        active = [h for h in active if room[h] > 0]
    return np.array(alloc, np.int64)


def _largest_remainder(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (integers, exact arithmetic): floors,
    then one more to the largest remainders (ties: larger weight, then lower position)."""
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    remainders = [total * w % whole for w in weights]
    order = sorted(range(len(weights)), key=lambda i: (-remainders[i], -weights[i], i))
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    return shares


def _map_record(
    path: Path, level: int, cmap: ClassMap, districts: Districts | None,
    placed: dict[str, MapDistricts] | None = None,
) -> tuple[MapRecord, np.ndarray, np.ndarray, tuple[Affine, str]]:  # fmt: skip
    """A map's record, (H,) pixels per stratum and (S, H) per strip (the first streaming
    pass), and its transform and WKT (for the points); H = K classes at ``level``, or (D + 1) * K
    with districts (the map opened once for all)."""
    with streaming(path) as src:
        pixel_ha = map_pixel_ha(src, path)
        crs, width, height = crs_text(src.crs), src.width, src.height
        grid = (src.transform, src.crs.to_wkt())
        if districts is not None:
            strata_strips, l3 = _district_strata_strips(src, path, level, cmap, districts, placed)
    if districts is None:
        per_strip = count_l3_strips(path)
        table = level_table(level, cmap)[:N_L3]
        onehot = np.zeros((256, len(level_names(level, cmap))), np.int64)
        onehot[np.arange(N_L3), table] = 1  # L3 value -> its class at the level; nodata: none
        strata_strips, l3 = per_strip @ onehot, per_strip.sum(0)
    record = MapRecord(
        region=path.stem, path=str(path), sha256=digest_file(path), crs=crs,
        pixel_ha=pixel_ha, width=width, height=height,
        pixels=int(collapse_counts(l3, level, cmap).sum()),
    )  # fmt: skip
    return record, strata_strips.sum(0), strata_strips, grid


def _strata_table(ids: np.ndarray, table: np.ndarray, k: int, h: int) -> np.ndarray:
    """((L + 1) * 256,) int64 the stratum of each key ``local << 8 | map value`` of a strip
    whose districts are ``ids`` (:func:`emb.estimation.districts.district_burn`): class at the
    level plus ``district * k``, and ``h`` (one past the last stratum) on nodata."""
    classes = table[:256].astype(np.int64)
    strata = ids.astype(np.int64)[:, None] * k + classes[None, :]
    return np.where(classes[None, :] == IGNORE, h, strata).ravel()


def _strip_keys(values: np.ndarray, local: np.ndarray, n_local: int) -> np.ndarray:
    """Flat keys ``local << 8 | value`` of a strip's pixels (uint16 while they fit)."""
    wide = np.uint16 if n_local <= 256 else np.int64
    return (local.ravel().astype(wide) << 8) | values.ravel()


def _district_strata_strips(
    src: rasterio.DatasetReader, path: Path, level: int, cmap: ClassMap, districts: Districts,
    placed: dict[str, MapDistricts] | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(S, (D + 1) * K) int64 pixels per (district, class) stratum of each strip, and (256,)
    pixels per map value (values that are no class refused), streamed strip by strip: a strip
    is counted per (district near it, map value), (L + 1) x 256 counts, then folded into its
    strata (a strip in one district is one histogram). ``src``: the map at ``path``, open
    (:func:`emb.estimation.population.streaming`). ``placed``: the districts moved onto a
    CRS (by its text), shared by the maps of that CRS."""
    table, k = level_table(level, cmap), len(level_names(level, cmap))
    h = (len(districts.names) + 1) * k
    rows, l3 = [], np.zeros(256, np.int64)
    shapes = _placed(districts, src, placed)
    for win in strips(src):
        values = src.read(1, window=win)
        local, ids = _one_district(*district_burn(shapes, src.transform, win))
        if local is None:
            hist = histogram(values)[None]
        else:
            hist = _key_counts(_strip_keys(values, local, len(ids)), len(ids) * 256)
        hist = hist.reshape(len(ids), 256)
        l3 += hist.sum(0)
        keys = _strata_table(ids, table, k, h)
        counts = np.bincount(keys, weights=hist.ravel(), minlength=h + 1)
        rows.append(np.rint(counts[:h]).astype(np.int64))
    refuse_foreign(path, l3)
    return np.array(rows, np.int64).reshape(-1, h), l3


def _one_district(local: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(None, [its id]) where a strip's pixels all lie in one domain (no per-pixel key then),
    else ``(local, ids)`` as they are."""
    if len(ids) == 1:
        return None, ids
    if local.size and local.min() == local.max():
        return None, ids[int(local.flat[0]) :][:1]
    return local, ids


def _key_counts(keys: np.ndarray, width: int) -> np.ndarray:
    """(width,) int64 occurrences of each key, bincounted in chunks (an int64 copy each)."""
    counts = np.zeros(width, np.int64)
    for start in range(0, keys.size, CHUNK):
        counts += np.bincount(keys[start : start + CHUNK], minlength=width)
    return counts


def _placed(
    districts: Districts, src: rasterio.DatasetReader, placed: dict[str, MapDistricts] | None
) -> MapDistricts:
    """The districts on ``src``'s CRS, moved once per CRS (kept in ``placed``)."""
    crs, placed = crs_text(src.crs), {} if placed is None else placed
    shapes = placed[crs] = placed.get(crs) or on_map(districts, crs)
    return shapes


def _check_maps(maps: list[Path], records: list[MapRecord]) -> float:
    """The maps' one pixel area (ha); refuse two maps of one region or of unequal pixel
    areas (a sample of pixels weighs every pixel alike)."""
    if not maps:
        raise SampleDesignError("no map files to draw a sample from")
    regions = [r.region for r in records]
    twice = sorted({r for r in regions if regions.count(r) > 1})
    if twice:
        raise SampleDesignError(f"maps {[str(m) for m in maps]}: regions named twice: {twice}")
    areas = {r.path: r.pixel_ha for r in records}
    first = records[0].pixel_ha
    if any(abs(a - first) > PIXEL_AREA_RTOL * first for a in areas.values()):
        raise SampleDesignError(
            f"maps of unequal pixel areas (ha) {areas}: a sample of pixels needs one pixel size"
        )
    return first


def _check_mapped(records: list[MapRecord]) -> None:
    """Refuse maps without a mapped pixel, naming their regions and files (``allocate`` sees
    only the strata's sums); a region of no pixel beside others is only warned of, as the
    sample then covers the others alone. Predict writes such a map where its input embedding
    is nodata everywhere (and warns of it)."""
    empty = {r.region: r.path for r in records if r.pixels == 0}
    why = "every pixel is nodata (predict mapped an all-nodata raster: see its log)"
    if len(empty) == len(records):
        raise SampleDesignError(
            f"no mapped pixels in the maps of regions {list(empty)} ({', '.join(empty.values())})"
            f": {why}; draw the sample over regions whose embedding has data"
        )
    for region, path in empty.items():
        log.warning("region %s: map %s has no mapped pixel: %s; the sample covers the other "
                    "regions only", region, path, why)  # fmt: skip


def draw_points(
    maps: list[Path], level: int, cmap: ClassMap, n: int | str, min_per_class: int, seed: int,
    sized: Callable[[np.ndarray], SampleSize] | None = None, districts: Districts | None = None,
) -> Design:  # fmt: skip
    """Draw a stratified random sample of ``n`` pixel centres over ``maps`` (one per region,
    the stratum of a pixel its map class at ``level``); never on nodata. ``sized``: the units
    per stratum for these strata's pixels instead (``n: auto``, the recommended size).
    ``districts``: strata are (district, class) pairs instead, district 0 the outside, the
    minimum per pair, the rest by area over all pairs (a district is a pixel's by its centre,
    :mod:`emb.estimation.districts`)."""
    maps = [Path(m) for m in maps]
    table, names = level_table(level, cmap), level_names(level, cmap)
    placed: dict[str, MapDistricts] = {}  # the districts moved onto each CRS, once
    firsts = [_map_record(m, level, cmap, districts, placed) for m in maps]
    records = [r for r, _, _, _ in firsts]
    pixel_ha = _check_maps(maps, records)
    strata_px = np.sum([c for _, c, _, _ in firsts], axis=0).astype(np.int64)
    _check_mapped(records)
    size = sized(strata_px) if sized is not None else None
    allocation = size.units if size is not None else allocate(strata_px, n, min_per_class)
    rng = np.random.default_rng(seed)
    ranks = [np.sort(rng.choice(int(px), int(k), replace=False)) for px, k in
             zip(strata_px, allocation, strict=True)]  # fmt: skip
    found = _pick_ranked(maps, table, len(names), ranks, strata_px, [s for _, _, s, _ in firsts],
                         districts, placed)  # fmt: skip
    region = np.concatenate([np.full(len(rows), m.stem) for m, (rows, _, _) in
                             zip(maps, found, strict=True)])  # fmt: skip
    xs, ys, crs, lon, lat = [], [], [], [], []
    to_wgs84 = {}  # per CRS (its WKT), once: building one costs more than a map's points
    for (record, _, _, (transform, wkt)), (rows, cols, _) in zip(firsts, found, strict=True):
        x, y = transform * (cols + 0.5, rows + 0.5)
        if wkt not in to_wgs84:
            to_wgs84[wkt] = geo.transformer(CRS.from_user_input(wkt), geo.WGS84)
        lo, la = to_wgs84[wkt].transform(x, y)
        xs.append(np.asarray(x, np.float64))
        ys.append(np.asarray(y, np.float64))
        lon.append(np.asarray(lo, np.float64))
        lat.append(np.asarray(la, np.float64))
        crs.append(np.full(len(rows), record.crs, dtype=object))
    m = int(allocation.sum())
    points = Points(
        ids=np.arange(1, m + 1, dtype=np.int64), region=region, x=np.concatenate(xs),
        y=np.concatenate(ys), crs=np.concatenate(crs),
    )  # fmt: skip
    record = SampleRecord(
        level=level, class_names=names, maps=tuple(records), strata_px=strata_px,
        allocation=allocation, n=n if size is not None else int(n), n_drawn=m,
        min_per_class=int(min_per_class), seed=int(seed), pixel_ha=pixel_ha,
        target=None if size is None else size.target,
        expected_half_width=None if size is None else size.expected_where_targeted(),
        districts=None if districts is None else StrataDistricts.of(districts),
    )  # fmt: skip
    stratum = np.concatenate([c for _, _, c in found]).astype(np.int64)
    return Design(
        record=record, points=points, lon=np.concatenate(lon), lat=np.concatenate(lat),
        map_class=stratum % len(names), district=stratum // len(names),
    )  # fmt: skip


def _pick_ranked(
    maps: list[Path], table: np.ndarray, n_classes: int, ranks: list[np.ndarray],
    strata_px: np.ndarray, strata_strips: list[np.ndarray], districts: Districts | None,
    placed: dict[str, MapDistricts] | None = None,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:  # fmt: skip
    """Second streaming pass: per map, (rows, cols, stratum) of the pixels whose rank within
    their stratum (in scan order) was drawn, sorted row-major. A strip that holds no drawn
    rank (its first pass counts, ``strata_strips``: (S, H) per map, say so) is not read; a
    strip that is read is counted again and refused if it changed since. With ``districts``
    a read strip's districts are burned again (:func:`district_burn`), the same ids as the
    first pass gave it, and its strata looked up per pixel from (district near it, map value).
    In a chunk, the drawn ranks of every stratum it holds are found at once
    (:func:`_found_in`): thousands of district x class strata cost no scan each."""
    k = len(ranks)
    drawn = _Drawn(ranks, strata_px)
    seen = np.zeros(k, np.int64)  # pixels of each stratum passed so far
    out = []
    for path, per_strip in zip(maps, strata_strips, strict=True):
        rows, cols, classes = [], [], []
        with streaming(path) as src:
            shapes = None if districts is None else _placed(districts, src, placed)
            for win, strip_px in zip(strips(src), per_strip, strict=True):
                if not (drawn.next < seen + strip_px).any():
                    seen += strip_px
                    continue
                flat = _strata_of(src.read(1, window=win), shapes, src.transform, win, table,
                                  n_classes, k)  # fmt: skip
                before = seen.copy()
                for start in range(0, flat.size, RANK_CHUNK):
                    part = flat[start : start + RANK_CHUNK]
                    counts = np.bincount(part, minlength=max(256, k + 1))[:k]
                    hits = np.flatnonzero(drawn.next < seen + counts)
                    if hits.size:
                        index, stratum = _found_in(part, hits, seen, counts, drawn)
                        index += start
                        rows.append(int(win.row_off) + index // int(win.width))
                        cols.append(int(win.col_off) + index % int(win.width))
                        classes.append(stratum)
                    seen += counts
                if not np.array_equal(seen - before, strip_px):
                    raise SampleDesignError(
                        f"{path} changed while the sample was drawn: pixels per stratum of rows "
                        f"{win.row_off}..{win.row_off + win.height - 1} "
                        f"{(seen - before).tolist()} on the second pass, {strip_px.tolist()} "
                        "on the first"
                    )
        rows_a, cols_a, cls_a = (np.concatenate(v) if v else np.zeros(0, np.int64)
                                 for v in (rows, cols, classes))  # fmt: skip
        order = np.lexsort((cols_a, rows_a))
        out.append((rows_a[order], cols_a[order], cls_a[order]))
    if not np.array_equal(seen, strata_px) or not np.array_equal(drawn.taken, drawn.ends):
        raise SampleDesignError(
            f"maps {[str(m) for m in maps]} changed while the sample was drawn: pixels per "
            f"stratum {seen.tolist()} on the second pass, {strata_px.tolist()} on the first"
        )
    return out


class _Drawn:
    """Every stratum's drawn ranks (each sorted) in one array, ``flat``, stratum h's from
    ``taken[h]`` (the next not found yet) to ``ends[h]``; ``keys`` = h * ``big`` + rank, sorted
    as a whole, so the ranks of many strata below their bounds are one search; ``next`` each
    stratum's next drawn rank (SENTINEL when all are found)."""

    def __init__(self, ranks: list[np.ndarray], strata_px: np.ndarray) -> None:
        sizes = np.array([len(r) for r in ranks], np.int64)
        self.ends = np.cumsum(sizes)
        self.taken = self.ends - sizes
        self.flat = np.concatenate([np.asarray(r, np.int64) for r in ranks] + [[SENTINEL]])
        self.big = int(np.max(strata_px, initial=0)) + 1
        strata = np.repeat(np.arange(len(ranks), dtype=np.int64), sizes)
        self.keys = strata * self.big + self.flat[:-1]
        self.next = np.where(sizes > 0, self.flat[self.taken], SENTINEL)

    def take(self, hits: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ranks, their strata) of the strata ``hits`` below ``bounds`` (one per hit) not
        taken yet, in stratum then rank order; taken now."""
        end = np.searchsorted(self.keys, hits * self.big + bounds)
        first = self.taken[hits]
        lens = end - first
        units = np.repeat(first - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
        self.taken[hits] = end
        self.next[hits] = np.where(end < self.ends[hits], self.flat[end], SENTINEL)
        return self.flat[units], np.repeat(hits, lens)


def _found_in(
    part: np.ndarray, hits: np.ndarray, seen: np.ndarray, counts: np.ndarray, drawn: _Drawn
) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``part``, strata) of the drawn pixels a chunk holds: the chunk's pixels of
    the strata ``hits`` (those with a drawn rank in it) in stratum order, scan order within
    one (a stable sort), the drawn rank r of stratum h the (r - seen[h])-th of h's."""
    ranks, stratum = drawn.take(hits, seen[hits] + counts[hits])
    wanted = np.zeros(max(256, len(seen) + 1), bool)
    wanted[hits] = True
    where = np.flatnonzero(wanted[part])
    held = part[where]  # 8 or 16 bits: a radix sort
    held = held if held.dtype.itemsize <= 2 else held.astype(np.int64)
    order = np.argsort(held, kind="stable")  # a radix sort on 16 bits
    first = np.searchsorted(held[order], stratum)  # each stratum's start in the sort
    return where[order[first + ranks - seen[stratum]]], stratum


def _strata_of(
    values: np.ndarray, shapes: MapDistricts | None, transform: Affine, win: Window,
    table: np.ndarray, k: int, h: int,
) -> np.ndarray:  # fmt: skip
    """Flat stratum ids of a strip's pixels: class at the level (plus ``district * k``), and
    ``h`` (one past the last stratum) on nodata; the classes alone, 255 on nodata, without
    districts (as the design has always ranked them)."""
    if shapes is None:
        return table[values.ravel()]
    local, ids = _one_district(*district_burn(shapes, transform, win))
    # uint16 strata while they fit: a quarter of int64's bytes to write, count and sort
    strata = _strata_table(ids, table, k, h).astype(np.uint16 if h < 1 << 16 else np.int64)
    if local is None:
        return strata[values.ravel()]
    return strata[_strip_keys(values, local, len(ids))]
