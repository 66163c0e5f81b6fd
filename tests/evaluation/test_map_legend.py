"""Maps a GIS reads by name: GDAL's category names, the QGIS style beside the map, colours from
the input CDL's own table (NASS's published one as fallback), nodata transparent."""

from __future__ import annotations

import ctypes
import glob
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import CLASSES_CSV, TinyDemo
from tiny_runs import tiny_run

from emb.classes import load_class_map
from emb.colours import dominant_codes, official_palette
from emb.evaluation.predict import main as predict_main


@pytest.fixture(scope="module")
def trained(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_run(tiny_demo, tmp_path_factory.mktemp("legend"), "aef", "segformer", steps=10)


def predict(trained: Path, tiny_demo: TinyDemo, out: Path, cdl: Path | None = None) -> Path:
    args = [f"--run-dir={trained}", f"--raster={tiny_demo.rasters['demo_a']['aef']}",
            "--region=demo_a", f"--classes={CLASSES_CSV}", f"--out={out}",
            f"--png={out.with_suffix('.png')}", "--overlap=0.5", "--block=1024",
            "--batch-size=16", "--threads=1"]  # fmt: skip
    predict_main([*args, *([f"--cdl={cdl}"] if cdl else [])])
    return out


def gdal_category_names(path: Path) -> list[str]:
    """Band 1's category names as GDAL itself reports them (GDALGetRasterCategoryNames, the
    call gdalinfo and QGIS make), through the GDAL library rasterio ships (no gdal-bin here)."""
    import rasterio as _  # noqa: F401  (loads and registers its GDAL)

    lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(rasterio.__file__) + ".libs",
                                             "libgdal*"))[0])  # fmt: skip
    lib.GDALOpen.restype = ctypes.c_void_p
    lib.GDALGetRasterBand.restype = ctypes.c_void_p
    lib.GDALGetRasterBand.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.GDALGetRasterCategoryNames.restype = ctypes.POINTER(ctypes.c_char_p)
    lib.GDALGetRasterCategoryNames.argtypes = [ctypes.c_void_p]
    lib.GDALGetFileList.restype = ctypes.POINTER(ctypes.c_char_p)
    lib.GDALGetFileList.argtypes = [ctypes.c_void_p]
    lib.GDALClose.argtypes = [ctypes.c_void_p]
    lib.GDALAllRegister()
    dataset = lib.GDALOpen(str(path).encode(), 0)
    assert dataset, f"GDAL cannot open {path}"
    try:
        lib.GDALGetFileList(dataset)  # as gdalinfo does first ("Files:"); it loads the side-car
        names = lib.GDALGetRasterCategoryNames(lib.GDALGetRasterBand(dataset, 1))
        found = []
        while names and names[len(found)] is not None:
            found.append(names[len(found)].decode())
        return found
    finally:
        lib.GDALClose(dataset)


def test_gdal_and_qgis_name_every_class_of_the_map(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    out = predict(trained, tiny_demo, tmp_path / "demo_a.tif")
    names = list(load_class_map(CLASSES_CSV).l3_names)

    assert gdal_category_names(out) == names
    style = ET.parse(out.with_suffix(".qml")).getroot()  # QGIS loads demo_a.qml with demo_a.tif
    renderer = style.find("pipe/rasterrenderer")
    assert renderer.get("type") == "paletted" and renderer.get("band") == "1"
    entries = renderer.findall("colorPalette/paletteEntry")
    assert [e.get("label") for e in entries] == names
    assert [int(e.get("value")) for e in entries] == list(range(len(names)))
    with rasterio.open(out) as src:
        table = src.colormap(1)
        assert src.nodata == 255 and table[255][3] == 0  # nodata transparent
    for entry in entries:  # the style and the file's own colour table agree
        rgb = tuple(int(entry.get("color")[i : i + 2], 16) for i in (1, 3, 5))
        assert rgb == table[int(entry.get("value"))][:3]


def test_colours_come_from_the_cdls_own_table_else_the_published_one(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    cmap = load_class_map(CLASSES_CSV)
    codes = dominant_codes(cmap)
    cdl = tmp_path / "cdl_with_table.tif"
    with rasterio.open(tiny_demo.rasters["demo_a"]["cdl"]) as src:
        profile, data = src.profile, src.read()
    own = {code: (code, 255 - code, 7) for code in range(256)}  # unlike NASS's colours
    own[codes[1]] = (0, 0, 0)  # an entry left black counts as absent
    with rasterio.open(cdl, "w", **profile) as dst:
        dst.write(data)
        dst.write_colormap(1, {code: (*rgb, 255) for code, rgb in own.items()})

    with rasterio.open(predict(trained, tiny_demo, tmp_path / "own.tif", cdl)) as src:
        table = src.colormap(1)
    assert table[0][:3] == own[codes[0]]
    assert table[1][:3] == official_palette()[codes[1]]
    with rasterio.open(predict(trained, tiny_demo, tmp_path / "plain.tif")) as src:
        assert src.colormap(1)[0][:3] == official_palette()[codes[0]] == (255, 211, 0)


def test_the_published_table_is_the_one_shipped() -> None:
    palette = official_palette()
    assert len(palette) == 131 and palette[5] == (38, 112, 0) and palette[111] == (76, 112, 163)
    assert np.unique(list(palette)).size == len(palette)
