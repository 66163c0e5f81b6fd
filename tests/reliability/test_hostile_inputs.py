"""Hostile inputs across rasters, tables, configs, shards and checkpoints, each fed to the real
entry point that meets it first (the pre-job checks, a stage, the loader, the training stage).

Every case must end in a message naming the file or key and what was expected, and must leave
a tree of earlier good outputs (labels, shards, a trained run with checkpoints) byte-identical:
sha256 of every file before and after. Cases already covered end-to-end elsewhere
(tests/test_inputs.py, tests/prep/test_bad_data.py, tests/training/test_trainer.py) are counted
here through their entry points, with the before/after hash added.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
import yaml
from conftest import CLASSES_CSV, REPO, TinyDemo
from fault_runs import tree_hashes
from training_runs import resolve_config

from emb.classes import load_class_map
from emb.loading.batches import LoaderSpec, eval_batches
from emb.models.runtime import CPU_HOST, Runtime
from emb.prep import align_labels
from emb.prep.regions import read_regions
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec
from emb.training import checkpoint_file, loop, run_config, train, train_config
from emb.workflow.region_checks import check_regions

pytestmark = pytest.mark.reliability


@dataclass
class Env:
    demo: TinyDemo
    good: Path  # a tree of good outputs: labels, shards, a run with checkpoints
    tmp: Path  # where hostile inputs are made

    @property
    def run_dir(self) -> Path:
        return self.good / "runs" / "r"

    def raster(self, source: str = "aef") -> Path:
        return self.demo.rasters["demo_a"][source]


Case = Callable[[Env], tuple[Callable[[], object], list[str]]]
CASES: dict[str, tuple[Case, str | None]] = {}  # kind -> (case, xfail reason or None)


def case(kind: str, xfail: str | None = None):
    def register(fn: Case) -> Case:
        # a second case of one kind would replace the first, which then never runs
        assert kind not in CASES, f"two hostile-input cases named {kind!r}"
        CASES[kind] = (fn, xfail)
        return fn

    return register


# --- helpers -------------------------------------------------------------------------------


def regions_table(env: Env, rows: list[dict[str, str]]) -> Path:
    cols = ["region", "year", "aef", "tessera", "cdl", "split"]
    path = env.tmp / "regions.tsv"
    lines = ["\t".join(cols)] + ["\t".join(r.get(c, "") for c in cols) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def good_row(env: Env, **replace: str) -> dict[str, str]:
    row = {
        "region": "demo_a",
        "year": "2024",
        "aef": str(env.raster("aef")),
        "tessera": str(env.raster("tessera")),
        "cdl": str(env.raster("cdl")),
        "split": "",
    }
    row.update(replace)
    return row


def check_table(path: Path) -> Callable[[], None]:
    """What the workflow runs on regions.tsv before any job: its schema, then the files."""

    def action() -> None:
        from snakemake.utils import validate

        table = read_regions(path)
        validate(table, str(REPO / "workflow/schemas/regions.schema.yaml"))
        check_regions(table, path)

    return action


def copy_raster(src: Path, dest: Path, **changes) -> Path:
    with rasterio.open(src) as ds:
        profile, data = ds.profile, ds.read()
    count = changes.pop("count", profile["count"])
    dtype = changes.pop("dtype", profile["dtype"])
    profile.update(count=count, dtype=dtype, nodata=None, **changes)
    with rasterio.open(dest, "w", **profile) as out:
        out.write(np.resize(data, (count, *data.shape[1:])).astype(dtype))
    return dest


def train_stage(config_path: Path) -> Callable[[], None]:
    """``python -m emb.training.train --config X`` in this process (world size 1)."""

    def action() -> None:
        handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
        try:
            train.main(["--config", str(config_path)])
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    return action


def good_run_config(env: Env, *overrides: str) -> Path:
    """A config for the good run's folder (its resume target is runs/r/last.pt)."""
    return resolve_config(env.demo, env.run_dir, "train.max_updates=2", *overrides)


def resolve_train(env: Env, *files_and_overrides: str) -> Callable[[], None]:
    files = [REPO / "config/train/defaults.yaml", REPO / "config/train/aef_segformer.yaml"]
    extra = [a for a in files_and_overrides if not a.startswith("--set")]
    sets = [a.split(" ", 1)[1] for a in files_and_overrides if a.startswith("--set")]
    argv = [
        *map(str, files),
        *extra,
        "--schema",
        str(REPO / "workflow/schemas/train.schema.yaml"),
        "--out",
        str(env.run_dir / "config.yaml"),
        *[x for s in sets for x in ("--set", s)],
    ]
    return lambda: train_config.main(argv)


def workflow_config(env: Env, **changes) -> Callable[[], None]:
    data = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:  # a section config.yaml leaves to the schema: made here
            node = node.setdefault(part, {})
        node[leaf] = value

    def action() -> None:
        from snakemake.utils import validate

        validate(data, str(REPO / "workflow/schemas/config.schema.yaml"))

    return action


def loader(env: Env, shard: Path, in_dim: int = 64, samples: int | None = None):
    counts = {str(shard): samples} if samples is not None else None
    return lambda: list(
        eval_batches(
            [str(shard)],
            LoaderSpec("aef", in_dim, 4, 0, shuffle_buffer=0, seed=0),
            shard_samples=counts,
        )
    )


def copy_shard(env: Env) -> tuple[Path, int]:
    part = env.demo.manifest("aef")["splits"]["train"]
    dest = env.tmp / "train-0000.tar"
    shutil.copy(part["shards"][0], dest)
    return dest, part["shard_samples"][0]


# --- rasters -------------------------------------------------------------------------------


@case("raster: wrong band count")
def _(env):
    bad = copy_raster(env.raster("aef"), env.tmp / "three.tif", count=3)
    return check_table(regions_table(env, [good_row(env, aef=str(bad))])), [
        "column 'aef'",
        "three.tif",
        "3 bands",
        "expected 64",
    ]


@case("raster: AEF int8 codes cast to float32 (not de-quantized)")
def _(env):
    bad = copy_raster(env.raster("aef"), env.tmp / "float.tif", dtype="float32")

    def action() -> None:
        check_table(regions_table(env, [good_row(env, aef=str(bad))]))()
        build_region(
            "aef",
            "demo_a",
            bad,
            env.demo.labels[("aef", "demo_a")],
            env.good / "shards" / "aef" / "demo_a",
            TileSpec(32),
            SplitSpec(320.0),
        )

    return action, ["float.tif", "band 1", "expected |x| <= 1", "int8"]


@case("raster: no CRS")
def _(env):
    bad = copy_raster(env.raster("aef"), env.tmp / "nocrs.tif", crs=None)
    return check_table(regions_table(env, [good_row(env, aef=str(bad))])), [
        "column 'aef'",
        "nocrs.tif",
        "no CRS",
    ]


@case("raster: CDL in a wrong CRS (no overlap)")
def _(env):
    bad = copy_raster(env.raster("cdl"), env.tmp / "cdl_wrong_crs.tif", crs="EPSG:3035")
    return check_table(regions_table(env, [good_row(env, cdl=str(bad))])), [
        "column 'cdl'",
        "cdl_wrong_crs.tif",
        "does not overlap",
    ]


@case("raster: empty file")
def _(env):
    bad = env.tmp / "empty.tif"
    bad.write_bytes(b"")
    return check_table(regions_table(env, [good_row(env, tessera=str(bad))])), [
        "column 'tessera'",
        "empty.tif",
        "cannot read",
    ]


@case("raster: truncated GeoTIFF")
def _(env):
    bad = env.tmp / "truncated.tif"
    data = env.raster("aef").read_bytes()
    bad.write_bytes(data[: len(data) // 3])
    out = env.good / "labels" / "aef" / "demo_a.tif"  # a good label raster already there
    argv = [
        "--emb",
        str(bad),
        "--cdl",
        str(env.raster("cdl")),
        "--classes",
        str(CLASSES_CSV),
        "--out",
        str(out),
        "--report",
        str(env.tmp / "report.json"),
    ]
    return lambda: align_labels.main(argv), ["truncated.tif"]


@case("raster: missing file")
def _(env):
    return check_table(regions_table(env, [good_row(env, aef=str(env.tmp / "nope.tif"))])), [
        "column 'aef'",
        "file not found",
        "nope.tif",
    ]


@case("raster: AEF in a geographic CRS (degrees)")
def _(env):
    bad = copy_raster(env.raster("aef"), env.tmp / "lonlat.tif", crs="EPSG:4326",
                      transform=rasterio.Affine(0.0001, 0, -93.5, 0, -0.0001, 42.0))  # fmt: skip
    return check_table(regions_table(env, [good_row(env, aef=str(bad))])), [
        "column 'aef'", "lonlat.tif", "geographic CRS EPSG:4326", "ground metres",
        "EPSG:32615"]  # fmt: skip


@case("raster: rotated geotransform")
def _(env):
    with rasterio.open(env.raster("aef")) as src:
        t = src.transform
    rotated = rasterio.Affine(t.a, 2.0, t.c, 1.5, t.e, t.f)
    bad = copy_raster(env.raster("aef"), env.tmp / "rotated.tif", transform=rotated)
    return check_table(regions_table(env, [good_row(env, aef=str(bad))])), [
        "column 'aef'", "rotated.tif", "rotated or sheared", "b = 2.0, d = 1.5"]  # fmt: skip


@case("raster: CDL with only background over the embedding")
def _(env):
    bad = copy_raster(env.raster("cdl"), env.tmp / "background.tif")
    with rasterio.open(bad, "r+") as dst:
        dst.write(np.zeros((1, dst.height, dst.width), dst.dtypes[0]))
    return check_table(regions_table(env, [good_row(env, cdl=str(bad))])), [
        "column 'cdl'", "background.tif", "no labelled pixel", "aef.tif"]  # fmt: skip


@case("raster: CDL with no class-table code reaches the align stage")
def _(env):
    bad = copy_raster(env.raster("cdl"), env.tmp / "unmapped.tif")
    with rasterio.open(bad, "r+") as dst:
        dst.write(np.full((1, dst.height, dst.width), 19, dst.dtypes[0]))  # not in the table
    out = env.good / "labels" / "aef" / "demo_a.tif"  # a good label raster already there
    argv = ["--emb", str(env.raster("aef")), "--cdl", str(bad), "--classes", str(CLASSES_CSV),
            "--out", str(out), "--report", str(env.tmp / "report.json")]  # fmt: skip
    return lambda: align_labels.main(argv), ["unmapped.tif", "no labelled pixel", "19"]


# --- tables --------------------------------------------------------------------------------


@case("regions.tsv: one raster listed under two region ids")
def _(env):
    rows = [good_row(env), good_row(env, region="demo_a2")]
    return check_table(regions_table(env, rows)), [
        "row 2", "demo_a2", "the same file as", "row 1", "two regions' splits"]  # fmt: skip


@case("regions.tsv: a copy of a raster (same grid) under another region id")
def _(env):
    copy = Path(shutil.copy(env.raster("aef"), env.tmp / "copy_of_aef.tif"))
    rows = [good_row(env), good_row(env, region="demo_a2", aef=str(copy), tessera="")]
    return check_table(regions_table(env, rows)), [
        "row 2", "copy_of_aef.tif", "a raster on the same grid as", "row 1"]  # fmt: skip


@case("regions.tsv: duplicate region ids")
def _(env):
    rows = [good_row(env), good_row(env, year="2023")]
    return check_table(regions_table(env, rows)), ["regions.tsv", "demo_a", "duplicate"]


@case("regions.tsv: region id with spaces and capitals")
def _(env):
    return check_table(regions_table(env, [good_row(env, region="Demo A")])), [
        "Demo A",
        "^[a-z0-9_][a-z0-9_-]*$",
    ]


@case("regions.tsv: no cdl column for a training row")
def _(env):
    path = env.tmp / "regions.tsv"
    path.write_text(f"region\tyear\taef\ndemo_a\t2024\t{env.raster('aef')}\n")
    return check_table(path), ["no CDL for a training row", "split 'predict'"]


@case("classes.csv: a CDL code listed twice")
def _(env):
    lines = CLASSES_CSV.read_text().splitlines()
    bad = env.tmp / "classes.csv"
    bad.write_text("\n".join([*lines, lines[1]]) + "\n")
    return lambda: load_class_map(bad), ["classes.csv", "listed more than once"]


@case("classes.csv: L3 id out of range")
def _(env):
    lines = CLASSES_CSV.read_text().splitlines()
    head = lines[0].split(",")
    row = lines[1].split(",")
    row[head.index("l3_id")] = "99"
    bad = env.tmp / "classes.csv"
    bad.write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    return lambda: load_class_map(bad), ["classes.csv", "l3_id", "0..60", "99"]


# --- configs -------------------------------------------------------------------------------


@case("train config: unknown key")
def _(env):
    return resolve_train(env, "--set optimizer.momentum=0.9"), [
        "Additional properties are not allowed ('momentum' was unexpected)"
    ]


@case("train config: wrong type")
def _(env):
    return resolve_train(env, "--set train.batch_size=eight"), [
        "batch_size",
        "'eight' is not of type 'integer'",
    ]


@case("train config: negative size")
def _(env):
    return resolve_train(env, "--set train.batch_size=-4"), [
        "batch_size",
        "-4 is less than the minimum of 1",
    ]


@case("train config: not a mapping")
def _(env):
    bad = env.tmp / "list.yaml"
    bad.write_text("- model\n- train\n")
    return resolve_train(env, str(bad)), ["list.yaml", "expected a mapping"]


@case("train config: GradScaler with bf16")
def _(env):
    return resolve_train(env, "--set train.precision=bf16", "--set train.grad_scaler=true"), [
        "train.grad_scaler",
        "bf16",
    ]


@case("config.yaml: unknown key")
def _(env):
    return workflow_config(env, learning_rate=0.1), [
        "Additional properties are not allowed ('learning_rate' was unexpected)"
    ]


@case("config.yaml: negative tile size")
def _(env):
    return workflow_config(env, tiles__size=-32), ["size", "-32 is less than the minimum of 8"]


# --- shards and manifests ------------------------------------------------------------------


@case("shard: truncated inside a member")
def _(env):
    shard, n = copy_shard(env)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2 + 700])
    return loader(env, shard, samples=n), ["train-0000.tar", "truncated"]


@case("shard: random bytes")
def _(env):
    shard, n = copy_shard(env)
    shard.write_bytes(np.random.default_rng(0).bytes(20_000))
    return loader(env, shard, samples=n), ["train-0000.tar", "corrupt"]


@case("shard: empty file")
def _(env):
    shard, n = copy_shard(env)
    shard.write_bytes(b"")
    return loader(env, shard, samples=n), ["train-0000.tar", "truncated"]


@case("shard: other in_dim than the manifest")
def _(env):
    shard, n = copy_shard(env)
    return loader(env, shard, in_dim=128, samples=n), [
        "train-0000.tar",
        "in_dim 64, manifest says 128",
    ]


@case("manifest: not JSON")
def _(env):
    bad = env.tmp / "manifest.json"
    bad.write_text('{"splits": {"train": ')
    return train_stage(good_run_config(env, f"data.manifest={bad}")), [
        "manifest.json",
        "not a JSON shard manifest",
    ]


@case("manifest: lists a shard that does not exist")
def _(env):
    manifest = env.demo.manifest("aef")
    manifest["splits"]["train"]["shards"][0] = str(env.tmp / "gone-0000.tar")
    bad = env.tmp / "manifest.json"
    bad.write_text(json.dumps(manifest))
    return train_stage(good_run_config(env, f"data.manifest={bad}", "train.restart=false")), [
        "gone-0000.tar"
    ]


# --- checkpoints ---------------------------------------------------------------------------


class Payload:
    """Pickles into a call of os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(env: Env, write: Callable[[Path], None], keep_sidecar: bool = False) -> Path:
    """Replace the good run's last.pt by a hostile one; the run's config resumes from it."""
    last = env.run_dir / "last.pt"
    if not keep_sidecar:
        checkpoint_file.checksum_path(last).unlink()
    write(last)
    return good_run_config(env)


@case("checkpoint: malicious pickle")
def _(env):
    marker = env.tmp / "pwned"
    config_path = plant(env, lambda p: torch.save({"model": {}, "x": Payload(marker)}, p))

    def action() -> None:
        train_stage(config_path)()
        assert not marker.exists(), "the pickle's payload ran"

    return action, ["last.pt", "not a loadable emb checkpoint", "weights_only"]


@case("checkpoint: plain pickle, no torch archive")
def _(env):
    marker = env.tmp / "pwned"

    def write(path: Path) -> None:
        with open(path, "wb") as fh:
            pickle.dump(Payload(marker), fh)

    return train_stage(plant(env, write)), ["last.pt", "not a loadable emb checkpoint"]


@case("checkpoint: truncated")
def _(env):
    def write(path: Path) -> None:
        path.write_bytes(path.read_bytes()[:5000])

    return train_stage(plant(env, write)), ["last.pt", "not a loadable emb checkpoint"]


@case("checkpoint: one flipped byte (checksum)")
def _(env):
    def write(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    return train_stage(plant(env, write, keep_sidecar=True)), [
        "last.pt",
        "does not match the checksum recorded in",
        "last.pt.sha256",
    ]


@case("checkpoint: empty file")
def _(env):
    return train_stage(plant(env, lambda p: p.write_bytes(b""))), [
        "last.pt",
        "not a loadable emb checkpoint",
    ]


@case("checkpoint: tensors but no model")
def _(env):
    return train_stage(plant(env, lambda p: torch.save({"w": torch.zeros(3)}, p))), [
        "last.pt",
        "no 'model' state dict",
    ]


@case("checkpoint: written by an incompatible config")
def _(env):
    # the good run is finished: resuming it is asked for explicitly (a rerun would retrain)
    resume = f"train.resume_from={env.run_dir / 'last.pt'}"
    return train_stage(good_run_config(env, "model.decoder_dim=24", resume)), [
        "last.pt",
        "incompatible config",
        "model.decoder_dim: checkpoint 16, config 24",
    ]


# --- the suite -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_tree(tiny_demo: TinyDemo, tmp_path_factory) -> Path:
    """Good outputs made by the real stages: a label raster, a region's shards, a run."""
    root = tmp_path_factory.mktemp("good")
    (root / "labels" / "aef").mkdir(parents=True)
    shutil.copy(tiny_demo.labels[("aef", "demo_a")], root / "labels" / "aef" / "demo_a.tif")
    shutil.copytree(tiny_demo.root / "shards" / "aef" / "demo_a", root / "shards/aef/demo_a")
    run_dir = root / "runs" / "r"
    config_path = resolve_config(tiny_demo, run_dir, "train.max_updates=2")
    cfg = run_config.load(config_path)
    runtime = Runtime.resolve(cfg.train, cfg.model.arch, CPU_HOST, training=True)
    loop.run(cfg, run_dir, 0, 1, runtime)
    assert (run_dir / "last.pt").exists() and (run_dir / "best.pt.sha256").exists()
    return root


def outcome(action: Callable[[], object], capsys) -> str | None:
    """The message an entry point ends with, or None when it accepted the input."""
    capsys.readouterr()
    previous = signal.signal(signal.SIGALRM, _no_answer)
    signal.alarm(CASE_SECONDS)  # a FIFO or a huge read must not hang the suite
    try:
        action()
    except SystemExit as err:
        if err.code in (0, None):
            return None
        return f"{err.code}\n{capsys.readouterr().err}"
    except Exception as err:  # noqa: BLE001 - any clear error is fine; its text is checked
        return f"{type(err).__name__}: {err}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return None


CASE_SECONDS = 60


class CaseTimeout(BaseException):
    """Raised by the alarm: a BaseException, so no ``except Exception`` in the code swallows it."""


def _no_answer(signum, frame):
    raise CaseTimeout(f"no answer within {CASE_SECONDS} s")


def kinds(cases: dict[str, tuple[Case, str | None]]) -> list:
    """The pytest params of a case registry (an xfail where a known bug is named)."""
    return [
        pytest.param(
            k, marks=pytest.mark.xfail(strict=True, reason=x) if x else (), id=f"hostile_inputs-{k}"
        )
        for k, (_, x) in cases.items()
    ]


def run_case(case: Case, kind: str, good_tree: Path, demo: TinyDemo, tmp_path: Path,
             capsys) -> None:  # fmt: skip
    """The suite's checks on one case: a message holding every needle, under a time limit, and
    a tree of good outputs byte-identical before and after."""
    good = tmp_path / "good"
    shutil.copytree(good_tree, good)
    (tmp_path / "in").mkdir()
    action, needles = case(Env(demo, good, tmp_path / "in"))
    before = tree_hashes(good)
    message = outcome(action, capsys)  # under a time limit: a hang fails the case
    assert message is not None, f"{kind}: accepted without a word"
    for needle in needles:
        assert needle in message, f"{kind}: {needle!r} not in the message:\n{message[-2000:]}"
    after = tree_hashes(good)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert not changed, f"{kind}: good outputs changed or removed: {changed}"


@pytest.mark.check("hostile_inputs")
@pytest.mark.parametrize("kind", kinds(CASES))
def test_hostile_input_gets_a_clear_message_and_changes_no_good_output(
    kind: str, good_tree: Path, tiny_demo: TinyDemo, tmp_path: Path, capsys
) -> None:
    run_case(CASES[kind][0], kind, good_tree, tiny_demo, tmp_path, capsys)


@pytest.mark.check("hostile_inputs")
def test_paths_with_spaces_are_accepted_and_processed(
    tiny_demo: TinyDemo, tmp_path: Path, class_map
) -> None:
    folder = tmp_path / "a folder with spaces"
    folder.mkdir()
    rasters = {
        k: Path(shutil.copy(tiny_demo.rasters["demo_a"][k], folder / f"{k} file.tif"))
        for k in ("aef", "tessera", "cdl")
    }
    env = Env(tiny_demo, tmp_path, folder)
    table = regions_table(env, [good_row(env, **{k: str(v) for k, v in rasters.items()})])
    check_table(table)()  # no error
    out = folder / "labels out" / "demo a.tif"
    align_labels.align_labels(rasters["aef"], rasters["cdl"], class_map, out)
    expected = rasterio.open(tiny_demo.labels[("aef", "demo_a")]).read()
    assert np.array_equal(rasterio.open(out).read(), expected)
