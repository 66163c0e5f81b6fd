"""Stage: a stratified random sample of a run's map to label by hand -> CSV, GeoPackage, JSON.

Where the model is used (a prediction-only region, a year without CDL) no label exists to check its
map against; the good-practice answer (Olofsson et al. 2014) is a probability sample of reference
labels. This draws one over the chosen regions' maps (strata: the map's classes at
``area_estimates.sample.level``; ``n`` units, at least ``min_per_class`` per class, the rest by
area; from ``seed``: ``--settings``, :mod:`emb.estimation.settings`): ``sample.csv`` to fill in (its
empty ``reference`` column: a CDL code or a class name of the level, from imagery or the field),
``sample.gpkg`` of the same points for a GIS, and ``sample.json``, the design record the estimate
needs (:mod:`emb.estimation.sample_record`). With ``--districts`` the strata are (district, class)
pairs, so one sample gives every district its estimates, and ``sample.csv`` names each
point's district. Give the labelled CSV as ``area_estimates.labelled``
and every run's area table gets its rows.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from emb import stage_runner
from emb.classes import load_class_map
from emb.estimation.design import draw_points
from emb.estimation.districts import DistrictsError, load_districts
from emb.estimation.sample_files import write_sample
from emb.estimation.sample_size import SampleSize, allocation, read_pilot
from emb.estimation.settings import add_option, parsed_option

log = logging.getLogger(__name__)


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
    add_option(p)
    p.add_argument("--sample-size", type=Path, help="{run}_sample_size.json (with n: auto)")
    p.add_argument("--out-dir", type=Path, required=True, help="results/samples/{run}")
    p.add_argument("--threads", type=int, default=1,
                   help="cores of the design's passes (the rule's threads): worker processes, "
                   "each a share of the maps (Linux; elsewhere a reader thread beside the "
                   "counting)")  # fmt: skip
    args = p.parse_args(argv)
    settings = parsed_option(p, args.settings)
    try:  # with districts (settings.districts), strata are district x class
        districts = load_districts(settings.district_source, settings.districts,
                                   settings.district_name,
                                   {Path(m).stem: m for m in args.maps})  # fmt: skip
    except DistrictsError as err:
        p.error(str(err))
    sized = None
    if settings.auto:
        if args.sample_size is None:
            p.error("--sample-size: expected area_estimates' {run}_sample_size.json with n: auto")
        pilot = read_pilot(args.sample_size, settings.level)

        def sized(strata_px: np.ndarray) -> SampleSize:
            return allocation(strata_px, pilot, settings.target, settings.min_share,
                              settings.min_per_class, settings.confidence)  # fmt: skip

    design = draw_points(args.maps, settings.level, load_class_map(args.classes), settings.n,
                         settings.min_per_class, settings.seed, sized, districts,
                         args.threads)  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    paths = write_sample(design, args.out_dir)
    record = design.record
    log.info("wrote %s (%d points over %d maps, L%d strata, allocation %s), %s and %s",
             paths.csv, record.n_drawn, len(record.maps), record.level,
             {record.stratum_name(h): int(v) for h, v in enumerate(record.allocation) if v},
             paths.gpkg, paths.record)  # fmt: skip


if __name__ == "__main__":
    main()
