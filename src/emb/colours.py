"""CDL colours, and the colour of each L3 class (its dominant code's).

Maps are coloured like the CDL itself, so a predicted map and the CDL it was trained on can be
compared at a glance in QGIS. The colours are the input CDL's own colour table when its file
holds one (:func:`cdl_palette`), else NASS's published table (``cdl_palette.tsv`` beside this
module, with its source; read, never typed here). An L3 class that groups several codes takes
the colour of its dominant code: the one with the largest US area (``DOMINANT_CODE``), else its
lowest code. Several official colours are shared (e.g. the three forests), so some L3 classes
share one.
"""

from __future__ import annotations

import csv
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import rasterio
from rasterio.errors import RasterioIOError

from emb.classes import N_L3, ClassMap

RGB = tuple[int, int, int]


@cache
def official_palette() -> dict[int, RGB]:
    """CDL code -> (r, g, b) of NASS's published colour table (``cdl_palette.tsv``)."""
    text = resources.files("emb").joinpath("cdl_palette.tsv").read_text(encoding="utf-8")
    rows = csv.DictReader((line for line in text.splitlines() if not line.startswith("#")),
                          delimiter="\t")  # fmt: skip
    return {int(r["code"]): (int(r["red"]), int(r["green"]), int(r["blue"])) for r in rows}


def cdl_palette(path: Path | str) -> dict[int, RGB] | None:
    """The colour table a CDL GeoTIFF holds (NASS ships one), or None when it holds none or only
    black; an unreadable file is the pre-job checks' business, so it counts as none here."""
    try:
        with rasterio.open(path) as src:
            table = src.colormap(1)
    except (ValueError, RasterioIOError):  # rasterio raises ValueError for "no colormap"
        return None
    palette = {code: (r, g, b) for code, (r, g, b, *_) in table.items()}
    return palette if any(rgb != (0, 0, 0) for rgb in palette.values()) else None


# L3 class name -> its dominant CDL code, where that is not the class's lowest code.
DOMINANT_CODE: dict[str, int] = {
    "other_small_grains": 25,
    "other_oilseeds": 33,
    "stone_fruits": 67,  # peaches
    "other_tree_crops": 71,
    "berries": 221,  # strawberries
    "melons_cucurbits": 48,  # watermelons
    "vegetables": 47,  # misc vegs & fruits: the CDL's generic vegetable colour
    "dbl_crop_other": 225,  # winter wheat / corn
    "open_water": 111,  # not aquaculture (92)
    "developed": 121,
}

FALLBACK: RGB = (128, 128, 128)  # a code without a colour in the table used


def dominant_codes(cmap: ClassMap) -> list[int]:
    """The dominant CDL code of every L3 class, indexed by L3 id."""
    codes = []
    for l3, name in enumerate(cmap.l3_names):
        members = np.flatnonzero(cmap.cdl_to_l3 == l3).tolist()
        preferred = DOMINANT_CODE.get(name)
        codes.append(preferred if preferred in members else min(members))
    return codes


def l3_colours(cmap: ClassMap, palette: dict[int, RGB] | None = None) -> np.ndarray:
    """(61, 3) uint8 RGB: each L3 class's dominant code's colour in ``palette`` (a CDL's own
    table), else in the official one."""
    official = official_palette()
    rgb = []
    for code in dominant_codes(cmap):
        own = (palette or {}).get(code)
        rgb.append(own if own is not None and own != (0, 0, 0) else official.get(code, FALLBACK))
    return np.asarray(rgb, np.uint8).reshape(N_L3, 3)
