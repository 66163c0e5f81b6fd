"""Memory and time the per-region and per-source stages ask SLURM for, from measured peaks.

``bench/memory.py`` runs each stage on rasters of several sizes and records its peak RSS (what
the rules' ``benchmark:`` files call ``max_rss``) and its time; ``PEAKS`` holds the fitted lines
``base + growth x megapixels``. A job asks for ``MARGIN`` times its line, in whole 100 MB, and
twice that at every retry: a job killed for memory (exit 137, OOM in its SLURM log) is the one
failure besides a stop at the time limit that a retry can fix, and Snakemake hands the retry's
``attempt`` to the resource. Time: ``TIME_MARGIN`` times the measured seconds (shared file
systems are slower than this machine's disk) plus ``START_MIN``, at least ``FLOOR_MIN``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from emb.workflow.signatures import known_parameters

MARGIN = 1.5  # over the measured peak: other GDAL builds and file systems, allocator slack
FLOOR_MB = 500  # the least a stage asks for: Python with numpy, rasterio and GDAL loaded
TIME_MARGIN = 10
START_MIN = 5
FLOOR_MIN = 10


@dataclass(frozen=True)
class Peak:
    """A stage's measured peak RSS (MiB) and time (s): ``base + per_mpx`` x megapixels."""

    base_mib: float
    per_mpx_mib: float
    base_s: float
    per_mpx_s: float


# bench/memory.py, 2026-11-25, this 2-core machine (rasterio's GDAL, ext4): peak RSS of AEF
# (64 x int8) rasters of 1, 17 and 67 megapixels and TESSERA (128 x float32) of 0.26, 1 and 4;
# seconds from the quiet first pass. align_labels reads 512 x 512 windows under a 64 MB GDAL
# cache: flat (a TESSERA window is 128 MiB); shards grows by about 1 MiB per megapixel;
# channel_stats reads its sampled tiles, not the rasters. Keys: (stage, source).
PEAKS: dict[tuple[str, str], Peak] = {
    ("align_labels", "aef"): Peak(192, 0.0, 0.5, 0.2),
    ("align_labels", "tessera"): Peak(350, 0.0, 3.0, 1.0),
    ("shards", "aef"): Peak(146, 1.1, 1.0, 1.8),
    ("shards", "tessera"): Peak(184, 1.0, 2.0, 20.0),
    ("channel_stats", "aef"): Peak(330, 0.0, 5.0, 0.0),
    ("channel_stats", "tessera"): Peak(320, 0.0, 7.0, 0.0),
}


def mem_mb(stage: str, pixels: float, source: str, attempt: int = 1) -> int:
    """MB a ``stage`` job on a raster of ``pixels`` pixels of ``source`` asks for at its
    ``attempt``-th try."""
    peak = PEAKS[(stage, source)]
    mib = peak.base_mib + peak.per_mpx_mib * pixels / 1e6
    mb = max(FLOOR_MB, MARGIN * mib * 1.048576)
    return int(math.ceil(mb / 100) * 100) * 2 ** (max(1, attempt) - 1)


def runtime(stage: str, pixels: float, source: str) -> int:
    """Minutes a ``stage`` job on a raster of ``pixels`` pixels of ``source`` asks for."""
    peak = PEAKS[(stage, source)]
    seconds = peak.base_s + peak.per_mpx_s * pixels / 1e6
    return max(FLOOR_MIN, math.ceil(TIME_MARGIN * seconds / 60) + START_MIN)


# evaluate and predict, per launched process (torchrun worker, CPU, the demo's SegFormer and
# DeepLab): evaluate 446 MiB; predict 490 MiB, plus about 450 bytes per pixel of its block
# (256: 759, 512: 840, 1024: 1220 MiB on a 2048 x 2048 AEF raster) plus the raster's bytes up
# to GDAL's block cache, which predict leaves at GDAL's default, 5% of the machine's memory
# (block 256: 559, 759, 1089 MiB at 1, 4 and 9.4 megapixels; 1229 MiB on this 24 GB machine).
PROCESS_BASE_MIB = {"evaluate": 446.0, "predict": 490.0}
BLOCK_BYTES_PER_PIXEL = 450
RASTER_BYTES_PER_PIXEL = {"aef": 64, "tessera": 512}  # 64 x int8, 128 x float32
GDAL_DEFAULT_CACHE_MIB = 1229


def launched_mem_mb(
    stage: str, processes: int, attempt: int = 1, block: int = 0, pixels: float = 0,
    source: str = "aef",
) -> int:  # fmt: skip
    """MB an ``evaluate`` or ``predict`` job of ``processes`` processes per node asks for
    (predict: ``block`` pixels per side, its largest raster ``pixels`` of ``source``)."""
    mib = PROCESS_BASE_MIB[stage]
    if stage == "predict":
        raster = RASTER_BYTES_PER_PIXEL[source] * pixels / 2**20
        mib += BLOCK_BYTES_PER_PIXEL * block**2 / 2**20 + min(raster, GDAL_DEFAULT_CACHE_MIB)
    mb = max(FLOOR_MB, MARGIN * mib * 1.048576) * max(1, processes)
    return int(math.ceil(mb / 100) * 100) * 2 ** (max(1, attempt) - 1)


# The rules' resource functions. Snakemake calls them once for every job of the DAG (2,000 shards
# jobs for 1,000 regions x 2 sources), so each one is a lookup in ``pixels``, computed once
# while the workflow parses (RegionTable.raster_pixels: (source, region) -> pixels of its raster).
RegionPixels = Mapping[tuple[str, str], int]


def region_mem_mb(stages: tuple[str, ...], pixels: RegionPixels) -> Callable[[Any, int], int]:
    """``mem_mb`` of a per-(source, region) rule running ``stages`` one after another (rule
    shards: align_labels, then shards): the largest of their peaks on its raster, doubled per
    retry (one process at a time, so the peaks never add up)."""

    @known_parameters
    def region_mem_mb(wildcards: Any, attempt: int) -> int:
        size = pixels.get((wildcards.source, wildcards.region), 0)
        return max(mem_mb(stage, size, wildcards.source, attempt) for stage in stages)

    return region_mem_mb


def region_runtime(stages: tuple[str, ...], pixels: RegionPixels) -> Callable[[Any], int]:
    """``runtime`` (minutes) of a per-(source, region) rule running ``stages`` one after
    another: the sum of their times on its raster (what the grouped SLURM job asked for when
    each stage was a job of its own)."""

    @known_parameters
    def region_runtime(wildcards: Any) -> int:
        size = pixels.get((wildcards.source, wildcards.region), 0)
        return sum(runtime(stage, size, wildcards.source) for stage in stages)

    return region_runtime


def source_mem_mb(stage: str) -> Callable[[Any, int], int]:
    """``mem_mb`` of a per-source rule (its peak does not grow with the rasters)."""

    def source_mem_mb(wildcards: Any, attempt: int) -> int:
        return mem_mb(stage, 0, wildcards.source, attempt)

    return source_mem_mb


def run_mem_mb(
    stage: str,
    processes: object,
    run_sources: Mapping[str, str],
    regions_of: Callable[[str], Iterable[str]],
    pixels: RegionPixels,
    block: int = 0,
) -> Callable[[Any, int], int]:
    """``mem_mb`` of ``evaluate`` or ``predict`` (one job per run): :func:`launched_mem_mb` for
    the profile's ``processes`` per node (tasks_per_node; 1 where it states none), the largest
    raster of the regions the run's source reads (``regions_of``: source -> regions) and
    predict's ``block``, doubled per retry."""
    per_node = processes if isinstance(processes, int) and processes else 1
    largest = {
        source: max((pixels.get((source, r), 0) for r in regions_of(source)), default=0)
        for source in set(run_sources.values())
    }

    def run_mem_mb(wildcards: Any, attempt: int) -> int:
        source = run_sources[wildcards.run]
        return launched_mem_mb(
            stage, per_node, attempt, block=block, pixels=largest[source], source=source
        )

    return run_mem_mb
