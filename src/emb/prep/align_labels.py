"""Stage: CDL codes -> L3 ids on an embedding raster's grid (nearest resampling, windowed).

Output ``results/labels/{source}/{region}.tif``: (H, W) uint8, 255 = ignore, a GeoTIFF
georeferenced exactly like the embedding raster (GeoTIFF or VRT mosaic, either orientation). A
sidecar JSON counts the pixels sent to ignore (embedding nodata, all-zero vectors included), per
reason and per unmapped CDL code.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import rasterio
from rasterio.enums import Resampling
from rasterio.warp import reproject, transform_bounds
from rasterio.windows import Window

from emb import stage_runner
from emb.classes import IGNORE, ClassMap, load_class_map
from emb.io import atomic_path, reading, write_json
from emb.progress import Progress
from emb.rasters import BANDS, check_value_range, embedding_nodata, nodata_mask

SOURCE_OF_BANDS = {bands: source for source, bands in BANDS.items()}

log = logging.getLogger(__name__)
GDAL_CACHE_MB = 64  # blocks are read once: GDAL's default cache (5% of RAM) only inflates memory


def _windows(height: int, width: int, block: int):
    for row in range(0, height, block):
        for col in range(0, width, block):
            yield Window(col, row, min(block, width - col), min(block, height - row))


class AlignmentError(ValueError):
    """A CDL raster that cannot give labels for an embedding raster."""


def check_overlap(emb: rasterio.DatasetReader, cdl: rasterio.DatasetReader) -> None:
    """Raise unless the CDL's footprint, taken into the embedding CRS, meets the raster's."""
    try:
        left, bottom, right, top = transform_bounds(cdl.crs, emb.crs, *cdl.bounds)
    except Exception as err:  # noqa: BLE001 - PROJ fails in many ways on far-apart CRSs
        raise AlignmentError(f"{cdl.name} cannot be transformed to {emb.crs}: {err}") from err
    e = emb.bounds
    if left >= e.right or right <= e.left or bottom >= e.top or top <= e.bottom:
        raise AlignmentError(
            f"{cdl.name} ({cdl.crs}) does not overlap {emb.name}: expected its bounds in "
            f"{emb.crs} to meet {tuple(round(v, 3) for v in e)}, found "
            f"{tuple(round(v, 3) for v in (left, bottom, right, top))}"
        )


def label_profile(emb: rasterio.DatasetReader) -> dict:
    """A GeoTIFF on exactly the embedding's grid, whatever the embedding's driver: a VRT
    mosaic's own profile names the VRT driver, which cannot be written with compression."""
    profile = {
        "driver": "GTiff",
        "width": emb.width,
        "height": emb.height,
        "count": 1,
        "dtype": "uint8",
        "nodata": IGNORE,
        "crs": emb.crs,
        "transform": emb.transform,
        "compress": "deflate",
    }
    if emb.height >= 16 and emb.width >= 16:
        profile.update(tiled=True, blockxsize=256, blockysize=256)
    return profile


def align_labels(
    emb_path: Path, cdl_path: Path, cmap: ClassMap, out_path: Path, block: int = 512
) -> dict:
    """Write the L3 label raster; peak memory is bounded by ``block`` (pixels per side)."""
    counts: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    with (
        rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_MB << 20),
        rasterio.open(emb_path) as emb,
        rasterio.open(cdl_path) as cdl,
    ):
        check_overlap(emb, cdl)
        profile = label_profile(emb)
        cdl_band = rasterio.band(cdl, 1)
        nodata = embedding_nodata(emb.dtypes[0], emb.nodata)
        source = SOURCE_OF_BANDS.get(emb.count)
        rows, cols = -(-emb.height // block), -(-emb.width // block)
        progress = Progress(rows * cols, "blocks", f"{out_path.name} labels", log)
        with atomic_path(out_path) as tmp, rasterio.open(tmp, "w", **profile) as dst:
            for win in _windows(emb.height, emb.width, block):
                # the CDL's own dtype: uint16 codes above 255 stay themselves (and unmapped)
                codes_win = np.zeros((win.height, win.width), cdl.dtypes[0])
                with reading(cdl_path):
                    reproject(
                        source=cdl_band,
                        destination=codes_win,
                        dst_transform=emb.window_transform(win),
                        dst_crs=emb.crs,
                        dst_nodata=0,
                        resampling=Resampling.nearest,
                    )
                l3 = cmap.l3_of(codes_win)
                with reading(emb_path):
                    block = emb.read(window=win)
                missing = nodata_mask(block, nodata)
                if source:  # a broken file is named here, before shards and statistics
                    check_value_range(
                        source,
                        block,
                        ~missing,
                        f"{emb_path}: block at row {win.row_off}, column {win.col_off}",
                    )
                unmapped = (l3 == IGNORE) & ~missing
                counts["emb_nodata"] += int(missing.sum())
                counts["cdl_background"] += int((unmapped & (codes_win == 0)).sum())
                counts["cdl_unmapped"] += int((unmapped & (codes_win != 0)).sum())
                values, n = np.unique(codes_win[unmapped & (codes_win != 0)], return_counts=True)
                codes.update(dict(zip(values.tolist(), n.tolist(), strict=True)))
                l3[missing] = IGNORE
                counts["labelled"] += int((l3 != IGNORE).sum())
                dst.write(l3, 1, window=win)
                progress.advance()
            if counts["labelled"] == 0:  # before the file is published
                raise AlignmentError(
                    f"{cdl_path} gives no labelled pixel on {emb_path}: expected CDL codes of "
                    f"the class table over the embedding's valid pixels, found {dict(counts)} "
                    f"(unmapped codes: {dict(codes.most_common(5))})"
                )
        counts["pixels"] = emb.height * emb.width
    progress.done()
    return {"counts": dict(counts), "unmapped_codes": {str(k): v for k, v in sorted(codes.items())}}


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emb", type=Path, required=True, help="embedding raster")
    parser.add_argument("--cdl", type=Path, required=True, help="CDL raster")
    parser.add_argument("--classes", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="label GeoTIFF")
    parser.add_argument("--report", type=Path, required=True, help="sidecar JSON")
    parser.add_argument("--block", type=int, default=512)
    args = parser.parse_args(argv)
    cmap = load_class_map(args.classes)
    report = align_labels(args.emb, args.cdl, cmap, args.out, args.block)
    report.update(emb=str(args.emb), cdl=str(args.cdl))
    write_json(args.report, report)
    log.info("%s: %s", args.out, json.dumps(report["counts"]))


if __name__ == "__main__":
    main()
