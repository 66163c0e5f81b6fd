"""Stage: write the VRTs of every planned (source, area, zone) and the regions table they
make (``results/areas/regions.tsv``, a record of what the workflow added to its table).

The plan is made again here, from the same areas file and collections as at parse time, so
the VRTs are those the dry run listed; tiles fetched since are read now.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from emb import stage_runner
from emb.areas.plan import plan_areas
from emb.areas.vrt import write_mosaic
from emb.io import atomic_path
from emb.prep.tessera_npy import convert, find_triple
from emb.progress import Progress

log = logging.getLogger(__name__)


def build(areas: Path, collections: dict, table: Path) -> list[Path]:
    """Every VRT of the plan, then the table; returns the VRTs written."""
    plan = plan_areas(areas, collections)
    stale = [t for t in plan.converted() if t.header is None]
    for tile in stale:  # geotessera .npy tiles: converted once (again when the .npy changes)
        convert(find_triple(tile.npy), tile.path)
        log.info("converted %s -> %s", tile.npy, tile.path)
    if stale:
        plan = plan_areas(areas, collections)  # their headers, read and checked
    written = []
    mosaics = [m for r in plan.regions for m in r.mosaics.values()]
    with Progress(len(mosaics), "VRTs", "areas", log) as progress:
        for mosaic in mosaics:
            written += write_mosaic(mosaic)
            progress.advance()
    for region in plan.regions:
        tiles = {s: len(m.tiles) for s, m in region.mosaics.items()}
        log.info("region %s: %s tiles %s", region.region, region.year, tiles)
    with atomic_path(table) as tmp:
        plan.rows().to_csv(tmp, sep="\t", index=False)
    return written


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--areas", type=Path, required=True, help="areas file")
    parser.add_argument("--collections", required=True, help="config collections: as JSON")
    parser.add_argument("--table", type=Path, required=True, help="regions table written")
    args = parser.parse_args(argv)
    written = build(args.areas, json.loads(args.collections), args.table)
    log.info("wrote %d VRTs and %s", len(written), args.table)


if __name__ == "__main__":
    main()
