"""Stage: TESSERA in geotessera's native form (int8 ``.npy`` + scales + landmask) -> the
float32 128-band GeoTIFF every later stage reads.

geotessera (0.11) lays a tile out as ``{base}/global_0.1_degree_representation/{year}/{g}/{g}.npy``
and ``{g}_scales.npy`` beside it, ``{base}/global_0.1_degree_tiff_all/{g}.tiff`` (the landmask,
which carries CRS and transform) and ``{base}/tessera_metadata.json`` (dataset version), with
``g = grid_{lon}_{lat}``; its published repository uses ``{root}/npy/{version}/{year}/{g}/`` and
``{root}/landmasks/{version}/``. Embedding (H, W, 128) int8; scales float32 (H, W) per pixel or
(H, W, 128) per channel; value ``q * scale`` (``geotessera.dequantize_embedding``). Nodata as
geotessera's zarr build: landmask 0 (water), a scale not finite, not positive or >= 1e6 (a
published sentinel); and the all-zero vector (issue 24). They become NaN, TESSERA's nodata in
emb. geotessera is not imported: its dequantization is one multiplication, and it pulls in
geopandas, matplotlib, scikit-learn, zarr and dask and needs Python >= 3.12.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from rasterio.coords import BoundingBox
from rasterio.crs import CRS
from rasterio.errors import RasterioIOError
from rasterio.windows import Window

from emb import stage_runner
from emb.io import atomic_path, reading
from emb.progress import Progress
from emb.rasters import BANDS

log = logging.getLogger(__name__)

EMBEDDINGS_DIR = "global_0.1_degree_representation"  # geotessera's EMBEDDINGS_DIR_NAME
LANDMASKS_DIR = "global_0.1_degree_tiff_all"  # geotessera's LANDMASKS_DIR_NAME
METADATA_FILE = "tessera_metadata.json"  # geotessera's TESSERA_METADATA_FILENAME
MAX_VALID_SCALE = 1.0e6  # geotessera's MAX_VALID_SCALE: above it a scale is a sentinel
CHANNELS = BANDS["tessera"]
BLOCK = 256  # pixels per side of a conversion window (= the output's tile size)
_YEAR = re.compile(r"\d{4}")
_GRID = re.compile(r"grid_(-?\d+\.\d+)_(-?\d+\.\d+)")
_DATASET_DIR = re.compile(r"v(\d+)(?:\.(\d+))?(?:-(.+))?")  # v1, v1.1-cam, v2-2B-L~beta1


class TesseraNpyError(ValueError):
    """A geotessera ``.npy`` tile that cannot be read as a TESSERA embedding raster."""


@dataclass(frozen=True)
class TesseraTriple:
    """The three files of one tile, and what its path and sidecar say about it."""

    embedding: Path
    scales: Path
    landmask: Path
    year: int | None = None  # from the ``{year}`` folder
    tags: dict[str, str] = field(default_factory=dict)  # GeoTIFF tags geotessera's export writes


@dataclass(frozen=True)
class TesseraFacts:
    """What :func:`check_triple` learned from the headers (no array is read)."""

    height: int
    width: int
    per_channel: bool  # scales (H, W, 128) rather than (H, W)
    crs: CRS
    transform: Affine
    bounds: BoundingBox


def _missing(path: Path, what: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, what, str(path))


def find_triple(npy_path: Path | str) -> TesseraTriple:
    """The embedding, its scales and its landmask, where geotessera puts them.

    Landmask candidates, first found wins: the download layout's
    ``{base}/global_0.1_degree_tiff_all/``, the published layout's
    ``{root}/landmasks/{version}/``, then ``grid_*.tif(f)`` beside the ``.npy``.
    """
    npy = Path(npy_path)
    if npy.name.endswith("_scales.npy"):
        raise TesseraNpyError(
            f"{npy}: is a scales file; expected the embedding .npy beside it "
            f"({npy.name.removesuffix('_scales.npy')}.npy)"
        )
    if npy.suffix != ".npy":
        raise TesseraNpyError(f"{npy}: expected a geotessera embedding .npy, found {npy.suffix!r}")
    if not npy.is_file():
        raise _missing(npy, "TESSERA embedding .npy not found")
    scales = npy.with_name(f"{npy.stem}_scales.npy")
    if not scales.is_file():
        raise _missing(scales, f"scales file of {npy.name} not found (geotessera writes both)")
    candidates = _landmask_candidates(npy)
    landmask = next((c for c in candidates if c.is_file()), None)
    if landmask is None:
        raise _missing(
            candidates[0],
            f"landmask of {npy.name} not found (it carries the grid); also looked for "
            + ", ".join(str(c) for c in candidates[1:]),
        )
    year_dir = npy.parent.parent.name
    year = int(year_dir) if _YEAR.fullmatch(year_dir) else None
    return TesseraTriple(npy, scales, landmask, year, _dataset_tags(npy, year))


def _landmask_candidates(npy: Path) -> list[Path]:
    name, root = f"{npy.stem}.tiff", npy.parents[2] if len(npy.parents) > 2 else None
    found = []
    if root is not None and root.name == EMBEDDINGS_DIR:
        found.append(root.parent / LANDMASKS_DIR / name)
    if root is not None and root.parent.name == "npy":
        found.append(root.parent.parent / "landmasks" / root.name / name)
    found += [npy.with_name(name), npy.with_name(f"{npy.stem}.tif")]
    return found


def _dataset_tags(npy: Path, year: int | None) -> dict[str, str]:
    """Tags as geotessera's GeoTIFF export writes them, from what the layout tells."""
    tags = {"TESSERA_SOURCE_FILE": npy.name}
    if year is not None:
        tags["TESSERA_YEAR"] = str(year)
    grid = _GRID.fullmatch(npy.stem)
    if grid:
        tags.update(TESSERA_TILE_LON=grid.group(1), TESSERA_TILE_LAT=grid.group(2))
    root = npy.parents[2] if len(npy.parents) > 2 else npy.parent
    sidecar = root.parent / METADATA_FILE
    if root.name == EMBEDDINGS_DIR and sidecar.is_file():
        try:
            meta = dict(json.loads(sidecar.read_text(encoding="utf-8")))
        except (ValueError, TypeError) as err:  # UnicodeDecodeError is a ValueError
            raise TesseraNpyError(f"{sidecar}: expected geotessera's JSON, found {err}") from None
        keys = {
            "TESSERA_DATASET_VERSION": "dataset_version",
            "TESSERA_DATASET_VERSION_PATH": "dataset_version_path",
            "TESSERA_DATASET_VARIANT": "dataset_variant",
        }
        return tags | {tag: str(meta[key]) for tag, key in keys.items() if meta.get(key)}
    version_dir = root.parent.name if root.name == EMBEDDINGS_DIR else root.name
    match = _DATASET_DIR.fullmatch(version_dir)
    if match:
        major, minor = match.group(1), match.group(2) or "0"
        tags["TESSERA_DATASET_VERSION"] = f"{major}.{minor}"
        tags["TESSERA_DATASET_VERSION_PATH"] = f"v{major}" if minor == "0" else f"v{major}.{minor}"
    return tags


def _load_header(path: Path) -> np.ndarray:
    """The array memory-mapped: its header is read, its data is not."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        detail = " ".join(str(err).split())
        raise TesseraNpyError(
            f"{path}: expected a .npy array, found a file numpy cannot map ({detail}); "
            "truncated download? fetch the tile again"
        ) from None


def check_triple(triple: TesseraTriple) -> TesseraFacts:
    """Raise :class:`TesseraNpyError` naming the file, expected and found, for the first
    mismatch: the embedding (H, W, 128) int8, the scales float32 (H, W) or (H, W, 128), the
    landmask H x W in a projected CRS."""
    emb = _load_header(triple.embedding)
    if emb.ndim != 3 or emb.shape[2] != CHANNELS:
        raise TesseraNpyError(
            f"{triple.embedding}: expected shape (H, W, {CHANNELS}), found {emb.shape}"
        )
    if emb.dtype != np.int8:
        raise TesseraNpyError(f"{triple.embedding}: expected dtype int8, found {emb.dtype}")
    height, width = emb.shape[:2]
    scales = _load_header(triple.scales)
    if scales.shape not in ((height, width), (height, width, CHANNELS)):
        raise TesseraNpyError(
            f"{triple.scales}: expected shape ({height}, {width}) or ({height}, {width}, "
            f"{CHANNELS}) to match {triple.embedding.name}, found {scales.shape}"
        )
    if scales.dtype != np.float32:
        raise TesseraNpyError(f"{triple.scales}: expected dtype float32, found {scales.dtype}")
    try:
        with rasterio.open(triple.landmask) as mask:
            crs, transform, bounds = mask.crs, mask.transform, mask.bounds
            shape = (mask.height, mask.width)
    except RasterioIOError as err:
        raise TesseraNpyError(f"{triple.landmask}: cannot read it as a GeoTIFF ({err})") from None
    if shape != (height, width):
        raise TesseraNpyError(
            f"{triple.landmask}: expected {height} x {width} pixels like "
            f"{triple.embedding.name}, found {shape[0]} x {shape[1]}"
        )
    if crs is None:
        raise TesseraNpyError(f"{triple.landmask}: expected a projected CRS, found none")
    if not crs.is_projected:
        raise TesseraNpyError(
            f"{triple.landmask}: expected a projected CRS (geotessera's landmasks are in the "
            f"tile's UTM zone), found {crs.to_string()}: the embedding's grid is unknown"
        )
    return TesseraFacts(height, width, scales.ndim == 3, crs, transform, bounds)


def nodata_reasons(
    emb: np.ndarray, scales: np.ndarray, land: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(h, w, 128) int8, (h, w[, 128]) float32, (h, w) landmask -> the (128, h, w) float32
    block, NaN where a pixel is nodata, and the (h, w) mask of each reason (disjoint: water
    first, then a bad scale on land, then an all-zero vector)."""
    with np.errstate(invalid="ignore", over="ignore"):  # sentinel scales: masked below
        x = emb.astype(np.float32) * (scales if scales.ndim == 3 else scales[..., None])
        ok = np.isfinite(scales) & (scales >= 0) & (scales < MAX_VALID_SCALE)
        if scales.ndim == 3:  # every channel's scale usable, one at least positive
            ok = ok.all(axis=2) & (scales > 0).any(axis=2)
        else:
            ok &= scales > 0
    water = land == 0
    bad_scale = ~ok & ~water
    zero_vector = ~(x != 0).any(axis=2) & ok & ~water
    block = np.ascontiguousarray(x.transpose(2, 0, 1))
    block[:, water | bad_scale | zero_vector] = np.nan
    return block, {"water": water, "bad_scale": bad_scale, "zero_vector": zero_vector}


def convert(triple: TesseraTriple, out_tif: Path | str, block: int = BLOCK) -> dict:
    """Write the dequantized float32 GeoTIFF on the landmask's grid, ``block`` x ``block``
    windows at a time (peak memory ~ 1.5 KB per window pixel, whatever the tile's size).
    Returns pixel counts; refuses, before publishing, a tile with no valid pixel."""
    facts = check_triple(triple)
    emb, scales = _load_header(triple.embedding), _load_header(triple.scales)
    profile = {
        "driver": "GTiff", "count": CHANNELS, "dtype": "float32", "nodata": float("nan"),
        "height": facts.height, "width": facts.width, "crs": facts.crs,
        "transform": facts.transform, "compress": "deflate", "predictor": 3,
        "BIGTIFF": "IF_SAFER",
    }  # fmt: skip
    if facts.height >= 16 and facts.width >= 16:
        profile.update(tiled=True, blockxsize=BLOCK, blockysize=BLOCK)
    windows = [
        Window(c, r, min(block, facts.width - c), min(block, facts.height - r))
        for r in range(0, facts.height, block)
        for c in range(0, facts.width, block)
    ]
    counts: Counter[str] = Counter(pixels=facts.height * facts.width)
    progress = Progress(len(windows), "windows", f"{Path(out_tif).name} from .npy", log)
    with (
        rasterio.open(triple.landmask) as mask,
        atomic_path(out_tif) as tmp,
        rasterio.open(tmp, "w", **profile) as dst,
    ):
        for win in windows:
            rows = slice(win.row_off, win.row_off + win.height)
            cols = slice(win.col_off, win.col_off + win.width)
            with reading(triple.landmask):
                land = mask.read(1, window=win)
            data, reasons = nodata_reasons(np.asarray(emb[rows, cols]), scales[rows, cols], land)
            for reason, where in reasons.items():
                counts[reason] += int(where.sum())
            counts["valid"] += int(np.isfinite(data[0]).sum())
            dst.write(data, window=win)
            progress.advance()
        dst.update_tags(**triple.tags)
        dst.descriptions = tuple(f"Tessera_Band_{i}" for i in range(CHANNELS))
        if counts["valid"] == 0:
            raise TesseraNpyError(
                f"{triple.embedding}: no valid pixel: expected land pixels with a finite "
                f"positive scale and a non-zero vector, found {dict(counts)}"
            )
    progress.done()
    return dict(counts)


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npy", type=Path, required=True, help="geotessera embedding .npy")
    parser.add_argument("--out", type=Path, required=True, help="float32 GeoTIFF to write")
    parser.add_argument("--year", type=int, help="the table's year: refused if the path differs")
    args = parser.parse_args(argv)
    triple = find_triple(args.npy)
    if args.year is not None and triple.year is not None and args.year != triple.year:
        raise TesseraNpyError(
            f"{args.npy}: lies in geotessera's {triple.year} folder, expected year {args.year} "
            "(the regions table's): list the tile of that year"
        )
    counts = convert(triple, args.out)
    log.info("%s: %s (from %s)", args.out, json.dumps(counts), args.npy)


if __name__ == "__main__":
    main()
