"""geotessera's native tiles (int8 .npy + scales + landmask) converted, or refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine

from emb.prep.tessera_npy import (
    TesseraNpyError,
    check_triple,
    convert,
    find_triple,
    main,
)
from emb.rasters import nodata_mask
from emb.stage_runner import EXIT_INPUT, EXIT_NO_INPUT, StageExit

H, W, D = 40, 48, 128
GRID = "grid_0.15_52.05"
UTM = "EPSG:32631"
TRANSFORM = Affine(10.0, 0.0, 300_000.0, 0.0, -10.0, 5_770_000.0)


def write_landmask(path: Path, land: np.ndarray, crs: str | None = UTM) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    profile = {"driver": "GTiff", "count": 1, "dtype": "uint8", "height": land.shape[0],
               "width": land.shape[1], "transform": TRANSFORM}  # fmt: skip
    if crs is not None:
        profile["crs"] = crs
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(land.astype(np.uint8), 1)


def tile(rng: np.random.Generator, per_channel: bool) -> dict[str, np.ndarray]:
    """A tile with every kind of nodata in known places."""
    q = rng.integers(-127, 128, (H, W, D), dtype=np.int8)
    q[q == 0] = 1  # no accidental zero vector
    scales = rng.uniform(0.01, 0.2, (H, W, D) if per_channel else (H, W)).astype(np.float32)
    land = np.ones((H, W), np.uint8)
    land[:5, :7] = 0  # water in a corner
    expected = land == 0
    q[10, 10] = 0  # a zero vector with a good scale
    scales[11, 11] = 0  # a zero scale (per channel: every channel)
    scales[12, 12] = np.nan
    scales[13, 13] = 3.0e38  # the ~FLT_MAX sentinel geotessera drops
    scales[14, 14] = -1.6e5  # a broken, negative scale
    for r in (10, 11, 12, 13, 14):
        expected[r, r] = True
    if per_channel:
        scales[15, 15, 3] = np.inf  # one channel unusable: the pixel is nodata
        scales[16, 16, :64] = 0  # some channels zero: values 0 there, the pixel stays valid
        expected[15, 15] = True
    return {"q": q, "scales": scales, "land": land, "nodata": expected}


def write_triple(
    base: Path, arrays: dict[str, np.ndarray], year: str = "2024", metadata: dict | None = None
) -> Path:
    """geotessera's download layout under ``base``; returns the embedding's path."""
    folder = base / "global_0.1_degree_representation" / year / GRID
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{GRID}.npy", arrays["q"])
    np.save(folder / f"{GRID}_scales.npy", arrays["scales"])
    write_landmask(base / "global_0.1_degree_tiff_all" / f"{GRID}.tiff", arrays["land"])
    if metadata is not None:
        (base / "tessera_metadata.json").write_text(json.dumps(metadata))
    return folder / f"{GRID}.npy"


@pytest.fixture(params=[False, True], ids=["per_pixel", "per_channel"])
def per_channel(request) -> bool:
    return request.param


@pytest.mark.parametrize("block", [16, 256])
def test_conversion_equals_geotessera_dequantization(tmp_path, per_channel, block) -> None:
    arrays = tile(np.random.default_rng(3), per_channel)
    meta = {"dataset_version": "1.1", "dataset_version_path": "v1.1",
            "dataset_variant": "cambridge"}  # fmt: skip
    npy = write_triple(tmp_path / "tiles", arrays, metadata=meta)
    out = tmp_path / "out" / "region.tif"
    counts = convert(find_triple(npy), out, block=block)

    s = arrays["scales"] if per_channel else arrays["scales"][..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        want = (arrays["q"].astype(np.float32) * s).transpose(2, 0, 1)  # geotessera's formula
    with rasterio.open(out) as src:
        got = src.read()
        assert (src.count, src.dtypes[0], src.crs.to_string()) == (D, "float32", UTM)
        assert src.transform == TRANSFORM
        assert src.profile["compress"] == "deflate" and src.profile["tiled"]
        tags = src.tags()
    nodata = arrays["nodata"]
    np.testing.assert_array_equal(nodata_mask(got, float("nan")), nodata)
    np.testing.assert_array_equal(got[:, ~nodata], want[:, ~nodata])
    assert np.isnan(got[:, nodata]).all()
    assert tags["TESSERA_YEAR"] == "2024"
    assert tags["TESSERA_DATASET_VERSION"] == "1.1"
    assert tags["TESSERA_DATASET_VARIANT"] == "cambridge"
    assert (tags["TESSERA_TILE_LON"], tags["TESSERA_TILE_LAT"]) == ("0.15", "52.05")
    assert counts["valid"] == H * W - nodata.sum()
    assert counts["water"] == 35 and counts["zero_vector"] == 1


def test_published_and_sibling_layouts(tmp_path) -> None:
    arrays = tile(np.random.default_rng(0), per_channel=False)
    root = tmp_path / "repo"
    folder = root / "npy" / "v1.1-cam" / "2023" / GRID
    folder.mkdir(parents=True)
    np.save(folder / f"{GRID}.npy", arrays["q"])
    np.save(folder / f"{GRID}_scales.npy", arrays["scales"])
    write_landmask(root / "landmasks" / "v1.1-cam" / f"{GRID}.tiff", arrays["land"])
    triple = find_triple(folder / f"{GRID}.npy")
    assert triple.landmask == root / "landmasks" / "v1.1-cam" / f"{GRID}.tiff"
    assert triple.year == 2023
    assert triple.tags["TESSERA_DATASET_VERSION"] == "1.1"
    assert triple.tags["TESSERA_DATASET_VERSION_PATH"] == "v1.1"

    loose = tmp_path / "loose"  # the three files copied into one folder
    loose.mkdir()
    for name in (f"{GRID}.npy", f"{GRID}_scales.npy"):
        (loose / name).write_bytes((folder / name).read_bytes())
    write_landmask(loose / f"{GRID}.tif", arrays["land"])
    triple = find_triple(loose / f"{GRID}.npy")
    assert (triple.landmask.name, triple.year) == (f"{GRID}.tif", None)
    assert "TESSERA_YEAR" not in triple.tags
    assert check_triple(triple).height == H


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


@pytest.fixture
def good(tmp_path) -> Path:
    return write_triple(tmp_path / "tiles", tile(np.random.default_rng(1), per_channel=False))


def test_missing_scales_names_the_file(good: Path) -> None:
    scales = good.with_name(f"{GRID}_scales.npy")
    scales.unlink()
    with pytest.raises(FileNotFoundError) as err:
        find_triple(good)
    assert err.value.filename == str(scales) and "scales" in one_line(err.value)


def test_missing_landmask_names_where_geotessera_puts_it(good: Path) -> None:
    landmask = good.parents[3] / "global_0.1_degree_tiff_all" / f"{GRID}.tiff"
    landmask.unlink()
    with pytest.raises(FileNotFoundError) as err:
        find_triple(good)
    assert err.value.filename == str(landmask) and "landmask" in one_line(err.value)


def test_scales_file_given_for_the_embedding(good: Path) -> None:
    with pytest.raises(TesseraNpyError, match=rf"{GRID}_scales.npy: is a scales file"):
        find_triple(good.with_name(f"{GRID}_scales.npy"))


BAD_ARRAYS = {
    "scales_shape": ("scales", np.ones((H, W - 1), np.float32),
                     rf"_scales.npy: expected shape \({H}, {W}\) or \({H}, {W}, 128\) .* "
                     rf"found \({H}, {W - 1}\)"),
    "scales_float64": ("scales", np.ones((H, W), np.float64),
                       r"_scales.npy: expected dtype float32, found float64"),
    "scales_64_channels": ("scales", np.ones((H, W, 64), np.float32),
                           r"_scales.npy: expected shape .* found \(40, 48, 64\)"),
    "emb_float32": ("emb", np.ones((H, W, D), np.float32),
                    rf"{GRID}.npy: expected dtype int8, found float32"),
    "emb_64": ("emb", np.ones((H, W, 64), np.int8),
               rf"{GRID}.npy: expected shape \(H, W, 128\), found"),
    "emb_bands_first": ("emb", np.ones((D, H, W), np.int8),
                        rf"{GRID}.npy: expected shape \(H, W, 128\), found"),
}  # fmt: skip


@pytest.mark.parametrize(("which", "array", "message"), BAD_ARRAYS.values(), ids=BAD_ARRAYS)
def test_bad_arrays_are_refused_by_name(good: Path, which, array, message) -> None:
    target = good if which == "emb" else good.with_name(f"{GRID}_scales.npy")
    np.save(target, array)
    with pytest.raises(TesseraNpyError, match=message) as err:
        check_triple(find_triple(good))
    one_line(err.value)


def test_truncated_npy_is_refused(good: Path) -> None:
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    with pytest.raises(TesseraNpyError, match=rf"{GRID}.npy: expected a .npy array.*truncated"):
        check_triple(find_triple(good))


@pytest.mark.parametrize(
    ("crs", "shape", "message"),
    [
        ("EPSG:4326", (H, W), r"expected a projected CRS .* found EPSG:4326"),
        (None, (H, W), r"expected a projected CRS, found none"),
        (UTM, (H + 1, W), rf"expected {H} x {W} pixels like {GRID}.npy, found {H + 1} x {W}"),
    ],
    ids=["geographic", "no_crs", "other_size"],
)
def test_bad_landmask_is_refused_by_name(good: Path, crs, shape, message) -> None:
    landmask = good.parents[3] / "global_0.1_degree_tiff_all" / f"{GRID}.tiff"
    write_landmask(landmask, np.ones(shape, np.uint8), crs=crs)
    with pytest.raises(TesseraNpyError, match=rf"{GRID}.tiff: {message}") as err:
        check_triple(find_triple(good))
    one_line(err.value)


def test_all_water_tile_is_refused_and_nothing_is_replaced(good: Path, tmp_path) -> None:
    landmask = good.parents[3] / "global_0.1_degree_tiff_all" / f"{GRID}.tiff"
    write_landmask(landmask, np.zeros((H, W), np.uint8))
    out = tmp_path / "region.tif"
    out.write_bytes(b"earlier output")
    with pytest.raises(TesseraNpyError, match=r"no valid pixel: .*'water': 1920") as err:
        convert(find_triple(good), out)
    one_line(err.value)
    assert out.read_bytes() == b"earlier output"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_stage_exit_codes_and_year_check(good: Path, tmp_path) -> None:
    out = tmp_path / "region.tif"
    main([f"--npy={good}", f"--out={out}", "--year=2024"])
    with rasterio.open(out) as src:
        assert src.tags()["TESSERA_YEAR"] == "2024"
    with pytest.raises(StageExit) as err:
        main([f"--npy={good}", f"--out={tmp_path / 'other.tif'}", "--year=2021"])
    assert err.value.code == EXIT_INPUT
    assert "geotessera's 2024 folder, expected year 2021" in str(err.value)
    good.with_name(f"{GRID}_scales.npy").unlink()
    with pytest.raises(StageExit) as err:
        main([f"--npy={good}", f"--out={out}"])
    assert err.value.code == EXIT_NO_INPUT and f"{GRID}_scales.npy" in str(err.value)
    assert not (tmp_path / "other.tif").exists()


def test_mirror_version_folder_and_broken_sidecar(tmp_path) -> None:
    arrays = tile(np.random.default_rng(2), per_channel=False)
    npy = write_triple(tmp_path / "mirror" / "v1", arrays)  # an `aws s3 sync` of one version
    assert find_triple(npy).tags["TESSERA_DATASET_VERSION"] == "1.0"
    sidecar = tmp_path / "mirror" / "v1" / "tessera_metadata.json"
    sidecar.write_text("{not json")
    with pytest.raises(TesseraNpyError, match=r"tessera_metadata.json: expected geotessera's JSON"):
        find_triple(npy)
