"""What the workflow's report shows beyond the summary, and where it files each map: the
scored regions' maps under "Maps", the prediction-only ones in a section of their own (their
maps were never compared with labels); and how each rule's file is flagged for the report
(``report_settings``, behind the rules' ``report_file``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from emb.prep.regions import PREDICT, is_predict_only

MAPS = "Maps"
UNSCORED_MAPS = "Maps, unscored (prediction-only regions)"


def report_targets(runs: Iterable[str], sources: Iterable[str]) -> list[str]:
    """Every run's maps and training curves, then each source's data figure and tables
    (``sources``: the runs' sources), in that order (rule all's inputs)."""
    runs = list(runs)
    return [
        *(f"results/maps/{run}" for run in runs),
        *(f"results/runs/{run}/curves.png" for run in runs),
        *(f"results/data/{source}.{ext}" for source in sources for ext in ("png", "html")),
    ]


def map_category(split: str) -> str:
    """The report's section of a region's map, from the region's split cell."""
    return UNSCORED_MAPS if is_predict_only(split) else MAPS


def map_labels(run: str, region: str, split: str) -> dict[str, str]:
    """The report's labels of a map: its run, its region and whether it was ever scored."""
    scored = f"no (split {PREDICT})" if is_predict_only(split) else "test tiles"
    return {"run": run, "region": region, "scored": scored}


LABELLED_BY = ("run", "source")  # a file of one run or one source is labelled with it


def report_settings(path: str, caption: str, category: str, figure: str) -> dict:
    """``report()``'s settings of one output ``path``: its caption
    ``workflow/report/{caption}.rst`` (relative to workflow/rules/, where the rules call it),
    its section ``category`` (a subsection per run for a run's files), and its labels: the
    run or source its path names, then what it shows (``figure``)."""
    wildcards = set(re.findall(r"\{(\w+)", path))
    return {
        "caption": f"../report/{caption}.rst",
        "category": category,
        "subcategory": "{run}" if "run" in wildcards else None,
        "labels": {
            **{name: f"{{{name}}}" for name in LABELLED_BY if name in wildcards},
            "figure": figure,
        },
    }
