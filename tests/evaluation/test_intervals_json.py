"""Every JSON file the project writes is strict JSON: a missing value is ``null``, never the
bare ``NaN``/``Infinity`` Python's json writes by default and ``JSON.parse`` or ``jq`` refuse.

A tiny run as a user starts it (statistics, training, evaluation: the stages' own CLIs), then
every ``*.json`` under it and under the tiny demo's shards is read with a parser that refuses
non-standard constants.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CLASSES_CSV, TinyDemo, venv_env
from training_runs import resolve_config

from emb.io import write_json

pytestmark = pytest.mark.slow  # three stage processes (torch imports, a training run): ~40 s


def strict(text: str) -> object:
    """``json.loads`` as a strict reader: NaN, Infinity and -Infinity are errors."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_missing_values_are_written_as_null(tmp_path: Path) -> None:
    nan, inf = float("nan"), float("inf")
    data = {"a": nan, "b": [1.5, inf, {"c": np.float64("nan"), "d": (-inf, 2)}], "e": "NaN"}
    write_json(tmp_path / "x.json", data)
    assert strict((tmp_path / "x.json").read_text()) == {
        "a": None, "b": [1.5, None, {"c": None, "d": [None, 2]}], "e": "NaN"
    }  # fmt: skip
    with pytest.raises(ValueError, match="not JSON: NaN"):
        strict(json.dumps({"a": nan}))  # the reader is strict indeed


def stage(module: str, *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", module, *args], env=venv_env(),
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, f"{module}: {result.stderr[-3000:]}"


def test_every_json_of_a_tiny_run_parses_under_a_strict_reader(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    stats = tmp_path / "stats"
    stage("emb.prep.channel_stats", "--n-tiles=all",
          f"--manifest={tiny_demo.manifests['tessera']}", f"--out-dir={stats}")  # fmt: skip
    config = resolve_config(tiny_demo, tmp_path / "run", "train.epochs=2",
                            f"data.stats_dir={stats}", source="tessera")  # fmt: skip
    stage("emb.training.train", f"--config={config}")
    out = tmp_path / "eval"
    for split in ("test", "train"):  # few test blocks (no bounds); train's enough for bounds
        stage("emb.evaluation.evaluate", f"--run-dir={config.parent}", f"--classes={CLASSES_CSV}",
              f"--out-dir={out / split}", f"--split={split}", "--threads=1")  # fmt: skip

    written = sorted([*tmp_path.rglob("*.json"), *tiny_demo.root.rglob("*.json")])
    names = {p.name for p in written}
    assert {"stats.json", "train.json", "metrics.json", "manifest.json"} <= names, names
    assert any(name.endswith(".tar.idx.json") for name in names), names  # the shard sidecars
    for path in written:
        strict(path.read_text())  # raises, naming the constant, on a bare NaN

    few = strict((out / "test" / "metrics.json").read_text())
    assert isinstance(few, dict) and not few["bootstrap"]["reliable"] and few["miou_l3_lo"] is None
    # with enough blocks, the bounds of classes absent from the split were NaN: now null
    enough = strict((out / "train" / "metrics.json").read_text())
    assert isinstance(enough, dict) and enough["bootstrap"]["reliable"], enough["bootstrap"]
    iv = enough["intervals"][enough["weights"]]["l3"]
    assert len(iv["iou_lo"]) == 61 and None in iv["iou_lo"]
    assert any(isinstance(v, float) for v in iv["iou_lo"])
