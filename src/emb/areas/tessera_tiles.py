"""The TESSERA tiles of an area's part in one UTM zone: geotessera's GeoTIFFs, or its native
``.npy`` tiles (planned as the GeoTIFFs rule areas converts them to), checked against the
registry; a part no tile covers is a gap."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import shapely

from emb.areas import AreasError
from emb.areas.checks import check_tile, raise_gap
from emb.areas.index import (
    CollectionTile,
    read_tessera_registry,
    tessera_cells,
    tessera_key,
    tessera_npy_path,
)
from emb.geo import zone_epsg
from emb.prep.tessera_npy import TesseraNpyError, check_triple, find_triple

NPY_OUT = "resources/areas/tessera_tiles"  # geotessera .npy tiles as GeoTIFFs, once per tile


def tessera_tiles(
    where: str,
    zone: str,
    year: int,
    part,
    part_utm,
    collection: Mapping,
    registry: set | None,
    fetching: bool,
) -> list[CollectionTile]:
    folder = Path(collection["folder"])
    crs = f"EPSG:{zone_epsg(zone)}"
    tiles, absent = [], []
    for lon, lat in tessera_cells(part):
        key = tessera_key(year, lon, lat)
        listed = registry is None or (year, round(lon * 100), round(lat * 100)) in registry
        tile = CollectionTile(folder / key, key, crs)
        npy = tessera_npy_path(folder, year, lon, lat)
        if not tile.path.exists() and npy.exists():
            tiles.append(npy_tile(where, npy, key, crs))
            continue
        if listed and (tile.path.exists() or (fetching and registry is not None)):
            listed_in = collection.get("registry") or folder
            tile.header = check_tile(where, "tessera", tile, listed_in, fetching)
            tiles.append(tile)
        elif listed and registry is not None:
            raise AreasError(
                f"{collection['registry']}: {where}: lists {key}, not in {folder}: download it "
                "(or set collections.tessera.url and let the workflow fetch it)"
            )
        else:
            absent.append(shapely.box(lon - 0.05, lat - 0.05, lon + 0.05, lat + 0.05))
    if absent:
        gap = shapely.intersection(part, shapely.union_all(absent))
        raise_gap(where, "TESSERA", collection.get("registry") or folder, gap)
    return tiles


def npy_tile(where: str, npy: Path, key: str, crs: str) -> CollectionTile:
    """A geotessera ``.npy`` tile, checked (its three files, shapes, CRS) and planned as the
    GeoTIFF rule areas converts it to; read as such once it exists."""
    try:
        facts = check_triple(find_triple(npy))
    except (TesseraNpyError, FileNotFoundError) as err:
        raise AreasError(f"{npy}: {where}: not a geotessera tile: {err}") from None
    if f"EPSG:{facts.crs.to_epsg()}" != crs:
        raise AreasError(
            f"{npy}: {where}: its landmask is in {facts.crs.to_string()}, but the tile's cell "
            f"is in {crs}"
        )
    tile = CollectionTile(Path(NPY_OUT) / key, key, crs, (facts.width, facts.height), npy=npy)
    tile.bounds = tuple(facts.bounds)
    if tile.path.exists() and tile.path.stat().st_mtime >= npy.stat().st_mtime:
        tile.header = check_tile(where, "tessera", tile, npy, fetching=False)
    return tile


def registry_of(collection: Mapping | None) -> set | None:
    if not collection or not collection.get("registry"):
        return None
    return read_tessera_registry(collection["registry"])
