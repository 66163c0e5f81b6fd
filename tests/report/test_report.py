"""Report pieces: the summary table, training curves, the data manifest and the colours."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import CLASSES_CSV, TinyDemo
from PIL import Image

from emb.classes import load_class_map
from emb.colours import dominant_codes, l3_colours, official_palette
from emb.report.curves import main as curves_main
from emb.report.data_report import class_table, split_table
from emb.report.data_report import main as data_report_main
from emb.report.summary import main as summary_main

LEVELS = ("l1", "l2", "l3")


def metrics(seed: int, weight_sets: list[str]) -> dict:
    """A metrics.json record as the evaluate stage writes it (figures made up, structure real)."""
    rng = np.random.default_rng(seed)
    record = {"epoch": 4, "samples": 10, "weights": weight_sets[-1], "weight_sets": weight_sets}
    for name in weight_sets:
        record[name] = {lv: {k: float(rng.random()) for k in ("oa", "miou", "f1")} for lv in LEVELS}
    for lv in LEVELS:
        for key in ("oa", "miou", "f1"):
            record[f"{key}_{lv}"] = record[weight_sets[-1]][lv][key]
    return record


def test_summary_has_one_row_per_run_with_the_selected_weights(tmp_path: Path) -> None:
    paths = []
    for run, sets in (("a", ["raw", "ema"]), ("b", ["raw"])):
        path = tmp_path / f"{run}.json"
        path.write_text(json.dumps(metrics(len(sets), sets)))
        paths.append(str(path))
    out = tmp_path / "summary.csv"
    html, png = tmp_path / "s.html", tmp_path / "s.png"
    summary_main(["--runs", "a", "b", "--metrics", *paths, "--out", str(out),
                  "--html", str(html), "--png", str(png)])  # fmt: skip
    table = pd.read_csv(out).set_index("run")
    assert list(table["weights"]) == ["ema", "raw"]
    a = json.loads(Path(paths[0]).read_text())
    assert table.loc["a", "miou_l3"] == pytest.approx(a["ema"]["l3"]["miou"])
    assert table.loc["a", "raw_miou_l3"] == pytest.approx(a["raw"]["l3"]["miou"])
    assert np.isnan(table.loc["b", "ema_miou_l3"])
    page = html.read_text()
    assert "<table" in page and ">a<" in page and ">b<" in page
    assert Image.open(png).format == "PNG"


@pytest.mark.parametrize("ema", [False, True])
def test_curves_are_drawn_from_history_with_or_without_ema(tmp_path: Path, ema: bool) -> None:
    epochs = np.arange(1, 6)
    history = {"epoch": epochs, "lr": 1e-3 / epochs, "train_loss": 3.0 / epochs}
    history.update({f"train_loss_{lv}": 1.0 / epochs for lv in LEVELS})
    sets = ["ema_", "raw_"] if ema else [""]
    for prefix in sets:
        history[f"val_{prefix}loss"] = 2.0 / epochs
        history.update({f"val_{prefix}miou_{lv}": epochs / 10 for lv in LEVELS})
    path = tmp_path / "history.csv"
    pd.DataFrame(history).to_csv(path, index=False)
    from emb.plots import curves_figure

    fig = curves_figure(pd.read_csv(path), "t")
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert len(labels) == 3 * len(sets)
    curves_main(["--history", str(path), "--run", "r", "--out", str(tmp_path / "c.png")])
    assert Image.open(tmp_path / "c.png").format == "PNG"


def test_curves_of_a_run_never_trained_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "runs" / "ghost" / "history.csv"
    with pytest.raises(SystemExit) as exc:
        curves_main(["--history", str(missing), "--run", "ghost",
                      "--out", str(tmp_path / "c.png")])  # fmt: skip
    assert "ghost" in str(exc.value) and str(missing) in str(exc.value)


def test_data_tables_add_up_to_the_manifest(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    manifest = tiny_demo.manifest("aef")
    names = load_class_map(CLASSES_CSV).l3_names
    splits = split_table(manifest).set_index("split")
    for split, part in manifest["splits"].items():
        assert splits.loc[split, "tiles"] == part["samples"]
        assert splits.loc[split, "labelled_pixels"] == part["labelled_pixels"]
    classes = class_table(manifest, names)
    for split, part in manifest["splits"].items():
        assert classes[split].sum() == part["labelled_pixels"]
    data_report_main(["--manifest", str(tiny_demo.manifests["aef"]), "--classes",
                  str(CLASSES_CSV), "--png", str(tmp_path / "d.png"),
                  "--html", str(tmp_path / "d.html")])  # fmt: skip
    html = (tmp_path / "d.html").read_text()
    # splits, classes, and the share of labelled pixels in a kept tile per region and split
    assert html.count("<table") == 3 and "soybeans" in html
    assert set(manifest["label_coverage"]) == {"demo_a", "demo_b"}
    assert "share of labelled pixels in a kept tile" in html


def test_every_l3_class_takes_an_official_colour_of_one_of_its_own_codes(class_map) -> None:
    codes = dominant_codes(class_map)
    colours = l3_colours(class_map)
    for l3, code in enumerate(codes):
        assert class_map.cdl_to_l3[code] == l3
        assert tuple(colours[l3]) == official_palette()[code]
    by_name = dict(zip(class_map.l3_names, codes, strict=True))
    assert by_name["open_water"] == 111 and by_name["developed"] == 121 and by_name["corn"] == 1


def blocks_run(root: Path, run: str, source: str, arch: str, ids: list[str], right: float) -> str:
    """A run's metrics.json and blocks.npz (3 classes, ``right`` share of pixels correct)."""
    from emb.evaluation.block_scores import interval_record, write_blocks
    from emb.evaluation.bootstrap import BootstrapSettings
    from emb.metrics import scores_from_confusion

    rng = np.random.default_rng(len(run))
    stacks = {"raw": {}}
    for lv in LEVELS:
        ok = rng.binomial(100, right, size=(len(ids), 3))
        cms = np.zeros((len(ids), 3, 3), dtype=np.int64)
        for c in range(3):
            cms[:, c, c], cms[:, c, (c + 1) % 3] = ok[:, c], 100 - ok[:, c]
        stacks["raw"][lv] = cms
    settings = BootstrapSettings(resamples=200)
    record = {"epoch": 1, "samples": len(ids), "weights": "raw", "weight_sets": ["raw"],
              "source": source, "arch": arch,
              "bootstrap": {**settings.record(), "blocks": len(ids), "reliable": len(ids) >= 10,
                            "note": f"{len(ids)} test blocks"}}  # fmt: skip
    record["raw"] = {lv: scores_from_confusion(stacks["raw"][lv].sum(0)) for lv in LEVELS}
    for lv in LEVELS:
        record["raw"][lv].pop("per_class")
        for f in ("oa", "miou", "f1"):
            record[f"{f}_{lv}"] = record["raw"][lv][f]
    record.update({k: v for k, v in interval_record(stacks, "raw", settings).items()
                   if k != "per_weights"})  # fmt: skip
    out = root / run
    out.mkdir()
    write_blocks(out / "blocks.npz", ids, stacks)
    (out / "metrics.json").write_text(json.dumps(record))
    return str(out / "metrics.json")


def test_summary_pairs_runs_on_shared_blocks_and_says_why_not(tmp_path: Path) -> None:
    """Intervals in summary.csv; TESSERA - AEF (SegFormer) and SegFormer - DeepLab (AEF) are
    paired on their shared blocks; TESSERA DeepLab was scored elsewhere: not paired, and why."""
    here, there = [f"r1_b{i}" for i in range(12)], [f"r9_b{i}" for i in range(12)]
    runs = {"aef_segformer": ("aef", "segformer", here, 0.9),
            "tessera_segformer": ("tessera", "segformer", here, 0.6),
            "aef_deeplab": ("aef", "deeplab", here, 0.9),
            "tessera_deeplab": ("tessera", "deeplab", there, 0.6)}  # fmt: skip
    paths = [blocks_run(tmp_path, run, *spec) for run, spec in runs.items()]
    out, pairs, html = tmp_path / "summary.csv", tmp_path / "pairs.csv", tmp_path / "s.html"
    summary_main(["--runs", *runs, "--metrics", *paths, "--out", str(out), "--pairs", str(pairs),
                  "--html", str(html), "--png", str(tmp_path / "s.png")])  # fmt: skip
    table = pd.read_csv(out).set_index("run")
    assert (table["miou_l3_lo"] <= table["miou_l3"]).all()
    assert (table["miou_l3"] <= table["miou_l3_hi"]).all() and (table["blocks"] == 12).all()
    p = pd.read_csv(pairs)
    te = p[(p["pair"] == "TESSERA - AEF (SegFormer)") & (p["figure"] == "oa")]
    assert len(te) == 3 and (te["hi"] < 0).all() and (te["blocks"] == 12).all()
    assert te["sentence"].str.contains(": distinguishable on this test split").all()
    arch = p[(p["pair"] == "SegFormer - DeepLab (AEF)") & (p["level"] == "l3")]
    assert len(arch) == 3
    for label in ("TESSERA - AEF (DeepLab)", "SegFormer - DeepLab (TESSERA)"):
        (why,) = p.loc[p["pair"] == label, "sentence"]
        assert "not paired" in why and "no test block in common" in why
    assert (p.loc[p["level"].notna(), "verdict"] != "no verdict").all()
    page = html.read_text()
    assert page.index("can support") < page.index("Test split, all runs") < page.index("Paired")


def test_paired_differences_are_the_first_named_run_minus_the_second(tmp_path: Path) -> None:
    """Four runs of four accuracies on the same blocks: each pair's difference is its label's
    first run minus its second (SegFormer - DeepLab, TESSERA - AEF), with a matching sign
    and an interval around it; swapping a pair's runs turns these red."""
    ids = [f"b{i}" for i in range(12)]
    right = {"aef_segformer": 0.9, "aef_deeplab": 0.6, "tessera_segformer": 0.7,
             "tessera_deeplab": 0.8}  # fmt: skip
    runs = {r: (*r.split("_"), ids, acc) for r, acc in right.items()}
    paths = [blocks_run(tmp_path, run, *spec) for run, spec in runs.items()]
    out, pairs = tmp_path / "summary.csv", tmp_path / "pairs.csv"
    summary_main(["--runs", *runs, "--metrics", *paths, "--out", str(out),
                  "--pairs", str(pairs)])  # fmt: skip
    table = pd.read_csv(out).set_index("run")
    p = pd.read_csv(pairs)
    named = {"TESSERA - AEF (SegFormer)": ("tessera_segformer", "aef_segformer"),
             "TESSERA - AEF (DeepLab)": ("tessera_deeplab", "aef_deeplab"),
             "SegFormer - DeepLab (AEF)": ("aef_segformer", "aef_deeplab"),
             "SegFormer - DeepLab (TESSERA)": ("tessera_segformer", "tessera_deeplab")}  # fmt: skip
    assert set(p["pair"]) == set(named)
    for label, (first, second) in named.items():
        rows = p[p["pair"] == label]
        assert len(rows) == 9 and (rows["b"] == first).all() and (rows["a"] == second).all()
        sign = np.sign(right[first] - right[second])
        for _, r in rows.iterrows():
            fig = f"{r['figure']}_{r['level']}"
            want = table.loc[first, fig] - table.loc[second, fig]
            assert r["difference"] == pytest.approx(want, abs=1e-12), (label, fig)
            assert np.sign(r["difference"]) == sign and r["lo"] <= r["difference"] <= r["hi"]
            assert (
                r["verdict"] == "distinguishable" and f": {r['difference']:+.3f} [" in r["sentence"]
            )


def test_too_few_blocks_give_no_interval_and_no_verdict_anywhere(tmp_path: Path) -> None:
    """4 shared blocks, and a metrics.json that still holds bounds (as evaluate wrote them
    before the floor): summary.csv and pairs.csv hold no bound and no verdict, say why, and
    the page shows the figures alone with the reason once."""
    ids = [f"b{i}" for i in range(4)]
    runs = {"aef_segformer": ("aef", "segformer", ids, 0.9),
            "tessera_segformer": ("tessera", "segformer", ids, 0.6)}  # fmt: skip
    paths = [blocks_run(tmp_path, run, *spec) for run, spec in runs.items()]
    for path in paths:  # an older metrics.json: bounds from 4 blocks
        m = json.loads(Path(path).read_text())
        m.update({f"{f}_{lv}_{e}": m[f"{f}_{lv}"] for f in ("oa", "miou", "f1")
                  for lv in LEVELS for e in ("lo", "hi")})  # fmt: skip
        m["bootstrap"]["reliable"] = True
        Path(path).write_text(json.dumps(m))
    out, pairs, html = tmp_path / "summary.csv", tmp_path / "pairs.csv", tmp_path / "s.html"
    summary_main(["--runs", *runs, "--metrics", *paths, "--out", str(out), "--pairs", str(pairs),
                  "--html", str(html)])  # fmt: skip
    table = pd.read_csv(out)
    bounds = [f"{f}_{lv}_{e}" for f in ("oa", "miou", "f1") for lv in LEVELS for e in ("lo", "hi")]
    assert table[bounds].isna().all().all() and (table["blocks"] == 4).all()
    p = pd.read_csv(pairs)
    assert len(p) == 9 and p[["lo", "hi"]].isna().all().all()
    assert (p["verdict"] == "no verdict").all() and p["difference"].lt(0).all()
    assert (
        p["sentence"].str.contains("only 4 shared test blocks (fewer than 10)", regex=False).all()
    )
    assert not p["sentence"].str.contains(r"\[|: distinguishable|: not distinguishable").any()
    page = html.read_text()
    assert page.count("Below 10 blocks no interval and no verdict") == 1
    assert "no verdict (4 shared blocks)" in page and "unreliable" not in page
    miou = json.loads(Path(paths[0]).read_text())["miou_l1"]
    assert f">{miou:.3f}</td>" in page and f"{miou:.3f} <span" not in page
