"""The summary page's crop-area section: each run's area table read back and shown compactly.

The page shows one level (L2, the seven groups, by default: readable side by side) of every run's
test-split check: the map's pixel count, the estimate with its interval, the CDL's area of the same
pixels and how often the interval (and Wald's) covered it over the draws; a user's labelled sample
in a table of its own (each method said once); and a figure of the check. The CSVs
(``results/area_estimates/{run}.csv``) hold every level and class.

With districts, the check by district follows: one class per run, its headline (the largest
estimated class at L2 over all districts: one number per district reads as a map), in a table
(each district, the outside and their total: the estimate with its interval, the CDL's area,
the coverage) and a choropleth of the districts; every class per district: the CSV and the
run's ``{run}_districts.gpkg``.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from emb import plots
from emb.estimation.district_layer import LAYER, LAYER_NAME_FIELD
from emb.estimation.districts import OUTSIDE, read_districts
from emb.estimation.estimates_table import (
    ALL,
    CHECK,
    COLUMNS,
    DISTRICT_CHECK,
    DISTRICT_LEVEL,
    USER_SAMPLE,
)
from emb.estimation.settings import AreaSettings

AREAS_TITLE = "Crop areas (hectares, {level} intervals)"
PAGE_LEVEL = 2


class AreaTableError(ValueError):
    """An area table that cannot be read back: named, with what is wrong."""


def read_area_table(path: Path) -> pd.DataFrame:
    """A run's area CSV, refused in one line naming the file when it is cut or not one."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise AreaTableError(f"{path}: not an area table ({err})") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise AreaTableError(f"{path}: expected the columns {COLUMNS}, missing {missing}")
    frame["district"] = frame["district"].fillna("").astype(str)  # "" (read as NaN): the whole
    return frame


def _interval(value: object, lo: object, hi: object) -> str:
    if pd.isna(value):
        return ""
    if pd.isna(lo) or pd.isna(hi):
        return f"{value:.1f} (no interval)"
    return f"{value:.1f} [{lo:.1f}, {hi:.1f}]"


def page_rows(
    tables: dict[str, pd.DataFrame], level: int = PAGE_LEVEL, method: str = CHECK
) -> pd.DataFrame:
    """One row per run and class at ``level`` of one ``method`` (said once, in the section's
    heading), largest estimated first within a run; coverage of the interval that holds and of
    Wald's."""
    rows = []
    for run, frame in tables.items():
        whole = frame["district"].isna() | (frame["district"] == "")  # per district: below
        part = frame[(frame["level"] == level) & (frame["method"] == method) & whole]
        for r in part.sort_values("estimated_ha", ascending=False).to_dict("records"):
            rows.append({
                "run": run,
                "class": r["class"],
                "map (ha)": f"{r['mapped_ha']:.1f}",
                "estimated (ha)": _interval(r["estimated_ha"], r["lo_ha"], r["hi_ha"]),
                "CDL (ha)": "" if pd.isna(r["cdl_ha"]) else f"{r['cdl_ha']:.1f}",
                "coverage": _coverage(r["coverage"], r["draws"]),
                "Wald coverage": _coverage(r["wald_coverage"], r["draws"]),
                "units": int(r["units_reference"]),
                "note": "" if pd.isna(r["note"]) else str(r["note"]),
            })  # fmt: skip
    return pd.DataFrame(rows)


def _coverage(share: object, draws: object) -> str:
    return "" if pd.isna(share) else f"{share:.0%} of {int(draws)}"


def area_section(
    paths: dict[str, Path], settings: AreaSettings, top: int = 10,
    layers: dict[str, Path] | None = None,
) -> tuple[str, str]:  # fmt: skip
    """The section's title (the intervals' level) and HTML: the figure (inline) and the table
    at ``PAGE_LEVEL``; with districts, each run's choropleth drawn from its district layer
    (``layers``: run -> ``{run}_districts.gpkg``, whatever the districts' source)."""
    html = _section_html(paths, settings, top, layers or {})
    return AREAS_TITLE.format(level=settings.percent), html


def _section_html(
    paths: dict[str, Path], settings: AreaSettings, top: int, layers: dict[str, Path]
) -> str:
    tables = {run: read_area_table(Path(p)) for run, p in paths.items()}
    if not tables:
        return "<p>No area tables.</p>"
    panels = []
    for run, frame in tables.items():
        part = frame[(frame["level"] == PAGE_LEVEL) & (frame["method"] == CHECK)]
        panels.append((run, part.nlargest(top, "estimated_ha")))
    figure = plots.png_bytes(plots.area_figure(panels, f"L{PAGE_LEVEL}, {CHECK}",
                                               settings.percent))  # fmt: skip
    image = (f"<img id='areas' alt='mapped vs estimated area per class' "
             f"src='data:image/png;base64,{base64.b64encode(figure).decode()}'>")  # fmt: skip
    text = (
        f"<p><b>{CHECK}</b>: a stratified random sample of each run's map over its test tiles "
        "(strata: the map's classes), labelled by the CDL, estimated as Olofsson et al. (2014) "
        f"give it, with {settings.percent} intervals that hold where the normal (Wald) one "
        "fails (rare classes, accuracies near 0 or 1; docs/design.md); <i>coverage</i>: how "
        "often the interval covered the CDL's area over the repeated draws, <i>Wald "
        "coverage</i>: how often the normal interval other tools give did. The CDL is taken as "
        "the truth (its own errors are not corrected); the test split's error rates do not "
        "hold on the train blocks. Every level and class: "
        "<code>results/area_estimates/{run}.csv</code>.</p>"
    )
    page = (
        image
        + text
        + plots.html_table(page_rows(tables), "areas")
        + recommended_html(tables, settings)
    )
    if any((f["method"] == USER_SAMPLE).any() for f in tables.values()):
        users = page_rows(tables, method=USER_SAMPLE).drop(
            columns=["CDL (ha)", "coverage", "Wald coverage"]
        )
        page += (f"<p><b>{USER_SAMPLE}</b>: your labelled sample, estimated on each run's "
                 "map.</p>" + plots.html_table(users, "areas-user"))  # fmt: skip
    if settings.has_districts and any(
        (f["method"] == DISTRICT_CHECK).any() for f in tables.values()
    ):
        page += district_html(tables, settings, layers)
    return page


def recommended_html(tables: dict[str, pd.DataFrame], settings: AreaSettings) -> str:
    """How many units to label, per run: the recommended size's total (the strata's units are
    the CSV's ``recommended_units``), what it aims at and what it delivered on the test split."""
    lines = []
    for run, frame in tables.items():
        rows = frame[(frame["method"] == CHECK) & (frame["level"] == settings.level)
                     & frame["recommended_units"].notna()]  # fmt: skip
        if rows.empty:
            continue
        delivered = rows["delivered_half_width"].max()
        got = "" if pd.isna(delivered) else f"; at most {delivered:.1%} delivered on its test split"
        lines.append(f"<li>{html.escape(run)}: {int(rows['recommended_units'].sum())} units{got}"
                     "</li>")  # fmt: skip
    if not lines:
        return ""
    return (
        f"<p><b>How many to label</b> for each class with at least {settings.min_share:.0%} "
        f"of the map to reach a {settings.percent} interval of relative half-width "
        f"{settings.target:.0%} (<code>area_estimates.sample.target</code>; per stratum: "
        "<code>recommended_units</code>; <code>n: auto</code> draws it), assuming the map "
        f"errs in your area as on its test split:</p><ul>{''.join(lines)}</ul>"
    )


def headline(frame: pd.DataFrame) -> str | None:
    """The class the page shows per district: the largest estimated at ``DISTRICT_LEVEL`` in
    the total over the districts (None without district rows)."""
    rows = frame[(frame["method"] == DISTRICT_CHECK) & (frame["level"] == DISTRICT_LEVEL)
                 & (frame["district"] == ALL)]  # fmt: skip
    return None if rows.empty else str(rows.loc[rows["estimated_ha"].idxmax(), "class"])


def district_rows(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per run and domain (districts in the file's order, the outside, the total): its
    headline class's map area, estimate with interval, CDL area and coverage."""
    rows = []
    for run, frame in tables.items():
        cls = headline(frame)
        part = frame[(frame["method"] == DISTRICT_CHECK) & (frame["level"] == DISTRICT_LEVEL)
                     & (frame["class"] == cls)].set_index("district")  # fmt: skip
        every = frame.loc[frame["method"] == DISTRICT_CHECK, "district"]
        for name in dict.fromkeys(every):
            r = part.loc[name] if name in part.index else None
            rows.append({
                "run": run, "district": name, "class": cls,
                "map (ha)": "" if r is None else f"{r['mapped_ha']:.1f}",
                "estimated (ha)": ("no test pixel" if r is None else
                                   _interval(r["estimated_ha"], r["lo_ha"], r["hi_ha"])),
                "CDL (ha)": "" if r is None or pd.isna(r["cdl_ha"]) else f"{r['cdl_ha']:.1f}",
                "coverage": "" if r is None else _coverage(r["coverage"], r["draws"]),
            })  # fmt: skip
    return pd.DataFrame(rows)


def _source_text(settings: AreaSettings) -> str:
    """Where the districts came from, as the page says it."""
    if settings.district_source == "regions":
        return "each region a district"
    if settings.district_source == "areas":
        return f"each area of {settings.districts} a district"
    return str(settings.districts)


def district_html(
    tables: dict[str, pd.DataFrame], settings: AreaSettings, layers: dict[str, Path]
) -> str:
    """The district table and, per run with a district layer, the choropleth of its headline
    class (the layer's polygons: the districts file's, the areas' or the regions' footprints)."""
    images = []
    for run, frame in tables.items():
        cls = headline(frame)
        if cls is None or run not in layers:
            continue
        districts = read_districts(layers[run], LAYER_NAME_FIELD, LAYER)
        part = frame[(frame["method"] == DISTRICT_CHECK) & (frame["level"] == DISTRICT_LEVEL)
                     & (frame["class"] == cls)].set_index("district")["estimated_ha"]  # fmt: skip
        values = [part.get(name, float("nan")) for name in districts.names]
        figure = plots.district_figure(
            districts.geometries, districts.names, values, f"{run}: {cls}, L{DISTRICT_LEVEL}",
            f"estimated {cls} (ha)", districts.crs.is_geographic,
        )  # fmt: skip
        data = base64.b64encode(plots.png_bytes(figure)).decode()
        images.append(f"<img class='districts' alt='{cls} per district, {run}' "
                      f"src='data:image/png;base64,{data}'>")  # fmt: skip
    text = (
        f"<p><b>{DISTRICT_CHECK}</b> ({_source_text(settings)}): the test split sampled by "
        f"district x map class, each district estimated from its own units; <i>{OUTSIDE}</i>: "
        f"the pixels in no district; <i>{ALL}</i>: their sum (its variance the sum of theirs). "
        f"Each run's largest class at L{DISTRICT_LEVEL}; every class: the CSV and "
        "<code>results/area_estimates/{run}_districts.gpkg</code>.</p>"
    )
    return "".join(images) + text + plots.html_table(district_rows(tables), "areas-districts")
