"""The spatial split: each block's split is fixed by its key, seed and the fractions (the same
blocks go to the same splits in every build), and a ``splits.block_m`` larger than the regions
is refused while the workflow is parsed, naming block_m and each region's size: a block goes
whole to one split, so fewer blocks than splits leave a split without tiles (found before only
at the manifest, after every shard was built)."""

from __future__ import annotations

import pytest

from emb.prep.spatial_split import (
    BlockGround,
    SplitBlocksError,
    SplitSpec,
    assign_blocks,
    block_count,
    blocks_in,
    check_blocks_hold_splits,
)

DRAWN = [  # (key, seed, the 5 x 3 blocks of 640 m from the north row: train . val v test t)
    ("demo_b", 0, ["...t.", "v...t", "...v."]),
    ("demo_b", 1, [".....", ".vtt.", "....v"]),
    ("field_2024", 0, ["..t.v", "v.t..", "....."]),
]


@pytest.mark.parametrize(("key", "seed", "rows"), DRAWN)
def test_each_block_goes_to_the_split_it_always_went_to(key: str, seed: int, rows: list) -> None:
    """Pinned draws: a change to the draw, the order or the cut would move blocks between
    splits (and tiles of existing shards with them), which a rebuild must never do. The
    fractions hold exactly: 15 blocks at 0.7/0.15/0.15 are 11/2/2."""
    drawn = assign_blocks(key, blocks_in((0.0, 0.0, 3200.0, 1920.0), 640.0),
                          SplitSpec(640.0, seed=seed))  # fmt: skip
    initial = {"train": ".", "val": "v", "test": "t"}
    found = ["".join(initial[drawn[(bx, by)]] for bx in range(5)) for by in (2, 1, 0)]
    assert found == rows


def ground(region: str, x0: float, y0: float, km: float = 2.0, **kw) -> BlockGround:
    extent = (x0, y0, x0 + km * 1000, y0 + km * 1000)
    return BlockGround(region, kw.get("split", "auto"), extent, kw.get("key", region))


def test_a_region_inside_one_block_is_refused_naming_block_m_and_its_size() -> None:
    one = [ground("field", 10_500.0, 20_500.0)]  # 2 x 2 km inside one 5120-m block
    with pytest.raises(SplitBlocksError) as err:
        check_blocks_hold_splits("aef", one, 5120.0, "areas.geojson")
    text = str(err.value)
    for needle in ("areas.geojson", "splits.block_m 5120 m", "aef", "region field is 2 km x 2 km",
                   "(1 block)", "at most 1 of the 3 splits"):  # fmt: skip
        assert needle in text, (needle, text)
    check_blocks_hold_splits("aef", one, 640.0, "areas.geojson")  # 4 x 4 blocks: passes


def test_the_bound_counts_blocks_per_draw_and_fixed_splits() -> None:
    """Two regions of one split group draw over one extent: its blocks count once. A region
    fixed to a split brings that split; three regions of one block each may fill all three."""
    a, b = ground("a", 10_500.0, 20_500.0, key="g"), ground("b", 10_500.0, 20_500.0, key="g")
    with pytest.raises(SplitBlocksError, match=r"at most 1 of the 3 splits \(group g is"):
        check_blocks_hold_splits("aef", [a, b], 5120.0, "t.tsv")
    fixed = [ground("v", 60_000.0, 0.0, split="val"), ground("t", 90_000.0, 0.0, split="test")]
    check_blocks_hold_splits("aef", [a, *fixed], 5120.0, "t.tsv")
    with pytest.raises(SplitBlocksError, match=r"at most 2 of the 3.*fixed splits \['val'\]"):
        check_blocks_hold_splits("aef", [a, fixed[0]], 5120.0, "t.tsv")
    apart = [ground(r, x, 20_500.0) for r, x in (("a", 10_500.0), ("b", 51_500.0))]
    with pytest.raises(SplitBlocksError, match="at most 2 of the 3"):
        check_blocks_hold_splits("aef", apart, 5120.0, "t.tsv")
    check_blocks_hold_splits("aef", [*apart, ground("c", 61_500.0, 20_500.0)], 5120.0, "t.tsv")
    across = [ground("x", 4_120.0, 4_120.0)]  # a 2 km region on the corner of four blocks
    check_blocks_hold_splits("aef", across, 5120.0, "t.tsv")


@pytest.mark.parametrize("x0", [0.0, 10_240.0, -5_120.0])
def test_an_extent_of_exactly_one_block_counts_as_one_block(x0: float) -> None:
    """Edges on block lines are exclusive: a region exactly one block across meets one
    block (as the jobs list them), so the parse-time check refuses it; a hair wider meets
    four."""
    extent = (x0, 20_480.0, x0 + 5_120.0, 25_600.0)
    assert block_count(extent, 5_120.0) == len(blocks_in(extent, 5_120.0)) == 1
    exact = [BlockGround("field", "auto", extent, "field")]
    with pytest.raises(SplitBlocksError, match=r"region field is 5.12 km x 5.12 km \(1 block\)"):
        check_blocks_hold_splits("aef", exact, 5_120.0, "t.tsv")
    wider = (x0, 20_480.0, x0 + 5_120.5, 25_600.5)
    assert block_count(wider, 5_120.0) == len(blocks_in(wider, 5_120.0)) == 4
    check_blocks_hold_splits(
        "aef", [BlockGround("field", "auto", wider, "field")], 5_120.0, "t.tsv"
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_region_of_two_blocks_is_split_into_train_and_val(seed: int) -> None:
    """With fewer blocks than splits, the first splits get one each (train, then val), never
    a draw without train: the parse-time check lets a two-block region beside a test region
    through, and together they hold all three splits."""
    blocks = blocks_in((0.0, 0.0, 10_240.0, 5_120.0), 5_120.0)
    drawn = assign_blocks("field", blocks, SplitSpec(5_120.0, seed=seed))
    assert sorted(drawn.values()) == ["train", "val"]
    one = assign_blocks("field", blocks[:1], SplitSpec(5_120.0, seed=seed))
    assert list(one.values()) == ["train"]
    two = BlockGround("field", "auto", (0.0, 0.0, 10_240.0, 5_120.0), "field")
    fixed = ground("t", 90_000.0, 0.0, split="test")
    check_blocks_hold_splits("aef", [two, fixed], 5_120.0, "t.tsv")
