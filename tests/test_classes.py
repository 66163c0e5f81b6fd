"""Invariants of config/classes.csv and the checks of emb.classes.load_class_map."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from emb.classes import (
    COLUMNS,
    IGNORE,
    N_L1,
    N_L2,
    N_L3,
    ClassMap,
    ClassTableError,
    load_class_map,
)

CLASSES = Path(__file__).resolve().parents[1] / "config" / "classes.csv"
CROP, NON_CROP = 1, 0


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return pd.read_csv(CLASSES)


@pytest.fixture(scope="module")
def cmap() -> ClassMap:
    return load_class_map(CLASSES)


def write_broken(tmp_path: Path, table: pd.DataFrame) -> Path:
    path = tmp_path / "broken_classes.csv"
    table.to_csv(path, index=False)
    return path


# --- the real file ---------------------------------------------------------------------------


def test_columns_are_exactly_the_contract(table):
    assert list(table.columns) == COLUMNS


def test_each_cdl_code_in_byte_range_appears_at_most_once(table):
    assert table["cdl_code"].between(1, 254).all()
    assert not table["cdl_code"].duplicated().any()


def test_background_code_zero_is_absent(table):
    assert 0 not in set(table["cdl_code"])


@pytest.mark.parametrize("code", [63, 64, 65, 81, 82, 83, 87, 88])
def test_pre_2008_codes_are_left_unmapped(table, code):
    assert code not in set(table["cdl_code"])


@pytest.mark.parametrize(("col", "n"), [("l3_id", N_L3), ("l2_id", N_L2), ("l1_id", N_L1)])
def test_every_id_of_each_level_is_used(table, col, n):
    assert sorted(set(table[col])) == list(range(n))


def test_level_sizes_are_61_7_2():
    assert (N_L3, N_L2, N_L1) == (61, 7, 2)


@pytest.mark.parametrize(
    ("child", "parent"),
    [
        ("l3_id", "l3_name"),
        ("l3_id", "l2_id"),
        ("l2_id", "l2_name"),
        ("l2_id", "l1_id"),
        ("l1_id", "l1_name"),
    ],
)
def test_each_child_has_one_parent(table, child, parent):
    assert (table.groupby(child)[parent].nunique() == 1).all()


@pytest.mark.parametrize("col", ["l3_name", "l2_name", "l1_name"])
def test_names_are_unique_per_level(table, col):
    id_col = col.replace("_name", "_id")
    assert (table.groupby(col)[id_col].nunique() == 1).all()


def test_l2_groups_are_wholly_crop_or_wholly_non_crop(table):
    per_group = table.groupby("l2_id")["l1_id"].agg(set)
    assert all(len(s) == 1 for s in per_group)
    assert set().union(*per_group) == {CROP, NON_CROP}


def test_l1_names_are_non_crop_then_crop(cmap):
    assert cmap.l1_names == ("non_crop", "crop")


def test_no_cdl_name_or_class_name_is_blank(table):
    for col in ("cdl_name", "l3_name", "l2_name", "l1_name"):
        assert table[col].str.strip().ne("").all(), col


def test_common_crops_take_the_first_l3_ids(table):
    l3_of = dict(zip(table["cdl_code"], table["l3_id"], strict=True))
    assert (l3_of[1], l3_of[5], l3_of[24]) == (0, 1, 2)  # corn, soybeans, winter wheat


@pytest.mark.parametrize(
    ("code", "l1"),
    [(1, CROP), (36, CROP), (37, CROP), (61, CROP), (176, NON_CROP), (141, NON_CROP)],
)
def test_crop_mask_convention(cmap, code, l1):
    assert cmap.l3_to_l1[cmap.cdl_to_l3[code]] == l1


def test_developed_codes_share_one_l3_class(cmap):
    assert len(set(cmap.cdl_to_l3[[121, 122, 123, 124]])) == 1


# --- the lookup tables -----------------------------------------------------------------------


def test_luts_are_uint8_of_length_256(cmap):
    for lut in (cmap.cdl_to_l3, cmap.l3_to_l2, cmap.l3_to_l1):
        assert lut.shape == (256,)
        assert lut.dtype == np.uint8


def test_luts_map_ignore_to_ignore(cmap):
    assert cmap.cdl_to_l3[IGNORE] == IGNORE
    assert cmap.l3_to_l2[IGNORE] == IGNORE
    assert cmap.l3_to_l1[IGNORE] == IGNORE


@pytest.mark.parametrize("code", [0, 63, 81, 88, 7, 253])
def test_unmapped_codes_map_to_ignore(cmap, code):
    assert cmap.cdl_to_l3[code] == IGNORE


def test_cdl_lut_agrees_with_the_table(cmap, table):
    np.testing.assert_array_equal(cmap.cdl_to_l3[table["cdl_code"]], table["l3_id"])
    mapped = np.flatnonzero(cmap.cdl_to_l3 != IGNORE)
    assert sorted(mapped) == sorted(table["cdl_code"])


def test_l3_luts_cover_exactly_the_l3_ids(cmap):
    assert (cmap.l3_to_l2[:N_L3] < N_L2).all()
    assert (cmap.l3_to_l1[:N_L3] < N_L1).all()
    assert (cmap.l3_to_l2[N_L3:] == IGNORE).all()
    assert (cmap.l3_to_l1[N_L3:] == IGNORE).all()


def test_name_tuples_have_one_name_per_id(cmap):
    assert (len(cmap.l3_names), len(cmap.l2_names), len(cmap.l1_names)) == (N_L3, N_L2, N_L1)
    assert cmap.l3_names[0] == "corn"


def test_corn_is_crop(cmap):
    l3 = cmap.cdl_to_l3[1]
    assert l3 != IGNORE
    assert cmap.l1_names[cmap.l3_to_l1[l3]] == "crop"


def test_open_water_is_non_crop(cmap):
    l3 = cmap.cdl_to_l3[111]
    assert l3 != IGNORE
    assert cmap.l1_names[cmap.l3_to_l1[l3]] == "non_crop"


def test_levels_of_an_array_are_consistent(cmap, table):
    cdl = np.array([[1, 5, 111, 0], [176, 63, 255, 24]], np.uint8)
    l3 = cmap.cdl_to_l3[cdl]
    levels = cmap.levels(l3)
    assert set(levels) == {"l1", "l2", "l3"}
    np.testing.assert_array_equal(levels["l3"], l3)
    for name in ("l1", "l2"):
        assert levels[name].shape == cdl.shape
        assert levels[name].dtype == np.uint8
    ignored = l3 == IGNORE
    np.testing.assert_array_equal(ignored, np.isin(cdl, [0, 63, 255]))
    assert (levels["l1"][ignored] == IGNORE).all()
    assert (levels["l2"][ignored] == IGNORE).all()
    row_of = table.set_index("cdl_code")
    mapped = zip(cdl[~ignored], levels["l1"][~ignored], levels["l2"][~ignored], strict=True)
    for code, l1, l2 in mapped:
        assert (l1, l2) == (row_of.at[code, "l1_id"], row_of.at[code, "l2_id"])


def test_levels_l1_follows_from_l2(cmap):
    l3 = np.arange(N_L3, dtype=np.uint8)
    levels = cmap.levels(l3)
    l1_of_l2 = {}
    for l1, l2 in zip(levels["l1"], levels["l2"], strict=True):
        assert l1_of_l2.setdefault(l2, l1) == l1


# --- broken copies are refused, naming the file -----------------------------------------------


def test_duplicated_code_is_refused(tmp_path, table):
    broken = pd.concat([table, table.iloc[[0]]], ignore_index=True)
    path = write_broken(tmp_path, broken)
    with pytest.raises(ClassTableError, match=r"more than once") as err:
        load_class_map(path)
    assert str(path) in str(err.value)


def test_l3_id_with_two_l2_parents_is_refused(tmp_path, table):
    broken = table.copy()
    # Move one code of a multi-code L3 class into another L2: that L3 id gets two parents.
    multi = broken.groupby("l3_id")["cdl_code"].transform("size") > 1
    row = broken.index[multi][0]
    broken.loc[row, "l2_id"] = (broken.loc[row, "l2_id"] + 1) % N_L2
    path = write_broken(tmp_path, broken)
    with pytest.raises(ClassTableError, match=r"each l3_id must have one l2_id") as err:
        load_class_map(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("column", ["l2_id", "cdl_name", "l1_name"])
def test_missing_column_is_refused(tmp_path, table, column):
    path = write_broken(tmp_path, table.drop(columns=column))
    with pytest.raises(ClassTableError, match=rf"missing columns \['{column}'\]") as err:
        load_class_map(path)
    assert str(path) in str(err.value)


def test_gap_in_l3_ids_is_refused(tmp_path, table):
    broken = table[table["l3_id"] != 30]
    path = write_broken(tmp_path, broken)
    with pytest.raises(ClassTableError, match=r"l3_id must use every id") as err:
        load_class_map(path)
    assert str(path) in str(err.value)


def test_background_code_is_refused(tmp_path, table):
    extra = table.iloc[[0]].assign(cdl_code=0, cdl_name="Background")
    path = write_broken(tmp_path, pd.concat([table, extra], ignore_index=True))
    with pytest.raises(ClassTableError, match=r"background") as err:
        load_class_map(path)
    assert str(path) in str(err.value)


def test_l3_id_out_of_range_is_refused(tmp_path, table):
    broken = table.copy()
    broken.loc[broken["l3_id"] == N_L3 - 1, "l3_id"] = N_L3
    path = write_broken(tmp_path, broken)
    with pytest.raises(ClassTableError, match=r"l3_id must lie in 0\.\.60") as err:
        load_class_map(path)
    assert str(path) in str(err.value)


def test_unmodified_copy_loads_like_the_original(tmp_path, table, cmap):
    copy = load_class_map(write_broken(tmp_path, table))
    np.testing.assert_array_equal(copy.cdl_to_l3, cmap.cdl_to_l3)
    assert copy.l3_names == cmap.l3_names
