"""Every stage's command line (emb.stage_runner): a known bad input ends in one timestamped
ERROR line naming the file, no traceback, and the exit code of its kind; real ``python -m``
processes on real files."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLASSES_CSV, REPO, TinyDemo, corrupt_copy, venv_env

from emb import stage_runner

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (INFO|WARNING|ERROR) emb\.[\w.]+: ")


def stage(module: str, *args: object, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True, text=True, env={**venv_env(), **env}, timeout=300,
    )  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess, code: int, *needles: object) -> str:
    """The stage's single ERROR line, checked: exit code, timestamp, needles, no traceback."""
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert LINE.match(errors[0]), errors[0]
    for needle in needles:
        assert str(needle) in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


def test_align_labels_with_a_cdl_elsewhere_is_exit_2_naming_both(tiny_demo: TinyDemo, tmp_path):
    a, b = tiny_demo.rasters["demo_a"], tiny_demo.rasters["demo_b"]
    out = tmp_path / "labels.tif"
    result = stage("emb.prep.align_labels", f"--emb={a['aef']}", f"--cdl={b['cdl']}",
                   f"--classes={CLASSES_CSV}", f"--out={out}",
                   f"--report={tmp_path / 'r.json'}")  # fmt: skip
    one_error_line(result, stage_runner.EXIT_INPUT, b["cdl"], a["aef"], "does not overlap")
    assert not out.exists()


def test_align_labels_with_a_missing_raster_is_exit_66_naming_it(tiny_demo: TinyDemo, tmp_path):
    missing = tmp_path / "no such" / "aef.tif"
    cdl = tiny_demo.rasters["demo_a"]["cdl"]
    result = stage("emb.prep.align_labels", f"--emb={missing}", f"--cdl={cdl}",
                   f"--classes={CLASSES_CSV}", f"--out={tmp_path / 'l.tif'}",
                   f"--report={tmp_path / 'r.json'}")  # fmt: skip
    one_error_line(result, stage_runner.EXIT_NO_INPUT, missing)


def test_shards_of_a_raster_with_the_wrong_band_count_is_exit_2_naming_it(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    tessera = tiny_demo.rasters["demo_a"]["tessera"]
    label = tiny_demo.labels[("tessera", "demo_a")]
    result = stage("emb.prep.shards", "--source=aef", "--region=demo_a", f"--emb={tessera}",
                   f"--labels={label}", f"--index={tmp_path / 'index.json'}", "--tile-size=32",
                   "--block-m=320")  # fmt: skip
    one_error_line(result, stage_runner.EXIT_INPUT, tessera, "expected 64 bands for aef, found 128")
    assert not list(tmp_path.iterdir())  # no index, no shards, no staging folder


def test_a_raster_that_fails_past_its_first_block_is_exit_66_naming_its_path(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """GDAL alone says "aef.tif, band 1: IReadBlock failed", and every region's file is aef.tif."""
    demo = tiny_demo.rasters["demo_a"]
    bad = corrupt_copy(demo["aef"], tmp_path / "regions" / "r7" / "aef.tif")
    labels = stage("emb.prep.align_labels", f"--emb={bad}", f"--cdl={demo['cdl']}",
                   f"--classes={CLASSES_CSV}", f"--out={tmp_path / 'l.tif'}",
                   f"--report={tmp_path / 'r.json'}")  # fmt: skip
    one_error_line(
        labels, stage_runner.EXIT_NO_INPUT, f"{bad}: cannot read it", "IReadBlock failed"
    )
    out = tmp_path / "shards"
    shards = stage("emb.prep.shards", "--source=aef", "--region=r7", f"--emb={bad}",
                   f"--labels={tiny_demo.labels[('aef', 'demo_a')]}", f"--index={out / 'i.json'}",
                   "--tile-size=32", "--block-m=320")  # fmt: skip
    one_error_line(shards, stage_runner.EXIT_NO_INPUT, f"{bad}: cannot read it")
    assert not list(out.iterdir())  # no index, no shards, no staging folder


def test_manifest_of_an_index_that_is_not_json_is_exit_2_naming_it(tmp_path: Path) -> None:
    index = tmp_path / "index.json"
    index.write_text("{ truncated")
    result = stage("emb.prep.manifest", index, f"--out={tmp_path / 'manifest.json'}")
    one_error_line(result, stage_runner.EXIT_INPUT, index, "not a JSON region index")
    assert not (tmp_path / "manifest.json").exists()


def test_channel_stats_of_a_missing_manifest_is_exit_66_naming_it(tmp_path: Path) -> None:
    manifest = tmp_path / "shards" / "manifest.json"
    result = stage("emb.prep.channel_stats", f"--manifest={manifest}", f"--out-dir={tmp_path}")
    one_error_line(result, stage_runner.EXIT_NO_INPUT, manifest, "No such file")


def test_demo_region_with_a_missing_class_table_is_exit_66_naming_it(tmp_path: Path) -> None:
    classes = tmp_path / "classes.csv"
    result = stage("emb.prep.demo_region", "--region=demo_a", "--size=32",
                   f"--classes={classes}", f"--out-dir={tmp_path / 'demo'}")  # fmt: skip
    one_error_line(result, stage_runner.EXIT_NO_INPUT, classes)


def test_train_config_with_a_tab_in_the_yaml_is_exit_2_naming_file_and_line(tmp_path: Path):
    run = tmp_path / "run.yaml"
    run.write_text("train:\n\tepochs: 3\n")
    result = stage("emb.training.train_config", REPO / "config/train/defaults.yaml", run,
                   f"--schema={REPO / 'workflow/schemas/train.schema.yaml'}",
                   f"--out={tmp_path / 'config.yaml'}")  # fmt: skip
    one_error_line(result, stage_runner.EXIT_INPUT, f"{run}: line 2 column 1: not valid YAML")
    assert not (tmp_path / "config.yaml").exists()


def test_train_on_a_config_that_is_not_a_mapping_is_exit_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("- just\n- a list\n")
    result = stage("emb.training.train", f"--config={config}")
    one_error_line(result, 2, config, "expected a mapping")


def test_curves_of_an_unparsable_history_is_exit_2_naming_it(tmp_path: Path) -> None:
    history = tmp_path / "history.csv"
    history.write_bytes(b"epoch,step\n1,2,3,4\n\xff\xfe")
    result = stage("emb.report.curves", f"--history={history}", "--run=r",
                   f"--out={tmp_path / 'c.png'}")  # fmt: skip
    one_error_line(result, stage_runner.EXIT_INPUT, history)
    assert not (tmp_path / "c.png").exists()


def test_data_report_of_a_manifest_without_splits_is_exit_2_naming_it(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"source": "aef", "in_dim": 64}')
    result = stage("emb.report.data_report", f"--manifest={manifest}",
                   f"--classes={CLASSES_CSV}", f"--png={tmp_path / 'd.png'}",
                   f"--html={tmp_path / 'd.html'}")  # fmt: skip
    one_error_line(result, stage_runner.EXIT_INPUT, manifest, "expected a shard manifest")


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/x"), stage_runner.EXIT_DISK_FULL),
        (OSError(errno.EDQUOT, "Disk quota exceeded", "/x"), stage_runner.EXIT_DISK_FULL),
        (OSError(errno.EROFS, "Read-only file system", "/x"), stage_runner.EXIT_CANT_CREATE),
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"),
            stage_runner.EXIT_NO_INPUT,
        ),
        (PermissionError(errno.EACCES, "Permission denied", "/no/such/dir/out"), 73),
        (ValueError("a builtin ValueError is a bug"), stage_runner.EXIT_BUG),
        (KeyError("k"), stage_runner.EXIT_BUG),
        (stage_runner.Interrupted(15), 143),
        (KeyboardInterrupt(), 130),
    ],
)
def test_each_kind_of_error_has_its_exit_code(err: BaseException, code: int) -> None:
    assert stage_runner.exit_code(err) == code


def test_an_emb_value_error_is_bad_input_and_its_message_one_line() -> None:
    from emb.training.run_config import ConfigError

    err = ConfigError("run.yaml: train.epochs:\n  expected >= 1,\n  found 0")
    assert stage_runner.exit_code(err) == stage_runner.EXIT_INPUT
    assert stage_runner.message(err) == "run.yaml: train.epochs: expected >= 1, found 0"


def test_stage_exit_carries_the_code_and_the_message(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "history.csv"

    @stage_runner.stage
    def main() -> None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(missing))

    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == stage_runner.EXIT_NO_INPUT and str(missing) in str(exc.value)
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(f"ERROR {__name__}: {missing}: No such file or directory"), line
