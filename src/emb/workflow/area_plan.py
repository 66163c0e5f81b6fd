"""What the workflow asks of the areas while it is parsed (workflow/rules/common.smk and
areas.smk): the plan from the config, the rows without a table, the rule's inputs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
from affine import Affine
from rasterio.crs import CRS

from emb.areas.plan import AreaPlan, plan_areas
from emb.areas.tile_yield import check_tile_yield, specs_of
from emb.prep.footprints import Footprint

COLUMNS = ("region", "year", "aef", "tessera", "cdl", "split")


def empty_regions() -> pd.DataFrame:
    """A regions table without rows (``regions: ""``: the areas give every region)."""
    return pd.DataFrame(columns=list(COLUMNS), dtype=str).set_index("region", drop=False)


def plan_from_config(config: Mapping) -> AreaPlan | None:
    """The plan of ``config["areas"]`` over ``config["collections"]``; None when areas are off.
    With a ``tiles`` section (the workflow's), an area whose region keeps no tile is refused
    here, before any job."""
    if not config.get("areas"):
        return None
    plan = plan_areas(config["areas"], config.get("collections") or {})
    specs = specs_of(config)
    if specs is not None:
        check_tile_yield(plan, config["areas"], *specs)
    return plan


HOW_FETCHED = ("url", "workers")  # how missing tiles are downloaded, not what they hold


def region_collections(collections: Mapping | None) -> dict:
    """``collections`` as far as they decide the regions' content: the folders, index,
    registry and CDL paths of each source, without ``url`` and ``workers``. Rule areas takes
    this as its param, so a mirror or a thread count changed reruns nothing (the tiles are
    the same bytes, checked against the index either way)."""
    return {
        source: {k: v for k, v in settings.items() if k not in HOW_FETCHED}
        for source, settings in (collections or {}).items()
        if isinstance(settings, Mapping)
    }


def fetch_collections(collections: Mapping | None, source: str) -> dict:
    """Rule fetch_tiles' param for ``source``: that collection's content alone (what the
    fetch plans from and writes to), so a change elsewhere (the CDL, the other source) does
    not rerun it, and its ``url`` travels apart (:func:`fetch_url`)."""
    content = region_collections(collections)
    return {source: content[source]} if source in content else {}


def fetch_url(collections: Mapping | None, source: str) -> str:
    """The base URL rule fetch_tiles downloads ``source``'s missing tiles from."""
    return str(((collections or {}).get(source) or {}).get("url") or "")


def fetched_markers(collections: Mapping | None) -> list[str]:
    """One marker per collection with a url (rule fetch_tiles): its missing tiles fetched."""
    return [
        f"results/areas/fetched/{source}.tsv"
        for source in ("aef", "tessera")
        if ((collections or {}).get(source) or {}).get("url")
    ]


def tile_folders(plan: AreaPlan | None, source: str) -> list[str]:
    """The folders that hold (or will hold) ``source``'s planned tiles, those that exist now:
    rule fetch_tiles' inputs. A tile deleted from one changes its time, so the next run
    fetches again (a folder has no checksum for Snakemake to find unchanged). Tiles converted
    from geotessera's .npy by rule areas are not fetched: their folders are left out."""
    folders = {t.path.parent for r in (plan.regions if plan else [])
               if (m := r.mosaics.get(source)) is not None for t in m.tiles
               if t.npy is None}  # fmt: skip
    return sorted(str(f) for f in folders if f.is_dir())


def age_stale_markers(plan: AreaPlan | None, collections: Mapping | None) -> list[str]:
    """Date back each marker of rule fetch_tiles whose collection lacks a tile the areas
    need to a second before the oldest folder it stands for (:func:`tile_folders`): the
    next run fetches again, however the tile went (a folder restored with its old time).
    The files, not the marker, say what is there. Kept, not removed: a missing marker would
    rerun rule areas and every job after it, for the same bytes. Returns the markers aged."""
    aged = []
    for marker in fetched_markers(collections):
        path = Path(marker)
        if plan is None or not path.exists() or not plan.missing(path.stem):
            continue
        folders = [Path(f).stat().st_mtime for f in tile_folders(plan, path.stem)]
        before = max(1.0, min(folders, default=path.stat().st_mtime) - 1)  # 0: "no time"
        if path.stat().st_mtime > before:
            os.utime(path, (before, before))
        aged.append(marker)
    return aged


def npy_inputs(plan: AreaPlan | None) -> list[str]:
    """The geotessera ``.npy`` tiles rule areas converts (a change reruns it)."""
    return [str(t.npy) for t in plan.converted()] if plan else []


def npy_outputs(plan: AreaPlan | None) -> list[str]:
    """The GeoTIFFs rule areas converts them to (resources/areas/tessera_tiles/)."""
    return [str(t.path) for t in plan.converted()] if plan else []


def plan_inputs(collections: Mapping | None) -> list[str]:
    """The index and registry files a plan reads (a change reruns rule areas)."""
    collections = collections or {}
    aef, tessera = collections.get("aef") or {}, collections.get("tessera") or {}
    return [f for f in (aef.get("index"), tessera.get("registry")) if f]


def planned_footprints(plan: AreaPlan, areas_file: str) -> dict[str, list[Footprint]]:
    """Per source, the ground each masked VRT holds (its part, in its CRS): what the
    table's checks compare with every other region (overlap in one year, one split draw
    for the years of one ground), before the VRTs exist."""
    prints: dict[str, list[Footprint]] = {}
    for r in plan.regions:
        for source, m in r.mosaics.items():
            if m.cutline is None or source == "cdl":
                continue
            res = m.resolution()
            w, _, _, n = m.cutline.bounds
            where = f"{areas_file}: area {r.area!r} ({r.year}, zone {r.zone}), {source}"
            prints.setdefault(source, []).append(
                Footprint(r.region, where, m.vrt, str(r.year), CRS.from_user_input(m.crs),
                          Affine(res, 0, w, 0, -res, n), (0, 0), r.split, m.cutline)
            )  # fmt: skip
    return prints
