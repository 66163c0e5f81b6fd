"""emb's own JSON files read back (issue 51, items 5 and 10): a file cut short (an interrupted
copy) or holding a setting that cannot be right is refused in one line naming it, with exit
code 2, by the summary and by every reader of the files emb writes, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from emb import stage_runner
from emb.io import read_json
from emb.loading.shard_manifest import read_manifest
from emb.prep.manifest import read_index
from emb.report.summary import main as summary_main

GOOD_BOOTSTRAP = {"resamples": 1000, "seed": 0, "level": 0.95}


def metrics_file(path: Path, **changes: object) -> Path:
    """A metrics.json of the evaluate stage's shape, past 300 bytes."""
    record = {"run": "r", "source": "aef", "arch": "segformer", "weights": "ema", "epoch": 3,
              "samples": 40, "bootstrap": dict(GOOD_BOOTSTRAP),
              **{f"{f}_{lv}": 0.5 for f in ("miou", "f1", "oa") for lv in ("l1", "l2", "l3")},
              **changes}  # fmt: skip
    path.write_text(json.dumps(record, indent=2))
    return path


def summary_refusal(tmp_path: Path, metrics: Path, capsys: pytest.CaptureFixture) -> str:
    """The summary stage over one run's ``metrics``: its exit code 2 and its one ERROR line."""
    out = tmp_path / "summary.csv"
    with pytest.raises(SystemExit) as exc:
        summary_main(["--runs", "r", "--metrics", str(metrics), "--out", str(out)])
    assert exc.value.code == stage_runner.EXIT_INPUT, exc.value
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if " ERROR " in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not out.exists()
    return lines[0]


def test_a_metrics_file_cut_short_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    metrics = metrics_file(tmp_path / "metrics.json")
    metrics.write_bytes(metrics.read_bytes()[:300])  # an interrupted copy
    line = summary_refusal(tmp_path, metrics, capsys)
    assert f"{metrics}: not a JSON metrics file of an evaluate job" in line
    assert "300 bytes: cut short" in line and "--forcerun evaluate" in line


def test_a_bootstrap_level_out_of_range_reaches_the_user_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    metrics = metrics_file(tmp_path / "metrics.json", bootstrap={**GOOD_BOOTSTRAP, "level": 1.5})
    line = summary_refusal(tmp_path, metrics, capsys)
    assert f"{metrics}: bootstrap: " in line and "level" in line


def index_file(path: Path) -> Path:
    path.write_text(json.dumps({"source": "aef", "region": "r", "in_dim": 64, "tile_size": 32,
                                "dtype": "int8", "dropped": {}, "splits": {}}))  # fmt: skip
    return path


def manifest_file(path: Path) -> Path:
    split = {"shards": [], "shard_samples": [], "samples": 0}
    path.write_text(json.dumps({"in_dim": 64, "splits": {"train": split, "val": split}}))
    return path


@pytest.mark.parametrize(
    ("write", "read", "what"),
    [
        (index_file, read_index, "JSON region index"),
        (manifest_file, read_manifest, "JSON shard manifest"),
        (lambda p: metrics_file(p), lambda p: read_json(p, "JSON file"), "JSON file"),
    ],
)
def test_every_reader_of_embs_json_names_a_file_cut_short(
    tmp_path: Path, write: Callable[[Path], Path], read: Callable[[Path], object], what: str
) -> None:
    path = write(tmp_path / "file.json")
    read(path)  # whole: read
    size = len(path.read_bytes()) // 2
    path.write_bytes(path.read_bytes()[:size])
    with pytest.raises(ValueError) as err:
        read(path)
    assert (
        stage_runner.exit_code(err.value) == stage_runner.EXIT_INPUT
    )  # a known error: one line, exit 2
    text = stage_runner.message(err.value)
    assert text.startswith(f"{path}: not a {what} (") and f"; {size} bytes: cut short" in text
    path.write_bytes(b"\xff\xfe{}")  # not even text
    with pytest.raises(ValueError, match=r"byte 0 is not UTF-8") as err:
        read(path)
    assert stage_runner.exit_code(err.value) == stage_runner.EXIT_INPUT
