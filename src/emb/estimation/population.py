"""The population a class map defines: pixels per class at a level (the strata), counted by
streaming the map in strips, the area of one pixel, and the map's classes at given points.

A map is what predict writes (``results/maps/{run}/{region}.tif``): one uint8 band of L3 ids
(0..60), 255 = nodata, in a projected CRS. Counting reads full-width strips of whole block rows
(a few MB each) with GDAL's block cache held to about two strips, so memory stays flat in the
map's size (``bench/map_counts.py``). The strips' row-major order is also the scan order in
which the sample design ranks a stratum's pixels.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import rasterio
from pyproj import CRS
from rasterio.windows import Window

from emb import geo
from emb.classes import IGNORE, N_L3, ClassMap
from emb.io import reading

LEVELS = (1, 2, 3)  # L1 crop/non-crop, L2 groups, L3 classes
STRIP_BYTES = 4 << 20  # at most this many pixels (uint8) in one strip read
CHUNK = 1 << 18  # pixels per bincount call: it copies its input as int64 (8 bytes a pixel)
MIN_CACHE_BYTES = 8 << 20  # GDAL's block cache while streaming (at least)
AHEAD = 2  # strips a reader thread may have read before the counting takes them
T = TypeVar("T")


class MapCrsError(ValueError):
    """A map whose pixel area cannot be known in square metres (no or a geographic CRS)."""


class MapFileError(ValueError):
    """A file that is not a class map as predict writes it, or holds values no class has."""


class PointError(ValueError):
    """A sample point that no map of its region holds (outside it, on nodata, no map)."""


@dataclass(frozen=True)
class Points:
    """Where sample units lie, (m,) arrays: ``ids`` int64; ``region`` str (a map file's stem);
    ``x``, ``y`` float64 pixel centres in that map's CRS; ``crs`` str (``EPSG:n`` or WKT)."""

    ids: np.ndarray
    region: np.ndarray
    x: np.ndarray
    y: np.ndarray
    crs: np.ndarray


def crs_text(crs: rasterio.crs.CRS) -> str:
    """``EPSG:n`` when the CRS has an EPSG code, else its WKT."""
    epsg = crs.to_epsg()
    return f"EPSG:{epsg}" if epsg else crs.to_wkt()


def level_table(level: int, cmap: ClassMap) -> np.ndarray:
    """(256,) uint8: L3 id -> class id at ``level``; 255 for nodata and for any value that is
    no L3 id."""
    if level == 1:
        return cmap.l3_to_l1
    if level == 2:
        return cmap.l3_to_l2
    if level == 3:
        table = np.full(256, IGNORE, np.uint8)
        table[:N_L3] = np.arange(N_L3, dtype=np.uint8)
        return table
    raise ValueError(f"class level must be one of {LEVELS}, found {level!r}")


def level_names(level: int, cmap: ClassMap) -> tuple[str, ...]:
    """The class names at ``level``, indexed by class id."""
    names = {1: cmap.l1_names, 2: cmap.l2_names, 3: cmap.l3_names}
    if level not in names:
        raise ValueError(f"class level must be one of {LEVELS}, found {level!r}")
    return names[level]


def check_map(src: rasterio.DatasetReader, path: Path | str) -> None:
    """Refuse a file that is not a class map: one uint8 band, nodata 255 or none declared (a
    probability file has one band per class)."""
    if src.count != 1 or src.dtypes[0] != "uint8":
        raise MapFileError(
            f"{path}: not a class map: expected 1 uint8 band of L3 ids, found {src.count} "
            f"band(s) of {src.dtypes[0]}"
        )
    if src.nodata is not None and src.nodata != IGNORE:
        raise MapFileError(f"{path}: a class map's nodata is {IGNORE}, found {src.nodata}")


def pixel_hectares(path: Path | str) -> float:
    """The area of one pixel in hectares, from the transform (|determinant|, in the CRS's
    linear unit converted to metres); a geographic CRS (degrees) or none is refused, since a
    degree's length varies over the map."""
    with reading(path), rasterio.open(path) as src:
        return map_pixel_ha(src, path)


def map_pixel_ha(src: rasterio.DatasetReader, path: Path | str) -> float:
    crs = src.crs
    if crs is None:
        raise MapCrsError(f"{path}: no CRS; a pixel's area needs a projected CRS (e.g. UTM)")
    if crs.is_geographic or not crs.is_projected:
        raise MapCrsError(
            f"{path}: CRS {crs.to_string()} is not projected (geographic degrees); a pixel's "
            f"area needs a projected CRS (e.g. UTM)"
        )
    _, metres = crs.linear_units_factor
    return abs(src.transform.determinant) * metres**2 / 10_000.0


def strip_rows(src: rasterio.DatasetReader) -> int:
    """Rows per strip: whole block rows while a full-width strip stays under STRIP_BYTES, else
    as many rows as fit (at least one)."""
    block_h = src.block_shapes[0][0]
    fit = max(1, STRIP_BYTES // max(1, src.width))
    return block_h * max(1, fit // block_h) if fit >= block_h else fit


def cache_bytes(src: rasterio.DatasetReader) -> int:
    """GDAL's block cache while streaming: one full-width row of blocks twice, so a strip
    thinner than a block row reads each block from disk once."""
    block_h = src.block_shapes[0][0]
    return max(MIN_CACHE_BYTES, 2 * src.width * block_h)


def strips(src: rasterio.DatasetReader, window: Window | None = None) -> Iterator[Window]:
    """Full-width strips of ``window`` (default: the whole map), top row first."""
    full = Window(0, 0, src.width, src.height)
    window = full if window is None else window.intersection(full)
    col0, row0 = int(window.col_off), int(window.row_off)
    width, height = int(window.width), int(window.height)
    step = strip_rows(src)
    for row in range(row0, row0 + height, step):
        yield Window(col0, row, width, min(step, row0 + height - row))


def histogram(values: np.ndarray) -> np.ndarray:
    """(256,) int64 occurrences of each value of a uint8 array, bincounted in chunks so that
    bincount's int64 copy stays small."""
    flat = values.ravel()
    counts = np.zeros(256, np.int64)
    for start in range(0, flat.size, CHUNK):
        counts += np.bincount(flat[start : start + CHUNK], minlength=256)
    return counts


@contextmanager
def streaming(path: Path | str) -> Iterator[rasterio.DatasetReader]:
    """The map at ``path``, checked, open under a GDAL block cache sized for strips (GDAL's
    default, 5% of RAM, would grow with the map up to it); read errors name the file."""
    with reading(path), rasterio.open(path) as src:
        check_map(src, path)
        with rasterio.Env(GDAL_CACHEMAX=cache_bytes(src)):
            yield src


class PlaneRing:
    """``size`` sets of ``planes`` reused uint8 strip planes, handed out in turn (a fresh set a
    strip would cost its page faults; each plane contiguous, so a raster reads straight into
    it). With a reader thread ahead of the counting (:func:`read_ahead`) a set is written only
    once the counting is done with it when there are ``AHEAD`` + 2 sets (the one taken, the
    queue's, the one being read): :meth:`for_threads`."""

    def __init__(self, size: int, planes: int = 1) -> None:
        self.flats = [np.zeros((planes, 0), np.uint8) for _ in range(size)]
        self.at = -1

    @classmethod
    def for_threads(cls, threads: int, planes: int = 1) -> PlaneRing:
        """One set for one thread; ``AHEAD`` + 2 sets with a reader thread."""
        return cls(1 if threads <= 1 else AHEAD + 2, planes)

    def next(self, height: int, width: int) -> tuple[np.ndarray, ...]:
        """The next set in turn as (height, width) uint8 views, grown when too small."""
        self.at = (self.at + 1) % len(self.flats)
        flat = self.flats[self.at]
        if flat.shape[1] < height * width:
            flat = self.flats[self.at] = np.zeros((flat.shape[0], height * width), np.uint8)
        return tuple(flat[:, : height * width].reshape(-1, height, width))


def one_env(items: Iterator[T]) -> Iterator[T]:
    """``items`` produced under one GDAL environment (``rasterio.Env``), entered by the thread
    that produces them (a generator's body runs where it is advanced): each ``rasterio.open``
    inside finds it and neither sets up nor tears down one of its own (about a tenth of a
    map's open, 0.1 ms, measured 2026-12-07)."""
    with rasterio.Env():
        yield from items


def read_ahead(items: Iterator[T], threads: int, ahead: int = AHEAD) -> Iterator[T]:
    """``items`` in their order; with ``threads`` > 1 produced by a thread of their own up to
    ``ahead`` items before they are taken (a bounded queue: memory stays that of a few strips),
    so that reading and decoding a strip (GDAL lets go of the GIL) overlaps counting the one
    before. The producer's error is raised here in its place; closing this generator stops the
    producer. A strip buffer reused by the producer must outlast ``ahead`` + 2 items (the one
    taken, the queue's, the one being read)."""
    if threads <= 1:
        yield from items
        return
    handed: queue.Queue = queue.Queue(maxsize=ahead)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        handed.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            handed.put((done, None))
        except BaseException as err:  # noqa: BLE001 - raised in the consumer's thread
            handed.put((done, err))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=produce, name="read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item, err = handed.get()
            if err is not None:
                raise err
            if item is done:
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # a producer blocked on a full queue sees the stop
            try:
                handed.get(timeout=0.1)
            except queue.Empty:
                continue
        worker.join()


def count_l3(path: Path | str, mask_window: Window | None = None) -> np.ndarray:
    """(256,) int64 pixels per map value, streamed by strips; values that are neither an L3 id
    nor nodata are refused (naming them), so no pixel falls out of the strata silently."""
    counts = np.zeros(256, np.int64)
    with streaming(path) as src:
        for win in strips(src, mask_window):
            counts += histogram(src.read(1, window=win))
    refuse_foreign(path, counts)
    return counts


def count_l3_strips(path: Path | str) -> np.ndarray:
    """(S, 256) int64 pixels per map value of each of the map's S strips (:func:`strips`
    order), refused as :func:`count_l3` refuses: the sample design's first pass, whose
    per-strip counts let the second read only the strips that hold a drawn pixel."""
    with streaming(path) as src:
        rows = [histogram(src.read(1, window=win)) for win in strips(src)]
    counts = np.array(rows, np.int64).reshape(-1, 256)
    refuse_foreign(path, counts.sum(0))
    return counts


def refuse_foreign(path: Path | str, counts: np.ndarray) -> None:
    """Refuse (256,) counts of a map with values that are neither L3 ids nor nodata."""
    foreign = np.flatnonzero(counts[N_L3:IGNORE]) + N_L3
    if foreign.size:
        raise MapFileError(
            f"{path}: values {foreign.tolist()} are neither L3 class ids (0..{N_L3 - 1}) nor "
            f"nodata {IGNORE}"
        )


def collapse_counts(l3_counts: np.ndarray, level: int, cmap: ClassMap) -> np.ndarray:
    """(K,) int64 pixels per class at ``level`` from (256,) counts per map value; nodata is
    not counted."""
    table = level_table(level, cmap)[:N_L3]
    n_classes = len(level_names(level, cmap))
    return np.bincount(table, weights=l3_counts[:N_L3], minlength=n_classes).astype(np.int64)


def count_classes(
    path: Path | str, level: int, cmap: ClassMap, mask_window: Window | None = None
) -> np.ndarray:
    """(K,) int64 pixels per class at ``level`` of the map at ``path`` (only inside
    ``mask_window`` when given), nodata not counted; memory flat in the map's size."""
    level_table(level, cmap)  # an unknown level is refused before the map is read
    return collapse_counts(count_l3(path, mask_window), level, cmap)


def pixels_of(
    src: rasterio.DatasetReader, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, inside): the pixel holding each point (x, y in the map's CRS), int64,
    and whether it lies inside the map (bool)."""
    fcols, frows = ~src.transform * (np.asarray(x, np.float64), np.asarray(y, np.float64))
    rows = np.floor(frows).astype(np.int64)
    cols = np.floor(fcols).astype(np.int64)
    inside = (rows >= 0) & (rows < src.height) & (cols >= 0) & (cols < src.width)
    return rows, cols, inside


def values_at(src: rasterio.DatasetReader, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(m,) uint8 map values at pixels inside the map, each block holding a point read once."""
    block_h, block_w = src.block_shapes[0]
    across = -(-src.width // block_w)
    keys = (rows // block_h) * across + cols // block_w
    out = np.empty(len(rows), np.uint8)
    order = np.argsort(keys, kind="stable")
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for group in np.split(order, bounds) if len(order) else []:
        down, right = divmod(int(keys[group[0]]), across)
        row0, col0 = down * block_h, right * block_w
        win = Window(col0, row0, min(block_w, src.width - col0), min(block_h, src.height - row0))
        block = src.read(1, window=win)
        out[group] = block[rows[group] - row0, cols[group] - col0]
    return out


def map_classes_at(
    points: Points, maps: dict[str, Path], level: int, cmap: ClassMap, no_data: int | None = None
) -> np.ndarray:
    """(m,) int64 the class at ``level`` of each point on ``maps`` (region -> map file; e.g.
    another run's maps of the same regions), points moved into a map's CRS where it differs.
    A point outside its map or on its nodata is refused naming the point's id and the map, or
    given the class ``no_data`` when one is (another source's map may lack data where the
    design's had it); a region without a map is refused."""
    table = level_table(level, cmap)
    out = np.empty(len(points.ids), np.int64)
    region = np.asarray(points.region, dtype=object)
    for name in dict.fromkeys(region.tolist()):
        picked = np.flatnonzero(region == name)
        if name not in maps:
            raise PointError(
                f"no map of region {name!r} (point id {points.ids[picked[0]]}); maps given for "
                f"{sorted(maps)}"
            )
        path = Path(maps[name])
        with reading(path), rasterio.open(path) as src:
            check_map(src, path)
            x, y = points.x[picked], points.y[picked]
            map_crs = crs_text(src.crs)
            for text in dict.fromkeys(np.asarray(points.crs, dtype=object)[picked].tolist()):
                if text != map_crs:
                    same = np.asarray(points.crs, dtype=object)[picked] == text
                    move = geo.transformer(
                        CRS.from_user_input(text), CRS.from_wkt(src.crs.to_wkt())
                    )
                    x, y = x.copy(), y.copy()
                    x[same], y[same] = move.transform(x[same], y[same])
            rows, cols, inside = pixels_of(src, x, y)
            if no_data is not None:
                found = np.full(len(picked), IGNORE, np.uint8)
                found[inside] = table[values_at(src, rows[inside], cols[inside])]
                out[picked] = np.where(found == IGNORE, no_data, found)
                continue
            if not inside.all():
                i = picked[np.flatnonzero(~inside)[0]]
                raise PointError(
                    f"{path}: point id {points.ids[i]} ({points.x[i]}, {points.y[i]}) lies "
                    f"outside the map"
                )
            found = table[values_at(src, rows, cols)]
        if (found == IGNORE).any():
            i = picked[np.flatnonzero(found == IGNORE)[0]]
            raise PointError(f"{path}: point id {points.ids[i]} lies on nodata")
        out[picked] = found
    return out
