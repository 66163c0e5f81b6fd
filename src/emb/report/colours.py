"""Official USDA NASS CDL colours, and the colour of each L3 class (its dominant code's).

Maps are coloured like the CDL itself, so a predicted map and the CDL it was trained on can be
compared at a glance in QGIS. An L3 class that groups several codes takes the colour of its
dominant code: the one with the largest US area (``DOMINANT_CODE``), else its lowest code.
Several official colours are shared (e.g. the three forests), so some L3 classes share one.
"""

from __future__ import annotations

import numpy as np

from emb.classes import N_L3, ClassMap

# CDL code -> official colour (the CDL's own colour table, as published by USDA NASS).
CDL_COLOURS: dict[int, str] = {
    1: "#ffd400", 2: "#ff2626", 3: "#00a9e6", 4: "#ff9e0f", 5: "#267300", 6: "#ffff00",
    10: "#70a800", 11: "#00af4d", 12: "#e0a60f", 13: "#e0a60f", 14: "#80d4ff",
    21: "#e2007f", 22: "#8a6453", 23: "#d9b56c", 24: "#a87000", 25: "#d69dbc",
    26: "#737300", 27: "#ae017e", 28: "#a15889", 29: "#73004c", 30: "#d69dbc",
    31: "#d1ff00", 32: "#8099ff", 33: "#d6d600", 34: "#d1ff00", 35: "#00af4d",
    36: "#ffa8e3", 37: "#a5f58d", 38: "#00af4d", 39: "#d69dbc", 41: "#a900e6",
    42: "#a80000", 43: "#732600", 44: "#00af4d", 45: "#b380ff", 46: "#732600",
    47: "#ff6666", 48: "#ff6666", 49: "#ffcc66", 50: "#ff6666", 51: "#00af4d",
    52: "#00deb0", 53: "#55ff00", 54: "#f5a27a", 55: "#ff6666", 56: "#00af4d",
    57: "#80d4ff", 58: "#e8beff", 59: "#b2ffde", 60: "#00af4d", 61: "#bfbf7a",
    63: "#95ce93", 64: "#c7d79e", 65: "#ccbfa3", 66: "#ff00ff", 67: "#ff91ab",
    68: "#b90050", 69: "#704489", 70: "#007878", 71: "#b39c70", 72: "#ffff80",
    74: "#b6705c", 75: "#00a884", 76: "#ebd6b0", 77: "#b39c70", 81: "#f7f7f7",
    82: "#9c9c9c", 83: "#4d70a3", 87: "#80b3b3", 88: "#e9ffbe", 92: "#00ffff",
    111: "#4d70a3", 112: "#d4e3fc", 121: "#9c9c9c", 122: "#9c9c9c", 123: "#9c9c9c",
    124: "#9c9c9c", 131: "#ccbfa3", 141: "#95ce93", 142: "#95ce93", 143: "#95ce93",
    152: "#c7d79e", 176: "#e9ffbe", 190: "#80b3b3", 195: "#80b3b3", 204: "#00ff8c",
    205: "#d69dbc", 206: "#ff6666", 207: "#ff6666", 208: "#ff6666", 209: "#ff6666",
    210: "#ff91ab", 211: "#344a34", 212: "#e67525", 213: "#ff6666", 214: "#ff6666",
    215: "#66994d", 216: "#ff6666", 217: "#b39c70", 218: "#ff91ab", 219: "#ff6666",
    220: "#ff91ab", 221: "#ff6666", 222: "#ff6666", 223: "#ff91ab", 224: "#00af4d",
    225: "#ffd400", 226: "#ffd400", 227: "#ff6666", 228: "#ffd400", 229: "#ff6666",
    230: "#8a6453", 231: "#ff6666", 232: "#ff2626", 233: "#e2007f", 234: "#ff9e0f",
    235: "#ff9e0f", 236: "#a87000", 237: "#ffd400", 238: "#a87000", 239: "#267300",
    240: "#267300", 241: "#ffd400", 242: "#000099", 243: "#ff6666", 244: "#ff6666",
    245: "#ff6666", 246: "#ff6666", 247: "#ff6666", 248: "#ff6666", 249: "#ff6666",
    250: "#ff6666", 254: "#267300",
}  # fmt: skip

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

FALLBACK = "#808080"  # a code without an official colour (none in classes.csv)


def dominant_codes(cmap: ClassMap) -> list[int]:
    """The dominant CDL code of every L3 class, indexed by L3 id."""
    codes = []
    for l3, name in enumerate(cmap.l3_names):
        members = np.flatnonzero(cmap.cdl_to_l3 == l3).tolist()
        preferred = DOMINANT_CODE.get(name)
        codes.append(preferred if preferred in members else min(members))
    return codes


def hex_to_rgb(colour: str) -> tuple[int, int, int]:
    value = colour.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16)


def l3_colours(cmap: ClassMap) -> np.ndarray:
    """(61, 3) uint8 RGB, the official colour of each L3 class's dominant code."""
    rgb = [hex_to_rgb(CDL_COLOURS.get(code, FALLBACK)) for code in dominant_codes(cmap)]
    return np.asarray(rgb, np.uint8).reshape(N_L3, 3)
