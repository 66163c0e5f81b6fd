"""The regions check's cheaper reads (emb.workflow.region_checks) still catch what the dearer
ones caught: a raster whose header opens but whose pixels do not read, labels missing under
either source however their extents compare, and a CRS named by its own authority code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.transform import from_origin

from emb.prep.regions import RegionsError, read_regions
from emb.workflow.region_checks import check_regions, crs_name

KINDS = {"aef": (64, "int8"), "tessera": (128, "float32"), "cdl": (1, "uint8")}


def raster(path: Path, kind: str, crs: str = "EPSG:32615", x: float = 500000) -> Path:
    """A 64 x 64 raster of ``kind`` in tiles of 32, compressed (four tiles, each its bytes)."""
    count, dtype = KINDS[kind]
    rng = np.random.default_rng(0)
    grid = {"crs": crs, "transform": from_origin(x, 4000000, 10, 10), "width": 64, "height": 64}
    tiles = {"tiled": True, "blockxsize": 32, "blockysize": 32, "compress": "deflate"}
    with rasterio.open(path, "w", driver="GTiff", count=count, dtype=dtype, **grid, **tiles) as dst:
        dst.write(rng.integers(1, 100, (count, 64, 64)).astype(dtype))
    return path


def table(root: Path, files: dict[str, Path]) -> Path:
    path = root / "regions.tsv"
    cells = [str(files[kind]) for kind in ("aef", "tessera", "cdl")]
    row = "\t".join(["r1", "2024", *cells, ""])
    path.write_text(f"region\tyear\taef\ttessera\tcdl\tsplit\n{row}\n")
    return path


@pytest.mark.parametrize("column", ["aef", "tessera", "cdl"])
def test_a_raster_whose_header_opens_but_pixels_do_not_is_refused(
    tmp_path: Path, column: str
) -> None:
    """The file ends where its first tile's bytes begin: GDAL opens it from its header, and
    only a read of a pixel finds the data gone."""
    files = {kind: raster(tmp_path / f"{kind}.tif", kind) for kind in KINDS}
    with rasterio.open(files[column]) as src:
        first_tile = int(src.get_tag_item("BLOCK_OFFSET_0_0", "TIFF", bidx=1))
    cut = files[column].read_bytes()[:first_tile]
    files[column].write_bytes(cut)
    with rasterio.open(files[column]) as src:  # the header alone opens
        assert src.count == KINDS[column][0]
    path = table(tmp_path, files)
    with pytest.raises(
        RegionsError, match=rf"row 1 \(region 'r1'\), column '{column}': cannot read .*{column}"
    ):
        check_regions(read_regions(path), path)


def test_labels_are_checked_under_a_source_with_the_same_bounds_in_another_crs(
    tmp_path: Path,
) -> None:
    """AEF and TESSERA with the same bounds share one labels check only in one CRS: the same
    numbers in the next UTM zone are ground ~540 km away, where the CDL has no pixel."""
    files = {kind: raster(tmp_path / f"{kind}.tif", kind) for kind in ("aef", "cdl")}
    files["tessera"] = raster(tmp_path / "tessera.tif", "tessera", crs="EPSG:32614")
    path = table(tmp_path, files)
    with pytest.raises(RegionsError, match=r"column 'cdl': .*cdl\.tif does not overlap the "
                       r"embedding raster .*tessera\.tif"):  # fmt: skip
        check_regions(read_regions(path), path)


def test_both_sources_on_one_grid_pass_with_their_labels(tmp_path: Path) -> None:
    files = {kind: raster(tmp_path / f"{kind}.tif", kind) for kind in KINDS}
    path = table(tmp_path, files)
    pixels = check_regions(read_regions(path), path).pixels
    assert pixels == {str(f): 64 * 64 for f in files.values()}


def test_each_crs_is_named_by_its_own_code_once_looked_up() -> None:
    utm15, utm14 = CRS.from_epsg(32615), CRS.from_epsg(32614)
    for _ in range(2):  # looked up, then remembered
        assert (crs_name(utm15), crs_name(utm14)) == ("EPSG:32615", "EPSG:32614")
    assert crs_name(CRS.from_wkt(utm15.to_wkt())) == "EPSG:32615"
