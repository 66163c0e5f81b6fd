"""What the workflow's report shows beyond the summary, and where it files each map: the
scored regions' maps under "Maps", the prediction-only ones in a section of their own (their
maps were never compared with labels)."""

from __future__ import annotations

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
