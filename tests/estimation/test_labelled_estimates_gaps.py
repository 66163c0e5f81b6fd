"""H6's proposed tests for emb.estimation.labelled_estimates: on another map the accuracies are
that map's (its classes at the points, its "no data"), and a 1-unit stratum withholds only
the standard errors it enters at a coarser level."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import rasterio
from test_labelled_estimates import CMAP, labelled_sample, scene, write_map

from emb.classes import IGNORE
from emb.estimation.estimates_table import estimate_rows
from emb.estimation.estimators import stehman
from emb.estimation.labelled_estimates import estimate_sample
from emb.estimation.sample_files import read_labelled
from emb.estimation.settings import from_json


def classes_at(path: Path, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """The map's L3 value at each point, read here with rasterio's own index."""
    with rasterio.open(path) as src:
        data = src.read(1)
        return np.array([data[src.index(x, y)] for x, y in zip(xs, ys, strict=True)])


def test_on_another_map_the_accuracies_are_that_maps(tmp_path: Path) -> None:
    truth, mapped = scene(0)
    _, other = scene(5)
    other = np.where(mapped == IGNORE, IGNORE, other).astype(np.uint8)
    other_map = write_map(tmp_path / "other.tif", other)
    sample_csv, record = labelled_sample(tmp_path, truth, mapped, level=2)
    sample = read_labelled(sample_csv, record, CMAP)
    found = estimate_sample(sample, {"r1": other_map}, CMAP)[0]
    assert found.level == 2
    on_other = CMAP.l3_to_l2[classes_at(other_map, sample.points.x, sample.points.y)]
    counts = np.bincount(CMAP.l3_to_l2[other[other != IGNORE]], minlength=7).astype(np.int64)
    want = stehman(np.asarray(sample.record.strata_px), sample.stratum,
                   on_other.astype(np.int64), sample.reference, counts)  # fmt: skip
    want_by = {c.cls: c for c in want.classes}
    for c in found.estimates.classes:
        if c.cls < 7:
            assert c.users == want_by[c.cls].users, c.cls
            assert c.producers == want_by[c.cls].producers, c.cls
    assert found.estimates.overall == want.overall


def test_a_point_where_another_map_has_no_data_is_mapped_no_data(tmp_path: Path) -> None:
    truth, mapped = scene(0)
    sample_csv, record = labelled_sample(tmp_path, truth, mapped, level=2)
    sample = read_labelled(sample_csv, record, CMAP)
    holed = mapped.copy()
    holed[3:40, :] = IGNORE  # another source's map: no data over a band the design had
    other_map = write_map(tmp_path / "holed.tif", holed)
    on_hole = classes_at(other_map, sample.points.x, sample.points.y) == IGNORE
    assert on_hole.any()
    found = estimate_sample(sample, {"r1": other_map}, CMAP)[0]
    no_data = {c.cls: c for c in found.estimates.classes}[7]  # one past the L2 ids
    assert no_data.units_mapped == on_hole.sum()
    assert no_data.mapped_px == (mapped != IGNORE).sum() - (holed != IGNORE).sum()
    assert no_data.proportion.value == 0  # no reference is "no data"
    rows = estimate_rows(found.estimates, 2, CMAP, 0.01, from_json("{}"), {})
    assert [r["class"] for r in rows if r["class_id"] == 7] == ["no data"]


def keep_one_labelled(sample_csv: Path, stratum: int) -> None:
    """Blank the reference of every row of ``stratum`` (map_class) but the first."""
    rows = list(csv.DictReader(sample_csv.open()))
    seen = False
    for row in rows:
        if int(row["map_class"]) == stratum and row["reference"]:
            if seen:
                row["reference"] = ""
            seen = True
    with sample_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_a_lone_unit_withholds_at_a_coarser_level_only_the_ses_it_enters(tmp_path: Path) -> None:
    truth, mapped = scene(0)
    sample_csv, record = labelled_sample(tmp_path, truth, mapped, level=3)
    keep_one_labelled(sample_csv, 5)  # cotton (L2 row_crops, 0): one labelled unit
    sample = read_labelled(sample_csv, record, CMAP)
    l3, l2, _ = estimate_sample(sample, {"r1": tmp_path / "maps" / "r1.tif"}, CMAP)
    assert l2.level == 2 and l2.estimates.classes[0].cls == 0
    by = {c.cls: c for c in l2.estimates.classes}
    assert by[0].users.se is None and "1 sample unit" in by[0].users.why
    assert by[1].users.se is not None and by[2].users.se is not None  # cotton is none of them
    assert all(c.proportion.se is None for c in l2.estimates.classes)  # areas draw on it
