"""VRTs as GDAL documents them, written from a plan: no pixel is copied.

A masked mosaic is two files. ``{source}_tiles.vrt`` places every tile on one grid in the tiles'
own orientation: the public AEF COGs are bottom-up (positive NS resolution), which gdalbuildvrt
skips, so their mosaic is bottom-up too. ``{source}.vrt`` is a VRTWarpedDataset over it on the
same grid, north up, cropped to the region's part and masked to it by a cutline (pixels whose
centre lies outside the part are nodata): same CRS and resolution, so the warp is a pure
flip and crop with nearest neighbour. A CDL needs no mask (labels exist only where embeddings
do): its VRT is the mosaic alone.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
import shapely
from affine import Affine
from pyproj import CRS

from emb.areas import AreasError
from emb.areas.plan import Mosaic, tiles_vrt
from emb.io import atomic_path

GDAL_TYPES = {
    "int8": "Int8",
    "uint8": "Byte",
    "uint16": "UInt16",
    "int16": "Int16",
    "float32": "Float32",
    "float64": "Float64",
}
NODATA = {"aef": -128.0, "tessera": float("nan")}  # what the masked VRT marks outside the part


class Grid:
    """A north-up or bottom-up grid: origin at the top-left (or bottom-left) corner."""

    def __init__(self, x0: float, y0: float, res: float, width: int, height: int, up: bool):
        self.x0, self.y0, self.res, self.width, self.height, self.up = (
            x0,
            y0,
            res,
            width,
            height,
            up,
        )

    @property
    def transform(self) -> Affine:
        return Affine(self.res, 0, self.x0, 0, self.res if self.up else -self.res, self.y0)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        span = self.height * self.res
        south, north = (self.y0, self.y0 + span) if self.up else (self.y0 - span, self.y0)
        return self.x0, south, self.x0 + self.width * self.res, north


def write_mosaic(mosaic: Mosaic) -> list[Path]:
    """The VRT file(s) of one mosaic; returns the paths written."""
    headers = [t.header for t in mosaic.tiles]
    if any(h is None for h in headers):
        missing = next(t.path for t in mosaic.tiles if t.header is None)
        raise AreasError(
            f"{missing}: not read (missing or not fetched yet): cannot write {mosaic.vrt}"
        )
    grid = mosaic_grid(mosaic)
    if mosaic.cutline is None:
        _write(Path(mosaic.vrt), mosaic_xml(mosaic, grid, Path(mosaic.vrt)))
        return [Path(mosaic.vrt)]
    below = Path(tiles_vrt(mosaic.vrt))
    _write(below, mosaic_xml(mosaic, grid, below))
    _write(Path(mosaic.vrt), warped_xml(mosaic, grid, below.name))
    return [below, Path(mosaic.vrt)]


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def mosaic_grid(mosaic: Mosaic) -> Grid:
    """One grid holding every tile: the first tile's resolution, origin and orientation."""
    headers = [t.header for t in mosaic.tiles]
    first = headers[0]
    res = first.transform.a
    ups = {h.bottom_up for h in headers}
    if len(ups) > 1:
        odd = next(h.path for h in headers if h.bottom_up != first.bottom_up)
        raise AreasError(
            f"{odd}: {'bottom-up' if not first.bottom_up else 'top-down'} among "
            f"{'bottom-up' if first.bottom_up else 'top-down'} tiles of {mosaic.vrt}: expected "
            "one orientation per collection"
        )
    for h in headers:
        if not (math.isclose(h.transform.a, res) and math.isclose(abs(h.transform.e), res)):
            raise AreasError(
                f"{h.path}: pixel size {h.transform.a} x {abs(h.transform.e)}, expected "
                f"{res} x {res} like {first.path} (one resolution per mosaic of {mosaic.vrt})"
            )
    bounds = np.array([h.bounds for h in headers])
    ox, oy = first.transform.c, first.transform.f

    def snap(v: float, origin: float, up: bool) -> float:
        return origin + (math.floor if up else math.ceil)(round((v - origin) / res, 6)) * res

    x0 = snap(bounds[:, 0].min(), ox, True)
    x1 = snap(bounds[:, 2].max(), ox, False)
    south = snap(bounds[:, 1].min(), oy, True)
    north = snap(bounds[:, 3].max(), oy, False)
    width, height = round((x1 - x0) / res), round((north - south) / res)
    up = first.bottom_up
    return Grid(x0, south if up else north, res, width, height, up)


def _gt(t: Affine) -> str:
    return ", ".join(repr(float(v)) for v in t.to_gdal())


def _srs(crs) -> str:
    return escape(CRS.from_user_input(crs).to_wkt())


def _source_name(tile_path: Path, vrt: Path) -> tuple[str, int]:
    if tile_path.is_absolute():
        return str(tile_path), 0
    return os.path.relpath(tile_path, vrt.parent), 1


def mosaic_xml(mosaic: Mosaic, grid: Grid, vrt: Path) -> str:
    """Every tile as a SimpleSource (ComplexSource with the tiles' nodata where they have one)
    at its place in ``grid``; sources keep their properties so GDAL opens them only when read."""
    first = mosaic.tiles[0].header
    dtype = GDAL_TYPES[first.dtype]
    placed = []
    for tile in mosaic.tiles:
        h = tile.header
        hx0, hs, _, hn = h.bounds
        xoff = (hx0 - grid.x0) / grid.res
        yoff = (hs - grid.y0) / grid.res if grid.up else (grid.y0 - hn) / grid.res
        name, rel = _source_name(tile.path, vrt)
        placed.append(
            (
                f'<SourceFilename relativeToVRT="{rel}">{escape(name)}</SourceFilename>',
                f'<SourceProperties RasterXSize="{h.width}" RasterYSize="{h.height}" '
                f'DataType="{GDAL_TYPES[h.dtype]}" BlockXSize="{h.block[0]}" '
                f'BlockYSize="{h.block[1]}"/>'
                f'<SrcRect xOff="0" yOff="0" xSize="{h.width}" ySize="{h.height}"/>'
                f'<DstRect xOff="{xoff:.10g}" yOff="{yoff:.10g}" xSize="{h.width}" '
                f'ySize="{h.height}"/>',
                h.nodata,
            )
        )
    bands = []
    for band in range(1, first.count + 1):
        parts = [f'<VRTRasterBand dataType="{dtype}" band="{band}">']
        if first.nodata is not None:
            parts.append(f"<NoDataValue>{_num(first.nodata)}</NoDataValue>")
        for filename, rest, nodata in placed:
            kind = "ComplexSource" if nodata is not None else "SimpleSource"
            extra = f"<NODATA>{_num(nodata)}</NODATA>" if nodata is not None else ""
            parts.append(f"<{kind}>{filename}<SourceBand>{band}</SourceBand>{rest}{extra}</{kind}>")
        parts.append("</VRTRasterBand>")
        bands.append("".join(parts))
    return (
        f'<VRTDataset rasterXSize="{grid.width}" rasterYSize="{grid.height}">\n'
        f"  <SRS>{_srs(first.crs)}</SRS>\n  <GeoTransform>{_gt(grid.transform)}</GeoTransform>\n"
        + "\n".join(bands)
        + "\n</VRTDataset>\n"
    )


def _num(v: float) -> str:
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else repr(float(v))


def snap_outward(
    bounds: tuple[float, float, float, float], ox: float, oy: float, res: float
) -> tuple[float, float, float, float]:
    """(west, south, east, north) widened onto the pixel lattice through (``ox``, ``oy``)."""
    w, s, e, n = bounds
    return (
        ox + math.floor(round((w - ox) / res, 6)) * res,
        oy + math.floor(round((s - oy) / res, 6)) * res,
        ox + math.ceil(round((e - ox) / res, 6)) * res,
        oy + math.ceil(round((n - oy) / res, 6)) * res,
    )


def part_grid(mosaic: Mosaic, grid: Grid) -> Grid:
    """North-up grid on the mosaic's pixels, cropped to the part's bounds."""
    gx0, gs, gx1, gn = grid.bounds
    res = grid.res
    x0, south, x1, north = snap_outward(mosaic.cutline.bounds, gx0, gs, res)
    x0, south, x1, north = max(gx0, x0), max(gs, south), min(gx1, x1), min(gn, north)
    if x1 <= x0 or north <= south:
        raise AreasError(f"{mosaic.vrt}: the area's part lies outside its tiles {grid.bounds}")
    return Grid(x0, north, res, round((x1 - x0) / res), round((north - south) / res), False)


def warped_xml(mosaic: Mosaic, grid: Grid, source_name: str) -> str:
    """A VRTWarpedDataset: the mosaic flipped north up (where bottom-up), cropped to the part
    and masked by its cutline (given in the mosaic's pixel coordinates, as GDAL wants it)."""
    first = mosaic.tiles[0].header
    dtype = GDAL_TYPES[first.dtype]
    dst = part_grid(mosaic, grid)
    src_t, dst_t = grid.transform, dst.transform
    sign = 1.0 if grid.up else -1.0

    def to_pixels(xy: np.ndarray) -> np.ndarray:
        return np.column_stack(
            [(xy[:, 0] - grid.x0) / grid.res, sign * (xy[:, 1] - grid.y0) / grid.res]
        )

    cut = shapely.transform(mosaic.cutline, to_pixels)
    nodata = NODATA.get(mosaic.source, first.nodata if first.nodata is not None else 0)
    band_defs = "".join(
        f'<VRTRasterBand dataType="{dtype}" band="{b}" subClass="VRTWarpedRasterBand">'
        f"<NoDataValue>{_num(nodata)}</NoDataValue></VRTRasterBand>\n"
        for b in range(1, first.count + 1)
    )
    mapping = "".join(
        f'<BandMapping src="{b}" dst="{b}"><DstNoDataReal>{_num(nodata)}</DstNoDataReal>'
        "<DstNoDataImag>0</DstNoDataImag></BandMapping>"
        for b in range(1, first.count + 1)
    )
    return (
        f'<VRTDataset rasterXSize="{dst.width}" rasterYSize="{dst.height}" '
        f'subClass="VRTWarpedDataset">\n'
        f"  <SRS>{_srs(first.crs)}</SRS>\n  <GeoTransform>{_gt(dst_t)}</GeoTransform>\n"
        f"{band_defs}  <BlockXSize>256</BlockXSize>\n  <BlockYSize>256</BlockYSize>\n"
        "  <GDALWarpOptions>\n    <WarpMemoryLimit>67108864</WarpMemoryLimit>\n"
        f"    <ResampleAlg>NearestNeighbour</ResampleAlg>\n"
        f"    <WorkingDataType>{dtype}</WorkingDataType>\n"
        '    <Option name="INIT_DEST">NO_DATA</Option>\n'
        f'    <SourceDataset relativeToVRT="1">{escape(source_name)}</SourceDataset>\n'
        "    <Transformer><GenImgProjTransformer>"
        f"<SrcGeoTransform>{_gt(src_t)}</SrcGeoTransform>"
        f"<SrcInvGeoTransform>{_gt(~src_t)}</SrcInvGeoTransform>"
        f"<DstGeoTransform>{_gt(dst_t)}</DstGeoTransform>"
        f"<DstInvGeoTransform>{_gt(~dst_t)}</DstInvGeoTransform>"
        "</GenImgProjTransformer></Transformer>\n"
        f"    <BandList>{mapping}</BandList>\n"
        f"    <Cutline>{escape(shapely.to_wkt(cut, rounding_precision=4))}</Cutline>\n"
        "  </GDALWarpOptions>\n</VRTDataset>\n"
    )
