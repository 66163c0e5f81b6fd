"""A GeoTIFF's header read straight from its first IFD, for planning thousands of tiles:
GDAL's open costs milliseconds per file (seconds over a continent of tiles), this reads a few
kilobytes. Anything it does not know (no EPSG code, other layouts) returns None, and the
caller asks GDAL instead."""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path

import rasterio
from affine import Affine

TYPES = {
    1: "B",
    2: "s",
    3: "H",
    4: "I",
    6: "b",
    7: "B",
    8: "h",
    9: "i",
    11: "f",
    12: "d",
    16: "Q",
    17: "q",
}
SIZES = {"B": 1, "s": 1, "H": 2, "I": 4, "b": 1, "h": 2, "i": 4, "f": 4, "d": 8, "Q": 8, "q": 8}
DTYPES = {
    (1, 8): "uint8",
    (2, 8): "int8",
    (1, 16): "uint16",
    (2, 16): "int16",
    (3, 32): "float32",
    (3, 64): "float64",
}
PROJECTED, GEOGRAPHIC = 3072, 2048  # GeoKeys holding an EPSG code


def read_tags(path: Path, head: int = 65536) -> dict[int, tuple] | None:
    """The first IFD's tags and values (classic TIFF or BigTIFF)."""
    with open(path, "rb") as fh:
        data = fh.read(head)

        def at(offset: int, size: int) -> bytes:
            if offset + size <= len(data):
                return data[offset : offset + size]
            fh.seek(offset)
            return fh.read(size)

        order = {b"II": "<", b"MM": ">"}.get(data[:2])
        if order is None or len(data) < 16:
            return None
        (magic,) = struct.unpack(order + "H", data[2:4])
        if magic == 42:
            (ifd,) = struct.unpack(order + "I", data[4:8])
            count_fmt, entry_fmt, entry_size, inline = "H", "HHI", 12, 4
        elif magic == 43:
            (ifd,) = struct.unpack(order + "Q", data[8:16])
            count_fmt, entry_fmt, entry_size, inline = "Q", "HHQ", 20, 8
        else:
            return None
        (n,) = struct.unpack(order + count_fmt, at(ifd, SIZES[count_fmt]))
        entries = at(ifd + SIZES[count_fmt], n * entry_size)
        tags = {}
        for i in range(n):
            entry = entries[i * entry_size : (i + 1) * entry_size]
            tag, kind, count = struct.unpack(order + entry_fmt, entry[: entry_size - inline])
            fmt = TYPES.get(kind)
            if fmt is None:
                continue
            size = SIZES[fmt] * count
            raw = entry[entry_size - inline :]
            if size > inline:
                (offset,) = struct.unpack(order + ("I" if inline == 4 else "Q"), raw)
                raw = at(offset, size)
            if fmt == "s":
                tags[tag] = (raw[:size].rstrip(b"\0").decode("latin-1"),)
            else:
                tags[tag] = struct.unpack(order + fmt * count, raw[:size])
    return tags


def geotiff_header(path: Path) -> dict | None:
    """width, height, count, dtype, epsg, transform, nodata, block of a GeoTIFF; None where
    the file holds what this reader does not handle."""
    tags = read_tags(path)
    if not tags or 256 not in tags or 257 not in tags:
        return None
    bits = tags.get(258, (1,))[0]
    fmt = tags.get(339, (1,))[0]
    dtype = DTYPES.get((fmt, bits))
    keys = tags.get(34735)
    epsg = None
    if keys:
        for k in range(4, len(keys), 4):
            if keys[k] in (PROJECTED, GEOGRAPHIC) and keys[k + 1] == 0:
                epsg = keys[k + 3]
    if dtype is None or epsg in (None, 32767):
        return None
    if 34264 in tags:
        m = tags[34264]
        transform = Affine(m[0], m[1], m[3], m[4], m[5], m[7])
    elif 33550 in tags and 33922 in tags:
        sx, sy, _ = tags[33550]
        i, j, _, x, y, _ = tags[33922][:6]
        transform = Affine(sx, 0, x - i * sx, 0, -sy, y + j * sy)
    else:
        return None
    nodata = tags.get(42113, (None,))[0]
    block = (
        (tags[322][0], tags[323][0]) if 322 in tags else (tags[256][0], tags.get(278, tags[257])[0])
    )
    return {
        "width": tags[256][0],
        "height": tags[257][0],
        "count": tags.get(277, (1,))[0],
        "dtype": dtype,
        "epsg": epsg,
        "transform": transform,
        "nodata": float(nodata) if nodata not in (None, "") else None,
        "block": block,
    }


@dataclass(frozen=True)
class Header:
    """What the planner needs of a tile, read from its header only."""

    path: Path
    crs: rasterio.crs.CRS
    transform: Affine
    width: int
    height: int
    count: int
    dtype: str
    nodata: float | None = None
    block: tuple[int, int] = (256, 256)  # (width, height) of its first band's blocks
    epsg: int | None = None

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        x0, y0 = self.transform.c, self.transform.f
        x1 = x0 + self.transform.a * self.width
        y1 = y0 + self.transform.e * self.height
        return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)

    @property
    def bottom_up(self) -> bool:
        return self.transform.e > 0


def read_header(path: Path) -> Header:
    """A raster's header: GeoTIFFs read directly (fast), others by GDAL (raises
    RasterioIOError when it cannot be read)."""
    fast = geotiff_header(path) if path.suffix.lower() in (".tif", ".tiff") else None
    if fast is not None:
        return Header(
            path,
            _crs(fast["epsg"]),
            fast["transform"],
            fast["width"],
            fast["height"],
            fast["count"],
            fast["dtype"],
            fast["nodata"],
            fast["block"],
            fast["epsg"],
        )
    with rasterio.open(path) as src:
        rows, cols = src.block_shapes[0]
        epsg = src.crs.to_epsg() if src.crs else None
        return Header(
            path,
            src.crs,
            src.transform,
            src.width,
            src.height,
            src.count,
            src.dtypes[0],
            src.nodata,
            (cols, rows),
            epsg,
        )


@functools.lru_cache(maxsize=256)
def _crs(epsg: int) -> rasterio.crs.CRS:
    return rasterio.crs.CRS.from_epsg(epsg)
