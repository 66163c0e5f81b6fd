"""Stage: a source's data manifest (tiles per split, dropped tiles, L3 class histogram) as a
figure and as HTML tables for the report."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pandas as pd

from emb import plots, stage_runner
from emb.classes import load_class_map
from emb.io import atomic_path
from emb.loading.shard_manifest import read_manifest
from emb.prep.region_index import label_coverage

log = logging.getLogger(__name__)


def split_table(manifest: dict) -> pd.DataFrame:
    """One row per split: tiles, shards, labelled pixels, classes present, dropped tiles."""
    rows = []
    for split, part in manifest["splits"].items():
        dropped = part.get("dropped", {})
        rows.append(
            {
                "split": split,
                "tiles": part["samples"],
                "shards": len(part["shards"]),
                "labelled_pixels": part["labelled_pixels"],
                "classes_present": sum(1 for n in part["class_hist"] if n > 0),
                "dropped": sum(dropped.values()),
                "dropped_by_reason": ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items())),
            }
        )
    return pd.DataFrame(rows)


def region_coverage(manifest: dict) -> dict[str, dict]:
    """Per region, its index's ``label_coverage`` (the manifest's own where it carries them,
    else the ``index.json`` beside each region's shards); regions built before it: absent."""
    if "label_coverage" in manifest:
        return dict(manifest["label_coverage"])
    found: dict[str, dict] = {}
    folders = dict.fromkeys(Path(p).parent for part in manifest["splits"].values()
                            for p in part["shards"])  # fmt: skip
    for folder in folders:
        coverage = label_coverage(folder / "index.json")
        if coverage is not None:
            found[coverage[0]] = coverage[1]
    return found


def coverage_table(manifest: dict) -> pd.DataFrame:
    """One row per region and split: the share of the region's labelled pixels that lie in a
    kept tile (of that split; ``all``: of any split). Why: pixels outside every tile are
    neither trained nor evaluated on, and a small area can lose many of them."""
    rows = [
        {
            "region": region,
            "split": split,
            "labelled_pixels_in_tiles": part["covered"],
            "share": round(part["share"], 4),
        }
        for region, coverage in sorted(region_coverage(manifest).items())
        for split, part in coverage.items()
    ]
    return pd.DataFrame(rows, columns=["region", "split", "labelled_pixels_in_tiles", "share"])


def class_table(manifest: dict, l3_names: tuple[str, ...]) -> pd.DataFrame:
    """Labelled pixels per L3 class (rows) and split (columns), classes present anywhere."""
    table = pd.DataFrame({split: part["class_hist"] for split, part in manifest["splits"].items()})
    table.insert(0, "l3_name", list(l3_names))
    table.insert(0, "l3_id", range(len(l3_names)))
    counts = table[list(manifest["splits"])]
    table = table[counts.sum(axis=1) > 0]
    return table.sort_values(list(manifest["splits"])[0], ascending=False)


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--classes", type=Path, required=True)
    parser.add_argument("--png", type=Path, required=True)
    parser.add_argument("--html", type=Path, required=True)
    args = parser.parse_args(argv)
    manifest = read_manifest(args.manifest)
    names = load_class_map(args.classes).l3_names
    plots.save(plots.data_figure(manifest, names), args.png)
    tables = [
        (f"{manifest['source']}: tiles per split", split_table(manifest)),
        (f"{manifest['source']}: labelled pixels per L3 class", class_table(manifest, names)),
    ]
    coverage = coverage_table(manifest)
    if len(coverage):  # shards built before the coverage was recorded have none
        tables.append((f"{manifest['source']}: share of labelled pixels in a kept tile", coverage))
    page = plots.html_page(f"{manifest['source']} data", tables)
    with atomic_path(args.html) as tmp:
        tmp.write_text(page)
    log.info("wrote %s and %s", args.png, args.html)


if __name__ == "__main__":
    main()
