"""Whether every planned region yields a tile, decided while the workflow is parsed.

An area smaller than a few tiles can give a region in which no tile reaches ``tiles.min_valid``;
without this check the workflow learns it in ``shards``, after the fetch, the VRTs and the label
alignment have run. The count is an upper bound, so a region refused here can never yield a
tile later: it is geometric (no pixel is read; a tile's labelled pixels are its area inside the
area's part, and the CDL may leave holes), and every split block counts as a training block
(whatever the draw, which for the years of one ground uses their group's key: only training
tiles may lie half a tile off the grid, :mod:`emb.prep.shifted_tiles`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

import shapely
from affine import Affine
from rasterio.transform import array_bounds

from emb.areas import AreasError
from emb.areas.plan import AreaPlan, Mosaic
from emb.areas.vrt import snap_outward
from emb.prep.data_settings import tiling_in_force
from emb.prep.regions import PREDICT
from emb.prep.spatial_split import SPLITS, SplitSpec
from emb.prep.tiles import Ground, TileSpec, count_tiles

TRY_SIZES = (128, 64, 32, 16, 8)  # smaller tiles a message may suggest (the schema's minimum: 8)
TRY_MIN_VALID = (0.2, 0.15, 0.1, 0.05, 0.01)


def specs_of(config: Mapping) -> tuple[TileSpec, SplitSpec] | None:
    """The config's tiling as the shards stage gets it (:func:`tiling_in_force`; the areas'
    regions are your own data: no demo overlay) and its split blocks, each one counted as
    training ground (None without a ``tiles`` section: a plan checked alone, outside the
    workflow)."""
    if not config.get("tiles"):
        return None
    tiling = tiling_in_force(config)
    return tiling.tile_spec(), tiling.split_spec(fractions={"train": 1.0})


def region_grid(mosaic: Mosaic) -> tuple[Affine, int, int]:
    """(transform, width, height) of a masked VRT before it exists (its tiles may not be
    fetched yet): its part's bounds snapped outward onto its tiles' pixel grid, north up, as
    ``emb.areas.vrt.part_grid`` crops it."""
    res = mosaic.resolution()
    header = next((t.header for t in mosaic.tiles if t.header is not None), None)
    ox, oy = (header.transform.c, header.transform.f) if header is not None else (0.0, 0.0)
    x0, south, x1, north = snap_outward(mosaic.cutline.bounds, ox, oy, res)
    width, height = max(1, round((x1 - x0) / res)), max(1, round((north - south) / res))
    return Affine(res, 0, x0, 0, -res, north), width, height


def check_tile_yield(
    plan: AreaPlan, areas_file: str, tile_spec: TileSpec, split_spec: SplitSpec
) -> None:
    """Refuse, naming every such area at once, a plan with a labelled region (split not
    ``predict``) of which some source's raster keeps no tile at ``tile_spec``."""
    found = []
    for r in plan.regions:
        if r.split == PREDICT:
            continue
        fixed = r.split if r.split in SPLITS else None
        for source, m in r.mosaics.items():
            if m.cutline is None:
                continue
            transform, width, height = region_grid(m)
            ground = Ground(m.cutline, shapely.box(*array_bounds(height, width, transform)))
            count = partial(count_tiles, transform, width, height, split_spec=split_spec,
                            footprint=ground, region=r.region, fixed_split=fixed)  # fmt: skip
            if count(tile_spec):
                continue
            found.append(
                f"area {r.area!r} ({r.year}, zone {r.zone}): region {r.region} is {width} x "
                f"{height} px ({source}, {transform.a:g} m) and none of its {tile_spec.size}-px "
                f"tiles has {tile_spec.min_valid:.0%} (tiles.min_valid {tile_spec.min_valid:g}) "
                f"of its pixels inside the area: {_ways_out(tile_spec, count)}"
            )
            break  # one sentence per region: its sources share the part
    if found:
        raise AreasError(f"{areas_file}: " + "; ".join(found))


def _ways_out(tile_spec: TileSpec, count: Callable[[TileSpec], int]) -> str:
    """What would give the region a tile: the largest smaller tile size (the stride scaled
    with it), the largest lower min_valid, each alone, when one does."""
    size, stride = tile_spec.size, tile_spec.stride
    sizes = [s for s in TRY_SIZES if s < size]
    size_n = next(((s, n) for s in sizes if (n := count(TileSpec(
        s, max(1, stride * s // size), tile_spec.min_valid)))), None)  # fmt: skip
    lower = [v for v in TRY_MIN_VALID if v < tile_spec.min_valid]
    valid_n = next(((v, n) for v in lower if (n := count(replace(tile_spec, min_valid=v)))), None)
    return (
        "set a smaller tiles.size"
        + (f" ({size_n[0]} gives up to {_tiles(size_n[1])})" if size_n else "")
        + ", a lower tiles.min_valid"
        + (f" ({valid_n[0]:g} gives up to {_tiles(valid_n[1])})" if valid_n else "")
        + ", draw a bigger area, or give it split: predict to only map it"
    )


def _tiles(n: int) -> str:
    return f"{n} tile" + "s" * (n != 1)
