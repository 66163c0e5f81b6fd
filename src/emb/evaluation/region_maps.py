"""One prediction job maps every region of a run: regions spread over ranks, maps staged.

On a cluster a SLURM job per map drowns the queue (1,000 regions x 4 runs were 4,000 jobs), so
``predict`` runs once per run, through the same launcher as training and evaluation: torchrun
starts one process per GPU (or per CPU slot), and each rank maps its share of the regions. The
share is fixed by the regions' pixel counts alone (largest first, each to the least loaded
rank), so every rank computes the same split without talking to the others, and a map does not
depend on how many processes made it.

Maps are written into a staging folder, one region at a time (each file atomically), with a
marker naming what made it. Only when every rank has finished are the files moved into the
job's output folder, which Snakemake deletes when a job fails; the staging folder survives a
failure, a time limit or a preemption, and the next attempt keeps every map whose marker still
matches (same checkpoint, options and input rasters) instead of computing it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import rasterio
from rasterio.errors import RasterioIOError

from emb.io import write_json
from emb.prep.regions import PREDICT, read_regions

LOCK_SUFFIX = ".lock"


class RegionMapsError(ValueError):
    """A region list or staging folder that a prediction job cannot use."""


@dataclass(frozen=True)
class RegionInput:
    """One region to map: its id, embedding raster and (optional) CDL for the colours."""

    region: str
    raster: Path
    cdl: Path | None = None
    year: str = ""
    predict_only: bool = False  # split predict: no labels, never scored
    training_years: str = ""  # the years of the table's labelled regions of the source


@dataclass(frozen=True)
class MapFiles:
    """The files of one region's map inside a folder."""

    map: Path
    png: Path
    qml: Path
    probabilities: Path | None

    @classmethod
    def of(cls, folder: Path, region: str, probabilities: bool) -> MapFiles:
        prob = folder / f"{region}_probabilities.tif" if probabilities else None
        return cls(folder / f"{region}.tif", folder / f"{region}.png", folder / f"{region}.qml",
                   prob)  # fmt: skip


TRAINED_SPLITS = ("", "auto", "train")  # rows whose tiles train a model (auto: some of them)


def regions_with(table: Path, source: str) -> list[RegionInput]:
    """The regions of ``table`` (regions.tsv) that have a ``source`` raster, in table order."""
    rows = read_regions(table)
    if source not in rows.columns:
        raise RegionMapsError(f"{table}: no column {source!r}; expected one naming its rasters")
    trained = [rec for _, rec in rows.iterrows() if rec[source] and rec.get("split", "") in
               TRAINED_SPLITS]  # fmt: skip
    years = ",".join(sorted({str(rec.get("year", "")) for rec in trained} - {""}))
    regions = [
        RegionInput(
            str(region),
            Path(rec[source]),
            Path(rec["cdl"]) if rec.get("cdl") else None,
            str(rec.get("year", "")),
            rec.get("split") == PREDICT,
            years,
        )  # fmt: skip
        for region, rec in rows.iterrows()
        if rec[source]
    ]
    if not regions:
        raise RegionMapsError(f"{table}: no region has a {source} raster; nothing to map")
    return regions


def pixels(raster: Path) -> int:
    """The raster's pixel count; 0 when it cannot be opened, so that its region comes last and
    fails, named, after the others are staged."""
    try:
        with rasterio.open(raster) as src:
            return src.width * src.height
    except (RasterioIOError, OSError):
        return 0


def share_of_rank(regions: list[RegionInput], rank: int, world: int) -> list[RegionInput]:
    """This rank's regions: largest first, each to the rank with the fewest pixels so far
    (ties to the lower rank), the same on every rank."""
    if not 0 <= rank < world:
        raise RegionMapsError(f"rank {rank} of {world}: expected 0 <= rank < world size")
    sized = sorted(((pixels(r.raster), r.region, r) for r in regions), key=lambda t: (-t[0], t[1]))
    load = [0] * world
    mine = []
    for size, _, region in sized:
        target = min(range(world), key=lambda k: (load[k], k))
        load[target] += size
        if target == rank:
            mine.append(region)
    return mine


def aux_xml(tif: Path) -> Path:
    return tif.with_name(tif.name + ".aux.xml")


def _stat(path: Path | None) -> list[int | str] | None:
    if path is None:
        return None
    info = path.stat()
    return [str(path), info.st_size, info.st_mtime_ns]


class Staging:
    """The folder where one run's maps wait until every rank is done."""

    def __init__(self, folder: Path, out_dir: Path, identity: dict, probabilities: bool) -> None:
        self.folder, self.out_dir = Path(folder), Path(out_dir)
        self.identity, self.probabilities = identity, probabilities

    def files(self, region: str) -> MapFiles:
        return MapFiles.of(self.folder, region, self.probabilities)

    def _marker(self, region: str) -> Path:
        return self.folder / f".{region}.done.json"

    def _stamp(self, item: RegionInput) -> dict:
        return {"made_by": self.identity, "raster": _stat(item.raster), "cdl": _stat(item.cdl)}

    def is_done(self, item: RegionInput) -> bool:
        """The region's files are staged, made by this checkpoint and these options from these
        rasters (an earlier attempt of the job made them)."""
        marker = self._marker(item.region)
        try:
            stamp = json.loads(marker.read_text())
        except (OSError, ValueError):
            return False
        files = [*self._made(item.region), aux_xml(self.files(item.region).map)]  # + GDAL's names
        return stamp == self._stamp(item) and all(f.is_file() for f in files)

    def mark_done(self, item: RegionInput) -> None:
        write_json(self._marker(item.region), self._stamp(item))

    @property
    def stopped(self) -> Path:
        """Written when a signal stopped the job (the launcher's ``--checkpoint``: exit 75, so
        Snakemake's retry maps the rest)."""
        return self.folder / ".stopped"

    def mark_stopped(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stopped.touch()

    def _made(self, region: str) -> list[Path]:
        return [Path(f) for f in asdict(self.files(region)).values() if f is not None]

    def published_files(self, region: str) -> list[Path]:
        """The region's staged files, GDAL's side files (``.aux.xml``) included."""
        files = self._made(region)
        side = [aux_xml(f) for f in files if f.suffix == ".tif"]
        return files + [f for f in side if f.is_file()]

    def finish(self, rank: int, world: int, launch_id: str, regions: list[RegionInput]) -> bool:
        """Note this rank as done; the last rank to finish moves the files of ``regions`` into
        the output folder and removes the staging folder (with whatever else an earlier attempt
        left there). True when this rank published."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f".rank-{launch_id}-{rank}-of-{world}").touch()
        lock = self.folder.with_name(self.folder.name + LOCK_SUFFIX)
        with _locked(lock):
            ranks = [self.folder / f".rank-{launch_id}-{r}-of-{world}" for r in range(world)]
            if not self.folder.is_dir() or not all(p.exists() for p in ranks):
                return False
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for item in regions:
                for path in self.published_files(item.region):
                    os.replace(path, self.out_dir / path.name)
            shutil.rmtree(self.folder)
            lock.unlink(missing_ok=True)  # a rank still waiting on it finds the folder gone
        with suppress(OSError):
            self.folder.parent.rmdir()  # the .partial folder, when no other run uses it
        return True


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
