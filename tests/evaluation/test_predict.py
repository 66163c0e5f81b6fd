"""Prediction maps: georeferencing of the input, no seams, nodata kept, bounded memory, errors."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from conftest import CLASSES_CSV, TinyDemo
from tiny_runs import resolved_config, tiny_run, write_run

from emb.classes import load_class_map
from emb.colours import official_palette
from emb.evaluation.map_files import read_north_up
from emb.evaluation.predict import main as predict_main
from emb.evaluation.predict import predict_raster
from emb.evaluation.predict_spec import PredictSpec
from emb.evaluation.runs import open_run
from emb.evaluation.windows import blend_weights, tile_origins, window_count
from emb.models import build_model
from emb.prep.demo_region import DEMO_REGIONS, write_region
from emb.rasters import shard_arrays, valid_pixels

TILE = 32  # the tiny demo's training tile
REGIONS = [r.name for r in DEMO_REGIONS]  # demo_a is stored bottom-up, demo_b north-up


@pytest.fixture(scope="module")
def trained(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AEF run fitted long enough to have learned the demo's fields."""
    return tiny_run(tiny_demo, tmp_path_factory.mktemp("predict"), "aef", "segformer", steps=80)


@pytest.fixture(scope="module")
def maps(trained: Path, tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each demo region predicted by the real CLI, with probabilities."""
    out = tmp_path_factory.mktemp("maps")
    paths = {}
    for region in REGIONS:
        suffixes = {"map": ".tif", "png": ".png", "prob": "_probabilities.tif"}
        paths[region] = {k: out / f"{region}{s}" for k, s in suffixes.items()}
        predict_main([
            "--run-dir", str(trained), "--raster", str(tiny_demo.rasters[region]["aef"]),
            "--region", region, "--classes", str(CLASSES_CSV), "--out", str(paths[region]["map"]),
            "--png", str(paths[region]["png"]), "--probabilities", str(paths[region]["prob"]),
            "--overlap", "0.5", "--block", "1024", "--batch-size", "16", "--threads", "1",
        ])  # fmt: skip
    return paths


def model_of(run_dir: Path) -> tuple[torch.nn.Module, object]:
    run = open_run(run_dir, load_class_map(CLASSES_CSV), CLASSES_CSV)
    return run.model(run.selected), run.dequantize()


@torch.no_grad()
def window_logits(model, dequantize, raster: Path, origins: list[tuple[int, int]], flip=False):
    """L3 logits (N, C, T, T) of windows read straight from the raster (no predict code)."""
    with rasterio.open(raster) as src:
        arrays = [shard_arrays("aef", src.read(window=((r, r + TILE), (c, c + TILE))), src.nodata)
                  for r, c in origins]  # fmt: skip
    emb = torch.from_numpy(np.stack([a["emb"] for a in arrays]))
    x, _ = dequantize({"emb": emb, "label": torch.zeros(len(arrays), TILE, TILE)})
    if flip:
        return model(x.flip(-1))["l3"].flip(-1).numpy()
    return model(x)["l3"].numpy()


@pytest.mark.parametrize("region", REGIONS)
def test_map_has_exactly_the_crs_transform_and_shape_of_the_input(
    maps, tiny_demo: TinyDemo, region: str
) -> None:
    with rasterio.open(tiny_demo.rasters[region]["aef"]) as src:
        crs, transform, shape = src.crs, src.transform, src.shape
    assert (transform.e > 0) == (region == "demo_a"), "demo_a must be stored bottom-up"
    with rasterio.open(maps[region]["map"]) as out:
        assert out.crs == crs
        assert out.transform == transform
        assert out.shape == shape
        assert out.count == 1 and out.dtypes[0] == "uint8" and out.nodata == 255
        assert out.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"


@pytest.mark.parametrize("region", REGIONS)
def test_map_keeps_nodata_where_the_input_has_none(maps, tiny_demo: TinyDemo, region: str) -> None:
    with rasterio.open(tiny_demo.rasters[region]["aef"]) as src:
        valid = valid_pixels("aef", shard_arrays("aef", src.read(), src.nodata))
    with rasterio.open(maps[region]["map"]) as out:
        ids = out.read(1)
    assert (~valid).any(), "the demo raster has nodata holes"
    assert ((ids == 255) == ~valid).all()
    assert ids[valid].max() < 61


def test_map_carries_official_cdl_colours_and_class_names(maps) -> None:
    names = load_class_map(CLASSES_CSV).l3_names
    with rasterio.open(maps["demo_a"]["map"]) as out:
        colours = out.colormap(1)
        tags = out.tags()
        band_tags = out.tags(1)
    official = official_palette()
    assert colours[0][:3] == official[1] == (255, 211, 0)  # corn: the CDL's corn yellow
    assert colours[1][:3] == official[5]  # soybeans
    assert colours[58][:3] == official[111]  # open water: open water's blue
    assert colours[255][3] == 0  # nodata transparent
    assert json.loads(tags["CLASS_NAMES"]) == list(names)
    assert band_tags["class_0"] == "corn" and tags["REGION"] == "demo_a"


def test_probabilities_sum_to_one_and_their_argmax_is_the_map(maps) -> None:
    with rasterio.open(maps["demo_b"]["prob"]) as src:
        q = src.read()
        scale = src.scales[0]
        assert src.count == 61 and src.descriptions[0] == "corn"
    with rasterio.open(maps["demo_b"]["map"]) as out:
        ids = out.read(1)
    valid = ids != 255
    p = q[:, valid].astype(np.float64) * scale
    assert np.allclose(p.sum(0), 1.0, atol=61 * 0.5 * scale)
    top2 = np.sort(q[:, valid], axis=0)[-2:]
    clear = top2[1] > top2[0]  # rounding to 1/254 can tie close runners-up
    assert (q[:, valid].argmax(0)[clear] == ids[valid][clear]).all()
    assert (q[:, ~valid] == 255).all()


def test_quicklook_is_north_up_for_bottom_up_maps(maps) -> None:
    with rasterio.open(maps["demo_a"]["map"]) as out:
        stored = out.read(1)
    assert (read_north_up(maps["demo_a"]["map"]) == stored[::-1]).all()
    assert maps["demo_a"]["png"].stat().st_size > 1000


@pytest.mark.parametrize("region", REGIONS)
def test_seam_predictions_agree_with_interior_ones_within_the_models_flip_variance(
    maps, trained: Path, tiny_demo: TinyDemo, region: str
) -> None:
    """Pixels on window edges (rows or columns 0 and 15 mod the stride of 16) against the same
    pixels predicted alone by a window whose central half holds them; the yardstick is how
    often the model itself changes its mind when that window is mirrored."""
    raster = tiny_demo.rasters[region]["aef"]
    with rasterio.open(maps[region]["map"]) as out:
        ids = out.read(1)
    model, dequantize = model_of(trained)
    stride, half = TILE // 2, TILE // 4
    size = ids.shape[0]
    origins = [(r, c) for r in range(0, size - TILE + 1, stride)
               for c in range(0, size - TILE + 1, stride)]  # fmt: skip
    centre, centre_flip = np.full(ids.shape, 255), np.full(ids.shape, 255)
    for flip, target in ((False, centre), (True, centre_flip)):
        logits = window_logits(model, dequantize, raster, origins, flip)
        for (r, c), lg in zip(origins, logits, strict=True):
            inner = np.s_[half : TILE - half, half : TILE - half]
            target[r + half : r + TILE - half, c + half : c + TILE - half] = lg.argmax(0)[inner]
    rows = np.arange(size)[:, None]
    cols = np.arange(size)[None, :]
    on_edge = (rows % stride == 0) | (rows % stride == stride - 1)
    on_edge = on_edge | (cols % stride == 0) | (cols % stride == stride - 1)
    seam = on_edge & (centre != 255) & (ids != 255)
    assert seam.sum() > 1000
    seam_disagreement = (ids[seam] != centre[seam]).mean()
    flip_disagreement = (centre_flip[seam] != centre[seam]).mean()
    assert flip_disagreement > 0, "a model that never changes its mind is no yardstick"
    assert seam_disagreement <= flip_disagreement, (seam_disagreement, flip_disagreement)


def test_without_overlap_the_map_is_the_argmax_of_each_tile(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """Placement check: non-overlapping windows must land exactly where they were read."""
    raster = tiny_demo.rasters["demo_a"]["aef"]
    out = tmp_path / "map.tif"
    predict_main(["--run-dir", str(trained), "--raster", str(raster), "--region", "demo_a",
                  "--classes", str(CLASSES_CSV), "--out", str(out), "--png",
                  str(tmp_path / "map.png"), "--overlap", "0", "--block", "48",
                  "--batch-size", "16", "--threads", "1"])  # fmt: skip
    with rasterio.open(out) as src:
        ids = src.read(1)
    model, dequantize = model_of(trained)
    size = ids.shape[0]
    origins = [(r, c) for r in range(0, size, TILE) for c in range(0, size, TILE)]
    logits = window_logits(model, dequantize, raster, origins)
    for (r, c), lg in zip(origins, logits, strict=True):
        got = ids[r : r + TILE, c : c + TILE]
        want = lg.argmax(0)
        valid = got != 255
        assert (got[valid] == want[valid]).all(), (r, c)


def test_block_size_does_not_change_the_map(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    run = open_run(trained, load_class_map(CLASSES_CSV), CLASSES_CSV)
    cmap = load_class_map(CLASSES_CSV)
    raster = tiny_demo.rasters["demo_b"]["aef"]
    results = []
    for block in (40, 1024):
        out = tmp_path / f"block{block}.tif"
        predict_raster(run, "raw", raster, cmap, PredictSpec(TILE, 0.5, block), out)
        with rasterio.open(out) as src:
            results.append(src.read(1))
    assert (results[0] == results[1]).mean() >= 0.999


def test_windows_of_every_block_together_cover_the_raster_once_as_a_whole() -> None:
    for length, tile, stride, block in ((128, 32, 16, 40), (100, 32, 24, 33), (20, 32, 16, 7)):
        whole = tile_origins(0, length, length, tile, stride)
        assert len(whole) == window_count(length, tile, stride)
        assert whole[-1] + tile >= length  # the last pixel is covered
        per_block = set()
        for start in range(0, length, block):
            found = tile_origins(start, min(start + block, length), length, tile, stride)
            assert all(o < min(start + block, length) and o + tile > start for o in found)
            per_block |= set(found)
        assert sorted(per_block) == whole
    weights = blend_weights(32)
    assert weights.min() > 0 and weights[16, 16] == weights.max()


def test_memory_is_bounded_by_the_block_not_the_raster(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    """Peak traced allocations: 4x the pixels at the same block cost about the same; a larger
    block costs more."""
    cmap = load_class_map(CLASSES_CSV)
    config = resolved_config(tiny_demo, tmp_path, "aef", "segformer")
    from emb.training.run_config import TrainConfig

    model = build_model(TrainConfig.from_dict(config).model)
    run = open_run(write_run(tmp_path / "runs" / "init", config, model.state_dict()), cmap,
                   CLASSES_CSV)  # fmt: skip
    small = tiny_demo.rasters["demo_b"]["aef"]
    big = write_region(DEMO_REGIONS[1], 256, tmp_path / "big", CLASSES_CSV, seed=3)["aef"]

    def peak(raster: Path, block: int) -> int:
        tracemalloc.start()
        try:
            predict_raster(run, "raw", raster, cmap, PredictSpec(TILE, 0.0, block, 16),
                           tmp_path / f"{raster.parent.name}_{block}.tif")  # fmt: skip
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small_64, big_64, big_256 = peak(small, 64), peak(big, 64), peak(big, 256)
    assert big_64 < 1.5 * small_64, (small_64, big_64)
    assert big_256 > 4 * big_64, (big_64, big_256)


def run_cli(args: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        predict_main(args)
    return str(exc.value)


def cli_args(run_dir: Path, raster: Path, out: Path) -> list[str]:
    return ["--run-dir", str(run_dir), "--raster", str(raster), "--region", "demo_a",
            "--classes", str(CLASSES_CSV), "--out", str(out), "--png",
            str(out.with_suffix(".png")), "--overlap=0.5", "--block=1024", "--batch-size=16",
            "--threads=1"]  # fmt: skip


def test_missing_region_raster_is_an_error_naming_it(trained: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "aef.tif"
    message = run_cli(cli_args(trained, missing, tmp_path / "map.tif"))
    assert str(missing) in message and "demo_a" in message
    assert not (tmp_path / "map.tif").exists()


def test_run_without_checkpoint_is_an_error_naming_it(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    raster = tiny_demo.rasters["demo_a"]["aef"]
    message = run_cli(cli_args(tmp_path / "runs" / "ghost", raster, tmp_path / "map.tif"))
    assert "ghost" in message and "best.pt" in message


def test_raster_band_count_not_matching_in_dim_is_an_error_naming_both(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    tessera = tiny_demo.rasters["demo_a"]["tessera"]  # 128 bands for a 64-D model
    out = tmp_path / "map.tif"
    message = run_cli(cli_args(trained, tessera, out))
    assert str(tessera) in message and "in_dim is 64" in message and "in_dim 128" in message
    assert not out.exists() and not list(tmp_path.glob(".*"))


def test_a_map_without_a_mapped_pixel_is_warned_of_naming_region_and_rasters(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An embedding of nodata only maps to nodata only: said when the map is written, as a
    sample designed over it later can only name the map (issue 59, item 5)."""
    source = tiny_demo.rasters["demo_a"]["aef"]
    empty = tmp_path / "empty_aef.tif"
    with rasterio.open(source) as src:
        profile, shape, nodata = src.profile, (src.count, src.height, src.width), src.nodata
    with rasterio.open(empty, "w", **profile) as dst:
        dst.write(np.full(shape, nodata, profile["dtype"]))
    out = tmp_path / "map.tif"
    with caplog.at_level("WARNING", logger="emb.evaluation.predict"):
        predict_main(cli_args(trained, empty, out))
    with rasterio.open(out) as src:
        assert (src.read(1) == 255).all()
    assert f"region demo_a: map {out} has no mapped pixel: its input {empty}" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="emb.evaluation.predict"):
        predict_main(cli_args(trained, source, tmp_path / "full.tif"))
    assert "no mapped pixel" not in caplog.text
