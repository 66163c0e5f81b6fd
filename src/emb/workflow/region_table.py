"""The workflow's questions about the regions table, answered by name: which regions a source's
runs train on, which ones they map, whether a source holds only the demo's rasters (and so gets
the demo's tiling), the raster a job reads, a region's split and the draw it shares.

The workflow (``workflow/rules/common.smk``) builds one :class:`RegionTable` while it parses
and its input functions are one-liners over it; everything is computed once per source
because input functions run for every job of a 1,000-region DAG.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from emb.prep.data_settings import (
    data_settings as data_settings,  # the rules import emb.workflow only
)
from emb.prep.data_settings import tiling_in_force
from emb.prep.demo_region import DEMO_REGIONS, EMB_RES
from emb.prep.regions import RegionsError, is_predict_only
from emb.prep.regions import read_regions as read_regions  # the rules import emb.workflow only
from emb.prep.spatial_split import BlockGround, check_block_above_pixel, check_blocks_hold_splits
from emb.prep.tessera_npy import find_triple
from emb.rasters import SOURCES

if TYPE_CHECKING:
    from emb.workflow.region_checks import RegionChecks

CONVERTED_TESSERA = "results/converted/tessera/{region}.tif"  # rule tessera_npy's output
DEMO_NAMES = [region.name for region in DEMO_REGIONS]


def demo_rasters() -> list[str]:
    """The rasters rule demo_region writes (not made yet while the workflow parses, so the
    regions check skips them and a source listing only them is demo data)."""
    return [
        f"resources/demo/{name}/{kind}.tif"
        for name in DEMO_NAMES
        for kind in ("aef", "tessera", "cdl")
    ]


# The region ids the regions schema allows (workflow/schemas/regions.schema.yaml, its ``region``
# pattern without anchors): the workflow's wildcard constraint. Not the table's names joined
# (one_of): Snakemake writes a constraint into every file pattern of every rule that has the
# wildcard and scans those patterns for each file of each job, and 1,000 names made a
# 1,000-region dry run ~5% slower (bench/dry_run.py). A name the table lacks is refused by
# :meth:`RegionTable.cell` instead, naming it.
REGION_ID = "[a-z0-9_][a-z0-9_-]*"


def one_of(names: Iterable[object]) -> str:
    """A wildcard pattern matching exactly these names (escaped: a run's name or a demo region's
    may hold characters a regular expression reads otherwise)."""
    return "|".join(re.escape(str(name)) for name in names)


def check_tilings(config: Mapping, table: RegionTable, sources: Iterable[str]) -> None:
    """The tiling of each of ``sources`` (those the runs train on) as its shards jobs will get
    it, refused while the workflow is parsed when its stride leaves gaps between tiles
    (:meth:`emb.prep.data_settings.Tiling.tile_spec`), naming the keys it came from."""
    for source in sorted(set(sources)):
        tiling_in_force(config, table.is_demo_data(source)).tile_spec()


def split_group(checks: RegionChecks, source: str, region: str) -> dict[str, str]:
    """The id a region's split blocks are drawn with and the extent (``w,s,e,n``, '' for the
    region's own) they are drawn over: shared by the years of one ground, so that a block has
    one split in every year (``checks``: what the regions check learnt)."""
    extent = checks.split_extent(source, region)
    return {
        "key": checks.split_key(source, region),
        "extent": ",".join(f"{v:.6f}" for v in extent) if extent else "",
    }


def check_split_blocks(
    checks: RegionChecks,
    table: RegionTable,
    config: Mapping,
    file: str | Path,
    sources: Iterable[str] = SOURCES,
) -> None:
    """``splits.block_m`` against the extents of the regions of each of ``sources`` (those the
    runs train on), while the workflow is parsed
    (:func:`emb.prep.spatial_split.check_blocks_hold_splits`). A source with a raster not made
    yet (the demo's) is left to its jobs: its extent is unknown here."""
    for source in sorted(set(sources)):
        regions = table.training_regions(source)
        demo = table.is_demo_data(source)
        tiling = tiling_in_force(config, demo)
        block_m, key = float(tiling.splits["block_m"]), tiling.keys["splits.block_m"]
        prints = {f.key: f for f in checks.footprints.get(source, [])}
        if demo:  # the demo's rasters, not made yet: their pixel size alone is known
            check_block_above_pixel(source, block_m, EMB_RES, str(file), key)
            continue
        if not regions or any(r not in prints for r in regions):
            continue
        grounds = [
            BlockGround(
                r,
                prints[r].split or "auto",
                tuple(checks.split_extent(source, r) or prints[r].polygon().bounds),
                checks.split_key(source, r),
                prints[r].pixel_m,
            )
            for r in regions
        ]
        check_blocks_hold_splits(source, grounds, block_m, str(file), key)


def write_jobs_table(path: str, log: str, rows: str) -> None:
    """Rule regions_table's work (it runs where Snakemake runs): the jobs' table ``rows``
    (TSV text of :meth:`RegionTable.jobs_table`) to ``path``, their count to ``log``."""
    Path(path).write_text(rows, encoding="utf-8")
    Path(log).write_text(f"wrote {path}: {rows.count(chr(10)) - 1} regions\n")


def is_tessera_npy(path: str) -> bool:
    """geotessera's native tile (.npy + scales + landmask), converted by rule tessera_npy."""
    return str(path).lower().endswith(".npy")


@dataclass
class RegionTable:
    """The regions table (``read_regions``' frame, area rows appended) with its answers.

    ``generated``: the demo's rasters (made by rule demo_region): a source whose every training
    region lists only those is demo data (it gets the demo's small tiling and training overlay).
    """

    frame: pd.DataFrame
    generated: Iterable[str] = ()
    _training: dict[str, list[str]] = field(init=False, repr=False)
    _mapped: dict[str, list[str]] = field(init=False, repr=False)
    _demo: dict[str, bool] = field(init=False, repr=False)
    _cells: dict[str, dict[str, str]] = field(init=False, repr=False)  # column -> region -> cell

    def __post_init__(self) -> None:
        frame = self.frame
        # input functions ask for cells thousands of times: a dict, not the frame's lookup
        self._cells = {
            str(column): dict(zip(frame.index, map(str, frame[column]), strict=True))
            for column in frame.columns
        }
        splits = frame["split"] if "split" in frame else pd.Series("", frame.index)
        predict_only = splits.map(is_predict_only)
        generated = set(self.generated)
        self._training, self._mapped, self._demo = {}, {}, {}
        for source in SOURCES:
            has = frame[source] != "" if source in frame else pd.Series(False, frame.index)
            self._mapped[source] = list(frame.index[has])
            self._training[source] = list(frame.index[has & ~predict_only])
            training = self._training[source]
            self._demo[source] = bool(training) and all(
                frame.at[r, source] in generated for r in training
            )

    @property
    def regions(self) -> pd.Index:
        """Every region id, in table order."""
        return self.frame.index

    def training_regions(self, source: str) -> list[str]:
        """The regions a run of ``source`` trains on (and that are labelled, tiled, sharded and
        scored): those with a ``source`` raster whose split is not predict."""
        return self._training[source]

    def mapped_regions(self, source: str) -> list[str]:
        """Every region a run of ``source`` maps: its training regions and the prediction-only
        ones (split predict: mapped, never labelled or scored)."""
        return self._mapped[source]

    def regions_trained_by(self, run: str, run_sources: Mapping[str, str]) -> list[str]:
        """The regions run ``run`` trains on (``run_sources``: run -> its ``data.source``)."""
        return self.training_regions(run_sources[run])

    def is_demo_data(self, source: str) -> bool:
        """Every training region of ``source`` lists a raster the demo generates."""
        return self._demo[source]

    def split(self, region: str) -> str:
        """The region's split cell ('' when the table has none or the region is not in it:
        auto; ``is_predict_only`` of it says whether the region is only mapped)."""
        return self._cells.get("split", {}).get(region, "")

    def cell(self, region: str, column: str) -> str:
        """A cell as the table gives it ('' when empty or the table has no such column); a
        region the table lacks is an error naming it (a target such as
        results/labels/aef/<typo>.tif matches the rules' region pattern, REGION_ID)."""
        if column not in self._cells:
            return ""
        try:
            return self._cells[column][region]
        except KeyError:
            raise RegionsError(
                f"region {region!r} is not in the regions table (nor planned from the areas)"
            ) from None

    def raster_pixels(self, pixels: Mapping[str, int]) -> dict[tuple[str, str], int]:
        """Pixels of each (source, region)'s raster (``pixels``: raster -> pixel count, as the
        regions check read them; a raster not made yet counts as 0): what the resource
        functions of the per-region rules look up, once per job."""
        return {
            (source, region): pixels.get(self.cell(region, source), 0)
            for source in SOURCES
            for region in self.regions
        }

    def job_raster(self, region: str, source: str) -> str:
        """The raster the jobs read for a region's ``source`` cell: the cell's own file, or
        the GeoTIFF a geotessera .npy tile is converted into."""
        path = self.cell(region, source)
        if source == "tessera" and is_tessera_npy(path):
            return CONVERTED_TESSERA.format(region=region)
        return path

    def mapped_rasters(self, source: str) -> list[str]:
        """The rasters predict reads for a run of ``source``: every mapped region's."""
        return [self.job_raster(r, source) for r in self.mapped_regions(source)]

    def tessera_npy_inputs(self, region: str) -> dict[str, str]:
        """The three files of a region's geotessera .npy tile as rule tessera_npy's inputs (a
        changed scales or landmask file reruns the conversion)."""
        npy = find_triple(self.cell(region, "tessera"))
        return {"npy": str(npy.embedding), "scales": str(npy.scales), "landmask": str(npy.landmask)}

    def megapixels_mapped(self, source: str, pixels: Mapping[str, int]) -> float:
        """Megapixels a run of ``source`` maps (``pixels``: raster -> pixel count, as the
        regions check read them; a raster not made yet counts as 0): its predict's work."""
        rasters = [self.cell(r, source) for r in self.mapped_regions(source)]
        return sum(pixels.get(raster, 0) for raster in rasters) / 1e6

    def labelled_cdls(self, source: str) -> list[str]:
        """The CDL rasters of the regions a run of ``source`` maps (those that have one)."""
        return [c for r in self.mapped_regions(source) if (c := self.cell(r, "cdl"))]

    def jobs_table(self) -> pd.DataFrame:
        """The table as the jobs read it (results/regions.tsv): converted rasters in place of
        .npy tiles."""
        table = self.frame.copy()
        for source in SOURCES:
            if source in table:
                table[source] = [
                    self.job_raster(r, source) if c else c for r, c in table[source].items()
                ]
        return table
