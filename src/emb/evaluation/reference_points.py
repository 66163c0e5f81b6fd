"""Stage: a stratified random sample of a run's map to label by hand -> CSV, GeoPackage, JSON.

Where the model is used (a prediction-only region, a year without CDL) no label exists to
check its map against; the good-practice answer (Olofsson et al. 2014) is a probability sample
of reference labels. This draws one over the chosen regions' maps (strata: the map's classes
at ``--level``; ``--n`` units, at least ``--min-per-class`` per class, the rest by area; from
``--seed``): ``sample.csv`` to fill in (its empty ``reference`` column: a CDL code or a class
name of the level, from imagery or the field), ``sample.gpkg`` of the same points for a GIS,
and ``sample.json``, the design record the estimate needs (:mod:`emb.evaluation.sample_design`).
Give the labelled CSV as ``area_estimates.labelled`` and every run's area table gets its rows.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from emb import stage_runner
from emb.classes import load_class_map
from emb.config_schema import config_option
from emb.evaluation.sample_design import draw_points, write_design

log = logging.getLogger(__name__)


def add_design_options(p: argparse.ArgumentParser) -> None:
    """The design's options (config ``area_estimates.sample``), shared with the estimates'
    stage, whose check draws by the same design."""
    p.add_argument("--n", type=int, **config_option("area_estimates.sample.n", "sample units"))
    p.add_argument(
        "--min-per-class", type=int, **config_option("area_estimates.sample.min_per_class")
    )
    p.add_argument(
        "--level",
        type=int,
        choices=[1, 2, 3],
        **config_option("area_estimates.sample.level", "the strata's level"),
    )
    p.add_argument("--seed", type=int, **config_option("area_estimates.sample.seed"))  # fmt: skip


def check_design_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, in one line (exit 2), a design that cannot give standard errors."""
    if args.n < 1:
        p.error(f"--n: expected an integer >= 1, found {args.n}")
    if args.min_per_class < 2:
        p.error(f"--min-per-class: expected >= 2 (a standard error needs 2 units), "
                f"found {args.min_per_class}")  # fmt: skip
    if args.seed < 0:
        p.error(f"--seed: expected an integer >= 0, found {args.seed}")


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--maps",
        type=Path,
        nargs="+",
        required=True,
        help="the map of each region to sample (results/maps/{run}/{region}.tif)",
    )
    p.add_argument("--classes", type=Path, required=True, help="classes.csv")
    add_design_options(p)
    p.add_argument("--out-dir", type=Path, required=True, help="results/samples/{run}")
    args = p.parse_args(argv)  # fmt: skip
    check_design_options(p, args)
    design = draw_points(args.maps, args.level, load_class_map(args.classes), args.n,
                         args.min_per_class, args.seed)  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    paths = write_design(design, args.out_dir)
    log.info("wrote %s (%d points over %d maps, L%d strata, allocation %s), %s and %s",
             paths.csv, int(design.allocation.sum()), len(design.maps), design.level,
             {design.class_names[k]: int(v) for k, v in enumerate(design.allocation) if v},
             paths.gpkg, paths.record)  # fmt: skip


if __name__ == "__main__":
    main()
