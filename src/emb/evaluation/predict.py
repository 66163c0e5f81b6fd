"""Stage: predict a whole region raster with a run's best checkpoint -> a georeferenced L3 map.

The raster goes block by block through :func:`emb.evaluation.windows.predict_block` (sliding
windows of the training tile size, overlapping logits blended so tile edges leave no seams,
memory bounded by the block, not the raster) and into the files of
:mod:`emb.evaluation.map_files`: a Cloud-Optimized GeoTIFF with the input's CRS, transform and
shape, uint8 L3 ids, 255 = nodata (wherever the input embedding is nodata), a colour table of
the CDL's colours (the input CDL's own table when it has one), class names in the metadata, in
GDAL's category names and in a QGIS style beside it; optionally a second COG of per-class
probabilities; a PNG quicklook with a legend.
"""

from __future__ import annotations

import argparse
import logging
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import rasterio
import torch

from emb import cli
from emb.classes import ClassMap, load_class_map
from emb.evaluation.inference import Inference, inference
from emb.evaluation.map_files import (
    NODATA,
    describe_map,
    describe_probabilities,
    map_profile,
    map_tags,
    tmp_sibling,
    to_cog,
    write_legend,
    write_quicklook,
)
from emb.evaluation.runs import RunError, TrainedRun, open_run
from emb.evaluation.windows import PredictSpec, blocks, classify, predict_block
from emb.prep.manifest import read_manifest
from emb.progress import Progress
from emb.provenance import provenance
from emb.report.colours import cdl_palette, l3_colours

log = logging.getLogger(__name__)


def predict_raster(
    run: TrainedRun, weights: str, raster: Path, cmap: ClassMap, spec: PredictSpec,
    out: Path, probabilities: Path | None = None, run_on: Inference | None = None,
    tags: dict[str, str] | None = None, colours: np.ndarray | None = None,
) -> None:  # fmt: skip
    """Write the L3 map of ``raster`` (and optionally probabilities) as COGs, coloured with
    ``colours`` ((61, 3) uint8; the official CDL colours by default).

    Blocks go into tiled temporary GeoTIFFs, which GDAL then copies into COGs (the COG driver
    only copies); the final files appear atomically, complete or not at all.
    """
    run_on = run_on or Inference(torch.device("cpu"))
    raster = Path(raster)
    if not raster.is_file():
        raise RunError(f"region raster {raster} not found")
    model = run_on.prepare(run.model(weights))
    dequantize = run.dequantize().to(run_on.device)
    names = list(cmap.l3_names)
    tags = map_tags(names, tags)
    tmp_map = tmp_sibling(out, "map")
    tmp_prob = tmp_sibling(probabilities, "prob") if probabilities else None
    try:
        with ExitStack() as stack:
            src = stack.enter_context(rasterio.open(raster))
            run.check_in_dim(src.count, str(raster))
            out.parent.mkdir(parents=True, exist_ok=True)
            dst = stack.enter_context(rasterio.open(tmp_map, "w", **map_profile(src, 1)))
            prob = None
            if tmp_prob is not None:
                profile = map_profile(src, len(names))
                prob = stack.enter_context(rasterio.open(tmp_prob, "w", **profile))
            todo = list(blocks(src.height, src.width, spec.block))
            progress = Progress(len(todo), "blocks", f"{raster.name} map", log)
            for block in todo:
                acc, wsum, valid = predict_block(
                    model, dequantize, src, run.cfg.data.source, block, spec, run_on
                )
                ids, probs = classify(acc, wsum, valid, prob is not None)
                dst.write(ids, 1, window=block)
                if prob is not None:
                    if probs is None:  # a block without a single valid pixel
                        probs = np.full((len(names), block.height, block.width), NODATA, np.uint8)
                    prob.write(probs, window=block)
                progress.advance()
            progress.done()
            colours = l3_colours(cmap) if colours is None else colours
            describe_map(dst, cmap, tags, colours)
            if prob is not None:
                describe_probabilities(prob, names, tags)
        to_cog(tmp_map, out, "MODE")
        if probabilities is not None and tmp_prob is not None:
            to_cog(tmp_prob, probabilities, "AVERAGE")
    finally:
        tmp_map.unlink(missing_ok=True)
        if tmp_prob is not None:
            tmp_prob.unlink(missing_ok=True)


def default_tile(run: TrainedRun) -> int:
    """The tile size the run was trained on (its manifest's ``tile_size``)."""
    path = Path(run.cfg.data.manifest)
    if not path.is_file():
        raise RunError(f"{path}: manifest of run {run.name} not found; pass --tile")
    return int(read_manifest(path, splits=())["tile_size"])


def provenance_tags(run: TrainedRun, device: object) -> dict[str, str]:
    """What made the map: this code and device (``PROVENANCE_*``), and what trained the model
    (``TRAINED_*``: the checkpoint's own provenance, with its config and data digests)."""
    trained = run.trained_with
    now = provenance(config_digest=trained.get("config_digest"),
                     manifest_digest=trained.get("manifest_digest"), device=device)  # fmt: skip
    return {
        **{f"PROVENANCE_{key.upper()}": value for key, value in now.items()},
        **{f"TRAINED_{key.upper()}": str(value) for key, value in trained.items()},
    }


@cli.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="results/runs/{run}")
    parser.add_argument("--checkpoint", default="best.pt", help="file name inside --run-dir")
    parser.add_argument("--raster", type=Path, required=True, help="the region's embedding raster")
    parser.add_argument("--region", required=True)
    parser.add_argument("--classes", type=Path, required=True, help="classes.csv")
    parser.add_argument(
        "--cdl", type=Path, help="the region's CDL: its colour table colours the map"
    )
    parser.add_argument("--out", type=Path, required=True, help="results/maps/{run}/{region}.tif")
    parser.add_argument("--png", type=Path, required=True, help="quicklook with legend")
    parser.add_argument(
        "--qml", type=Path, help="QGIS style with class names (default: beside --out)"
    )
    parser.add_argument("--probabilities", type=Path, help="also write per-class probabilities")
    parser.add_argument("--tile", type=int, help="window side (default: the training tile)")
    parser.add_argument("--overlap", type=float, default=0.5, help="fraction of the window")
    parser.add_argument("--block", type=int, default=1024, help="pixels per block side")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (no GPU)")
    args = parser.parse_args(argv)
    cmap = load_class_map(args.classes)
    run = open_run(args.run_dir, cmap, args.classes, args.checkpoint)
    loop = run.cfg.train
    run_on = inference(loop.precision, loop.channels_last, args.threads)
    spec = PredictSpec(args.tile or default_tile(run), args.overlap, args.block, args.batch_size)
    spec.check(2 ** (len(run.cfg.model.widths) + 1))
    if not args.raster.is_file():
        raise RunError(f"region {args.region!r}: embedding raster {args.raster} not found")
    tags = {"RUN": args.run_dir.name, "REGION": args.region, "WEIGHTS": run.selected,
            "CHECKPOINT": str(run.path), **provenance_tags(run, run_on.device)}  # fmt: skip
    colours = l3_colours(cmap, cdl_palette(args.cdl) if args.cdl else None)
    predict_raster(run, run.selected, args.raster, cmap, spec, args.out, args.probabilities,
                   run_on, tags, colours)  # fmt: skip
    write_legend(args.out, args.qml or args.out.with_suffix(".qml"), list(cmap.l3_names), colours)
    title = f"{args.run_dir.name} on {args.region} ({run.selected} weights)"
    write_quicklook(args.out, args.png, cmap, title, colours)
    log.info("wrote %s, its legend and %s", args.out, args.png)


if __name__ == "__main__":
    main()
