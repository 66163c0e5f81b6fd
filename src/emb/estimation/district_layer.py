"""The districts' estimates as a GIS layer (``results/area_estimates/{run}_districts.gpkg``):
one feature per district, its polygon in the districts file's CRS, and per class five wide
columns a GIS user can style a map by.

Columns, in order: ``district`` (the name), ``dist_id`` (1..D, the file's order, as in the
district ids of the maps), then per class, the class with the largest estimated area over all
districts first, ``{short}_map`` (the map's hectares), ``{short}_est`` (the estimate),
``{short}_lo`` and ``{short}_hi`` (its interval), ``{short}_n`` (reference units). ``short``
is at most 6 lower-case letters and digits (:func:`short_names`), so every column fits a
shapefile's 10 characters when a user exports the layer; the attribute table
``district_classes`` in the same file gives each ``short`` its class name. A figure a district
lacks (no map reaches it, a class it does not hold, an interval that cannot be given) is NULL,
not 0. The outside (pixels in no district) has no polygon: its numbers are in the CSV only.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyogrio.raw
import shapely

from emb.estimation.districts import OUTSIDE, Districts
from emb.io import atomic_path

LAYER = "districts"  # the feature layer
LAYER_NAME_FIELD = "district"  # its field naming each district
CLASSES_TABLE = "district_classes"  # short -> class name (an attribute table, no geometry)
SHORT_LEN = 6  # + the longest suffix "_map" = 10 characters, a shapefile field name's limit
STATS = {"map": "mapped_ha", "est": "estimated_ha", "lo": "lo_ha", "hi": "hi_ha",
         "n": "units_reference"}  # fmt: skip
ROW_COLUMNS = ("district", "class", *STATS.values())
DESCRIPTION = (
    "Crop areas per district, hectares. Per class (short name: table district_classes): "
    "_map the map's pixel count, _est the estimate, _lo/_hi its interval, _n reference units. "
    "NULL: no figure. Pixels in no district: the CSV's 'outside' rows."
)


class DistrictLayerError(ValueError):
    """Rows that do not make one figure per district and class of the districts file."""


def _words(name: str) -> list[str]:
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return [w for w in re.split(r"[^a-z0-9]+", ascii_name.lower()) if w]


def _short(name: str) -> str:
    """Up to ``SHORT_LEN`` letters: a word's start, or the starts of up to six words shared
    out evenly (``winter_wheat`` -> ``winwhe``), a leading digit behind a ``c``."""
    words = _words(name)[:SHORT_LEN] or ["c"]
    if words[0][0].isdigit():
        words[0] = "c" + words[0]
    out, left = "", SHORT_LEN
    for i, word in enumerate(words):
        take = word[: left // (len(words) - i)]
        out, left = out + take, left - len(take)
    return out


def short_names(classes: Sequence[str]) -> dict[str, str]:
    """class -> its short name, unique among ``classes`` (in their order): where two classes'
    names shorten alike the later one ends in a number (``othcr2``)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for name in classes:
        base = short = _short(name)
        k = 2
        while short in used:
            short = base[: SHORT_LEN - len(str(k))] + str(k)
            k += 1
        out[name] = short
        used.add(short)
    return out


def class_order(rows: pd.DataFrame) -> list[str]:
    """The classes, the one with the largest estimated area over all districts first (the
    headline a figure colours by), ties in their first row's order."""
    estimated = pd.to_numeric(rows["estimated_ha"], errors="coerce")
    totals = estimated.groupby(rows["class"], sort=False).sum(min_count=1).fillna(0.0)
    return list(totals.sort_values(ascending=False, kind="stable").index)


def layer_fields(classes: Sequence[str]) -> list[str]:
    """The layer's attribute columns for ``classes`` in that order."""
    shorts = short_names(classes)
    return [LAYER_NAME_FIELD, "dist_id", *(f"{shorts[c]}_{s}" for c in classes for s in STATS)]


def _checked(districts: Districts, rows: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in ROW_COLUMNS if c not in rows.columns]
    if missing:
        raise DistrictLayerError(
            f"district rows: expected columns {list(ROW_COLUMNS)}, found {list(rows.columns)} "
            f"(missing {missing})"
        )
    rows = rows[rows["district"].astype(str) != OUTSIDE]
    unknown = sorted(set(rows["district"].astype(str)) - set(districts.names))
    if unknown:
        raise DistrictLayerError(
            f"{districts.path}: field {districts.name_field!r}: rows name districts "
            f"{unknown[:5]} the file does not hold: expected names among "
            f"{list(districts.names)[:5]}"
        )
    twice = rows.duplicated(["district", "class"], keep=False)
    if twice.any():
        first = rows[twice].iloc[0]
        raise DistrictLayerError(
            f"district rows: district {first['district']!r} class {first['class']!r}: expected "
            "one row per district and class, found several (one method and level at a time)"
        )
    return rows


def _columns(districts: Districts, rows: pd.DataFrame, classes: list[str]) -> tuple[list, list]:
    """(field arrays, masks): float64 hectares and int64 units, masked where NULL."""
    index = pd.MultiIndex.from_product([districts.names, classes])
    keyed = rows.assign(district=rows["district"].astype(str)).set_index(["district", "class"])
    wide = keyed.reindex(index)
    data: list[np.ndarray] = [np.array(districts.names, object),
                              np.arange(1, len(districts.names) + 1, dtype=np.int64)]  # fmt: skip
    masks: list[np.ndarray | None] = [None, None]
    for cls in classes:
        part = wide.xs(cls, level=1)
        for stat, column in STATS.items():
            values = pd.to_numeric(part[column], errors="coerce").to_numpy(np.float64)
            null = ~np.isfinite(values)
            if stat == "n":
                data.append(np.where(null, 0, values).astype(np.int64))
            else:
                data.append(np.where(null, 0.0, values))
            masks.append(null)
    return data, masks


def write_district_layer(path: Path | str, districts: Districts, rows: pd.DataFrame) -> Path:
    """Write the layer (and its ``district_classes`` table) to the GeoPackage ``path``,
    whole or not at all. ``rows``: the area table's long form for one method and level with a
    ``district`` column (``district``, ``class``, ``mapped_ha``, ``estimated_ha``, ``lo_ha``,
    ``hi_ha``, ``units_reference``); ``outside`` rows are left to the CSV. Refused
    (:class:`DistrictLayerError`): missing columns, a district the file does not hold, two rows
    of one district and class."""
    rows = _checked(districts, rows)
    classes = class_order(rows)
    shorts = short_names(classes)
    data, masks = _columns(districts, rows, classes)
    multi = [g if g.geom_type == "MultiPolygon" else shapely.MultiPolygon([g])
             for g in districts.geometries]  # fmt: skip
    epsg = districts.crs.to_epsg()
    crs = f"EPSG:{epsg}" if epsg else districts.crs.to_wkt()
    with atomic_path(path) as tmp:
        named = tmp.with_name(tmp.name + ".gpkg")  # GDAL wants the extension on what it makes
        try:
            pyogrio.raw.write(
                str(named), shapely.to_wkb(multi), data, layer_fields(classes),
                field_mask=masks, layer=LAYER, driver="GPKG", geometry_type="MultiPolygon",
                crs=crs, layer_options={"DESCRIPTION": DESCRIPTION},
            )  # fmt: skip
            pyogrio.raw.write(
                str(named), None, [np.array(list(shorts.values()), object),
                                   np.array(list(shorts), object)],
                ["short", "class"], layer=CLASSES_TABLE, driver="GPKG", append=True,
            )  # fmt: skip
            os.replace(named, tmp)
        finally:
            named.unlink(missing_ok=True)
    return Path(path)
