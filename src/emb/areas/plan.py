"""Areas -> regions, planned while the workflow is parsed: the tiles of each area and year per
UTM zone, the VRT each (source, area, zone) will be, and every check of index against files.

An area is cut at the UTM zone boundaries (6-degree meridians, the equator): each part is a
region ``{area}_{zone}`` whose mosaics are masked to that part, so each ground pixel (its
centre) lies in exactly one region. Nothing here writes a file; ``emb.areas.build`` writes the
VRTs of the same plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import shapely
from pyproj import CRS
from rasterio.errors import RasterioIOError
from shapely.geometry.base import BaseGeometry

from emb.areas import AreasError
from emb.areas.areas_file import read_areas
from emb.areas.checks import (
    check_aef_year,
    check_cdl_tile_year,
    check_gap,
    check_no_overlap,
    check_tessera_year,
    check_tile,
)
from emb.areas.index import (
    AEF_RESOLUTION,
    AefIndex,
    CollectionTile,
    aef_local_path,
    cdl_tiles,
    check_in_folder,
    read_aef_index,
)
from emb.areas.tessera_tiles import registry_of, tessera_tiles
from emb.areas.tiffhead import read_header
from emb.geo import DENSIFY_DEG, WGS84, reproject, zone_box, zone_epsg, zones_of
from emb.prep.regions import PREDICT

OUT = "resources/areas"  # where the VRTs go: resources/areas/{region}/{source}.vrt


@dataclass
class Mosaic:
    """One VRT of one region: ``source`` tiles masked to the region's part (``cutline``)."""

    source: str
    vrt: str
    crs: str
    tiles: list[CollectionTile]
    cutline: BaseGeometry | None  # the part in ``crs`` (None: no mask, a CDL)

    def resolution(self) -> float:
        """Metres per pixel: its first read tile's, else AEF's (tiles not fetched yet)."""
        header = next((t.header for t in self.tiles if t.header is not None), None)
        return abs(header.transform.a) if header is not None else AEF_RESOLUTION


@dataclass
class RegionPlan:
    region: str
    area: str
    zone: str
    year: int
    split: str
    part: BaseGeometry  # WGS84
    mosaics: dict[str, Mosaic] = field(default_factory=dict)
    cdl_file: str = ""  # a national CDL used as it is


@dataclass
class AreaPlan:
    """The regions of the areas file (not a training plan): what the workflow builds."""

    regions: list[RegionPlan]

    def rows(self) -> pd.DataFrame:
        """The rows the regions table gets (region year aef tessera cdl split)."""
        records = []
        for r in self.regions:
            m = r.mosaics
            records.append(
                {
                    "region": r.region,
                    "year": str(r.year),
                    "aef": m["aef"].vrt if "aef" in m else "",
                    "tessera": m["tessera"].vrt if "tessera" in m else "",
                    "cdl": m["cdl"].vrt if "cdl" in m else r.cdl_file,
                    "split": r.split,
                }
            )
        return pd.DataFrame.from_records(records).set_index("region", drop=False)

    def vrts(self) -> list[str]:
        """Every VRT the build writes (the tile mosaics beneath the masked ones included)."""
        out = []
        for r in self.regions:
            for m in r.mosaics.values():
                out.append(m.vrt)
                if m.cutline is not None:
                    out.append(tiles_vrt(m.vrt))
        return out

    def pixels(self) -> dict[str, int]:
        """Pixels of each masked VRT (at most its part's bounding box, snapped outward, at its
        tiles' resolution): what sizes the jobs that read it, before the VRT exists."""
        sizes = {}
        for r in self.regions:
            for m in r.mosaics.values():
                if m.cutline is None:
                    continue
                res = m.resolution()
                w, s, e, n = m.cutline.bounds
                sizes[m.vrt] = (math.ceil((e - w) / res) + 1) * (math.ceil((n - s) / res) + 1)
        return sizes

    def converted(self) -> list[CollectionTile]:
        """TESSERA tiles given as geotessera ``.npy``, each once: rule areas writes their
        GeoTIFFs (under :data:`NPY_OUT`) before the VRTs that list them."""
        seen: dict[Path, CollectionTile] = {}
        for r in self.regions:
            m = r.mosaics.get("tessera")
            for t in m.tiles if m else ():
                if t.npy is not None:
                    seen.setdefault(t.path, t)
        return list(seen.values())

    def missing(self, source: str) -> list[CollectionTile]:
        """Tiles of ``source`` not in the folder yet (what a fetch downloads), once each."""
        seen: dict[Path, CollectionTile] = {}
        for r in self.regions:
            m = r.mosaics.get(source)
            for t in m.tiles if m else ():
                if t.header is None and t.npy is None and not t.path.exists():
                    seen.setdefault(t.path, t)
        return list(seen.values())


def tiles_vrt(vrt: str) -> str:
    """The unmasked mosaic beneath a masked VRT: ``aef.vrt`` -> ``aef_tiles.vrt``."""
    return vrt[: -len(".vrt")] + "_tiles.vrt"


def plan_areas(areas_file: str | Path, collections: Mapping) -> AreaPlan:
    """The plan of every area of ``areas_file`` over ``collections`` (the config's
    ``collections:``). Raises :class:`AreasError` on the first bad input. Where a collection
    has a ``url``, tiles its index lists but the folder lacks are left to the fetch rule
    instead of refused."""
    areas = read_areas(areas_file)
    check_no_overlap(Path(areas_file), areas)
    sources = {k: v for k, v in collections.items() if k in ("aef", "tessera", "cdl") and v}
    fetching = {k for k, v in sources.items() if v.get("url")}
    if not ({"aef", "tessera"} & set(sources)):
        raise AreasError("collections: expected an aef or a tessera collection for the areas")
    aef = read_aef_index(sources["aef"]["index"]) if "aef" in sources else None
    registry = registry_of(sources.get("tessera"))
    regions = []
    names = [a.name for a in areas]
    for area in areas:
        where = f"{areas_file}: area {area.name!r} ({area.year})"
        check_aef_year(where, area.year, aef)
        for zone in zones_of(area.geometry.bounds):
            part = area.geometry.intersection(zone_box(zone))
            if part.is_empty or part.area == 0:
                continue
            tag = f"{area.name}_{area.year}" if names.count(area.name) > 1 else area.name
            region = f"{tag}_{zone.lower()}"
            plan = RegionPlan(region, area.name, zone, area.year, area.split, part)
            where_zone = f"{where}, zone {zone}"
            utm = CRS.from_epsg(zone_epsg(zone))
            part_utm = reproject(part, WGS84, utm, step=DENSIFY_DEG)
            out = f"{OUT}/{region}"
            if aef is not None:
                tiles = _aef_tiles(
                    where_zone,
                    zone,
                    area.year,
                    part,
                    part_utm,
                    aef,
                    Path(sources["aef"]["folder"]),
                    "aef" in fetching,
                )
                plan.mosaics["aef"] = Mosaic(
                    "aef", f"{out}/aef.vrt", utm.to_string(), tiles, part_utm
                )
            if "tessera" in sources:
                check_tessera_year(where, area.year)
                tiles = tessera_tiles(
                    where_zone,
                    zone,
                    area.year,
                    part,
                    part_utm,
                    sources["tessera"],
                    registry,
                    "tessera" in fetching,
                )
                plan.mosaics["tessera"] = Mosaic(
                    "tessera", f"{out}/tessera.vrt", utm.to_string(), tiles, part_utm
                )
            if "cdl" in sources and area.split != PREDICT:
                _plan_cdl(where_zone, plan, out, sources["cdl"])
            regions.append(plan)
    return AreaPlan(regions)


def _aef_tiles(
    where: str, zone: str, year: int, part, part_utm, index: AefIndex, folder: Path, fetching: bool
) -> list[CollectionTile]:
    rows = index.select(year, zone, part)
    f = index.frame.iloc[rows]
    boxes = shapely.box(f["utm_west"], f["utm_south"], f["utm_east"], f["utm_north"])
    check_gap(where, "AEF", index.file, part_utm, boxes, CRS.from_epsg(zone_epsg(zone)))
    tiles = []
    for rec in f.itertuples():
        path, key = aef_local_path(folder, rec.path)
        size = (
            round((rec.utm_east - rec.utm_west) / AEF_RESOLUTION),
            round((rec.utm_north - rec.utm_south) / AEF_RESOLUTION),
        )
        extent = (rec.utm_west, rec.utm_south, rec.utm_east, rec.utm_north)
        tile = CollectionTile(path, key, str(rec.crs), size, bounds=extent)
        check_in_folder(folder, tile, index.file)
        tile.header = check_tile(where, "aef", tile, index.file, fetching)
        tiles.append(tile)
    return tiles


def _plan_cdl(where: str, plan: RegionPlan, out: str, collection: Mapping) -> None:
    path = Path(str(collection["path"]).format(year=plan.year))
    if not path.exists():
        raise AreasError(
            f"collections.cdl.path: {where}: {path} not found (expected a national CDL of "
            f"{plan.year} or a folder of its tiles)"
        )
    if path.is_dir():
        headers = cdl_tiles(path)
        if not headers:
            raise AreasError(f"{path}: {where}: a CDL folder without .tif tiles")
        crs = headers[0].crs
        part = reproject(plan.part, WGS84, CRS.from_user_input(crs), step=DENSIFY_DEG)
        boxes = shapely.box(*zip(*(h.bounds for h in headers), strict=True))
        keep = shapely.intersects(boxes, part) & ~shapely.touches(boxes, part)
        chosen = [h for h, k in zip(headers, keep, strict=True) if k]
        for header in chosen:
            check_cdl_tile_year(where, header, plan.year)
        check_gap(where, "CDL", path, part, boxes[keep], CRS.from_user_input(crs))
        tiles = [CollectionTile(h.path, h.path.name, crs.to_string(), header=h) for h in chosen]
        plan.mosaics["cdl"] = Mosaic("cdl", f"{out}/cdl.vrt", crs.to_string(), tiles, None)
        return
    try:
        header = read_header(path)
    except RasterioIOError as err:
        raise AreasError(f"{path}: {where}: cannot read the CDL as a raster ({err})") from None
    part = reproject(plan.part, WGS84, CRS.from_user_input(header.crs), step=DENSIFY_DEG)
    check_gap(
        where, "CDL", path, part, [shapely.box(*header.bounds)], CRS.from_user_input(header.crs)
    )
    plan.cdl_file = str(path)
