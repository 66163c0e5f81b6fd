"""The evaluate stage's figures: row-normalized confusion matrices and per-class IoU bars of
the selected weights (``emb.report.plots`` draws them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from emb.classes import ClassMap
from emb.evaluation.runs import LEVELS
from emb.report import plots


def class_names(cmap: ClassMap) -> dict[str, tuple[str, ...]]:
    return {"l1": cmap.l1_names, "l2": cmap.l2_names, "l3": cmap.l3_names}


def write_figures(
    out_dir: Path, record: dict, table: pd.DataFrame, cms: dict[str, np.ndarray], cmap: ClassMap
) -> list[Path]:
    """``confusion_l{1,2,3}.png`` and ``iou.png`` of the selected weights into ``out_dir``."""
    names = class_names(cmap)
    written = []
    for level in LEVELS:
        title = (
            f"{record['run']} ({record['weights']} weights), {level.upper()}: "
            f"OA {record[f'oa_{level}']:.3f}, mIoU {record[f'miou_{level}']:.3f}"
        )
        path = out_dir / f"confusion_{level}.png"
        plots.save(plots.confusion_figure(cms[level], names[level], title), path)
        written.append(path)
    chosen = table[table["weights"] == record["weights"]]
    path = out_dir / "iou.png"
    plots.save(plots.iou_figure(chosen, f"{record['run']} ({record['weights']} weights)"), path)
    return [*written, path]
