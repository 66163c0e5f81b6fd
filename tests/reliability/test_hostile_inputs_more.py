"""More hostile inputs (issue 16): bounds checked before any allocation, unclear messages fixed
at their root, region ids that would reach a command line as options. Same checks as
test_hostile_inputs.py: a message naming the file or key, the good tree byte-identical, and a
time limit per case (a FIFO or a huge header must not hang or exhaust memory).
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import test_hostile_inputs as base
from conftest import CLASSES_CSV, TinyDemo
from test_hostile_inputs import (
    Env,
    check_table,
    good_row,
    kinds,
    regions_table,
    run_case,
    workflow_config,
)

from emb.classes import load_class_map
from emb.loading.dequantize import Dequantize
from emb.prep.regions import read_regions
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec, plan_tiles
from emb.training import checkpoint_file, run_config
from emb.workflow.region_checks import check_regions

pytestmark = pytest.mark.reliability
good_tree = base.good_tree  # the fixture: a tree of good outputs made by the real stages
CASES: dict = {}


def case(kind: str, xfail: str | None = None):  # noqa: F811 - this file's own registry
    def register(fn):
        # a kind named twice (here or in the first file) would replace a case that never runs
        assert kind not in CASES and kind not in base.CASES, f"two cases named {kind!r}"
        CASES[kind] = (fn, xfail)
        return fn

    return register


def table_text(env: Env, text: str, name: str = "regions.tsv") -> Path:
    path = env.tmp / name
    path.write_text(text)
    return path


def classes_text(env: Env, lines: list[str]) -> Path:
    path = env.tmp / "classes.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def stats_dir(env: Env, mean, std) -> Path:
    folder = env.tmp / "stats"
    folder.mkdir(exist_ok=True)
    np.save(folder / "channel_mean.npy", mean, allow_pickle=True)
    np.save(folder / "channel_std.npy", std, allow_pickle=True)
    return folder


def labels_and_transform(env: Env):
    import rasterio

    with rasterio.open(env.demo.labels[("aef", "demo_a")]) as ds:
        return ds.read(1), ds.transform


# --- regions.tsv ---------------------------------------------------------------------------


@case("regions.tsv: region id starting with '-' (passes for an option)")
def _(env):
    path = regions_table(env, [good_row(env, region="-h")])
    return lambda: check_regions(read_regions(path), path), ["regions.tsv", "'-h'", "region"]


@case("regions.tsv: region id '-h' against the schema")
def _(env):
    return check_table(regions_table(env, [good_row(env, region="-h")])), ["'-h'", "does not match"]


@case("regions.tsv: empty file")
def _(env):
    return check_table(table_text(env, "")), ["regions.tsv", "empty"]


@case("regions.tsv: header only, no region")
def _(env):
    return check_table(table_text(env, "region\tyear\taef\ttessera\tcdl\tsplit\n")), [
        "regions.tsv",
        "no region",
    ]


@case("regions.tsv: comma-separated (a CSV given as TSV)")
def _(env):
    row = good_row(env)
    text = ",".join(row) + "\n" + ",".join(row.values()) + "\n"
    return check_table(table_text(env, text)), ["regions.tsv", "tab-separated", "region"]


@case("regions.tsv: year not a number")
def _(env):
    return check_table(regions_table(env, [good_row(env, year="twenty")])), ["'twenty'"]


@case("regions.tsv: unknown split value")
def _(env):
    return check_table(regions_table(env, [good_row(env, split="holdout")])), [
        "'holdout' is not one of"
    ]


@case("regions.tsv: a column given twice")
def _(env):
    row = good_row(env)
    text = "\t".join([*row, "aef"]) + "\n" + "\t".join([*row.values(), row["aef"]]) + "\n"
    return check_table(table_text(env, text)), ["aef.1"]


@case("regions.tsv: neither aef nor tessera")
def _(env):
    return check_table(regions_table(env, [good_row(env, aef="", tessera="")])), [
        "regions.tsv",
        "neither aef nor tessera",
    ]


@case("raster: a directory where a GeoTIFF is expected")
def _(env):
    folder = env.tmp / "raster.tif"
    folder.mkdir()
    return check_table(regions_table(env, [good_row(env, aef=str(folder))])), [
        "column 'aef'",
        "raster.tif",
    ]


@case("raster: a VRT whose source file is missing")
def _(env):
    bands = "".join(
        f'<VRTRasterBand dataType="Int8" band="{b}"><SimpleSource><SourceFilename '
        f'relativeToVRT="1">gone.tif</SourceFilename><SourceBand>{b}</SourceBand></SimpleSource>'
        "</VRTRasterBand>"
        for b in range(1, 65)
    )
    vrt = env.tmp / "mosaic.vrt"
    vrt.write_text(
        '<VRTDataset rasterXSize="8" rasterYSize="8"><SRS>EPSG:32615</SRS>'
        f"<GeoTransform>500000,10,0,4000000,0,-10</GeoTransform>{bands}</VRTDataset>"
    )
    return check_table(regions_table(env, [good_row(env, aef=str(vrt))])), [
        "column 'aef'",
        "mosaic.vrt",
        "gone.tif",
        "do not exist",
    ]


@case("raster: a PNG renamed .tif")
def _(env):
    fake = env.tmp / "photo.tif"
    fake.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    return check_table(regions_table(env, [good_row(env, cdl=str(fake))])), [
        "column 'cdl'",
        "photo.tif",
    ]


@case("raster: TESSERA as int16")
def _(env):
    bad = base.copy_raster(env.raster("tessera"), env.tmp / "t16.tif", dtype="int16")
    return check_table(regions_table(env, [good_row(env, tessera=str(bad))])), [
        "column 'tessera'",
        "int16",
    ]


@case("raster: CDL with a text header (not a raster at all)")
def _(env):
    fake = env.tmp / "cdl.tif"
    fake.write_text("cdl_code,name\n1,Corn\n")
    return check_table(regions_table(env, [good_row(env, cdl=str(fake))])), [
        "column 'cdl'",
        "cdl.tif",
    ]


# --- classes.csv ---------------------------------------------------------------------------


@case("classes.csv: a row with an extra comma")
def _(env):
    lines = CLASSES_CSV.read_text().splitlines()
    bad = classes_text(env, [lines[0], lines[1] + ",extra", *lines[2:]])
    return lambda: load_class_map(bad), ["classes.csv", "line 2", "expected 8", "found 9"]


@case("classes.csv: a column missing")
def _(env):
    lines = [
        ",".join(x.split(",")[:2] + x.split(",")[3:]) for x in CLASSES_CSV.read_text().splitlines()
    ]
    bad = classes_text(env, lines)
    return lambda: load_class_map(bad), ["classes.csv", "l3_id"]


@case("classes.csv: empty file")
def _(env):
    bad = classes_text(env, [])
    return lambda: load_class_map(bad), ["classes.csv"]


@case("classes.csv: code not a number")
def _(env):
    lines = CLASSES_CSV.read_text().splitlines()
    row = lines[1].split(",")
    row[0] = "corn"
    bad = classes_text(env, [lines[0], ",".join(row), *lines[2:]])
    return lambda: load_class_map(bad), ["classes.csv", "cdl_code", "corn"]


@case("classes.csv: tab-separated")
def _(env):
    lines = [x.replace(",", "\t") for x in CLASSES_CSV.read_text().splitlines()]
    bad = classes_text(env, lines)
    return lambda: load_class_map(bad), ["classes.csv", "cdl_code"]


# --- configs and splits --------------------------------------------------------------------


@case("train config: a tab in the indentation")
def _(env):
    bad = env.tmp / "run.yaml"
    bad.write_text("model:\n  name: segformer\n\tdecoder_dim: 16\n")
    return lambda: run_config.load(bad), ["run.yaml", "line 3", "not valid YAML"]


@case("train config: a list where a mapping is expected")
def _(env):
    bad = env.tmp / "run.yaml"
    bad.write_text("- model\n- train\n")
    return lambda: run_config.load(bad), ["run.yaml", "expected a mapping"]


@case("train config: negative learning rate")
def _(env):
    return base.resolve_train(env, "--set optimizer.lr=-0.1"), ["lr", "-0.1"]


@case("train config: batch size 0")
def _(env):
    return base.resolve_train(env, "--set train.batch_size=0"), ["batch_size", "0"]


@case("train config: epochs 0")
def _(env):
    return base.resolve_train(env, "--set train.epochs=0"), ["epochs", "0"]


@case("config.yaml: tile stride 0")
def _(env):
    return workflow_config(env, tiles__stride=0), ["stride", "0 is less than the minimum of 1"]


@case("config.yaml: min_valid above 1")
def _(env):
    return workflow_config(env, tiles__min_valid=1.5), ["1.5 is greater than the maximum of 1"]


@case("splits: block_m below a pixel (MemoryError before)")
def _(env):
    labels, transform = labels_and_transform(env)
    spec = SplitSpec(block_m=1e-3)
    return lambda: plan_tiles(labels, transform, "demo_a", TileSpec(size=8), spec), [
        "splits.block_m",
        "pixel size",
        "0.001",
    ]


@case("splits: block_m zero")
def _(env):
    return lambda: SplitSpec(block_m=0.0), ["splits.block_m", "positive", "found 0"]


@case("splits: every fraction zero")
def _(env):
    fractions = {"train": 0.0, "val": 0.0, "test": 0.0}
    return lambda: SplitSpec(block_m=1280.0, fractions=fractions), [
        "splits.fractions",
        "positive sum",
    ]


# --- channel statistics --------------------------------------------------------------------


@case("stats: a pickled object array (code on load)")
def _(env):
    folder = stats_dir(env, np.array([{"x": 1}] * 4, dtype=object), np.ones(4))
    return lambda: Dequantize.from_stats("tessera", folder), ["channel_mean.npy", "pickle"]


@case("stats: a channel std of zero (diverged at step 1 before)")
def _(env):
    std = np.ones(128, np.float32)
    std[7] = 0.0
    folder = stats_dir(env, np.zeros(128, np.float32), std)
    return lambda: Dequantize.from_stats("tessera", folder), [
        "channel_std.npy",
        "channel 7",
        "positive",
    ]


@case("stats: mean and std of different channel counts")
def _(env):
    folder = stats_dir(env, np.zeros(64, np.float32), np.ones(128, np.float32))
    return lambda: Dequantize.from_stats("tessera", folder), ["64", "128", "channel"]


@case("stats: NaN mean")
def _(env):
    mean = np.zeros(128, np.float32)
    mean[3] = np.nan
    folder = stats_dir(env, mean, np.ones(128, np.float32))
    return lambda: Dequantize.from_stats("tessera", folder), ["channel_mean.npy", "channel 3"]


@case("stats: file missing")
def _(env):
    (env.tmp / "stats").mkdir()
    return lambda: Dequantize.from_stats("tessera", env.tmp / "stats"), ["channel_mean.npy"]


# --- shards --------------------------------------------------------------------------------


def rewrite_shard(env: Env, change) -> tuple[Path, int]:
    """A copy of a good shard with its first ``.emb.npy`` member replaced by ``change(info)``."""
    good, n = base.copy_shard(env)
    out = env.tmp / "train-0001.tar"
    with tarfile.open(good) as src, tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as dst:
        done = False
        for info in src.getmembers():
            data = src.extractfile(info).read() if info.isreg() else None
            if not done and info.name.endswith(".emb.npy"):
                info, data = change(info, data)
                done = True
            dst.addfile(info, io.BytesIO(data) if data is not None else None)
    return out, n


@case("shard: .npy header claiming a 215 GiB array (MemoryError before)")
def _(env):
    def huge(info, data):
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, {"descr": "|i1", "fortran_order": False, "shape": (64, 60000, 60000)}
        )
        info.size = len(head.getvalue()) + 64
        return info, head.getvalue() + bytes(64)

    shard, n = rewrite_shard(env, huge)
    return base.loader(env, shard, samples=n), ["train-0001.tar", "emb.npy", "230400000000"]


@case("shard: a member that is a symlink")
def _(env):
    def link(info, data):
        info.type, info.linkname, info.size = tarfile.SYMTYPE, "/etc/passwd", 0
        return info, None

    shard, n = rewrite_shard(env, link)
    return base.loader(env, shard, samples=n), ["train-0001.tar", "regular file", "/etc/passwd"]


@case("shard: a member that is a FIFO")
def _(env):
    def fifo(info, data):
        info.type, info.size = tarfile.FIFOTYPE, 0
        return info, None

    shard, n = rewrite_shard(env, fifo)
    return base.loader(env, shard, samples=n), ["train-0001.tar", "emb.npy", "regular file"]


# --- checkpoints ---------------------------------------------------------------------------


@case("checkpoint: last.pt is a FIFO (opening it hangs)")
def _(env):
    fifo = env.tmp / "last.pt"
    os.mkfifo(fifo)
    return lambda: checkpoint_file.load(fifo), ["last.pt", "regular", "FIFO"]


@case("checkpoint: best.pt is a directory")
def _(env):
    folder = env.tmp / "best.pt"
    folder.mkdir()
    return lambda: checkpoint_file.load(folder), ["best.pt", "regular", "directory"]


@case("checkpoint: a plain list pickled by torch")
def _(env):
    bad = env.tmp / "last.pt"
    import torch

    torch.save([1, 2, 3], bad)
    return lambda: checkpoint_file.load(bad), ["last.pt", "not an emb checkpoint"]


@case("checkpoint: a pickle of a set (not torch's format)")
def _(env):
    bad = env.tmp / "last.pt"
    bad.write_bytes(pickle.dumps({1, 2}))
    return lambda: checkpoint_file.load(bad), ["last.pt", "not a loadable emb checkpoint"]


# --- the suite -----------------------------------------------------------------------------


@pytest.mark.check("hostile_inputs")
@pytest.mark.parametrize("kind", kinds(CASES))
def test_more_hostile_inputs_get_a_clear_message_and_change_nothing(
    kind: str, good_tree: Path, tiny_demo: TinyDemo, tmp_path: Path, capsys
) -> None:
    run_case(CASES[kind][0], kind, good_tree, tiny_demo, tmp_path, capsys)


# --- odd but valid: accepted -----------------------------------------------------------------


def _crlf_bom_table(env: Env) -> Path:
    row = good_row(env, region="demo_a-2")
    text = "\t".join(row) + "\r\n" + "\t".join(row.values()) + "\r\n"
    path = env.tmp / "regions.tsv"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    return path


def _rewritten(env: Env, source: str, **creation) -> Path:
    return base.copy_raster(env.raster(source), env.tmp / f"{source}-odd.tif", **creation)


def _bigtiff(env: Env) -> Path:
    out = _rewritten(env, "aef", BIGTIFF="YES")
    assert out.read_bytes()[:4] == b"II+\0", "not written as a BigTIFF"
    return out


def _cdl_with_palette(env: Env) -> Path:
    import rasterio

    out = _rewritten(env, "cdl")
    with rasterio.open(out, "r+") as ds:
        ds.write_colormap(1, {1: (255, 211, 0, 255), 5: (38, 112, 0, 255)})
    return out


TILED_16 = {"tiled": True, "blockxsize": 16, "blockysize": 16}
ODD_BUT_VALID = {
    "regions.tsv with a BOM and CRLF line endings": lambda env: _crlf_bom_table(env),
    "AEF as BigTIFF": lambda env: regions_table(env, [good_row(env, aef=str(_bigtiff(env)))]),
    "AEF tiled 16x16 instead of striped": lambda env: regions_table(
        env,
        [good_row(env, aef=str(_rewritten(env, "aef", **TILED_16)))],
    ),
    "CDL with a colour palette": lambda env: regions_table(
        env, [good_row(env, cdl=str(_cdl_with_palette(env)))]
    ),
    "region id of digits and underscores": lambda env: regions_table(
        env, [good_row(env, region="_2024_iowa-7")]
    ),
}


@pytest.mark.check("hostile_inputs")
@pytest.mark.parametrize("kind", list(ODD_BUT_VALID), ids=[f"odd_valid-{k}" for k in ODD_BUT_VALID])
def test_odd_but_valid_inputs_are_accepted(kind: str, tiny_demo: TinyDemo, tmp_path: Path) -> None:
    env = Env(tiny_demo, tmp_path, tmp_path)
    table = ODD_BUT_VALID[kind](env)
    check_table(table)()  # raises on refusal
    assert list(read_regions(table).columns) == ["region", "year", "aef", "tessera", "cdl", "split"]
