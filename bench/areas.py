"""Areas at scale: planning an Iowa-sized area and writing its VRTs over a synthesized AEF
index of 1,000 and of 10,000 tiles (the same ground, 2x7 degrees around Iowa across the
14N/15N boundary, cut into smaller tiles for the larger index), every tile a real (sparse)
GeoTIFF on disk so the plan checks each selected file as it does on a user's collection.

- plan_s_{n}: seconds of ``plan_areas`` (read the index, select, split at the zone boundary,
  check every selected tile's header, find gaps): what each ``snakemake -n`` pays (goal for
  10,000 tiles: < 10 s).
- vrt_s_{n}: seconds to write every VRT of the plan (goal for 10,000: < 30 s).
- open_s_{n}: seconds to open one region's VRT and read a 256 px window (what each stage
  pays once per region: GDAL parses the whole XML).
- tiles_{n}: tiles the area selects (vrt_mb_{n}: their VRTs' size); growth_plan /
  growth_vrt: 10,000 over 1,000 (~10 when linear in the tiles selected).

The index is a GeoParquet, or with ``--index gpkg`` a GeoPackage (read through GDAL, pyogrio).

Usage: ``python bench/areas.py [--quick] [--index parquet|gpkg] [--json PATH] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pyogrio
import rasterio
import shapely
from affine import Affine
from pyproj import CRS

from emb.areas.plan import plan_areas
from emb.areas.vrt import write_mosaic
from emb.geo import WGS84, reproject, zone_box

EXTENT = (-97.0, 40.0, -90.0, 44.0)  # lon/lat box of the index
IOWA = (-96.6, 40.4, -90.2, 43.5)  # the area: about Iowa's bounding box
ZONES = {"14N": 32614, "15N": 32615}


def synthesize(root: Path, n_tiles: int, index_format: str = "parquet") -> tuple[Path, Path]:
    """An AEF collection of about ``n_tiles`` square tiles over EXTENT, and the areas file."""
    extent = shapely.box(*EXTENT)
    parts = {
        z: reproject(extent.intersection(zone_box(z)), WGS84, CRS.from_epsg(e), step=0.01)
        for z, e in ZONES.items()
    }
    area_m2 = sum(p.area for p in parts.values())
    side = math.ceil(math.sqrt(area_m2 / n_tiles) / 10) * 10  # metres, whole pixels
    rows = []
    for zone, part in parts.items():
        epsg = ZONES[zone]
        w, s, e, n = part.bounds
        x0, y0 = math.floor(w / side) * side, math.floor(s / side) * side
        for i in range(math.ceil((e - x0) / side)):
            for j in range(math.ceil((n - y0) / side)):
                x, y = x0 + i * side, y0 + j * side
                box = shapely.box(x, y, x + side, y + side)
                if not box.intersects(part):
                    continue
                foot = reproject(box, CRS.from_epsg(epsg), WGS84, step=side / 4)
                foot = foot.intersection(zone_box(zone))
                if foot.is_empty:
                    continue
                name = f"t{i:04d}_{j:04d}.tiff"
                path = root / "aef" / "2024" / zone / name
                path.parent.mkdir(parents=True, exist_ok=True)
                with rasterio.open(
                    path,
                    "w",
                    driver="GTiff",
                    width=side // 10,
                    height=side // 10,
                    count=64,
                    dtype="int8",
                    crs=f"EPSG:{epsg}",
                    transform=Affine(10, 0, x, 0, 10, y),
                    nodata=-128,
                    tiled=True,
                    blockxsize=256,
                    blockysize=256,
                    sparse_ok=True,
                ):
                    pass  # a sparse, bottom-up COG-like tile: header only
                fw, fs, fe, fn = foot.bounds
                rows.append(
                    {
                        "fid": len(rows),
                        "path": f"gs://b/v1/annual/2024/{zone}/{name}",
                        "year": 2024,
                        "crs": f"EPSG:{epsg}",
                        "utm_zone": zone,
                        "utm_west": x,
                        "utm_south": y,
                        "utm_east": x + side,
                        "utm_north": y + side,
                        "wgs84_west": fw,
                        "wgs84_south": fs,
                        "wgs84_east": fe,
                        "wgs84_north": fn,
                        "geometry": shapely.to_wkb(foot),
                    }
                )
    table = pa.Table.from_pylist(rows)
    index = root / "aef" / f"aef_index.{index_format}"
    if index_format == "gpkg":
        wkb = table.column("geometry").to_numpy(zero_copy_only=False)
        table = table.drop(["geometry", "fid"])
        pyogrio.raw.write(
            str(index), wkb, [table.column(n).to_numpy() for n in table.column_names],
            table.column_names, layer="aef_index", driver="GPKG", geometry_type="Polygon",
            crs="EPSG:4326",
        )  # fmt: skip
    else:
        pq.write_table(table, index)
    areas = root / "areas.tsv"
    areas.write_text(
        "area\tyear\tsplit\twest\tsouth\teast\tnorth\n"
        f"iowa\t2024\tauto\t{IOWA[0]}\t{IOWA[1]}\t{IOWA[2]}\t{IOWA[3]}\n"
    )
    return areas, index


def measure(n_tiles: int, repeats: int, index_format: str = "parquet") -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench_areas_") as tmp:
        root = Path(tmp)
        areas, index = synthesize(root, n_tiles, index_format)
        collections = {"aef": {"folder": str(root / "aef"), "index": str(index)}}
        cwd = os.getcwd()
        os.chdir(root)
        try:
            plan_s, vrt_s = [], []
            for _ in range(repeats):
                start = time.perf_counter()
                plan = plan_areas(areas, collections)
                plan_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                for region in plan.regions:
                    for mosaic in region.mosaics.values():
                        write_mosaic(mosaic)
                vrt_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            first = plan.regions[0].mosaics["aef"].vrt
            with rasterio.open(first) as src:  # what every stage pays to open a region
                src.read(window=rasterio.windows.Window(0, 0, 256, 256))
            open_s = time.perf_counter() - start
            tiles = sum(len(m.tiles) for r in plan.regions for m in r.mosaics.values())
            size = sum(p.stat().st_size for p in (root / "resources").rglob("*.vrt"))
        finally:
            os.chdir(cwd)
    return {
        "plan_s": min(plan_s),
        "vrt_s": min(vrt_s),
        "open_s": open_s,
        "tiles": tiles,
        "vrt_mb": size / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--index", choices=("parquet", "gpkg"), default="parquet")
    parser.add_argument("--quick", action="store_true", help="100 and 1000 tiles, one repeat")
    args = parser.parse_args()
    small, large = (100, 1000) if args.quick else (1000, 10000)
    repeats = 1 if args.quick else args.repeats
    results: dict[str, float] = {}
    for n in (small, large):
        got = measure(n, repeats, args.index)
        results.update({f"{k}_{n}": round(v, 3) for k, v in got.items()})
    results["growth_plan"] = round(results[f"plan_s_{large}"] / results[f"plan_s_{small}"], 2)
    results["growth_vrt"] = round(results[f"vrt_s_{large}"] / results[f"vrt_s_{small}"], 2)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
