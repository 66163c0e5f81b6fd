"""The files a prediction writes: the L3 map and probability COGs, and the PNG quicklook.

The map is a Cloud-Optimized GeoTIFF with the input's CRS, transform and shape, uint8 L3 ids,
255 = nodata (wherever the input embedding is nodata, transparent), a colour table of the CDL's
colours, class names in the metadata, in GDAL's category names (``.tif.aux.xml``) and in a QGIS
style beside it (``.qml``, loaded by QGIS with the map, so its legend names the classes). The
optional probabilities are a second COG, one uint8 band per class (round(p * 254), 255 =
nodata); the quicklook is a north-up PNG with a legend.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import numpy as np
import rasterio
from rasterio.enums import Resampling
from rasterio.shutil import copy as copy_raster

from emb import plots
from emb.classes import IGNORE, ClassMap
from emb.io import atomic_path

NODATA = IGNORE  # 255 in the map
PROB_SCALE = 254  # probabilities stored as round(p * 254) in uint8; 255 = nodata
QUICKLOOK_MAX = 1024  # pixels on the quicklook's longer side


def tmp_sibling(path: Path, tag: str) -> Path:
    """A hidden temporary file next to ``path``, unique to this process."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}.tif")


def to_cog(tmp: Path, out: Path, resampling: str) -> None:
    """Copy the tiled GeoTIFF ``tmp`` into a COG at ``out`` (atomically), then drop ``tmp``."""
    try:
        with atomic_path(out) as final:
            copy_raster(
                tmp, final, driver="COG", compress="DEFLATE", overview_resampling=resampling,
                blocksize=512,
            )  # fmt: skip
    finally:
        tmp.unlink(missing_ok=True)


def map_profile(src: rasterio.DatasetReader, count: int) -> dict:
    """The input's georeferencing (copied, never rebuilt) for a uint8 output of ``count`` bands."""
    return {
        "driver": "GTiff",
        "width": src.width,
        "height": src.height,
        "count": count,
        "dtype": "uint8",
        "crs": src.crs,
        "transform": src.transform,
        "nodata": NODATA,
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
    }


def map_tags(names: list[str], tags: dict[str, str] | None = None) -> dict[str, str]:
    """The dataset tags of both files: the class names (JSON) and ``tags``."""
    return {"CLASS_NAMES": json.dumps(names), **(tags or {})}


def describe_map(
    dst: rasterio.DatasetWriter, cmap: ClassMap, tags: dict[str, str], colours: np.ndarray
) -> None:
    """The map's colour table, band description, dataset tags and per-class band tags."""
    dst.write_colormap(1, colour_table(colours))
    dst.set_band_description(1, "L3 class id (names: CLASS_NAMES)")
    dst.update_tags(**tags)
    dst.update_tags(1, **{f"class_{i}": name for i, name in enumerate(cmap.l3_names)})


def describe_probabilities(
    prob: rasterio.DatasetWriter, names: list[str], tags: dict[str, str]
) -> None:
    """One band per class named after it, the uint8 scale and the encoding in the tags."""
    for i, name in enumerate(names, start=1):
        prob.set_band_description(i, name)
    prob.scales = [1.0 / PROB_SCALE] * len(names)
    prob.update_tags(ENCODING=f"uint8 round(p * {PROB_SCALE}); 255 = nodata", **tags)


def colour_table(colours: np.ndarray) -> dict[int, tuple[int, int, int, int]]:
    """GDAL colour table: class colours, transparent nodata, the rest black."""
    table = {i: (0, 0, 0, 255) for i in range(256)}
    table.update({i: (int(r), int(g), int(b), 255) for i, (r, g, b) in enumerate(colours)})
    table[NODATA] = (0, 0, 0, 0)
    return table


def read_north_up(path: Path, max_side: int = QUICKLOOK_MAX) -> np.ndarray:
    """The map's ids, decimated to at most ``max_side`` pixels, row 0 = north (bottom-up
    rasters are flipped)."""
    with rasterio.open(path) as src:
        factor = max(1, math.ceil(max(src.height, src.width) / max_side))
        shape = (max(1, src.height // factor), max(1, src.width // factor))
        ids = src.read(1, out_shape=shape, resampling=Resampling.nearest)
        if src.transform.e > 0:
            ids = ids[::-1]
    return ids


def write_quicklook(
    map_path: Path, png: Path, cmap: ClassMap, title: str, colours: np.ndarray
) -> None:
    ids = read_north_up(map_path)
    plots.save(plots.map_figure(ids, colours, cmap.l3_names, title), png)


def legend_qml(names: list[str], colours: np.ndarray) -> str:
    """A QGIS style: paletted renderer, one entry per class with its name and colour. QGIS loads
    ``<map>.qml`` beside ``<map>.tif`` by itself, so the legend shows names, not ids."""
    entries = "\n".join(
        f'        <paletteEntry value="{i}" color="#{r:02x}{g:02x}{b:02x}" alpha="255" '
        f"label={quoteattr(name)}/>"
        for i, (name, (r, g, b)) in enumerate(zip(names, colours.tolist(), strict=True))
    )
    return f"""<!DOCTYPE qgis PUBLIC 'http://mrcc.com/qgis.dtd' 'SYSTEM'>
<qgis version="3.28.0" styleCategories="Symbology">
  <pipe>
    <rasterrenderer type="paletted" band="1" opacity="1" alphaBand="-1" nodataColor="">
      <rasterTransparency/>
      <colorPalette>
{entries}
      </colorPalette>
    </rasterrenderer>
  </pipe>
</qgis>
"""


def category_names_xml(names: list[str]) -> str:
    """GDAL's PAM side-car (``<map>.tif.aux.xml``) with the class names as band 1's category
    names: what ``gdalinfo`` lists under Categories and GDAL-based tools label classes with."""
    categories = "\n".join(f"      <Category>{escape(n)}</Category>" for n in names)
    return f"""<PAMDataset>
  <PAMRasterBand band="1">
    <CategoryNames>
{categories}
    </CategoryNames>
  </PAMRasterBand>
</PAMDataset>
"""


def write_legend(map_path: Path, qml: Path, names: list[str], colours: np.ndarray) -> None:
    """The QGIS style ``qml`` and GDAL's category names next to ``map_path``, atomically."""
    for path, text in ((qml, legend_qml(names, colours)),
                       (aux_path(map_path), category_names_xml(names))):  # fmt: skip
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")


def aux_path(map_path: Path) -> Path:
    return map_path.with_name(map_path.name + ".aux.xml")
