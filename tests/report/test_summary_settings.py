"""A metrics.json whose bootstrap settings cannot be right is refused naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emb.report.summary import read_metrics


@pytest.mark.parametrize(
    ("key", "value"), [("level", 1.5), ("level", 0.0), ("resamples", 0), ("seed", -1)]
)
def test_a_bootstrap_setting_out_of_range_is_refused_naming_the_file(
    tmp_path: Path, key: str, value: float
) -> None:
    path = tmp_path / "metrics.json"
    good = {"resamples": 1000, "seed": 0, "level": 0.95}
    path.write_text(json.dumps({"bootstrap": good}))
    assert read_metrics(path)["bootstrap"] == good
    path.write_text(json.dumps({"bootstrap": {**good, key: value}}))
    with pytest.raises(ValueError, match=rf"{path}: bootstrap: .*{key}"):
        read_metrics(path)
