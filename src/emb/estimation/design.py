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
touches nearly all). The first pass burns the districts per strip, cut to it, and keeps the
burn as runs for the second; both count a strip per (district near it, map value), each a
compiled loop over its pixels (:mod:`emb.estimation.strata_scan`): their cost against one read
of the maps is measured by ``bench/state_scale.py``. With two threads (cores) each of two
forked worker processes takes a share of the maps through both passes (:mod:`emb.forks`); where
none can be forked the reads, the burns and the kept runs are a reader thread's, the loops
(which let go of the GIL) the counting thread's.
Memory stays flat in the maps' size but for those counts and runs (a few bytes a row a
district's edge crosses). The points go out as a CSV to fill in (``reference``), a GeoPackage
of the same points, and a JSON record of the design beside them, which the estimate needs.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from pyproj import CRS
from rasterio.windows import Window

from emb import geo
from emb.classes import IGNORE, N_L3, ClassMap
from emb.estimation import strata_scan
from emb.estimation.districts import Districts, MapDistricts, district_burn, on_map_once
from emb.estimation.population import (
    PlaneRing,
    Points,
    collapse_counts,
    count_l3_strips,
    crs_text,
    level_names,
    level_table,
    map_pixel_ha,
    one_env,
    read_ahead,
    refuse_foreign,
    streaming,
    strips,
)
from emb.estimation.sample_record import MapRecord, SampleRecord, StrataDistricts
from emb.estimation.sample_size import SampleSize
from emb.estimation.strata_scan import ALL_FOUND, NO_STRATUM, count_keys, pick_ranked
from emb.forks import forked_workers, shares, two_rounds
from emb.provenance import digest_file

log = logging.getLogger(__name__)
PIXEL_AREA_RTOL = 1e-6  # maps' pixel areas that differ by less are one pixel size
KEPT_RUN_PIXELS = 64  # a strip's burn is kept for the second pass below a run in this many px


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


def _records_in_turn(
    maps: Sequence[Path], level: int, cmap: ClassMap, districts: Districts | None,
    placed: dict[str, MapDistricts], threads: int, burns: dict,
) -> list[tuple[MapRecord, np.ndarray, np.ndarray, tuple[Affine, str]]]:  # fmt: skip
    """The first streaming pass over ``maps``, in turn: per map its record, (H,) pixels per
    stratum and (S, H) per strip, and its transform and WKT (for the points); H = K classes at
    ``level``, or (D + 1) * K with districts, each strip's districts kept in ``burns``
    (:class:`_KeptBurn`, by (map, strip)), placed on each CRS once in ``placed``. With
    districts the maps' strips come through :func:`_map_reads` (with ``threads`` > 1 read by a
    thread of their own, a few strips ahead of the counting); the reads, the district burns and
    the kept runs all in the reader thread, so that the counting thread runs only the compiled
    loop (which lets go of the GIL) and a little glue."""
    if districts is None:
        return [_map_record(m, level, cmap) for m in maps]
    out, ring = [], PlaneRing.for_threads(threads)
    near = _StripDistricts(districts, placed, burns, first=True)
    reads = (item for m in maps for item in _map_reads(m, ring, None, near))
    counter = None
    for item in read_ahead(one_env(reads), threads):
        if item[0] == "strip":
            counter.add(*item[3:])
        elif item[0] == "map":
            path, head = item[1], item[2]
            counter = _FirstPassCounts(level, cmap, districts)
        else:
            strata_strips, l3 = counter.result(path)
            out.append(_record_of(path, head, level, cmap, strata_strips, l3))
    return out


def _map_record(
    path: Path, level: int, cmap: ClassMap
) -> tuple[MapRecord, np.ndarray, np.ndarray, tuple[Affine, str]]:
    """:func:`_records_in_turn` of one map without districts (strata: its classes)."""
    with streaming(path) as src:
        head = _head(src, path)
    per_strip = count_l3_strips(path)
    table = level_table(level, cmap)[:N_L3]
    onehot = np.zeros((256, len(level_names(level, cmap))), np.int64)
    onehot[np.arange(N_L3), table] = 1  # L3 value -> its class at the level; nodata: none
    return _record_of(path, head, level, cmap, per_strip @ onehot, per_strip.sum(0))


def _head(src: rasterio.DatasetReader, path: Path) -> tuple:
    """(pixel ha, CRS text, width, height, (transform, WKT), transform, CRS) of an open map."""
    pixel_ha = map_pixel_ha(src, path)
    return (pixel_ha, crs_text(src.crs), src.width, src.height,
            (src.transform, src.crs.to_wkt()), src.transform, src.crs)  # fmt: skip


def _record_of(
    path: Path, head: tuple, level: int, cmap: ClassMap, strata_strips: np.ndarray,
    l3: np.ndarray,
) -> tuple[MapRecord, np.ndarray, np.ndarray, tuple[Affine, str]]:  # fmt: skip
    """A map's entry of :func:`_records_in_turn` from its :func:`_head` and counts."""
    pixel_ha, crs, width, height, grid = head[:5]
    record = MapRecord(
        region=path.stem, path=str(path), sha256=digest_file(path), crs=crs,
        pixel_ha=pixel_ha, width=width, height=height,
        pixels=int(collapse_counts(l3, level, cmap).sum()),
    )  # fmt: skip
    return record, strata_strips.sum(0), strata_strips, grid


def _map_reads(
    path: Path, ring: PlaneRing, wanted: np.ndarray | None = None,
    near: _StripDistricts | None = None,
) -> Iterator[tuple]:  # fmt: skip
    """The reads of one map, in the order they are counted (maybe in a thread of their own,
    :func:`emb.estimation.population.read_ahead`): ``("map", path, head)`` (:func:`_head`),
    ``("strip", i, window, values, local, ids)`` for each strip i (only where ``wanted[i]``,
    when given), ``("end", path)``; ``values`` (h, w) uint8 the strip's map values, in a
    buffer of ``ring``; ``local``, ``ids`` its districts from ``near`` (:func:`_one_district`;
    None, None without)."""
    with streaming(path) as src:
        head = _head(src, path)
        if near is not None:
            near.start(path, head)
        yield "map", path, head
        for i, win in enumerate(strips(src)):
            if wanted is None or wanted[i]:
                (values,) = ring.next(int(win.height), int(win.width))
                src.read(1, window=win, out=values)
                local, ids = (None, None) if near is None else near.of(i, win)
                yield "strip", i, win, values, local, ids
    yield "end", path


class _StripDistricts:
    """Each strip's districts for a pass over the maps, worked out where the strips are read
    (the reader thread): the first pass burns them (:func:`district_burn`) and keeps them in
    ``burns`` (:class:`_KeptBurn`, by (map, strip)); the second takes the kept ones out, and
    burns again where none was kept."""

    def __init__(
        self, districts: Districts, placed: dict[str, MapDistricts], burns: dict, first: bool
    ) -> None:
        self.districts, self.placed, self.burns, self.first = districts, placed, burns, first

    def start(self, path: Path, head: tuple) -> None:
        """Take the map at ``path`` (its :func:`_head`): the districts on its CRS."""
        self.path, self.transform = path, head[5]
        self.shapes = on_map_once(self.districts, head[6], self.placed)

    def of(self, i: int, win: Window) -> tuple[np.ndarray | None, np.ndarray]:
        """(local, ids) of the map's strip i (:func:`_one_district`)."""
        kept = None if self.first else self.burns.pop((self.path, i), None)
        if kept is not None:
            return kept.burned()
        local, ids = _one_district(*district_burn(self.shapes, self.transform, win))
        if self.first:
            _KeptBurn.keep(self.burns, (self.path, i), local, ids)
        return local, ids


class _FirstPassCounts:
    """A map's first pass with districts: (S, (D + 1) * K) int64 pixels per (district, class)
    stratum of each strip, and (256,) pixels per map value. A strip is counted per (district
    near it, map value) key by one compiled loop (:func:`emb.estimation.strata_scan.count_keys`,
    (L + 1) x 256 counts; a strip in one district per value), folded into its strata."""

    def __init__(self, level: int, cmap: ClassMap, districts: Districts) -> None:
        self.table, self.k = level_table(level, cmap), len(level_names(level, cmap))
        self.h = (len(districts.names) + 1) * self.k
        self.rows: list[np.ndarray] = []
        self.l3 = np.zeros(256, np.int64)

    def add(self, values: np.ndarray, local: np.ndarray | None, ids: np.ndarray) -> None:
        """Count a strip: its values and districts (:func:`_map_reads`)."""
        hist = np.zeros(len(ids) * 256, np.int64)
        count_keys(values.ravel(), None if local is None else local.ravel(), hist)
        self.l3 += hist.reshape(len(ids), 256).sum(0)
        strata = _strata_table(ids, self.table, self.k)
        held = strata != NO_STRATUM
        counts = np.bincount(strata[held], weights=hist[held], minlength=self.h)
        self.rows.append(np.rint(counts).astype(np.int64))

    def result(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """(S, H) per strip and (256,) per value; values that are no class refused."""
        refuse_foreign(path, self.l3)
        return np.array(self.rows, np.int64).reshape(-1, self.h), self.l3


class _KeptBurn:
    """A strip's districts as the first pass burned them (:func:`_one_district`), kept for the
    second pass, which then neither cuts the districts to the strip nor burns them again: the
    local plane as runs along the scan (a district's edges cross a row a few times), kept only
    while it has fewer than one run in KEPT_RUN_PIXELS pixels (memory: a few bytes a run)."""

    def __init__(self, local: np.ndarray | None, ids: np.ndarray) -> None:
        self.ids, self.shape = ids, None if local is None else local.shape
        if local is not None:
            flat = local.ravel()
            starts = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1])
            self.values = flat[starts]
            self.lengths = np.diff(np.append(starts, flat.size))

    @staticmethod
    def keep(burns: dict, key: tuple, local: np.ndarray | None, ids: np.ndarray) -> None:
        """Keep a strip's burn under ``key`` in ``burns`` where its runs are few enough."""
        kept = _KeptBurn(local, ids)
        if local is None or kept.values.size * KEPT_RUN_PIXELS <= local.size:
            burns[key] = kept

    def burned(self) -> tuple[np.ndarray | None, np.ndarray]:
        """(local, ids) as :func:`_one_district` gave them."""
        if self.shape is None:
            return None, self.ids
        return np.repeat(self.values, self.lengths).reshape(self.shape), self.ids


def _strata_table(ids: np.ndarray, table: np.ndarray, k: int) -> np.ndarray:
    """((L + 1) * 256,) int64 the stratum of each key ``local * 256 + map value`` of a strip
    whose districts are ``ids`` (:func:`emb.estimation.districts.district_burn`): class at the
    level plus ``district * k``, and NO_STRATUM on nodata."""
    classes = table[:256].astype(np.int64)
    strata = ids.astype(np.int64)[:, None] * k + classes[None, :]
    return np.where(classes[None, :] == IGNORE, NO_STRATUM, strata).ravel()


def _one_district(local: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(None, [its id]) where a strip's pixels all lie in one domain (no per-pixel key then),
    else ``(local, ids)`` as they are."""
    if len(ids) == 1:
        return None, ids
    if local.size and local.min() == local.max():
        return None, ids[int(local.flat[0]) :][:1]
    return local, ids


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
    threads: int = 1,
) -> Design:  # fmt: skip
    """Draw a stratified random sample of ``n`` pixel centres over ``maps`` (one per region,
    the stratum of a pixel its map class at ``level``); never on nodata. ``sized``: the units
    per stratum for these strata's pixels instead (``n: auto``, the recommended size).
    ``districts``: strata are (district, class) pairs instead, district 0 the outside, the
    minimum per pair, the rest by area over all pairs (a district is a pixel's by its centre,
    :mod:`emb.estimation.districts`). ``threads`` > 1: the maps in shares (by file size), each
    through both passes in one of up to ``threads`` forked processes (:func:`emb.forks.two_rounds`:
    a share's per-strip counts and burns stay there; the ranks are drawn here and sent, with the
    pixels of each stratum before the share); where none can be forked, with districts, the
    maps read and decoded by a thread of their own, a few strips ahead of the counting."""
    maps = [Path(m) for m in maps]
    table, names = level_table(level, cmap), level_names(level, cmap)
    workers = forked_workers(threads, len(maps))
    inner = 1 if workers > 1 else threads  # a worker is one thread: its core is its own
    parts = shares(maps, workers, [_file_size(m) for m in maps])
    if workers > 1:
        strata_scan.warm()  # once here, not once a worker
    # a part's own, in the process that counts it (its worker's, or this one's)
    placed: dict[str, MapDistricts] = {}  # the districts moved onto each CRS, once
    burns: dict = {}  # each strip's districts from the first pass, for the second
    kept_strips: dict[int, list[np.ndarray]] = {}  # each map's (S, H) per strip, by part
    made: dict = {}  # what the draw between the passes made here

    def first_pass(part: int) -> tuple[list[MapRecord], list[tuple[Affine, str]], np.ndarray]:
        found = _records_in_turn(parts[part], level, cmap, districts, placed, inner, burns)
        kept_strips[part] = [per_strip for _, _, per_strip, _ in found]
        return ([record for record, _, _, _ in found], [grid for _, _, _, grid in found],
                np.sum([counts for _, counts, _, _ in found], axis=0))  # fmt: skip

    def draw(firsts: list[tuple]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        records = made["records"] = [record for part in firsts for record in part[0]]
        made["grids"] = [grid for part in firsts for grid in part[1]]
        made["pixel_ha"] = _check_maps(maps, records)
        per_part = [part[2] for part in firsts]  # (H,) pixels per stratum of a part's maps
        strata_px = np.sum(per_part, axis=0).astype(np.int64)
        _check_mapped(records)
        size = made["size"] = sized(strata_px) if sized is not None else None
        allocation = size.units if size is not None else allocate(strata_px, n, min_per_class)
        rng = np.random.default_rng(seed)
        ranks = [np.sort(rng.choice(int(px), int(k), replace=False)) for px, k in
                 zip(strata_px, allocation, strict=True)]  # fmt: skip
        made["strata_px"], made["allocation"] = strata_px, allocation
        return ranks, strata_px, np.cumsum([np.zeros_like(strata_px), *per_part], axis=0)

    def second_pass(part: int, plan: tuple) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        ranks, strata_px, before = plan
        return _pick_ranked(parts[part], table, len(names), _Drawn(ranks, strata_px),
                            before[part], kept_strips[part], districts, placed, burns,
                            inner)  # fmt: skip

    found = [one for part in two_rounds(first_pass, draw, second_pass, len(parts))
             for one in part]  # fmt: skip
    records, strata_px, allocation = made["records"], made["strata_px"], made["allocation"]
    pixel_ha, size = made["pixel_ha"], made["size"]
    region = np.concatenate([np.full(len(rows), m.stem) for m, (rows, _, _) in
                             zip(maps, found, strict=True)])  # fmt: skip
    xs, ys, crs, lon, lat = [], [], [], [], []
    to_wgs84 = {}  # per CRS (its WKT), once: building one costs more than a map's points
    for record, (transform, wkt), (rows, cols, _) in zip(records, made["grids"], found,
                                                          strict=True):  # fmt: skip
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
    maps: Sequence[Path], table: np.ndarray, n_classes: int, every: _Drawn, start: np.ndarray,
    strata_strips: list[np.ndarray], districts: Districts | None,
    placed: dict[str, MapDistricts], burns: dict, threads: int = 1,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:  # fmt: skip
    """Second streaming pass over ``maps`` (all or a part, in turn), the scan having passed
    ``start`` pixels of each stratum before them (the first pass's counts of the maps before):
    per map, (rows, cols, stratum) of the pixels whose rank within their stratum (in scan
    order) was drawn (``every``: all strata's drawn ranks), sorted row-major. A strip that
    holds no drawn rank (its first pass counts, ``strata_strips``: (S, H) per map, say so) is
    not read (:func:`_wanted_strips`); a strip that is read is counted again and refused if
    it changed since. With ``districts`` a read strip's districts are the first pass's, kept in
    ``burns`` (:class:`_KeptBurn`, taken out as they are used), or burned again
    (:func:`district_burn`) where none was kept. A strip is walked in scan order by one
    compiled loop (:func:`emb.estimation.strata_scan.pick_ranked`) that counts each stratum's
    pixels and takes those of the drawn ranks. ``threads`` > 1: the strips read by a thread of
    their own, a few ahead."""
    wanted = _wanted_strips(every.at(start), start, strata_strips)
    drawn = every.at(start)
    end = start + np.sum([per_strip.sum(0) for per_strip in strata_strips], axis=0)
    near = None if districts is None else _StripDistricts(districts, placed, burns, first=False)
    seen = start.copy()  # pixels of each stratum passed so far
    found_at, found_in = np.zeros(drawn.flat.size, np.int64), np.zeros(drawn.flat.size, np.int64)
    out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    ring = PlaneRing.for_threads(threads)
    reads = (item for m, w in zip(maps, wanted, strict=True)
             for item in _map_reads(m, ring, w, near))  # fmt: skip
    classes = table[:256].astype(np.int64)  # int64 first: NO_STRATUM is no uint8
    by_value = np.where(classes == IGNORE, NO_STRATUM, classes)
    at, found = 0, ([], [], [])
    for item in read_ahead(one_env(reads), threads):
        if item[0] == "map":
            path, at, found = item[1], 0, ([], [], [])
            per_strip = strata_strips[len(out)]
            continue
        if item[0] == "end":
            seen += per_strip[at:].sum(0)  # the strips after the last read
            rows_a, cols_a, cls_a = (np.concatenate(v) if v else np.zeros(0, np.int64)
                                     for v in found)  # fmt: skip
            order = np.lexsort((cols_a, rows_a))
            out.append((rows_a[order], cols_a[order], cls_a[order]))
            continue
        _, i, win, values, local, ids = item
        seen += per_strip[at:i].sum(0)  # the strips skipped, no drawn rank in them
        at = i + 1
        before = seen.copy()
        strata_of = by_value if ids is None else _strata_table(ids, table, n_classes)
        m = pick_ranked(values.ravel(), None if local is None else local.ravel(), strata_of,
                        seen, drawn.next, drawn.taken, drawn.ends, drawn.flat, found_at,
                        found_in)  # fmt: skip
        found[0].append(int(win.row_off) + found_at[:m] // int(win.width))
        found[1].append(int(win.col_off) + found_at[:m] % int(win.width))
        found[2].append(found_in[:m].copy())
        if not np.array_equal(seen - before, per_strip[i]):
            raise SampleDesignError(
                f"{path} changed while the sample was drawn: pixels per stratum of rows "
                f"{win.row_off}..{win.row_off + win.height - 1} "
                f"{(seen - before).tolist()} on the second pass, {per_strip[i].tolist()} "
                "on the first"
            )
    if not np.array_equal(seen, end) or not np.array_equal(drawn.taken, drawn.at(end).taken):
        raise SampleDesignError(
            f"maps {[str(m) for m in maps]} changed while the sample was drawn: pixels per "
            f"stratum {seen.tolist()} on the second pass, {end.tolist()} on the first"
        )
    return out


def _wanted_strips(
    drawn: _Drawn, start: np.ndarray, strata_strips: list[np.ndarray]
) -> list[np.ndarray]:
    """Per map, (S,) bool the strips holding a drawn rank, from the first pass's counts (what
    the second would find before it reads a strip), the scan having passed ``start`` pixels of
    each stratum before them (``drawn`` as it is there, taken from): only those are read."""
    seen, out = start.copy(), []
    for per_strip in strata_strips:
        wanted = np.zeros(len(per_strip), bool)
        for i, strip_px in enumerate(per_strip):
            hits = np.flatnonzero(drawn.next < seen + strip_px)
            if hits.size:
                wanted[i] = True
                drawn.take(hits, seen[hits] + strip_px[hits])
            seen += strip_px
        out.append(wanted)
    return out


class _Drawn:
    """Every stratum's drawn ranks (each sorted) in one array, ``flat``, stratum h's from
    ``taken[h]`` (the next not found yet) to ``ends[h]``; ``keys`` = h * ``big`` + rank, sorted
    as a whole, so the ranks of many strata below their bounds are one search; ``next`` each
    stratum's next drawn rank (ALL_FOUND when all are found)."""

    def __init__(self, ranks: list[np.ndarray], strata_px: np.ndarray) -> None:
        sizes = np.array([len(r) for r in ranks], np.int64)
        self.ends = np.cumsum(sizes)
        self.taken = self.ends - sizes
        self.flat = np.concatenate([np.asarray(r, np.int64) for r in ranks] + [[ALL_FOUND]])
        self.big = int(np.max(strata_px, initial=0)) + 1
        strata = np.repeat(np.arange(len(ranks), dtype=np.int64), sizes)
        self.keys = strata * self.big + self.flat[:-1]
        self.next = np.where(sizes > 0, self.flat[self.taken], ALL_FOUND)

    def at(self, seen: np.ndarray) -> _Drawn:
        """A copy as a scan leaves it once it has passed ``seen`` pixels of each stratum: the
        ranks below taken (the ranks themselves shared, never written)."""
        other = copy.copy(self)
        strata = np.arange(len(self.ends), dtype=np.int64)
        other.taken = np.searchsorted(self.keys, strata * self.big + seen).astype(np.int64)
        other.next = np.where(other.taken < self.ends, self.flat[other.taken], ALL_FOUND)
        return other

    def take(self, hits: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ranks, their strata) of the strata ``hits`` below ``bounds`` (one per hit) not
        taken yet, in stratum then rank order; taken now."""
        end = np.searchsorted(self.keys, hits * self.big + bounds)
        first = self.taken[hits]
        lens = end - first
        units = np.repeat(first - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
        self.taken[hits] = end
        self.next[hits] = np.where(end < self.ends[hits], self.flat[end], ALL_FOUND)
        return self.flat[units], np.repeat(hits, lens)


def _file_size(path: Path) -> int:
    """A map's bytes on disk (its decoding's work, to share the maps out evenly); 1 where it
    cannot be read (the pass that opens it then says why)."""
    try:
        return max(1, path.stat().st_size)
    except OSError:
        return 1
