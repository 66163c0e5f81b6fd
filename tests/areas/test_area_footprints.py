"""Regions built from areas meet the table's ground checks before their VRTs exist: a table row
on the same ground in the same year is refused, and the years of one area share a split draw
(an areas file with two years, planned and built into shards as the workflow does)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import shapely
from areas_collection import AREA, YEAR, Collection, make_collection, write_geojson, write_index
from conftest import REPO
from test_plan import collections

from emb.areas.plan import AreaPlan, plan_areas
from emb.areas.vrt import write_mosaic
from emb.prep import align_labels, shards
from emb.prep.regions import RegionsError
from emb.workflow.area_plan import planned_footprints
from emb.workflow.region_checks import check_regions
from emb.workflow.region_table import split_group

NEXT = YEAR + 1


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory):
    c = make_collection(tmp_path_factory.mktemp("collection"))
    return c, plan_areas(c.areas, collections(c, cdl="one"))


def table_with(plan, *rows: dict) -> pd.DataFrame:
    extra = pd.DataFrame.from_records(list(rows)).set_index("region", drop=False)
    return pd.concat([extra, plan.rows()]).fillna("")


def test_a_table_row_on_an_areas_ground_in_its_year_is_refused(planned, tmp_path: Path) -> None:
    c, plan = planned
    row = {"region": "mine", "year": str(YEAR), "aef": str(c.truth["15N"]), "tessera": "",
           "cdl": str(c.cdl_one), "split": "auto"}  # fmt: skip
    with pytest.raises(RegionsError) as err:
        check_regions(table_with(plan, row), tmp_path / "regions.tsv", generated=plan.vrts(),
                      planned=planned_footprints(plan, str(c.areas)))  # fmt: skip
    message = str(err.value)
    assert "aef_15N.tif" in message and "area" in message and "km2" in message
    # without the planned ground the same table passes: the check is what refuses it
    check_regions(table_with(plan, row), tmp_path / "regions.tsv", generated=plan.vrts())


def with_next_year(c: Collection) -> tuple[Path, dict]:
    """The collection with its AEF tiles (index rows too) and CDL also given for ``NEXT`` (the
    same pixels: only the shared draw can keep a block in one split), and an areas file
    listing the one area in both years."""
    shutil.copytree(c.aef / str(YEAR), c.aef / str(NEXT))
    rows = pq.read_table(c.aef_index).to_pylist()
    later = [{**r, "fid": r["fid"] + len(rows), "year": NEXT,
              "path": r["path"].replace(f"/{YEAR}/", f"/{NEXT}/")} for r in rows]  # fmt: skip
    write_index(c.aef_index, rows + later)
    shutil.copy(c.cdl_one, str(c.cdl_one).replace(str(YEAR), str(NEXT)))
    areas = c.root / "two_years.geojson"
    write_geojson(areas, [{"area": "field_trial", "year": y, "split": "auto",
                           "geometry": shapely.box(*AREA)} for y in (YEAR, NEXT)])  # fmt: skip
    chosen = collections(c, cdl="one")
    return areas, {"aef": chosen["aef"], "cdl": chosen["cdl"]}


def build_shards(plan: AreaPlan, areas: Path, work: Path) -> dict[str, dict]:
    """Every region's AEF shards in ``work`` as the workflow makes them: the table's checks
    give each region its split group, then the VRT, align_labels and shards stages (the
    test config's small tiling)."""
    checks = check_regions(plan.rows(), work / "regions.tsv", generated=plan.vrts(),
                           planned=planned_footprints(plan, str(areas)))  # fmt: skip
    indexes = {}
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for r in plan.regions:
            write_mosaic(r.mosaics["aef"])
            vrt, cdl = r.mosaics["aef"].vrt, plan.rows().loc[r.region, "cdl"]
            labels = work / f"labels/{r.region}.tif"
            align_labels.main([f"--emb={vrt}", f"--cdl={cdl}", f"--out={labels}",
                               f"--classes={REPO / 'config/classes.csv'}",
                               f"--report={labels.with_suffix('.json')}"])  # fmt: skip
            group = split_group(checks, "aef", r.region)
            index = work / f"shards/{r.region}/index.json"
            shards.main(["--source=aef", f"--region={r.region}", f"--emb={vrt}",
                         f"--labels={labels}", f"--index={index}", "--tile-size=32",
                         "--stride=32", "--block-m=320", f"--split-key={group['key']}",
                         f"--split-extent={group['extent']}", "--max-samples=64"])  # fmt: skip
            indexes[r.region] = json.loads(index.read_text())
    finally:
        os.chdir(cwd)
    return indexes


def test_the_years_of_one_area_share_one_split_draw(tmp_path: Path) -> None:
    """Each zone's part in two years: four regions; a split block holds tiles of one split
    in both years, and the two zones (no shared ground) draw apart."""
    c = make_collection(tmp_path / "collection")
    areas, chosen = with_next_year(c)
    plan = plan_areas(areas, chosen)
    assert sorted(map(str, plan.rows()["year"])) == [str(YEAR)] * 2 + [str(NEXT)] * 2
    work = tmp_path / "work"
    work.mkdir()
    indexes = build_shards(plan, areas, work)
    by_ground: dict[tuple[str, str], dict[str, set[str]]] = {}  # (zone, block) -> year -> splits
    for r in plan.regions:
        for split, part in indexes[r.region]["splits"].items():
            for block in part["blocks"].values():  # "{split group}:{block on the ground}"
                key = (r.zone, block.rsplit(":", 1)[1])
                by_ground.setdefault(key, {}).setdefault(str(r.year), set()).add(split)
    both = {k: v for k, v in by_ground.items() if len(v) == 2}
    assert len(both) >= 8, by_ground  # most blocks hold tiles in both years
    differ = {k: v for k, v in both.items() if len(set.union(*v.values())) != 1}
    assert not differ, f"blocks in another split in {NEXT} than in {YEAR}: {differ}"
    assert len({s for v in both.values() for s in set.union(*v.values())}) >= 2
    groups = {r.region: indexes[r.region]["split_group"] for r in plan.regions}
    assert len(set(groups.values())) == 2  # one draw per zone: their parts share no ground
