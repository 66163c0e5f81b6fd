"""emb.io: strict JSON (a missing value is null, never a bare NaN) written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from emb.io import json_text, write_json


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
