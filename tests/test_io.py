"""emb.io: strict JSON (a missing value is null, never a bare NaN) written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from emb.io import YAMLFileError, json_text, read_yaml, write_json


def strict(text: str):
    """Parse as strict readers do (JavaScript's JSON.parse, jq): NaN and Infinity refused."""

    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_missing_values_become_null_at_any_depth(tmp_path: Path) -> None:
    data = {"a": math.nan, "b": [1.0, -math.inf, {"c": (math.inf, 2)}], "d": np.float64("nan")}
    want = {"a": None, "b": [1.0, None, {"c": [None, 2]}], "d": None}
    assert strict(json_text(data)) == want
    write_json(tmp_path / "out.json", data)
    assert strict((tmp_path / "out.json").read_text()) == want
    with pytest.raises(ValueError, match="NaN"):
        strict(json.dumps(data))  # what Python's json writes by default: refused


def test_what_is_not_json_is_refused_not_written(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    write_json(path, {"ok": 1})
    with pytest.raises(TypeError):
        write_json(path, {"bad": {1, 2}})
    assert strict(path.read_text()) == {"ok": 1}  # the good file stays as it was


def test_a_yaml_file_that_does_not_parse_is_named_with_its_line_and_column(tmp_path: Path) -> None:
    """One message for every YAML file emb reads (run configs, resolved configs): the file, the
    line and column where the parse stopped; raised as the caller's error when it names one."""
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  epochs: 3\n\tbatch_size: 2\n")  # a tab in the indentation
    with pytest.raises(YAMLFileError, match=rf"^{path}: line 3 column 1: not valid YAML: "):
        read_yaml(path)

    class OwnError(ValueError):
        pass

    with pytest.raises(OwnError, match="line 3 column 1"):
        read_yaml(path, OwnError)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(YAMLFileError, match="not a UTF-8 text file"):
        read_yaml(path)
    path.write_text("train: {epochs: 3}\n")
    assert read_yaml(path) == {"train": {"epochs": 3}}
