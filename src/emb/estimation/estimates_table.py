"""A run's area estimates as one table: a row per (method, level, class), in hectares.

The columns are the file's contract (``results/area_estimates/{run}.csv``, docs/design.md):
the map's pixel count (``mapped_ha``), the estimate with its standard error and the interval
that holds (``lo``/``hi``, :mod:`emb.estimation.intervals`) beside the Wald one other tools give
(``wald_lo``/``wald_hi``), the user's, producer's and overall accuracy likewise, the sample
units, the level (``confidence``), and for the test split's check the CDL's area of the same
pixels and how often each interval covered it. An interval that cannot be given leaves its
columns empty and says why in ``note``: never a silent NaN, never a zero-width interval.

With districts, the check by district (:mod:`emb.estimation.district_check`) adds rows of its
own method: ``district`` names the domain (a district, ``outside`` for the pixels in none,
``all`` for the total over them, the sum of their estimates); every other row has ``district``
empty (the whole area, as before).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from emb.classes import ClassMap
from emb.estimation.district_check import DistrictCheck
from emb.estimation.estimators import AreaEstimates, Estimate
from emb.estimation.holdout_check import ClassCoverage, LevelCheck
from emb.estimation.sample_size import SampleSize
from emb.estimation.settings import AreaSettings

CHECK = "test split, CDL reference"
USER_SAMPLE = "user sample"
DISTRICT_CHECK = "test split by district, CDL reference"
ALL = "all"  # the district column of the total over every domain
DISTRICT_LEVEL = 2  # the district layer's and the summary's level: seven groups read at a glance
COLUMNS = [
    "run", "method", "where", "district", "level", "class_id", "class", "confidence", "mapped_ha",
    "estimated_ha", "se_ha", "lo_ha", "hi_ha", "wald_lo_ha", "wald_hi_ha", "cdl_ha", "coverage",
    "wald_coverage", "draws", "users", "users_lo", "users_hi", "users_wald_lo", "users_wald_hi",
    "producers", "producers_lo", "producers_hi", "producers_wald_lo", "producers_wald_hi",
    "overall", "overall_lo", "overall_hi", "overall_wald_lo", "overall_wald_hi", "units_mapped",
    "units_reference", "recommended_units", "expected_half_width", "delivered_half_width", "note",
]  # fmt: skip
HECTARES = ("mapped_ha", "estimated_ha", "se_ha", "lo_ha", "hi_ha", "wald_lo_ha", "wald_hi_ha",
            "cdl_ha")  # fmt: skip
HA_DECIMALS, SHARE_DECIMALS = 2, 4  # 0.01 ha; proportions and accuracies to 4 decimals


def class_names(cmap: ClassMap, level: int) -> tuple[str, ...]:
    return {1: cmap.l1_names, 2: cmap.l2_names, 3: cmap.l3_names}[level]


NO_INTERVAL = "{what}: no interval, the sample cannot bound it ({why})"
SAMPLED_WHOLE = "{what}: its strata were sampled whole: known exactly, no interval needed"
ZERO_SE = (
    "{what}: Wald standard error 0 (no unit disagreed): no Wald interval, it would have no width"
)
NO_DATA = "no data"  # the class past a level's ids: where an assessed map has no data
LOW_COVERAGE = 0.9  # below (not at): the check's note says this class's intervals miss too often


def _figure(est: Estimate | None, z: float, scale: float = 1.0) -> list[float | None]:
    """value, lo, hi (the interval that holds), wald_lo, wald_hi; None where the estimate or an
    interval does not exist. No zero-width interval: a census's bounds are its value, shown
    as none; a Wald SE of 0 gives no Wald interval."""
    if est is None:
        return [None] * 5
    bounds = est.bounds if est.bounds and est.bounds[0] < est.bounds[1] else None
    wald = est.interval(z) if est.se else None
    lo, hi = (None, None) if bounds is None else (bounds[0] * scale, bounds[1] * scale)
    wald_lo, wald_hi = (None, None) if wald is None else (wald[0] * scale, wald[1] * scale)
    return [est.value * scale, lo, hi, wald_lo, wald_hi]


def _notes(named: dict[str, Estimate | None]) -> list[str]:
    """Why a figure's interval (or its Wald interval) is missing, once per reason."""
    notes = []
    for what, e in named.items():
        if e is None:
            continue
        if e.why:
            notes.append(NO_INTERVAL.format(what=what, why=e.why))
        elif e.bounds is not None and e.bounds[0] == e.bounds[1]:
            notes.append(SAMPLED_WHOLE.format(what=what))
        elif e.se == 0:
            notes.append(ZERO_SE.format(what=what))
    return notes


def estimate_rows(
    estimates: AreaEstimates, level: int, cmap: ClassMap, pixel_ha: float,
    settings: AreaSettings, common: dict,
) -> list[dict]:  # fmt: skip
    """One row per class of ``estimates``; ``common``: run, method, where (and what the
    caller adds, e.g. the CDL's area per class under ``cdl_ha``)."""
    total_ha = estimates.total_px * pixel_ha
    names = class_names(cmap, level)
    z = settings.z
    overall = _figure(estimates.overall, z)
    rows = []
    for c in estimates.classes:
        value, lo, hi, wald_lo, wald_hi = _figure(c.proportion, z, total_ha)
        named = {
            "area": c.proportion,
            "user's accuracy": c.users,
            "producer's accuracy": c.producers,
            "overall accuracy": estimates.overall,
        }
        se = c.proportion.se
        rows.append({
            **common,
            "level": level,
            "class_id": c.cls,
            "class": names[c.cls] if c.cls < len(names) else NO_DATA,
            "confidence": settings.confidence,
            "mapped_ha": c.mapped_px * pixel_ha,
            "estimated_ha": value,
            "se_ha": None if se is None else se * total_ha,
            "lo_ha": lo,
            "hi_ha": hi,
            "wald_lo_ha": wald_lo,
            "wald_hi_ha": wald_hi,
            **_columns("users", _figure(c.users, z)),
            **_columns("producers", _figure(c.producers, z)),
            **_columns("overall", overall),
            "units_mapped": c.units_mapped,
            "units_reference": c.units_reference,
            "note": "; ".join(dict.fromkeys(_notes(named))),
        })  # fmt: skip
    return rows


def _columns(name: str, figure: list[float | None]) -> dict[str, float | None]:
    keys = (name, f"{name}_lo", f"{name}_hi", f"{name}_wald_lo", f"{name}_wald_hi")
    return dict(zip(keys, figure, strict=True))


def _coverage_notes(tally: ClassCoverage | None, draws: int, settings: AreaSettings) -> list[str]:
    """What the check's coverage of a class means: the draws without an interval, why there
    is no coverage, and a coverage below ``LOW_COVERAGE``."""
    if tally is None:
        return []
    if tally.with_interval == 0:
        if tally.exact == draws:
            return ["every draw sampled its strata whole: the estimate is the CDL's area itself, "
                    "no coverage to measure"]  # fmt: skip
        return [f"no interval in any of the {draws} draws: no coverage to measure"]
    notes = []
    if tally.with_interval < draws:
        notes.append(f"an interval in {tally.with_interval} of the {draws} draws (the others: "
                     "none the sample could give, or strata sampled whole)")  # fmt: skip
    coverage = tally.covered / draws
    if coverage < LOW_COVERAGE:
        notes.append(f"the {settings.percent} interval covered the CDL's area in "
                     f"{coverage:.1%} of the draws, below {LOW_COVERAGE:.0%}: too few units of "
                     "this class (a larger area_estimates.sample.n gives more)")  # fmt: skip
    return notes


def check_rows(
    run: str, checks: Sequence[LevelCheck], cmap: ClassMap, pixel_ha: float,
    settings: AreaSettings, where: str, size: SampleSize | None = None,
    sized: Sequence[LevelCheck] = (),
) -> list[dict]:  # fmt: skip
    """The test split's check: the first draw's estimates beside the CDL's area and the
    coverage of both intervals (the one that holds, Wald's) over every draw; at the design's
    level, ``size``'s recommended units per stratum (the class's) with each reported class's
    expected relative half-width, and what samples of that size delivered (``sized``)."""
    rows = []
    delivered = {c.level: c for c in sized}
    for chk in checks:
        common = {"run": run, "method": CHECK, "where": where, "draws": chk.draws}
        shown = estimate_rows(chk.estimates, chk.level, cmap, pixel_ha, settings, common)
        names = class_names(cmap, chk.level)
        listed = {row["class_id"] for row in shown}
        for cls in np.flatnonzero(chk.cdl_px):  # the CDL holds it, the map and sample do not
            if int(cls) not in listed:
                shown.append({**common, "level": chk.level, "class_id": int(cls),
                              "class": names[cls], "confidence": settings.confidence,
                              "mapped_ha": 0.0, "estimated_ha": 0.0, "units_mapped": 0,
                              "units_reference": 0,
                              "note": "in neither map nor sample: estimated 0"})  # fmt: skip
        for row in shown:
            cls = row["class_id"]
            tally = chk.coverage.get(cls)
            row["cdl_ha"] = float(chk.cdl_px[cls]) * pixel_ha
            row["coverage"] = tally.covered / chk.draws if tally and tally.with_interval else None
            row["wald_coverage"] = (tally.wald_covered / chk.draws if tally and tally.wald_with
                                    else None)  # fmt: skip
            extra = _coverage_notes(tally, chk.draws, settings)
            if size is not None and chk.level == settings.level and cls < len(size.units):
                row["recommended_units"] = int(size.units[cls])
                if size.targeted[cls]:
                    row["expected_half_width"] = float(size.expected[cls])
                    got = delivered.get(chk.level)
                    tally = got.coverage.get(cls) if got else None
                    row["delivered_half_width"] = tally.mean_half_width if tally else None
            row["note"] = "; ".join(filter(None, [row.get("note"), *extra]))
            rows.append(row)
    return rows


def district_rows(
    run: str, checked: DistrictCheck, cmap: ClassMap, pixel_ha: float, settings: AreaSettings,
    where: str,
) -> list[dict]:  # fmt: skip
    """The check by district: per domain (the districts in the file's order, the outside, then
    ``all``, their sum) the rows :func:`check_rows` gives the whole, under
    :data:`DISTRICT_CHECK`; a domain without test pixels one row saying so."""
    domains = [*checked.domains[1:], checked.domains[0]]
    summed = ("the sum of the domains' estimates, its variance the sum of theirs (independent "
              "strata); a normal interval")  # fmt: skip
    rows = []
    for name, levels in [*((d.name, d.levels) for d in domains), (ALL, checked.total)]:
        common = {"run": run, "method": DISTRICT_CHECK, "where": where, "district": name}
        if not levels:
            rows.append({**common, "note": "no test pixel in this district: no estimate"})
            continue
        extra = [summed, checked.note] if name == ALL else []
        for row in check_rows(run, levels, cmap, pixel_ha, settings, where):
            rows.append({**row, **common,
                         "note": "; ".join(filter(None, [row["note"], *extra]))})  # fmt: skip
    return rows


def table(rows: list[dict]) -> pd.DataFrame:
    """The rows in the file's column order (largest estimated classes first per level, the
    check by district's domains in their order), at the file's precision: hectares to 0.01,
    shares and accuracies to 4 decimals."""
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if frame.empty:
        return frame
    frame["district"] = [d if isinstance(d, str) else "" for d in frame["district"]]
    shares = [c for c in COLUMNS if c.startswith(("users", "producers", "overall"))]
    shares += ["coverage", "wald_coverage", "expected_half_width", "delivered_half_width"]
    frame[list(HECTARES)] = frame[list(HECTARES)].astype(float).round(HA_DECIMALS)
    frame[shares] = frame[shares].astype(float).round(SHARE_DECIMALS)
    frame["domain"] = pd.factorize(frame["district"])[0]
    frame = frame.sort_values(["method", "domain", "level", "estimated_ha"],
                              ascending=[True, True, True, False], kind="stable")  # fmt: skip
    return frame.drop(columns="domain").reset_index(drop=True)


def largest(frame: pd.DataFrame, method: str, level: int, top: int) -> pd.DataFrame:
    """The ``top`` classes of one method and level by estimated area (the figure's rows)."""
    rows = frame[(frame["method"] == method) & (frame["level"] == level)]
    order = np.argsort(-rows["estimated_ha"].to_numpy(float), kind="stable")
    return rows.iloc[order[:top]]
