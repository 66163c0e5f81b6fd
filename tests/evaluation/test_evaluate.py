"""Evaluation: exact confusion matrices, figures recomputed from them, both weight sets, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import CLASSES_CSV, TinyDemo
from shard_reader import iter_samples, to_float
from tiny_runs import resolved_config, tiny_run, write_run

from emb.classes import IGNORE, load_class_map
from emb.evaluation.block_scores import BlockCounts
from emb.evaluation.evaluate import add_block_counts
from emb.evaluation.evaluate import main as evaluate_main
from emb.metrics import NUM_CLASSES, confusion_update, scores_from_confusion
from emb.models import build_model
from emb.training.loss import HierarchyTargets

LEVELS = ("l1", "l2", "l3")


@pytest.fixture(scope="module")
def evaluated(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An AEF run with raw and EMA weights, evaluated by the real CLI."""
    root = tmp_path_factory.mktemp("evaluate")
    run_dir = tiny_run(tiny_demo, root, "aef", "segformer", steps=60, with_ema=True)
    out = root / "eval"
    evaluate_main(["--run-dir", str(run_dir), "--classes", str(CLASSES_CSV), "--out-dir", str(out),
                   "--threads=1"])  # fmt: skip
    return {
        "run_dir": run_dir,
        "out": out,
        "metrics": json.loads((out / "metrics.json").read_text()),
        "table": pd.read_csv(out / "per_class.csv"),
    }


def numpy_scores(cm: np.ndarray) -> dict:
    """The figures, written out again from their definitions (independent of emb.metrics)."""
    cm = cm.astype(np.float64)
    n = cm.shape[0]
    tp = np.array([cm[i, i] for i in range(n)])
    support = np.array([cm[i, :].sum() for i in range(n)])
    predicted = np.array([cm[:, j].sum() for j in range(n)])
    present = [i for i in range(n) if support[i] > 0]
    iou = {i: tp[i] / (support[i] + predicted[i] - tp[i]) for i in present}
    f1 = {i: 2 * tp[i] / (support[i] + predicted[i]) for i in present}
    return {
        "oa": tp.sum() / cm.sum(),
        "miou": sum(iou.values()) / len(present),
        "f1": sum(f1.values()) / len(present),
        "iou": iou,
        "f1_class": f1,
        "precision": {i: tp[i] / predicted[i] for i in range(n) if predicted[i] > 0},
        "recall": {i: tp[i] / support[i] for i in present},
        "support": support,
    }


def test_metrics_equal_a_numpy_recomputation_from_the_raw_confusion_matrices(evaluated) -> None:
    metrics, table = evaluated["metrics"], evaluated["table"]
    for weights in ("raw", "ema"):
        for level in LEVELS:
            cm = np.array(metrics[weights][level]["confusion"], dtype=np.int64)
            want = numpy_scores(cm)
            got = metrics[weights][level]
            for key in ("oa", "miou", "f1"):
                assert got[key] == pytest.approx(want[key], abs=1e-9), (weights, level, key)
            rows = table[(table["weights"] == weights) & (table["level"] == level)]
            rows = rows.set_index("class_id")
            assert (rows["support"].to_numpy() == want["support"]).all()
            per_class = {"iou": want["iou"], "f1": want["f1_class"],
                         "precision": want["precision"], "recall": want["recall"]}  # fmt: skip
            for column, values in per_class.items():
                for class_id, value in values.items():
                    assert rows.loc[class_id, column] == pytest.approx(value, abs=1e-9)
            never_predicted = rows[rows["predicted"] == 0]
            assert never_predicted["precision"].isna().all()


def test_confusion_matrices_count_every_labelled_test_pixel_once(
    evaluated, tiny_demo: TinyDemo, class_map
) -> None:
    """The raw weights' matrices, rebuilt by running the model tile by tile outside evaluate."""
    manifest = tiny_demo.manifest("aef")
    state = torch.load(evaluated["run_dir"] / "best.pt", weights_only=True)
    from emb.training.run_config import TrainConfig

    model = build_model(TrainConfig.from_dict(state["config"]).model)
    model.load_state_dict(state["model"])
    model.eval()
    samples = list(iter_samples(manifest["splits"]["test"]["shards"]))
    x = torch.from_numpy(np.stack([to_float("aef", s) for s in samples]))
    labels = np.stack([s["label"] for s in samples])
    with torch.no_grad():
        logits = model(x)
    targets = class_map.levels(labels)
    metrics = evaluated["metrics"]
    for level in LEVELS:
        n = len(metrics["raw"][level]["confusion"])
        pred = logits[level].argmax(1).numpy()
        keep = targets[level] != IGNORE
        want = np.zeros((n, n), np.int64)
        np.add.at(want, (targets[level][keep], pred[keep]), 1)
        got = np.array(metrics["raw"][level]["confusion"])
        assert (got == want).all(), level
        assert got.sum() == manifest["splits"]["test"]["labelled_pixels"] == keep.sum()


def test_top_level_figures_are_the_ema_weights_when_the_checkpoint_has_them(evaluated) -> None:
    metrics = evaluated["metrics"]
    assert metrics["weights"] == "ema" and metrics["weight_sets"] == ["raw", "ema"]
    for level in LEVELS:
        for key in ("oa", "miou", "f1"):
            assert metrics[f"{key}_{level}"] == metrics["ema"][level][key]
    assert metrics["raw"]["l3"]["confusion"] != metrics["ema"]["l3"]["confusion"]


def test_a_checkpoint_without_ema_is_scored_on_its_raw_weights(
    tiny_demo: TinyDemo, tmp_path: Path, evaluated
) -> None:
    state = torch.load(evaluated["run_dir"] / "best.pt", weights_only=True)
    run_dir = write_run(tmp_path / "runs" / "plain", state["config"], state["model"])
    out = tmp_path / "eval"
    evaluate_main(["--run-dir", str(run_dir), "--classes", str(CLASSES_CSV), "--out-dir", str(out),
                   "--threads=1"])  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["weights"] == "raw" and metrics["weight_sets"] == ["raw"]
    assert metrics["raw"] == evaluated["metrics"]["raw"]
    assert set(pd.read_csv(out / "per_class.csv")["weights"]) == {"raw"}


def test_confusion_pngs_and_iou_bars_are_written(evaluated) -> None:
    from PIL import Image

    for name in ("confusion_l1.png", "confusion_l2.png", "confusion_l3.png", "iou.png"):
        with Image.open(evaluated["out"] / name) as image:
            assert image.format == "PNG" and min(image.size) > 200


def test_confusion_figure_is_row_normalized_with_class_names() -> None:
    from emb.plots import confusion_figure

    cm = np.array([[6, 0, 2], [0, 0, 0], [1, 0, 3]])  # class "b" neither occurs nor is predicted
    fig = confusion_figure(cm, ["a", "b", "c"], "t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "c"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "c"]
    image = ax.get_images()[0].get_array()
    np.testing.assert_allclose(np.asarray(image).sum(1), [1.0, 1.0])


def test_scores_average_over_classes_present_in_the_reference_only() -> None:
    # class 1 is predicted once but absent from the reference: it must not enter the means
    cm = np.array([[3, 1, 0], [0, 0, 0], [1, 0, 2]])
    s = scores_from_confusion(cm)
    assert s["classes_present"] == 2
    assert s["miou"] == pytest.approx((3 / 5 + 2 / 3) / 2, abs=1e-12)
    assert s["f1"] == pytest.approx((6 / 8 + 4 / 5) / 2, abs=1e-12)
    assert s["oa"] == pytest.approx(5 / 7, abs=1e-12)


def test_confusion_update_never_counts_ignored_pixels() -> None:
    cm = torch.zeros(3, 3, dtype=torch.int64)
    target = torch.tensor([[0, 1, 255], [2, 255, 2]])
    pred = torch.tensor([[0, 2, 1], [2, 0, 1]])
    confusion_update(cm, pred, target)
    assert cm.sum() == 4
    assert cm.tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 1]]


def test_confusion_update_counts_as_torchmetrics_does() -> None:
    """The device-side counts (a scatter-add, issue 31) against torchmetrics' confusion matrix,
    the field's reference, on 61 classes with ignored pixels."""
    from torchmetrics.functional.classification import multiclass_confusion_matrix

    g = torch.Generator().manual_seed(3)
    target = torch.randint(0, 61, (4, 32, 32), generator=g)
    target[torch.rand(4, 32, 32, generator=g) < 0.2] = 255
    pred = torch.randint(0, 61, (4, 32, 32), generator=g)
    cm = torch.zeros(61, 61, dtype=torch.int64)
    confusion_update(cm, pred, target)
    confusion_update(cm, pred, target)  # it adds
    reference = multiclass_confusion_matrix(pred, target, 61, ignore_index=255)
    assert torch.equal(cm, 2 * reference)


def run_cli(run_dir: Path, out: Path) -> str:
    with pytest.raises(SystemExit) as exc:
        evaluate_main(["--run-dir", str(run_dir), "--classes", str(CLASSES_CSV),
                       "--out-dir", str(out), "--threads=1"])  # fmt: skip
    assert not (out / "metrics.json").exists()
    return str(exc.value)


def test_run_without_checkpoint_is_an_error_naming_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "never_trained"
    run_dir.mkdir(parents=True)
    (run_dir / "last.pt").write_bytes(b"")
    message = run_cli(run_dir, tmp_path / "eval")
    assert "never_trained" in message and "best.pt" in message and "last.pt" in message


def test_checkpoint_in_dim_not_matching_the_data_is_an_error_naming_both(
    tiny_demo: TinyDemo, tmp_path: Path, evaluated
) -> None:
    state = torch.load(evaluated["run_dir"] / "best.pt", weights_only=True)
    config = dict(state["config"], data=dict(state["config"]["data"]))
    config["data"]["manifest"] = str(tiny_demo.manifests["tessera"])  # 128-D data, 64-D model
    run_dir = write_run(tmp_path / "runs" / "mixed", config, state["model"])
    message = run_cli(run_dir, tmp_path / "eval")
    assert "in_dim is 64" in message and "in_dim 128" in message
    assert str(tiny_demo.manifests["tessera"]) in message


def test_a_forged_tile_header_in_the_test_split_is_refused_before_allocating(
    tiny_demo: TinyDemo, tmp_path: Path, evaluated
) -> None:
    """evaluate's reader bounds a shard's header by the manifest's tile size (issue 32)."""
    from forged_shards import forged_shard

    manifest = tiny_demo.manifest("aef")
    shard = str(forged_shard(tmp_path / "test-0000.tar", sidecar=True, tile=manifest["tile_size"]))
    test = manifest["splits"]["test"]
    test.update(shards=[shard], shard_samples=[1], shard_keys=[["a"]], samples=1, tiles=1)
    (tmp_path / "forged.json").write_text(json.dumps(manifest))
    state = torch.load(evaluated["run_dir"] / "best.pt", weights_only=True)
    config = dict(state["config"], data=dict(state["config"]["data"]))
    config["data"]["manifest"] = str(tmp_path / "forged.json")
    run_dir = write_run(tmp_path / "runs" / "forged", config, state["model"])
    message = run_cli(run_dir, tmp_path / "eval")
    assert shard in message and "[64, 60000, 60000]" in message, message


def test_checkpoint_class_count_not_matching_classes_csv_is_an_error(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    config = resolved_config(tiny_demo, tmp_path, "aef", "segformer")
    config["model"]["num_classes"] = [2, 7, 40]
    from emb.training.run_config import TrainConfig

    model = build_model(TrainConfig.from_dict(config).model)
    run_dir = write_run(tmp_path / "runs" / "forty", config, model.state_dict())
    message = run_cli(run_dir, tmp_path / "eval")
    assert "L3 head has 40 classes" in message and "defines 61" in message
    assert "classes.csv" in message


def test_class_map_levels_agree_with_hierarchy_targets(class_map) -> None:
    """The test above rebuilds L1/L2 targets with ClassMap.levels; evaluate uses the torch
    lookup: both must give the same targets."""
    l3 = np.array([[0, 1, 255], [60, 3, 2]], dtype=np.uint8)
    torch_targets = HierarchyTargets(load_class_map(CLASSES_CSV))(torch.from_numpy(l3).long())
    for level, values in class_map.levels(l3).items():
        assert (torch_targets[level].numpy() == values).all()


def test_block_matrices_sum_to_the_test_matrix_and_bound_every_figure(evaluated) -> None:
    """blocks.npz splits the exact counts by spatial block (they sum back to metrics.json's
    matrices), and every figure sits inside its bootstrap interval."""
    m = evaluated["metrics"]
    with np.load(evaluated["out"] / "blocks.npz") as z:
        ids = z["block_ids"]
        for weights in m["weight_sets"]:
            for level in LEVELS:
                summed = z[f"{weights}_{level}"].sum(0)
                np.testing.assert_array_equal(summed, np.array(m[weights][level]["confusion"]))
    assert m["bootstrap"]["blocks"] == len(ids) > 1
    assert m["bootstrap"]["method"] == "percentile" and "resamples" in m["provenance"]["bootstrap"]
    assert m["bootstrap"]["reliable"] == (len(ids) >= 10)
    for level in LEVELS:
        for fig in ("oa", "miou", "f1"):
            lo, hi = m[f"{fig}_{level}_lo"], m[f"{fig}_{level}_hi"]
            if m["bootstrap"]["reliable"]:  # too few blocks: no interval (issue 41 item 1)
                assert lo <= m[f"{fig}_{level}"] <= hi
            else:
                assert lo is None and hi is None
    t = evaluated["table"]
    seen = t[t["support"] > 0]
    if not m["bootstrap"]["reliable"]:
        assert seen["iou_lo"].isna().all() and seen["iou_hi"].isna().all()
        return
    assert (seen["iou_lo"] <= seen["iou"] + 1e-12).all() and (
        seen["iou"] <= seen["iou_hi"] + 1e-12
    ).all()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--resamples", "0"), ("--resamples", "-5"), ("--resamples", "many"), ("--seed", "-1"),
     ("--level", "1.5"), ("--level", "0"), ("--level", "1"), ("--level", "nan")],
)  # fmt: skip
def test_bootstrap_options_out_of_range_are_refused_in_one_line_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture, option: str, value: str
) -> None:
    """Refused by the CLI before any run is opened (the run folder does not even exist)."""
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exc:
        evaluate_main(["--run-dir", str(tmp_path / "nowhere"), "--classes", str(CLASSES_CSV),
                       "--out-dir", str(out), "--threads=1", f"{option}={value}"])  # fmt: skip
    assert exc.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and f"argument {option}" in errors[0] and repr(value) in errors[0]
    assert "Traceback" not in err and not out.exists()


def test_a_confidence_level_inside_0_1_reaches_the_bootstrap_settings(
    evaluated: dict, tmp_path: Path
) -> None:
    out = tmp_path / "eval90"
    evaluate_main(["--run-dir", str(evaluated["run_dir"]), "--classes", str(CLASSES_CSV),
                   "--out-dir", str(out), "--threads=1", "--level", "0.9",
                   "--resamples", "50"])  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["provenance"]["bootstrap"]["level"] == 0.9
    assert metrics["provenance"]["bootstrap"]["resamples"] == 50


def test_block_counts_from_device_rows_equal_block_counts_add() -> None:
    """evaluate's per-batch block counting (rows sliced from one device tensor) counts what
    ``BlockCounts.add`` counts from host ids."""
    g = torch.Generator().manual_seed(5)
    blocks = ["b2", "b0", "b1", "b0", "b2", "b2", "b1"]
    ours = BlockCounts(blocks, ["raw"], torch.device("cpu"))
    theirs = BlockCounts(blocks, ["raw"], torch.device("cpu"))
    rows = torch.tensor([ours.index[b] for b in blocks])
    for start, stop in ((0, 4), (4, 7)):
        n = stop - start
        logits = {lv: torch.randn(n, k, 8, 8, generator=g) for lv, k in NUM_CLASSES.items()}
        targets = {lv: torch.randint(0, k, (n, 8, 8), generator=g) for lv, k in NUM_CLASSES.items()}
        targets["l3"][:, 0] = IGNORE
        add_block_counts(ours, "raw", rows[start:stop], logits, targets)
        theirs.add("raw", blocks[start:stop], logits, targets)
    for lv in NUM_CLASSES:
        assert torch.equal(ours.counts["raw"][lv], theirs.counts["raw"][lv])
        assert ours.counts["raw"][lv].sum() > 0
