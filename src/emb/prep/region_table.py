"""The workflow's questions about the regions table, answered by name: which regions a source's
runs train on, which ones they map, whether a source holds only the demo's rasters, the raster
a job reads and a region's split.

The workflow (``workflow/rules/common.smk``) builds one :class:`RegionTable` while it parses
and its input functions are one-liners over it; everything is computed once per source
because input functions run for every job of a 1,000-region DAG.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pandas as pd

from emb.prep.region_rows import is_predict_only
from emb.rasters import SOURCES

CONVERTED_TESSERA = "results/converted/tessera/{region}.tif"  # rule tessera_npy's output


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

    def __post_init__(self) -> None:
        frame = self.frame
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
        if "split" not in self.frame or region not in self.frame.index:
            return ""
        return str(self.frame.at[region, "split"])

    def cell(self, region: str, column: str) -> str:
        """A cell as the table gives it ('' when empty)."""
        return str(self.frame.at[region, column]) if column in self.frame else ""

    def job_raster(self, region: str, source: str) -> str:
        """The raster the jobs read for a region's ``source`` cell: the cell's own file, or
        the GeoTIFF a geotessera .npy tile is converted into."""
        path = self.cell(region, source)
        if source == "tessera" and is_tessera_npy(path):
            return CONVERTED_TESSERA.format(region=region)
        return path

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
