"""Stage: map every region of a run (or one raster) with its best checkpoint -> L3 GeoTIFFs.

The rule runs it once per run (``--regions``), through the launcher: each rank maps its share
of the regions into a staging folder and the last rank to finish publishes them
(:mod:`emb.evaluation.region_maps`). ``--raster`` maps one region by hand.

Each raster goes block by block through :func:`emb.evaluation.windows.map_blocks` (sliding
windows of the training tile size, which the run's checkpoint records; every block read once
and every window computed once, overlapping logits blended and classified on the model's
device so tile edges leave no seams and only uint8 comes back; memory bounded by the block and
one strip of the raster's width) and into the files of :mod:`emb.evaluation.map_files`: a
Cloud-Optimized GeoTIFF with the input's CRS, transform and shape, uint8 L3 ids, 255 = nodata
(wherever the input embedding is nodata), a colour table of the CDL's colours (the input CDL's
own table when it has one), class names in the metadata, in GDAL's category names and in a
QGIS style beside it; optionally a second COG of per-class probabilities; a PNG quicklook with
a legend.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import rasterio
import torch

from emb import stage_runner
from emb.classes import ClassMap, load_class_map
from emb.cluster.launch import LAUNCH_ID_ENV
from emb.colours import cdl_palette, l3_colours
from emb.config_schema import config_option
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
from emb.evaluation.predict_spec import PredictSpec, model_downsampling
from emb.evaluation.region_maps import (
    MapFiles,
    RegionInput,
    Staging,
    regions_with,
    share_of_rank,
)
from emb.evaluation.runs import RunError, TrainedRun, open_run
from emb.evaluation.windows import MapBlock, blocks, map_blocks
from emb.models.runtime import CPU_HOST, Host, Runtime
from emb.progress import Progress
from emb.provenance import digest_file, provenance
from emb.stage_runner import Interrupted

log = logging.getLogger(__name__)


def predict_raster(
    run: TrainedRun, weights: str, raster: Path, cmap: ClassMap, spec: PredictSpec,
    out: Path, probabilities: Path | None = None, run_on: Runtime | None = None,
    tags: dict[str, str] | None = None, colours: np.ndarray | None = None,
) -> None:  # fmt: skip
    """Write the L3 map of ``raster`` (and optionally probabilities) as COGs, coloured with
    ``colours`` ((61, 3) uint8; the official CDL colours by default).

    Blocks go into tiled temporary GeoTIFFs, written in a thread while the next block is
    mapped, which GDAL then copies into COGs (the COG driver only copies); the final files
    appear atomically, complete or not at all.
    """
    run_on = run_on or run.runtime(CPU_HOST)
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
            src = stack.enter_context(rasterio.open(raster, num_threads=decode_threads()))
            run.check_in_dim(src.count, str(raster))
            out.parent.mkdir(parents=True, exist_ok=True)
            dst = stack.enter_context(rasterio.open(tmp_map, "w", **map_profile(src, 1)))
            prob = None
            if tmp_prob is not None:
                profile = map_profile(src, len(names))
                prob = stack.enter_context(rasterio.open(tmp_prob, "w", **profile))
            writer = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="emb-write"))
            total = sum(1 for _ in blocks(src.height, src.width, spec.grid_block))
            progress = Progress(total, "blocks", f"{raster.name} map", log)
            pending: deque[Future[int]] = deque()
            mapped_px = 0  # pixels not nodata, summed as the blocks are written
            mapped = map_blocks(model, dequantize, src, run.cfg.data.source, spec, run_on,
                                len(names), prob is not None)  # fmt: skip
            for block in mapped:
                pending.append(writer.submit(write_block, dst, prob, block))
                while len(pending) > 2:  # bounded: at most two blocks wait for the disk
                    mapped_px += pending.popleft().result()
                progress.advance()
            while pending:
                mapped_px += pending.popleft().result()
            progress.done()
            colours = l3_colours(cmap) if colours is None else colours
            describe_map(dst, cmap, tags, colours)
            if prob is not None:
                describe_probabilities(prob, names, tags)
        to_cog(tmp_map, out, "MODE")
        if mapped_px == 0:  # said here: a sample design over it can only name the map
            log.warning("region %s: map %s has no mapped pixel: its input %s is nodata "
                        "everywhere (an area estimate or a sample cannot use it)",
                        tags.get("REGION", "?"), out, raster)  # fmt: skip
        if probabilities is not None and tmp_prob is not None:
            to_cog(tmp_prob, probabilities, "AVERAGE")
    finally:
        tmp_map.unlink(missing_ok=True)
        if tmp_prob is not None:
            tmp_prob.unlink(missing_ok=True)


def decode_threads() -> int:
    """GDAL's decoding threads for the input raster: the process's torch threads (the rule's
    threads on a CPU; on a GPU node, the cores the launcher gave the process)."""
    return max(1, torch.get_num_threads())


def write_block(
    dst: rasterio.io.DatasetWriter, prob: rasterio.io.DatasetWriter | None, block: MapBlock
) -> int:
    """One mapped block into the temporary map (and probabilities), once its bytes are on
    the host; returns its mapped (not nodata) pixels, counted once they are there."""
    block.wait()
    ids = block.ids.numpy()
    dst.write(ids, 1, window=block.window)
    if prob is not None:
        if block.probs is None:
            raise ValueError(f"block {block.window}: probabilities asked for but not mapped")
        prob.write(block.probs.numpy(), window=block.window)
    return int(np.count_nonzero(ids != NODATA))


def provenance_tags(run: TrainedRun, run_on: Runtime) -> dict[str, str]:
    """What made the map: this code, device and resolved numerics (``PROVENANCE_*``), and what
    trained the model (``TRAINED_*``: the checkpoint's own provenance, with its config and data
    digests)."""
    trained = run.trained_with
    now = provenance(config_digest=trained.get("config_digest"),
                     manifest_digest=trained.get("manifest_digest"),
                     stats_digest=trained.get("stats_digest"),
                     device=run_on.device) | run_on.record()  # fmt: skip
    return {
        **{f"PROVENANCE_{key.upper()}": value for key, value in now.items()},
        **{f"TRAINED_{key.upper()}": str(value) for key, value in trained.items()},
    }


def region_tags(item: RegionInput) -> dict[str, str]:
    """The region's year beside the years the model was trained on (a prediction-only region
    may be of a year no CDL exists for), and whether the map was ever scored."""
    tags = {"REGION_YEAR": item.year, "TRAINING_YEARS": item.training_years}
    tags["SCORED"] = "no: prediction-only region (no labels)" if item.predict_only else "yes"
    return {k: v for k, v in tags.items() if v}


def map_region(
    run: TrainedRun, cmap: ClassMap, spec: PredictSpec, run_on: Runtime, item: RegionInput,
    files: MapFiles,
) -> None:  # fmt: skip
    """Map one region into ``files``: the COG(s), its QGIS/GDAL legend and the quicklook."""
    if not item.raster.is_file():
        raise RunError(f"region {item.region!r}: embedding raster {item.raster} not found")
    tags = {"RUN": run.name, "REGION": item.region, "WEIGHTS": run.selected,
            "CHECKPOINT": str(run.path), **provenance_tags(run, run_on),
            **region_tags(item)}  # fmt: skip
    colours = l3_colours(cmap, cdl_palette(item.cdl) if item.cdl else None)
    predict_raster(run, run.selected, item.raster, cmap, spec, files.map, files.probabilities,
                   run_on, tags, colours)  # fmt: skip
    write_legend(files.map, files.qml, list(cmap.l3_names), colours)
    title = f"{run.name} on {item.region} ({run.selected} weights)"
    if item.predict_only:
        title += f", {item.year or 'its year'}: unscored, no labels"
    write_quicklook(files.map, files.png, cmap, title, colours)
    log.info("region %s: wrote %s, its legend and %s", item.region, files.map, files.png)


def map_regions(
    run: TrainedRun, cmap: ClassMap, spec: PredictSpec, run_on: Runtime,
    regions: list[RegionInput], staging: Staging, rank: int = 0, world: int = 1,
    launch_id: str = "single",
) -> None:  # fmt: skip
    """This rank's share of ``regions`` into ``staging``, kept where an earlier attempt made it;
    the last rank to finish publishes every map (see :mod:`emb.evaluation.region_maps`)."""
    mine = share_of_rank(regions, rank, world)
    log.info("rank %d of %d: %d of %d regions to map", rank, world, len(mine), len(regions))
    progress = Progress(len(mine), "regions", f"{run.name} maps", log)
    try:
        for item in mine:
            if staging.is_done(item):
                log.info("region %s: kept the map an earlier attempt made", item.region)
            else:
                try:
                    map_region(run, cmap, spec, run_on, item, staging.files(item.region))
                except Exception:
                    log.error("region %r (%s): its map failed; the maps done so far stay in %s",
                              item.region, item.raster, staging.folder)  # fmt: skip
                    raise
                staging.mark_done(item)
                log.info("region %s: staged (a later attempt keeps it)", item.region)
            progress.advance()
    except (Interrupted, KeyboardInterrupt):  # a time limit, a preemption: worth a retry
        staging.mark_stopped()
        log.warning("stopped by a signal; the maps done so far stay in %s", staging.folder)
        raise
    progress.done()
    if staging.finish(rank, world, launch_id, regions):
        log.info("published %d maps into %s", len(regions), staging.out_dir)


def map_identity(run: TrainedRun, spec: PredictSpec, run_on: Runtime, classes: Path) -> dict:
    """What a staged map must have been made by to be kept: weights, options, numerics."""
    return {"checkpoint": digest_file(run.path), "weights": run.selected,
            "spec": [spec.tile, spec.overlap, spec.block, spec.batch_size],
            "classes": digest_file(classes), "device": run_on.device.type,
            "precision": run_on.precision, "channels_last": run_on.channels_last}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="results/runs/{run}")
    parser.add_argument("--checkpoint", default="best.pt", help="file name inside --run-dir")
    parser.add_argument("--classes", type=Path, required=True, help="classes.csv")
    many = parser.add_argument_group("every region of a table (the rule; ranks share them)")
    many.add_argument("--regions", type=Path, help="regions.tsv: maps its rows with the source")
    many.add_argument("--out-dir", type=Path, help="results/maps/{run}")
    many.add_argument("--staging", type=Path, help="default: .partial/{run} beside --out-dir")
    many.add_argument("--with-probabilities", action="store_true",
                      help="also write {region}_probabilities.tif")  # fmt: skip
    one = parser.add_argument_group("one region")
    one.add_argument("--raster", type=Path, help="the region's embedding raster")
    one.add_argument("--region")
    one.add_argument("--cdl", type=Path, help="the region's CDL: its colour table colours the map")
    one.add_argument("--out", type=Path, help="results/maps/{run}/{region}.tif")
    one.add_argument("--png", type=Path, help="quicklook with legend")
    one.add_argument("--qml", type=Path, help="QGIS style with class names (default: beside --out)")
    one.add_argument("--probabilities", type=Path, help="also write per-class probabilities")
    # rule predict passes these from config predict: (by hand: the schema's defaults)
    parser.add_argument("--tile", type=int, help="window side (default: the training tile)")
    parser.add_argument(
        "--overlap", type=float, **config_option("predict.overlap", "fraction of the window")
    )
    parser.add_argument(
        "--block", type=int, **config_option("predict.block", "pixels per block side")
    )
    parser.add_argument(
        "--batch-size", type=int, **config_option("predict.batch_size", "windows per forward")
    )
    parser.add_argument(
        "--threads", type=int, **config_option("launch.threads", "CPU threads per process (no GPU)")
    )
    args = parser.parse_args(argv)
    wanted = ("regions", "out_dir") if args.regions or args.out_dir else ("raster", "region",
                                                                          "out", "png")  # fmt: skip
    missing = [f"--{name.replace('_', '-')}" for name in wanted if getattr(args, name) is None]
    if missing:
        parser.error(f"missing {', '.join(missing)}")
    return args


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cmap = load_class_map(args.classes)
    run = open_run(args.run_dir, cmap, args.classes, args.checkpoint)
    spec = PredictSpec(args.tile or run.tile_size, args.overlap, args.block, args.batch_size)
    tile = {} if args.tile else {"tile": f"the run's training tile ({run.path})"}
    spec.check(model_downsampling(run.cfg.model.arch, len(run.cfg.model.widths)), tile)
    run_on = run.runtime(Host.here(os.environ))  # the process's one runtime
    run_on.occupy(args.threads)
    if args.regions is None:
        files = MapFiles(args.out, args.png, args.qml or args.out.with_suffix(".qml"),
                         args.probabilities)  # fmt: skip
        map_region(run, cmap, spec, run_on, RegionInput(args.region, args.raster, args.cdl), files)
        return
    regions = regions_with(args.regions, run.cfg.data.source)
    staging_dir = args.staging or args.out_dir.parent / ".partial" / args.out_dir.name
    identity = map_identity(run, spec, run_on, args.classes)
    staging = Staging(staging_dir, args.out_dir, identity, args.with_probabilities)
    # one id per attempt (the launcher's), so no rank counts another attempt's as done
    launch_id = os.environ.get(LAUNCH_ID_ENV) or os.environ.get("TORCHELASTIC_RUN_ID", "single")
    map_regions(run, cmap, spec, run_on, regions, staging, rank, world, launch_id)


if __name__ == "__main__":
    main()
