"""Settings refused while the workflow is parsed, in one line naming the key and a value that
works (issue 51, items 1, 2, 3, 10 and 11): the tiles and windows each run's model must map,
a stride that leaves gaps between tiles, a split block below a pixel (a MemoryError before),
and fixed splits that leave a split without a region (a message that read "(; fixed
splits ['train'])")."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rasterio
import yaml
from affine import Affine
from conftest import CLASSES_CSV, REPO, venv_env
from rasterio.crs import CRS
from rasterio.transform import from_origin
from snakemake.utils import validate
from workflow_runs import make_workdir, snakemake

from emb.classes import load_class_map
from emb.estimation.design import draw_points
from emb.estimation.sample_files import SamplePaths, write_sample
from emb.evaluation.predict_spec import PredictSettingsError
from emb.prep.demo_region import DEMO_REGIONS, write_region
from emb.prep.footprints import Footprint
from emb.prep.spatial_split import (
    BlockGround,
    SplitBlocksError,
    TilingError,
    check_blocks_hold_splits,
)
from emb.workflow.parsed_runs import check_windows
from emb.workflow.region_checks import RegionChecks
from emb.workflow.region_table import RegionTable, check_split_blocks, demo_rasters

SCHEMA_CONFIG = yaml.safe_load((REPO / "config/config.yaml").read_text())
validate(SCHEMA_CONFIG, str(REPO / "workflow/schemas/config.schema.yaml"))  # the defaults filled
SEGFORMER = {"model": {"arch": "segformer", "widths": [16, 32, 64, 128]}}
DEEPLAB = {"model": {"arch": "deeplab", "widths": [16, 32, 64, 128]}}


def merged(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` at every depth, as Snakemake merges a --configfile."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both else value
    return out


def config(**sections: dict) -> dict:
    """config.yaml with ``sections`` merged over it."""
    return merged(SCHEMA_CONFIG, sections)


def table(demo: bool) -> RegionTable:
    """One AEF region: the demo's raster (demo data: the demo overlay applies), or one's own."""
    aef = demo_rasters()[0] if demo else "mine/aef.tif"
    row = {"region": "r", "year": "2024", "aef": aef, "tessera": "", "cdl": "c.tif",
           "split": "auto"}  # fmt: skip
    frame = pd.DataFrame([row]).set_index("region", drop=False)
    return RegionTable(frame, generated=demo_rasters())


def windows_refusal(settings: dict, run_config: dict = SEGFORMER, demo: bool = False) -> str:
    with pytest.raises((PredictSettingsError, TilingError)) as err:
        check_windows(settings, table(demo), {"run1": "aef"}, {"run1": run_config})
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    ("settings", "demo", "needles"),
    [
        ({"tiles": {"size": 40}}, False, ["config tiles.size 40", "multiple of 32",
                                          "e.g. 32 or 64", "run 'run1' (segformer, 4 stages)"]),
        ({"demo": {"overlay": {"tiles": {"size": 40, "stride": 40}}}}, True,
         ["config demo.overlay.tiles.size 40", "multiple of 32"]),
        ({"predict": {"tile": 48}}, False, ["config predict.tile 48", "multiple of 32"]),
        ({"tiles": {"size": 40}, "predict": {"tile": 32}}, False,  # trained and scored at 40
         ["config tiles.size 40", "multiple of 32"]),
        ({"tiles": {"size": 32}, "predict": {"overlap": 0.99}}, False,
         ["config predict.overlap 0.99", "at 32-px windows the stride", "is 0 px",
          "at most 0.96875"]),
        ({"predict": {"batch_size": 0}}, False, ["config predict.batch_size 0", ">= 1"]),
    ],
)  # fmt: skip
def test_a_tile_or_window_the_model_cannot_map_names_its_key(
    settings: dict, demo: bool, needles: list[str]
) -> None:
    found = windows_refusal(config(**settings), demo=demo)
    for needle in needles:
        assert needle in found, (needle, found)


def test_deeplab_maps_multiples_of_16_and_the_defaults_pass() -> None:
    check_windows(config(tiles={"size": 48}), table(False), {"d": "aef"}, {"d": DEEPLAB})
    assert "multiple of 16" in windows_refusal(config(tiles={"size": 40}), DEEPLAB)
    for demo in (False, True):  # config.yaml as it is, own data and the demo's
        check_windows(config(), table(demo), {"s": "aef", "d": "aef"},
                      {"s": SEGFORMER, "d": DEEPLAB})  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "demo", "keys"),
    [
        ({"tiles": {"size": 32, "stride": 48}}, False, ("tiles.stride 48", "tiles.size 32")),
        ({"demo": {"overlay": {"tiles": {"size": 32}}}}, True,  # the overlay's stride 64 stays
         ("demo.overlay.tiles.stride 64", "demo.overlay.tiles.size 32")),
    ],
)  # fmt: skip
def test_a_stride_past_the_tile_is_refused_with_the_share_the_gaps_leave_out(
    settings: dict, demo: bool, keys: tuple[str, str]
) -> None:
    found = windows_refusal(config(**settings), demo=demo)
    assert f"config {keys[0]} is larger than {keys[1]}" in found
    size, stride = (int(k.split()[-1]) for k in keys[::-1])
    assert f"leave {1 - (size / stride) ** 2:.0%} of the pixels" in found
    assert f"at most {size}" in found


def test_a_stride_equal_to_the_tile_or_below_passes() -> None:
    check_windows(config(tiles={"size": 64, "stride": 64}), table(False), {"r": "aef"},
                  {"r": SEGFORMER})  # fmt: skip
    check_windows(config(tiles={"size": 64, "stride": 32}), table(False), {"r": "aef"},
                  {"r": SEGFORMER})  # fmt: skip


def ground(pixel_m: float = 10.0, split: str = "auto", region: str = "r") -> BlockGround:
    return BlockGround(region, split, (500_000.0, 4_000_000.0, 505_000.0, 4_005_000.0), region,
                       pixel_m)  # fmt: skip


def test_a_block_below_a_pixel_is_refused_before_any_block_is_counted() -> None:
    """5 km at 1 mm blocks: 25 trillion blocks, which the count listed (MemoryError)."""
    with pytest.raises(SplitBlocksError) as err:
        check_blocks_hold_splits("aef", [ground()], 0.001, "regions.tsv")
    assert str(err.value).startswith("regions.tsv: splits.block_m 0.001 m: expected at least ")
    assert "pixel size of the aef rasters (10 m)" in str(err.value)
    check_blocks_hold_splits("aef", [ground()], 10.0, "regions.tsv")  # a pixel: 250,000 blocks


def test_the_workflows_block_check_names_the_key_for_own_data_and_the_demo(tmp_path: Path) -> None:
    own = table(False)
    prints = [Footprint("r", "regions.tsv row 2", "mine/aef.tif", "2024",
                        CRS.from_epsg(32615), Affine(10, 0, 500_000, 0, -10, 4_005_000),
                        (500, 500), "auto")]  # fmt: skip
    checks = RegionChecks(footprints={"aef": prints})
    with pytest.raises(SplitBlocksError, match=r"^t.tsv: splits.block_m 0.001 m: expected"):
        check_split_blocks(checks, own, config(splits={"block_m": 0.001}), "t.tsv", ["aef"])
    demo = config(demo={"overlay": {"splits": {"block_m": 1}}})
    with pytest.raises(SplitBlocksError, match=r"demo.overlay.splits.block_m 1 m: expected at "
                       r"least the pixel size of the aef rasters \(10 m\)"):  # fmt: skip
        check_split_blocks(RegionChecks(), table(True), demo, "t.tsv", ["aef"])
    check_split_blocks(RegionChecks(), table(True), config(), "t.tsv", ["aef"])


def test_regions_all_fixed_to_one_split_are_refused_for_their_splits_not_the_block() -> None:
    fixed = [ground(split="train", region="a"), ground(split="train", region="b")]
    with pytest.raises(SplitBlocksError) as err:
        check_blocks_hold_splits("aef", fixed, 5120.0, "t.tsv")
    text = str(err.value)
    assert "(;" not in text and "every aef region has a fixed split" in text, text
    assert "only ['train']" in text and "regions of ['val', 'test']" in text, text


# The user's view: `snakemake -n` with a config overlay prints the one line, nothing else of
# emb's (no traceback of its own, no MemoryError), before any job is planned.


@pytest.fixture(scope="module")
def own_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with the demo's two regions written as one's own rasters (the full-size
    settings apply to them, not the demo overlay)."""
    work = tmp_path_factory.mktemp("own")
    (work / "config").mkdir()
    for name in ("config.yaml", "classes.csv"):
        (work / "config" / name).write_text((REPO / "config" / name).read_text())
    (work / "config/train").symlink_to(REPO / "config/train")
    rows = ["region\tyear\taef\ttessera\tcdl\tsplit"]
    for region in DEMO_REGIONS:
        files = write_region(region, 96, work / "data" / region.name, CLASSES_CSV, seed=7)
        rows.append(f"{region.name}\t2024\t{files['aef']}\t{files['tessera']}\t{files['cdl']}"
                    "\tauto")  # fmt: skip
    (work / "own.tsv").write_text("\n".join(rows) + "\n")
    return work


@pytest.mark.parametrize(
    ("overlay", "line"),
    [
        ({"splits": {"block_m": 0.001}}, "own.tsv: splits.block_m 0.001 m: expected at least"),
        ({"tiles": {"size": 40}}, "config tiles.size 40: expected a positive multiple of 32"),
        ({"tiles": {"size": 32, "stride": 48}}, "config tiles.stride 48 is larger than"),
        ({"tiles": {"size": 32}, "predict": {"overlap": 0.99}},
         "config predict.overlap 0.99: at 32-px windows the stride"),
    ],
)  # fmt: skip
def test_snakemake_prints_the_refusal_in_one_line(own_work: Path, overlay: dict, line: str) -> None:
    (own_work / "overlay.yaml").write_text(yaml.safe_dump({"regions": "own.tsv", **overlay}))
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(own_work), "-n",
           "--configfile", "overlay.yaml"]  # fmt: skip
    # 4 GiB of address space: the block count that listed blocks died of memory here
    limited = ["bash", "-c", 'ulimit -v 4000000 && exec "$@"', "snakemake", *cmd]
    done = subprocess.run(limited, cwd=own_work, env=venv_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    printed = done.stdout + done.stderr  # Snakemake logs to stdout when it is no terminal
    assert done.returncode == 1, printed[-3000:]
    assert len([s for s in printed.splitlines() if line in s]) == 1, printed[-3000:]
    assert "MemoryError" not in printed and "Traceback" not in printed, printed[-3000:]


# A labelled sample is read while the workflow parses (issue 59, items 1, 3, 4): refused inside
# rule area_estimates' job, it failed the job and Snakemake deleted the run's good area table.


def bad_sample(design: SamplePaths, path: Path, bad: str) -> str:
    """The design's CSV, labelled, written to ``path`` with one thing wrong; what is said."""
    with open(design.csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["reference"] = r["map_name"]
    if bad == "row":
        rows[2]["reference"] = "999"
    with open(path, "w", newline="", encoding="latin-1" if bad == "latin-1" else "utf-8") as fh:
        writer = csv.DictWriter(fh, [*rows[0], "notes"], delimiter=";" if bad == ";" else ",")
        writer.writeheader()
        writer.writerows([{**r, "notes": "naïve"} for r in rows])
    if bad == "workbook":
        path.write_bytes(b"PK\x03\x04" + bytes(40))
    return {
        "row": "line 4: id 3: reference '999' is no CDL code",
        "latin-1": "line 2: not UTF-8 text (byte 0xef)",
        ";": "line 1: columns separated by ';', expected ','",
        "workbook": "a spreadsheet workbook, not a CSV",
    }[bad]


@pytest.fixture(scope="module")
def sample_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh checkout of the demo with a design drawn on a small map beside it, in
    ``mysample/`` (its maps are never read at parse time), and an earlier run's results."""
    work = make_workdir(tmp_path_factory.mktemp("sample"))
    ids = np.random.default_rng(3).integers(0, 61, (40, 40), dtype=np.uint8)
    profile = {"driver": "GTiff", "height": 40, "width": 40, "count": 1, "dtype": "uint8",
               "crs": "EPSG:32615", "nodata": 255,
               "transform": from_origin(400_000, 4_500_000, 10, 10)}  # fmt: skip
    with rasterio.open(work / "design_map.tif", "w", **profile) as dst:
        dst.write(ids, 1)
    drawn = draw_points([work / "design_map.tif"], 2, load_class_map(CLASSES_CSV), n=30,
                        min_per_class=2, seed=1)  # fmt: skip
    write_sample(drawn, work / "mysample")
    for name in ("area_estimates/aef_segformer.csv", "area_estimates/aef_segformer.png",
                 "maps/aef_segformer/demo_a.tif"):  # fmt: skip
        (work / "results" / name).parent.mkdir(parents=True, exist_ok=True)
        (work / "results" / name).write_bytes(name.encode() * 3)
    overlay = {"area_estimates": {"labelled": "mysample/labelled.csv"}}
    (work / "sample.yaml").write_text(yaml.safe_dump(overlay))
    return work


@pytest.mark.parametrize("bad", ["row", "latin-1", ";", "workbook"])
def test_a_bad_labelled_sample_is_refused_before_any_job_and_results_stay(
    sample_work: Path, bad: str
) -> None:
    """``snakemake -n`` refuses it in one line: the refusal comes while the workflow parses,
    where a run would refuse it too, before any job starts; every file under results/ (an
    earlier run's area table and figure, its map) stays byte for byte."""
    said = bad_sample(SamplePaths.in_folder(sample_work / "mysample"),
                      sample_work / "mysample/labelled.csv", bad)  # fmt: skip
    results = sample_work / "results"
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    done = snakemake(sample_work, "-n", "--configfile", ".test/config.yaml", "sample.yaml",
                     timeout=300)  # fmt: skip
    printed = done.stdout + done.stderr
    assert done.returncode == 1, printed[-3000:]
    line = f"mysample/labelled.csv: {said}"
    assert len([s for s in printed.splitlines() if line in s]) == 1, printed[-3000:]
    assert "Traceback" not in printed, printed[-3000:]
    assert {p: p.read_bytes() for p in results.rglob("*") if p.is_file()} == before
