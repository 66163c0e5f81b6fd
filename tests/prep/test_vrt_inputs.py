"""A region given as a VRT mosaic of tiles gives the labels, shard tiles and maps of the same
ground given as one GeoTIFF, and every output is a GeoTIFF whatever the input's driver."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import CLASSES_CSV, TINY, TinyDemo
from rasterio.windows import Window
from tiny_runs import tiny_run

from emb.classes import ClassMap
from emb.evaluation.predict import main as predict_main
from emb.prep.align_labels import align_labels
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec

GDAL_TYPES = {"int8": "Int8", "uint8": "Byte", "float32": "Float32", "float64": "Float64"}


def write_vrt_mosaic(raster: Path, folder: Path, parts: int = 2) -> Path:
    """``raster`` cut into parts x parts GeoTIFF tiles and a VRT listing them by relative path,
    as gdalbuildvrt writes one."""
    tiles_dir = folder / "tiles"
    tiles_dir.mkdir(parents=True, exist_ok=True)
    with rasterio.open(raster) as src:
        profile, (h, w) = src.profile, src.shape
        dtype, nodata, t = src.dtypes[0], src.nodata, src.transform
        sources = []
        rows = np.linspace(0, h, parts + 1).astype(int)
        cols = np.linspace(0, w, parts + 1).astype(int)
        for i in range(parts):
            for j in range(parts):
                win = Window(cols[j], rows[i], cols[j + 1] - cols[j], rows[i + 1] - rows[i])
                name = f"tile_{i}_{j}.tif"
                tile_profile = {**profile, "width": win.width, "height": win.height,
                                "transform": src.window_transform(win)}  # fmt: skip
                with rasterio.open(tiles_dir / name, "w", **tile_profile) as dst:
                    dst.write(src.read(window=win))
                sources.append((name, win))
        srs = src.crs.to_wkt()
    bands = []
    for b in range(1, profile["count"] + 1):
        simple = "".join(
            f'<SimpleSource><SourceFilename relativeToVRT="1">tiles/{name}</SourceFilename>'
            f"<SourceBand>{b}</SourceBand>"
            f'<SrcRect xOff="0" yOff="0" xSize="{win.width}" ySize="{win.height}"/>'
            f'<DstRect xOff="{win.col_off}" yOff="{win.row_off}" xSize="{win.width}" '
            f'ySize="{win.height}"/></SimpleSource>'
            for name, win in sources
        )
        nd = f"<NoDataValue>{nodata}</NoDataValue>" if nodata is not None else ""
        bands.append(
            f'<VRTRasterBand dataType="{GDAL_TYPES[dtype]}" band="{b}">{nd}{simple}</VRTRasterBand>'
        )
    geo = ", ".join(repr(float(v)) for v in (t.c, t.a, t.b, t.f, t.d, t.e))
    vrt = folder / "mosaic.vrt"
    vrt.write_text(
        f'<VRTDataset rasterXSize="{w}" rasterYSize="{h}"><SRS>{srs}</SRS>'
        f"<GeoTransform>{geo}</GeoTransform>{''.join(bands)}</VRTDataset>"
    )
    return vrt


def tar_members(folder: Path) -> dict[str, bytes]:
    """Every member of every shard in ``folder`` (the region's shards), by name."""
    members = {}
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                members[f"{shard.name}/{m.name}"] = tar.extractfile(m).read()
    return members


@pytest.fixture(scope="module")
def mosaics(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each source of demo_a (bottom-up AEF, like the public COGs) and demo_b as a 2x2 VRT."""
    root = tmp_path_factory.mktemp("vrt")
    return {
        f"{region}/{source}": write_vrt_mosaic(
            tiny_demo.rasters[region][source], root / region / source
        )
        for region in ("demo_a", "demo_b")
        for source in ("aef", "tessera")
    }


@pytest.mark.parametrize("region", ["demo_a", "demo_b"])
@pytest.mark.parametrize("source", ["aef", "tessera"])
def test_a_vrt_mosaic_gives_the_labels_and_shards_of_one_geotiff(
    tiny_demo: TinyDemo, mosaics: dict, class_map: ClassMap, tmp_path: Path, source: str,
    region: str,
) -> None:  # fmt: skip
    vrt, tif = mosaics[f"{region}/{source}"], tiny_demo.rasters[region][source]
    with rasterio.open(vrt) as src:
        assert src.driver == "VRT"
    cdl = tiny_demo.rasters[region]["cdl"]
    labels = {}
    for name, raster in (("vrt", vrt), ("tif", tif)):
        out = tmp_path / name / "labels.tif"
        report = align_labels(raster, cdl, class_map, out)
        with rasterio.open(out) as dst:
            assert dst.driver == "GTiff"
            labels[name] = (dst.read(1), dst.transform, dst.crs, report["counts"])
        build_region(source, region, raster, out, tmp_path / name / "shards",
                     TileSpec(TINY["tile"]), SplitSpec(TINY["block_m"]),
                     max_samples=TINY["max_samples"])  # fmt: skip
    assert np.array_equal(labels["vrt"][0], labels["tif"][0])
    assert labels["vrt"][1:] == labels["tif"][1:]
    shards = {name: tar_members(tmp_path / name / "shards") for name in ("vrt", "tif")}
    assert shards["vrt"] and shards["vrt"] == shards["tif"]


def test_a_vrt_mosaic_gives_the_map_of_one_geotiff(
    tiny_demo: TinyDemo, mosaics: dict, tmp_path: Path
) -> None:
    run = tiny_run(tiny_demo, tmp_path / "run", "aef", "segformer", steps=2)
    maps = {}
    for name, raster in (
        ("vrt", mosaics["demo_a/aef"]),
        ("tif", tiny_demo.rasters["demo_a"]["aef"]),
    ):
        out = tmp_path / name / "demo_a.tif"
        predict_main(["--run-dir", str(run), "--raster", str(raster), "--region", "demo_a",
                      "--classes", str(CLASSES_CSV), "--out", str(out),
                      "--png", str(out.with_suffix(".png")), "--overlap=0.5", "--block=1024",
                      "--batch-size=16", "--threads=1"])  # fmt: skip
        with rasterio.open(out) as dst:
            assert dst.driver == "GTiff"  # a COG is a GeoTIFF
            maps[name] = (dst.read(1), dst.transform, dst.crs)
    assert np.array_equal(maps["vrt"][0], maps["tif"][0])
    assert maps["vrt"][1:] == maps["tif"][1:]
