"""Real products as their distributors ship them (issue 24), each run through Snakemake.

Every kind writes one real form at small size (real_forms.py: the public AEF COGs, Earth
Engine exports, geotessera's GeoTIFFs, mosaics and native ``.npy`` tiles, NASS's CDL), a regions
table naming it, and runs the workflow in a fresh working directory: a dry run (``-n``) where
the verdict is due before any job, a real run of the labels, shards or statistics where it is
about outputs. Accepted forms must give the right outputs (nodata labelled 255, a VRT mosaic's
labels and shards equal to one GeoTIFF's, float AEF within one int8 step of its source);
refused ones must fail with one line naming the file and what was found.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import rasterio
import real_forms as rf
import yaml
from conftest import REPO, venv_env
from rasterio.enums import Resampling
from shard_reader import iter_samples, to_float

pytestmark = pytest.mark.reliability

# Small tiling, given explicitly as a user may: 128 px grounds, 32 px tiles, 320 m blocks.
CONFIG = {"tiles": {"size": 32, "stride": 32}, "splits": {"block_m": 320},
          "shards": {"max_samples": 6}}  # fmt: skip
# A hang guard, not a claim: a run takes ~20 s on an idle 2-core machine; a limit of 60 s ended
# a run of labels and shards under a load of 7 (issue 50).
SNAKEMAKE_SECONDS = 600
ZEROS = (slice(16, 48), slice(16, 48))  # rows, cols of a patch of all-zero vectors
UTM15 = ("32615", "UTM zone 15", "zone 15")  # how the zone to warp to may be named
RANGE = ("range", "magnitude", "1e3", "1e+03", "1000", "1.6e5", "1.6e+05", "160000")
Needle = str | tuple[str, ...]  # a string, or alternatives of which one must appear


class Grounds:
    """Demo scenes written once per module (read-only): (region, seed) -> Ground."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.made = folder, {}

    def get(self, region: str = "demo_a", seed: int = 7) -> rf.Ground:
        if (region, seed) not in self.made:
            folder = self.folder / f"{region}_{seed}"
            self.made[region, seed] = rf.make_ground(folder, region, seed=seed)
        return self.made[region, seed]


@dataclass
class Run:
    rc: int
    text: str  # stdout, stderr and every job's log


class Work:
    """A fresh working directory as a user's checkout holds it (config/), inputs under in/."""

    def __init__(self, root: Path, grounds: Grounds) -> None:
        self.root, self.grounds = root, grounds
        (root / "in").mkdir(parents=True)
        shutil.copytree(REPO / "config", root / "config")

    def ground(self, region: str = "demo_a", seed: int = 7) -> rf.Ground:
        return self.grounds.get(region, seed)

    def path(self, name: str) -> Path:
        path = self.root / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def sibling(self, name: str) -> Work:
        """A second working directory (the same ground in a reference form)."""
        return Work(self.root.parent / name, self.grounds)

    def table(self, rows: list[dict]) -> None:
        cols = ["region", "year", "aef", "tessera", "cdl", "split"]
        cells = [[self._cell(r.get(c, "")) for c in cols] for r in rows]
        lines = ["\t".join(cols)] + ["\t".join(c) for c in cells]
        (self.root / "regions.tsv").write_text("\n".join(lines) + "\n")

    def _cell(self, value) -> str:
        """Paths inside the working directory relative to it, as users write them."""
        if isinstance(value, Path) and value.is_relative_to(self.root):
            return str(value.relative_to(self.root))
        return str(value)

    def snakemake(self, *targets: str, dry: bool = False, config: dict | None = CONFIG,
                  shell: bool = False) -> Run:  # fmt: skip
        args = ["--cores", "1", *(["-n"] if dry else []), *(["-p"] if shell else []), *targets]
        if config is not None:  # options taking several values after the targets
            (self.root / "real.yaml").write_text(yaml.safe_dump(config))
            args += ["--configfile", "real.yaml"]
        cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(self.root), *args,
               "--config", "regions=regions.tsv"]  # fmt: skip
        result = subprocess.run(cmd, cwd=self.root, env=venv_env(), capture_output=True,
                                text=True, timeout=SNAKEMAKE_SECONDS)  # fmt: skip
        logs = sorted((self.root / "logs").rglob("*.log")) if (self.root / "logs").exists() else []
        text = "\n".join([result.stdout, result.stderr, *(p.read_text() for p in logs)])
        return Run(result.returncode, text)

    def labels(self, source: str, region: str, like: Path | None = None) -> np.ndarray:
        """A label raster (a GeoTIFF whatever the input's driver); with ``like``, in the array
        order of that embedding file (labels may be written north-up)."""
        with rasterio.open(self.root / f"results/labels/{source}/{region}.tif") as src:
            assert src.driver == "GTiff", f"labels of {region} written as {src.driver}"
            data, transform = src.read(1), src.transform
        if like is None:
            return data
        with rasterio.open(like) as emb:
            if transform.almost_equals(emb.transform):
                return data
            top = emb.transform.f + emb.transform.e * emb.height
            flipped = transform.e == -emb.transform.e and np.isclose(transform.f, top)
            assert flipped, f"labels of {region} not on the grid of {like}: {transform}"
            return data[::-1]

    def samples(self, source: str, region: str) -> dict[tuple[int, int], tuple[str, dict]]:
        """(row, col) of each tile -> (its split, its decoded arrays)."""
        index = json.loads((self.root / f"results/shards/{source}/{region}/index.json").read_text())
        out = {}
        for split, part in index["splits"].items():
            paths = [str(self.root / s["path"]) for s in part["shards"]]
            for sample in iter_samples(paths):
                col, row = sample["meta"]["window"][:2]
                out[row, col] = (split, sample)
        return out


def row(region: str, year: int = 2024, **files: Path) -> dict:
    return {"region": region, "year": str(year), **files}


def outputs(source: str, *regions: str, shards: bool = True) -> list[str]:
    labels = [f"results/labels/{source}/{r}.tif" for r in regions]
    return labels + ([f"results/shards/{source}/{r}/index.json" for r in regions] if shards else [])


def tail(text: str, n: int = 3000) -> str:
    return text[-n:]


def accepted(run: Run) -> None:
    assert run.rc == 0, f"refused (exit {run.rc}):\n{tail(run.text)}"


def refused(run: Run, *needles: Needle) -> str:
    """The one line that names every needle (case-insensitive); the run must have failed."""
    assert run.rc != 0, f"accepted without a word:\n{tail(run.text, 1500)}"

    def has(line: str, needle: Needle) -> bool:
        options = (needle,) if isinstance(needle, str) else needle
        return any(o.lower() in line.lower() for o in options)

    lines = [line for line in run.text.splitlines() if all(has(line, n) for n in needles)]
    assert lines, f"no one line names {needles}:\n{tail(run.text)}"
    print(f"refused: {lines[0].strip()}")  # the closing note's verdict (pytest -rP shows it)
    return lines[0]


Case = Callable[[Work], None]
CASES: dict[str, tuple[Case, str]] = {}  # kind -> (case, the verdict it asserts)


def case(kind: str, verdict: str):
    def register(fn: Case) -> Case:
        # a second case of one kind would replace the first, which then never runs
        assert kind not in CASES, f"two real-form cases named {kind!r}"
        CASES[kind] = (fn, verdict)
        return fn

    return register


# --- AEF -------------------------------------------------------------------------------------


@case("aef: public COG (int8, nodata -128, bottom-up, overviews, A00..A63)",
      "accepted: labels 255 wherever -128, shards made")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    cog = rf.aef_cog(g, w.path("aef_cog.tif"))
    w.table([row("r1", aef=cog, cdl=g.cdl)])
    accepted(w.snakemake(*outputs("aef", "r1")))
    q = rf.read(cog)[0]
    labels = w.labels("aef", "r1", like=cog)
    assert (labels[(q == rf.AEF_NODATA).any(axis=0)] == 255).all()
    assert (labels != 255).mean() > 0.5
    assert w.samples("aef", "r1")


@case("aef: public COG with all-zero vectors", "accepted: labels 255 on the zero vectors")
def _(w: Work) -> None:
    g = w.ground()
    cog = rf.aef_cog(g, w.path("aef_cog_zeros.tif"), zeros=ZEROS)
    w.table([row("r1", aef=cog, cdl=g.cdl)])
    accepted(w.snakemake(*outputs("aef", "r1", shards=False)))
    labels = w.labels("aef", "r1", like=cog)
    patch = labels[ZEROS]
    assert (patch == 255).all(), f"{(patch != 255).sum()} of {patch.size} zero vectors labelled"


def ee_export_round_trip(w: Work, dtype: str) -> None:
    """An Earth Engine export (masked pixels 0, a patch of zero vectors): labels 255 on every
    zero vector; the shards' int8 within one step of the values it was de-quantized from."""
    g = w.ground()
    path = rf.aef_ee_export(g, w.path(f"aef_ee_{dtype}.tif"), dtype, zeros=ZEROS)
    w.table([row("r1", aef=path, cdl=g.cdl)])
    accepted(w.snakemake(*outputs("aef", "r1")))
    _, q, _, _ = rf.aef_float(g)  # north-up like the export, -128 where masked
    zero = (q == rf.AEF_NODATA).any(axis=0)
    zero[ZEROS] = True
    labels = w.labels("aef", "r1", like=path)
    assert (labels[zero] == 255).all(), f"{(labels[zero] != 255).sum()} zero vectors labelled"
    assert (labels[~zero] != 255).mean() > 0.5
    samples = w.samples("aef", "r1")
    assert samples
    worst = 0
    for (r, c), (_, arrays) in samples.items():
        emb = arrays["emb"].astype(np.int16)
        size = emb.shape[-1]
        valid = ~zero[r : r + size, c : c + size]
        step = np.abs(emb - q[:, r : r + size, c : c + size])[:, valid]
        worst = max(worst, int(step.max(initial=0)))
    assert worst <= 1, f"{dtype} AEF quantized {worst} int8 steps away from its source"


@case("aef: Earth Engine export, float32, masked pixels 0",
      "accepted: quantized within one int8 step, zero vectors labelled 255")  # fmt: skip
def _(w: Work) -> None:
    ee_export_round_trip(w, "float32")


@case("aef: Earth Engine export, float64, masked pixels 0",
      "accepted: quantized within one int8 step, zero vectors labelled 255")  # fmt: skip
def _(w: Work) -> None:
    ee_export_round_trip(w, "float64")


@case("aef: Earth Engine export with values outside [-1, 1]",
      "refused naming the file and the band, no shards")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    path = rf.aef_ee_export(g, w.path("aef_ee_scaled.tif"), out_of_range=(7, 3.5))
    w.table([row("r1", aef=path, cdl=g.cdl)])
    refused(w.snakemake(*outputs("aef", "r1")), "aef_ee_scaled.tif", ("A07", "band 8"))
    assert not (w.root / "results/shards/aef/r1/index.json").exists()


@case("aef: Earth Engine export in EPSG:4326",
      "refused before any job naming the CRS and the UTM zone to warp to")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    utm = rf.aef_ee_export(g, w.path("utm/aef_ee.tif"))
    path = rf.warp(utm, w.path("aef_ee_4326.tif"), "EPSG:4326", Resampling.nearest)
    w.table([row("r1", aef=path, cdl=g.cdl)])
    refused(w.snakemake(*outputs("aef", "r1"), dry=True), "aef_ee_4326.tif", "4326", UTM15)


def same_as_one_file(w: Work, source: str, mosaic: Path, single: Path, cdl: Path) -> None:
    """A mosaic's labels and shard tiles equal those of the same ground as one GeoTIFF (the
    statistics read only the shards)."""
    w.table([row("r1", **{source: mosaic}, cdl=cdl)])
    accepted(w.snakemake(*outputs(source, "r1")))
    ref = w.sibling("one_file")
    ref.table([row("r1", **{source: single}, cdl=cdl)])
    accepted(ref.snakemake(*outputs(source, "r1")))
    np.testing.assert_array_equal(w.labels(source, "r1"), ref.labels(source, "r1"))
    got, expected = w.samples(source, "r1"), ref.samples(source, "r1")
    assert got and sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for key, (split, arrays) in expected.items():
        assert got[key][0] == split, f"tile {key}: {got[key][0]}, one file: {split}"
        for name in ("emb", "scale", "label"):
            if name in arrays:
                np.testing.assert_array_equal(got[key][1][name], arrays[name], err_msg=name)


@case("aef: Earth Engine export as 2 x 2 tiles in a VRT (relative paths)",
      "accepted: labels and shard tiles equal those of one GeoTIFF")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    single = rf.aef_ee_export(g, w.path("whole/aef_ee.tif"), zeros=ZEROS)
    vrt = rf.vrt_mosaic(single, w.path("mosaic/aef_ee.vrt"), "aef_ee-{row:010d}-{col:010d}")
    same_as_one_file(w, "aef", vrt, single, g.cdl)


@case("aef: public COG tiles (bottom-up) as 2 x 2 in a VRT",
      "accepted: labels and shard tiles equal those of one GeoTIFF")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    single = rf.aef_cog(g, w.path("whole/aef_cog.tif"))
    vrt = rf.vrt_mosaic(single, w.path("mosaic/aef_cogs.vrt"))
    same_as_one_file(w, "aef", vrt, single, g.cdl)


# --- TESSERA ---------------------------------------------------------------------------------


@case("tessera: geotessera GeoTIFF (float32, no nodata tag) with all-zero vectors",
      "accepted: labels 255 on the zero vectors, shards made")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    path = rf.tessera_geotiff(g, w.path("tessera_2024.tif"), zeros=ZEROS)
    w.table([row("r1", tessera=path, cdl=g.cdl)])
    accepted(w.snakemake(*outputs("tessera", "r1")))
    zero = (rf.read(path)[0] == 0).all(axis=0)
    labels = w.labels("tessera", "r1", like=path)
    assert (labels[zero] == 255).all(), f"{(labels[zero] != 255).sum()} zero vectors labelled"
    assert (labels[~zero] != 255).mean() > 0.5
    assert w.samples("tessera", "r1")


@case("tessera: geotessera's merged mosaic in EPSG:3857 (bilinear)",
      "refused before any job naming the CRS and the UTM zone to warp to")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    tile = rf.tessera_geotiff(g, w.path("tiles/tessera_2024.tif"))
    path = rf.tessera_mosaic_3857(tile, w.path("tessera_mosaic_3857.tif"))
    w.table([row("r1", tessera=path, cdl=g.cdl)])
    dry = w.snakemake(*outputs("tessera", "r1"), dry=True)
    refused(dry, "tessera_mosaic_3857.tif", "3857", UTM15)


@case("tessera: geotessera GeoTIFFs as 2 x 2 tiles in a VRT (relative paths)",
      "accepted: labels and shard tiles equal those of one GeoTIFF")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    single = rf.tessera_geotiff(g, w.path("whole/tessera_2024.tif"), zeros=ZEROS)
    vrt = rf.vrt_mosaic(single, w.path("mosaic/tessera_2024.vrt"))
    same_as_one_file(w, "tessera", vrt, single, g.cdl)


def native_like_geotiff(w: Work, per_channel: bool) -> None:
    """geotessera's .npy triple: labels equal, and shard values within one int8 step of,
    those of a float32 GeoTIFF of the same de-quantized values."""
    g = w.ground()
    paths = rf.tessera_native(g, w.path("geotessera"), 2024, per_channel=per_channel)
    w.table([row("r1", tessera=paths["embedding"], cdl=g.cdl)])
    accepted(w.snakemake(*outputs("tessera", "r1")))
    values = rf.native_values(paths)  # NaN where the scale is NaN
    with rasterio.open(paths["landmask"]) as mask:
        crs, transform = mask.crs, mask.transform
    ref = w.sibling("geotiff")
    tif = rf.write(ref.path("tessera_2024.tif"), values.astype(np.float32), crs, transform)
    ref.table([row("r1", tessera=tif, cdl=g.cdl)])
    accepted(ref.snakemake(*outputs("tessera", "r1")))
    np.testing.assert_array_equal(w.labels("tessera", "r1"), ref.labels("tessera", "r1"))
    got, expected = w.samples("tessera", "r1"), ref.samples("tessera", "r1")
    assert got and sorted(got) == sorted(expected)
    for key, (split, arrays) in expected.items():
        assert got[key][0] == split
        a, b = to_float("tessera", got[key][1]), to_float("tessera", arrays)
        step = np.abs(b).max(axis=0) / 127 + 1e-6
        assert (np.abs(a - b) <= step * 1.01).all(), f"tile {key}: values differ"


@case("tessera: geotessera native .npy + per-pixel scales (H, W) + landmask",
      "accepted: labels and shards as a GeoTIFF of the same values")  # fmt: skip
def _(w: Work) -> None:
    native_like_geotiff(w, per_channel=False)


@case("tessera: geotessera native .npy + per-channel scales (H, W, 128) + landmask",
      "accepted: labels and shards as a GeoTIFF of the same values")  # fmt: skip
def _(w: Work) -> None:
    native_like_geotiff(w, per_channel=True)


@case("tessera: native .npy from geotessera's 2021 folder in a 2024 row",
      "refused naming the file and both years, no labels")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    paths = rf.tessera_native(g, w.path("geotessera"), 2021)
    w.table([row("r1", 2024, tessera=paths["embedding"], cdl=g.cdl)])
    refused(w.snakemake(*outputs("tessera", "r1")), paths["embedding"].name, "2021", "2024")
    assert not (w.root / "results/labels/tessera/r1.tif").exists()


@case("tessera: TESSERA_YEAR tag contradicting the table's year",
      "refused before any job naming the file, the tag and its value")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    path = rf.tessera_geotiff(g, w.path("tessera_tile.tif"), year=2021)
    w.table([row("r1", 2024, tessera=path, cdl=g.cdl)])
    dry = w.snakemake(*outputs("tessera", "r1"), dry=True)
    refused(dry, "tessera_tile.tif", "TESSERA_YEAR", "2021")


@case("tessera: dataset versions mixed within the source (v1 beside v1.1)",
      "refused before any job naming the file, the tag and the value")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    west = rf.tessera_geotiff(g, w.path("tessera_west.tif"), version="v1",
                              window=(slice(None), slice(0, 68)))  # fmt: skip
    east = rf.tessera_geotiff(g, w.path("tessera_east.tif"), version="v1.1",
                              window=(slice(None), slice(68, 136)))  # fmt: skip
    w.table([row("west", tessera=west, cdl=g.cdl), row("east", tessera=east, cdl=g.cdl)])
    dry = w.snakemake(*outputs("tessera", "west", "east"), dry=True)
    refused(dry, ("tessera_west.tif", "tessera_east.tif"), "TESSERA_DATASET_VERSION", "1.1")


@case("tessera: a tile with a broken scale (values near -1.6e5)",
      "refused naming the file before shards and statistics")  # fmt: skip
def _(w: Work) -> None:
    a, b = w.ground("demo_a"), w.ground("demo_b")
    good = rf.tessera_geotiff(a, w.path("tessera_a.tif"))
    fine = rf.tessera_geotiff(b, w.path("fine/tessera_b.tif"))
    broken = rf.broken_scale(fine, w.path("tessera_b_broken.tif"))
    w.table([row("a", tessera=good, cdl=a.cdl), row("b", tessera=broken, cdl=b.cdl)])
    run = w.snakemake("results/stats/tessera/stats.json")
    refused(run, "tessera_b_broken.tif", RANGE)
    assert not (w.root / "results/shards/tessera/b/index.json").exists(), "broken tile sharded"
    assert not (w.root / "results/stats/tessera/stats.json").exists()


# --- CDL -------------------------------------------------------------------------------------


@case("cdl: NASS national CDL (Albers WKT without EPSG, colour table, 2024_30m_cdls.tif)",
      "accepted: labels equal those of the same CDL in EPSG:5070")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    cog = rf.aef_cog(g, w.path("aef.tif"))
    cdl = rf.nass_cdl(g, w.path("cdl"), 2024)
    w.table([row("r1", aef=cog, cdl=cdl)])
    accepted(w.snakemake(*outputs("aef", "r1", shards=False)))
    ref = w.sibling("epsg5070")
    ref.table([row("r1", aef=cog, cdl=g.cdl)])
    accepted(ref.snakemake(*outputs("aef", "r1", shards=False)))
    np.testing.assert_array_equal(w.labels("aef", "r1"), ref.labels("aef", "r1"))


@case("cdl: NASS 10 m CDL (2024_10m_cdls.tif)",
      "accepted: labels those of the 30 m CDL it refines")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    cog = rf.aef_cog(g, w.path("aef.tif"))
    cdl10 = rf.nass_cdl(g, w.path("cdl10"), 2024, resolution=10)
    w.table([row("r1", aef=cog, cdl=cdl10)])
    accepted(w.snakemake(*outputs("aef", "r1", shards=False)))
    ref = w.sibling("cdl30")
    ref.table([row("r1", aef=cog, cdl=rf.nass_cdl(g, ref.path("cdl30"), 2024))])
    accepted(ref.snakemake(*outputs("aef", "r1", shards=False)))
    got, expected = w.labels("aef", "r1"), ref.labels("aef", "r1")
    assert (got == expected).mean() > 0.99 and (got != 255).mean() > 0.5


@case("cdl: NASS file name's year contradicting the table (2021_30m_cdls.tif in 2024)",
      "refused before any job naming the file and both years")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    cog = rf.aef_cog(g, w.path("aef.tif"))
    cdl = rf.nass_cdl(g, w.path("cdl"), 2021)
    w.table([row("r1", 2024, aef=cog, cdl=cdl)])
    refused(w.snakemake(*outputs("aef", "r1"), dry=True), "2021_30m_cdls.tif", "2024")


# --- areas and years -------------------------------------------------------------------------


@case("area: one area delivered in two UTM zones as two regions of one year",
      "refused before any job naming both files and the overlap")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    z15 = rf.aef_cog(g, w.path("aef_utm15.tif"))
    z14 = rf.warp(z15, w.path("aef_utm14.tif"), "EPSG:32614", Resampling.nearest, 10.0)
    w.table([row("z15", aef=z15, cdl=g.cdl), row("z14", aef=z14, cdl=g.cdl)])
    dry = w.snakemake(*outputs("aef", "z15", "z14"), dry=True)
    refused(dry, "aef_utm15.tif", "aef_utm14.tif", "overlap")


@case("area: two tiles sharing an edge as two regions of one year",
      "accepted before any job (a shared edge is no overlap)")  # fmt: skip
def _(w: Work) -> None:
    g = w.ground()
    whole = rf.aef_cog(g, w.path("whole/aef.tif"))
    west = rf.crop(whole, w.path("aef_west.tif"), slice(None), slice(0, 64))
    east = rf.crop(whole, w.path("aef_east.tif"), slice(None), slice(64, 128))
    w.table([row("west", aef=west, cdl=g.cdl), row("east", aef=east, cdl=g.cdl)])
    accepted(w.snakemake(*outputs("aef", "west", "east"), dry=True))


@case("area: the same ground in two years (2023 and 2024 on one grid)",
      "accepted; every tile in the same split in both years")  # fmt: skip
def _(w: Work) -> None:
    g23, g24 = w.ground(seed=8), w.ground(seed=7)  # same grid, other fields
    rows = []
    for year, g in ((2023, g23), (2024, g24)):
        aef = rf.aef_cog(g, w.path(f"{year}/aef.tif"))
        rows.append(row(f"y{year}", year, aef=aef, cdl=rf.nass_cdl(g, w.path(f"{year}"), year)))
    w.table(rows)
    accepted(w.snakemake(*outputs("aef", "y2023", "y2024")))
    s23, s24 = w.samples("aef", "y2023"), w.samples("aef", "y2024")
    common = sorted(set(s23) & set(s24))
    assert len(common) >= 4 and len({s23[k][0] for k in common}) >= 2, common
    differ = {k: (s23[k][0], s24[k][0]) for k in common if s23[k][0] != s24[k][0]}
    assert not differ, f"tiles in another split in 2023 than in 2024: {differ}"


@case("own data: a user's table with no tiling of its own",
      "accepted: shards at the schema's tiles (256 px), blocks (5120 m), shards (256)")  # fmt: skip
def _(w: Work) -> None:
    g = rf.make_ground(w.root / "ground", size=384)  # the shared 128-px ground: no 256-px tile
    cog = rf.aef_cog(g, w.path("aef.tif"))
    w.table([row("r1", aef=cog, cdl=g.cdl)])
    run = w.snakemake("results/shards/aef/r1/index.json", config=None, shell=True)
    accepted(run)
    commands = [line for line in run.text.splitlines() if "emb.prep.shards" in line]
    assert commands, tail(run.text)
    for option in ("--tile-size=256", "--block-m=5120", "--max-samples=256"):
        assert option in commands[0], f"{option} not in {commands[0]}"
    samples = w.samples("aef", "r1")  # and the shards written hold 256-px tiles
    assert samples, tail(run.text)
    for _, sample in samples.values():
        assert sample["emb"].shape == (64, 256, 256) and sample["label"].shape == (256, 256)


# --- the family ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grounds(tmp_path_factory: pytest.TempPathFactory) -> Grounds:
    return Grounds(tmp_path_factory.mktemp("grounds"))


@pytest.mark.check("real_forms")
@pytest.mark.parametrize("kind", [pytest.param(k, id=f"real_forms-{k}") for k in CASES])
def test_real_form_is_accepted_correctly_or_refused_by_name(
    kind: str, grounds: Grounds, tmp_path: Path
) -> None:
    CASES[kind][0](Work(tmp_path / "work", grounds))
