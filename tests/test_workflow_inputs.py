"""The real Snakemake workflow from a fresh checkout, without the finished demo of
tests/test_workflow.py: its dry run lists every rule; your own regions get the full-size tiling
and the demo keeps its own; your regions' paths reach every stage as one argument, even those
a shell would break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import rasterio
import yaml
from conftest import TinyDemo
from workflow_runs import RULES, make_workdir, snakemake

# Your own config file: the default 5120 m blocks would leave a 1.28 km region one block, which
# is refused before any job. Merged last, over .test/config.yaml.
BLOCKS = "splits:\n  block_m: 640\n"
MINE = ["--configfile", ".test/config.yaml", "blocks.yaml"]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh checkout, with a config file of your own that sets ``splits.block_m``."""
    workdir = make_workdir(tmp_path_factory.mktemp("fresh"))
    (workdir / "blocks.yaml").write_text(BLOCKS)
    return workdir


@pytest.fixture(scope="module")
def demo_dry_run(fresh: Path) -> str:
    """``snakemake -n -p`` of the demo in the fresh checkout, your blocks.yaml merged: every job
    with its shell command (one dry run for the tests below)."""
    result = snakemake(fresh, "-n", "-p", *MINE)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_dry_run_on_fresh_checkout_lists_every_rule(demo_dry_run: str) -> None:
    missing = [rule for rule in RULES if f"rule {rule}:" not in demo_dry_run]
    assert not missing, f"dry run does not list {missing}"


def test_your_own_regions_get_the_full_size_tiling_and_the_demo_keeps_its_own(
    fresh: Path, demo_dry_run: str, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    demo = tiny_demo.rasters["demo_a"]
    table = tmp_path / "mine.tsv"
    table.write_text("region\tyear\taef\ttessera\tcdl\tsplit\n"
                     f"mine\t2024\t{demo['aef']}\t\t{demo['cdl']}\tauto\n")  # fmt: skip
    result = snakemake(fresh, "-n", "-p", "results/shards/aef/manifest.json", "--config",
                       f"regions={table}", *MINE)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    own = result.stdout
    assert "--tile-size=256 --stride=256" in own
    assert "--block-m=640" in own and "--max-samples=256" in own
    assert "--tile-size=32 --stride=32" in demo_dry_run and "--block-m=320" in demo_dry_run


# Spaces, both quotes, a command substitution, '#' and non-ASCII letters: every one of them
# must reach each stage as one argument and never run in a shell.
WEIRD_DIR = "in put 'single' \"double\" $(touch PWNED) $HOME #1 ñøé"


def test_demo_runs_end_to_end_from_paths_a_shell_would_break(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    workdir = make_workdir(tmp_path / "wd")
    inputs = workdir / WEIRD_DIR
    rows = ["region\tyear\taef\ttessera\tcdl\tsplit"]
    for region in ("demo_a", "demo_b"):  # the tiny demo's 128-px rasters, as your own
        cells = []
        for kind in ("aef", "tessera", "cdl"):
            target = inputs / f"{region} {kind} #$x.tif"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tiny_demo.rasters[region][kind], target)
            cells.append(str(target.relative_to(workdir)))
        rows.append("\t".join([f"odd_{region}", "2024", *cells, "auto"]))
    table = inputs / "my regions #1.tsv"
    table.write_text("# a comment line\n" + "\n".join(rows) + "\n", encoding="utf-8")

    # In the test config, not --config: the command line's YAML would cut the value at " #".
    test_config = workdir / ".test" / "config.yaml"
    # your own regions get the full-size tiling: these 128-px ones need the demo's small one
    small = yaml.safe_load(test_config.read_text())["demo"]["overlay"]
    settings = {"regions": str(table), "runs": ["aef_segformer"], **small}
    test_config.write_text(test_config.read_text() + yaml.safe_dump(settings, allow_unicode=True))

    result = snakemake(workdir, "--cores", "2")

    assert result.returncode == 0, result.stderr[-4000:]
    assert not list(workdir.rglob("PWNED")), "a path ran in a shell"
    for region in ("odd_demo_a", "odd_demo_b"):
        with rasterio.open(inputs / f"{region[4:]} aef #$x.tif") as src:
            grid = (src.crs, src.transform, src.shape)
        with rasterio.open(workdir / f"results/maps/aef_segformer/{region}.tif") as out:
            assert (out.crs, out.transform, out.shape) == grid
    assert pd.read_csv(workdir / "results/summary.csv")["run"].tolist() == ["aef_segformer"]


def test_the_demo_with_its_districts_lists_the_district_layer(demo_dry_run: str) -> None:
    """config/config.yaml sets the demo's districts: each run's area_estimates job makes the
    GIS layer and passes it to the stage."""
    for run in ("aef_segformer", "tessera_deeplab"):
        layer = f"results/area_estimates/{run}_districts.gpkg"
        assert layer in demo_dry_run and f"--gpkg {layer}" in demo_dry_run
