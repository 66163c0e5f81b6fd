"""Stage: each class's area in hectares with its interval, for one run -> CSV and figure.

Two methods, rows of one table (:mod:`emb.estimation.estimates_table`):

- the test split's check (always): stratified random samples of the run's map over its test
  tiles, labelled by the CDL, estimated as Olofsson et al. 2014 give it, beside the map's pixel
  count and the CDL's area of the same pixels, and the share of the check's ``draws`` samples whose
  interval covered the CDL's area (:mod:`emb.estimation.holdout_check`);
- a user's labelled sample (``--labelled``, its design record beside it): the estimates over
  the regions the sample was drawn on, with the paper's analytic standard errors; a sample
  designed on another map (another run's, or a simple random sample) through Stehman's (2014)
  general estimator, so one labelled sample serves every run.

With districts (``area_estimates.districts``), the check is also run per district
(:mod:`emb.estimation.district_check`): rows per district, the outside and their total in the
same table, and the districts' estimates at L2 (the seven groups: a layer a GIS user styles
without a legend of 61 classes) as a GeoPackage (``--gpkg``).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

import pandas as pd

from emb import stage_runner
from emb.classes import ClassMap, load_class_map
from emb.estimation.district_check import check_districts
from emb.estimation.district_layer import write_district_layer
from emb.estimation.districts import Districts, load_districts
from emb.estimation.estimates_table import (
    ALL,
    CHECK,
    DISTRICT_CHECK,
    DISTRICT_LEVEL,
    USER_SAMPLE,
    check_rows,
    district_rows,
    estimate_rows,
    largest,
    table,
)
from emb.estimation.holdout_check import check, error_matrix
from emb.estimation.holdout_counts import read_population
from emb.estimation.labelled_estimates import estimate_by_district, estimate_sample
from emb.estimation.sample_files import LabelledSample, read_labelled
from emb.estimation.sample_size import allocation, write_sample_size
from emb.estimation.settings import AreaSettings, add_option, parsed_option
from emb.io import atomic_path
from emb.plots import area_figure, save

log = logging.getLogger(__name__)
TOP_CLASSES = 12  # the figure's rows per panel
SIZED_DRAWS = 100  # draws of the recommended size on the test split (what it delivers)


def region_of(index_path: Path) -> str:
    """results/shards/{source}/{region}/index.json -> region."""
    return index_path.parent.name


def main_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="the run's name (the table's run column)")
    p.add_argument("--maps", type=Path, required=True, help="results/maps/{run}")
    p.add_argument(
        "--indexes",
        type=Path,
        nargs="+",
        required=True,
        help="results/shards/{source}/{region}/index.json of the run's regions",
    )
    p.add_argument(
        "--labels",
        type=Path,
        nargs="+",
        required=True,
        help="results/labels/{source}/{region}.tif, in the order of --indexes",
    )
    p.add_argument("--classes", type=Path, required=True, help="classes.csv")
    add_option(p)
    p.add_argument("--labelled", type=Path, help="a user's labelled sample.csv (optional)")
    p.add_argument("--record", type=Path, help="its design record (default: sample.json beside)")
    p.add_argument("--csv", type=Path, required=True, help="results/area_estimates/{run}.csv")
    p.add_argument("--sample-size", type=Path, help="{run}_sample_size.json: the recommended n")
    p.add_argument("--png", type=Path, required=True, help="results/area_estimates/{run}.png")
    p.add_argument(
        "--gpkg",
        type=Path,
        help="{run}_districts.gpkg: the districts' estimates (with districts only)",
    )
    p.add_argument("--threads", type=int, default=1,
                   help="cores of the test split's check (the rule's threads): worker "
                   "processes, each counting shares of the regions, then each drawing a range "
                   "of the check by district's draws (Linux; elsewhere one process, a reader "
                   "thread beside the counting)")  # fmt: skip
    args = p.parse_args(argv)  # fmt: skip
    if len(args.indexes) != len(args.labels):
        p.error(f"--labels: expected one per --indexes ({len(args.indexes)}), "
                f"found {len(args.labels)}")  # fmt: skip
    args.settings = parsed_option(p, args.settings)
    if args.gpkg and not args.settings.has_districts:
        p.error("--gpkg: expected districts in --settings (area_estimates.districts)")
    return args


def sample_rows(
    args: argparse.Namespace, cmap: ClassMap, settings: AreaSettings, districts: Districts | None
) -> list[dict]:
    """The rows of a user's labelled sample on this run's maps (its design's regions), and per
    district where the design or the config has districts."""
    record = args.record or args.labelled.with_name("sample.json")
    sample = read_labelled(args.labelled, record, cmap)
    regions = [m.region for m in sample.record.maps]
    where = " + ".join(regions)
    common = {"run": args.run, "method": USER_SAMPLE, "where": where}
    maps = {r: args.maps / f"{r}.tif" for r in regions}
    unmapped = [r for r, path in maps.items() if not path.is_file()]
    if unmapped:  # another source's regions: this run has no map to assess there
        log.warning("%s: run %s maps none of regions %s: no rows of it", args.labelled,
                    args.run, unmapped)  # fmt: skip
        return [{**common, "note": f"{args.labelled}: this run does not map {unmapped}"}]
    if settings.district_source == "regions":  # the sample's own regions, not the check's
        districts = load_districts("regions", None, settings.district_name, maps)
    found = estimate_sample(sample, maps, cmap, settings.confidence)
    notes = [f"{args.labelled}: {len(sample.reference)} labelled units"]
    if sample.unlabelled:
        notes.append(
            f"{sample.unlabelled} of {sample.record.n_drawn} units unlabelled (left out "
            "of their strata's samples; valid if missing at random within a stratum)"
        )
    rows = []
    for item in found:
        how = ("designed on this run's map" if item.same_maps else
               "designed on another map: Stehman 2014's estimator")  # fmt: skip
        for row in estimate_rows(item.estimates, item.level, cmap, sample.record.pixel_ha,
                                 settings, common):  # fmt: skip
            row["note"] = "; ".join(filter(None, [row["note"], how, *notes]))
            rows.append(row)
    log.info("%s on run %s: %d units, %d unlabelled (%s)", args.labelled, args.run,
             len(sample.reference), sample.unlabelled, how)  # fmt: skip
    if sample.record.districts is not None or districts is not None:
        rows += sample_district_rows(sample, maps, cmap, settings, districts, common)
    return rows


def sample_district_rows(
    sample: LabelledSample, maps: dict[str, Path], cmap: ClassMap, settings: AreaSettings,
    districts: Districts | None, common: dict,
) -> list[dict]:  # fmt: skip
    """A labelled sample's rows per district: within each district's own strata where the
    design was drawn by district (the total the sum of the districts, its variance the sum of
    theirs), else each district as a domain of the design's strata (Stehman 2014: wider)."""
    found = estimate_by_district(sample, maps, cmap, settings.confidence, districts)
    rows = []
    for d, estimates in found.districts.items():
        name = found.names[d]
        for item in estimates:
            for row in estimate_rows(item.estimates, item.level, cmap, sample.record.pixel_ha,
                                     settings, {**common, "district": name}):  # fmt: skip
                row["note"] = "; ".join(filter(None, [row["note"], found.note]))
                rows.append(row)
    for d, why in found.skipped.items():
        rows.append({**common, "district": found.names[d], "note": why})
    return rows


def write_layer(path: Path, districts: Districts, frame: pd.DataFrame) -> None:
    """The districts' rows of the check by district at ``DISTRICT_LEVEL`` as the GIS layer
    (the outside and the total stay in the CSV: they have no polygon)."""
    rows = frame[(frame["method"] == DISTRICT_CHECK) & (frame["level"] == DISTRICT_LEVEL)
                 & ~frame["district"].isin([ALL])]  # fmt: skip
    write_district_layer(path, districts, rows)
    log.info("wrote %s (%d districts, L%d)", path, len(districts.names), DISTRICT_LEVEL)


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    args = main_args(argv)
    cmap = load_class_map(args.classes)
    regions = [region_of(p) for p in args.indexes]
    settings = args.settings
    maps = {r: args.maps / f"{r}.tif" for r in regions}
    districts = load_districts(settings.district_source, settings.districts,
                               settings.district_name, maps)  # fmt: skip
    population = read_population(
        maps,
        dict(zip(regions, args.labels, strict=True)),
        dict(zip(regions, args.indexes, strict=True)),
        districts,
        args.threads,
    )
    log.info("%s: test split of %s: %d labelled pixels (%.1f ha)", args.run, ", ".join(regions),
             population.pixels, population.pixels * population.pixel_ha)  # fmt: skip
    pilot = error_matrix(population, settings.level, cmap)
    size = allocation(pilot.sum(1), pilot, settings.target, settings.min_share,
                      settings.min_per_class, settings.confidence)  # fmt: skip
    checks = check(population, cmap, settings, size.units if settings.auto else None)
    sized = checks if settings.auto else check(
        population, cmap, replace(settings, draws=min(settings.draws, SIZED_DRAWS)), size.units
    )  # fmt: skip
    where = f"test split of {' + '.join(regions)}"
    rows = check_rows(args.run, checks, cmap, population.pixel_ha, settings, where, size, sized)
    if args.sample_size:
        write_sample_size(args.sample_size, size, pilot, settings)
    log.info("%s: %d units give each class of >= %s of the map a %s interval of relative "
             "half-width <= %s on the test split (per stratum %s)", args.run, size.total,
             settings.min_share, settings.percent, settings.target,
             size.units.tolist())  # fmt: skip
    if districts is not None:
        by_district = check_districts(population, cmap, settings,
                                      size.total if settings.auto else int(settings.n),
                                      threads=args.threads)  # fmt: skip
        rows += district_rows(args.run, by_district, cmap, population.pixel_ha, settings, where)
    if args.labelled:
        rows += sample_rows(args, cmap, settings, districts)
    frame = table(rows)
    if args.gpkg and districts is not None:
        write_layer(args.gpkg, districts, frame)
    panels = [(f"L{level}: {CHECK}", largest(frame, CHECK, level, TOP_CLASSES)) for level in (2, 3)]
    figure = area_figure(panels, f"{args.run}: area per class, {where}", settings.percent)
    save(figure, args.png)
    with atomic_path(args.csv) as tmp:
        frame.to_csv(tmp, index=False)
    covered = frame[(frame["method"] == CHECK) & frame["coverage"].notna()]
    log.info("wrote %s (%d rows; median coverage of the %s intervals over %d draws: %.3f)",
             args.csv, len(frame), settings.percent, settings.draws,
             covered["coverage"].median() if len(covered) else float("nan"))  # fmt: skip


if __name__ == "__main__":
    main()
