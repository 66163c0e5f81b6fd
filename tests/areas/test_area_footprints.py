"""Regions built from areas meet the table's ground checks before their VRTs exist: a table row
on the same ground in the same year is refused, and the years of one area share a split draw."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from areas_collection import YEAR, make_collection
from test_plan import collections

from emb.areas.plan import plan_areas
from emb.areas.workflow import planned_footprints
from emb.prep.regions import RegionsError, check_regions


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


def test_the_years_of_one_area_share_one_split_draw(planned, tmp_path: Path) -> None:
    c, plan = planned
    prints = planned_footprints(plan, str(c.areas))
    assert set(prints) == {"aef", "tessera"} and len(prints["aef"]) == 2  # one per zone
    later = [dataclasses.replace(f, key=f"{f.key}_next", year=str(YEAR + 1)) for f in prints["aef"]]
    checks = check_regions(plan.rows(), tmp_path / "regions.tsv", generated=plan.vrts(),
                           planned={"aef": prints["aef"] + later})  # fmt: skip
    for f, g in zip(prints["aef"], later, strict=True):
        assert checks.split_key("aef", g.key) == checks.split_key("aef", f.key) == f.key
        assert checks.split_extent("aef", g.key) is not None
    zones = {checks.split_key("aef", f.key) for f in prints["aef"]}
    assert len(zones) == 2  # the two zones' parts share no ground: two draws
