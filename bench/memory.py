"""Peak memory of the per-region and per-source stages as a function of the raster's size: the
figures behind the ``mem_mb`` the rules ask for (``emb.workflow.resources``).

For each side S (default 1024, 2048, 4096) and source (AEF: 64 int8 bands; TESSERA: 128
float32 bands, half the side by default: the same bytes at S/2), writes a tiled SxS raster and
a CDL raster on its grid (every pixel corn, so every tile is kept), then runs the stages as
Snakemake runs them, each in a fresh wrapper process whose only child is the stage (its
``RUSAGE_CHILDREN`` peak is the stage's peak RSS, as the rules' ``benchmark:`` files record
it in ``max_rss``): ``align_labels``, ``shards``, ``manifest`` and ``channel_stats``
(``--n-tiles 500``, the default). Rule ``shards`` runs the first two one after the other in one
job: it asks for the larger of their two requests and their two times added.

Prints one row per (stage, source, side): megapixels, peak RSS (MiB) and seconds, then per
stage and source the least-squares line ``peak = a + b * megapixels`` and the largest
measured peak over the model's request (``emb.workflow.resources.mem_mb``; must be < 1).

Usage: ``python bench/memory.py [--sides 1024 2048 4096] [--tessera-sides ...] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import rasterio
from rasterio.windows import Window

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from data import write_raster  # noqa: E402

from emb.workflow.resources import mem_mb  # noqa: E402

WRAPPER = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)
BANDS = {"aef": (64, "int8", -128), "tessera": (128, "float32", None)}


def corn(emb: Path, path: Path) -> Path:
    """A CDL raster on ``emb``'s grid, every pixel code 1 (corn)."""
    with rasterio.open(emb) as src:
        profile = dict(src.profile, count=1, dtype="uint8", nodata=0)
        size = src.width
    with rasterio.open(path, "w", **profile) as dst:
        for row in range(0, size, 256):
            h = min(256, size - row)
            dst.write(np.ones((1, h, size), np.uint8), window=Window(0, row, size, h))
    return path


def peak(cmd: list[str]) -> tuple[float, float]:
    """Peak RSS (MiB) and seconds of ``python -m <cmd>`` in a fresh wrapper process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, "-m", *cmd],
                          check=True, capture_output=True, text=True)  # fmt: skip
    return int(done.stdout.split()[-1]) / 1024, time.perf_counter() - start


def measure(work: Path, source: str, side: int) -> dict[str, tuple[float, float]]:
    """Peak RSS and seconds of each stage on one SxS raster of ``source``."""
    count, dtype, nodata = BANDS[source]
    emb = write_raster(work / f"{source}{side}.tif", count, side, dtype, nodata)
    cdl = corn(emb, work / f"cdl{side}.tif")
    labels, index = work / f"labels{side}.tif", work / f"{source}{side}" / "index.json"
    out = {}
    out["align_labels"] = peak(["emb.prep.align_labels", f"--emb={emb}", f"--cdl={cdl}",
                                f"--classes={REPO / 'config/classes.csv'}", f"--out={labels}",
                                f"--report={work / 'labels.json'}"])  # fmt: skip
    out["shards"] = peak(["emb.prep.shards", f"--source={source}", "--region=r",
                          f"--emb={emb}", f"--labels={labels}", f"--index={index}",
                          "--tile-size=64", "--stride=64", "--block-m=1280"])  # fmt: skip
    manifest = work / f"manifest{source}{side}.json"
    subprocess.run([sys.executable, "-m", "emb.prep.manifest", f"--out={manifest}", "--",
                    str(index)], check=True, capture_output=True)  # fmt: skip
    out["channel_stats"] = peak(["emb.prep.channel_stats", f"--manifest={manifest}",
                                 "--n-tiles=500", "--threads=2",
                                 f"--out-dir={work / f'stats{source}{side}'}"])  # fmt: skip
    for path in (emb, cdl, labels, index.parent):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return out


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """``a, b`` of the least-squares line peak = a + b * megapixels (b = 0 for one point)."""
    x, y = np.array(points).T
    if len(set(x)) < 2:
        return float(y.max()), 0.0
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--tessera-sides", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="emb-mem-", dir=args.workdir) as tmp:
        for source, sides in (("aef", args.sides), ("tessera", args.tessera_sides)):
            for side in sides:
                for stage, (mib, seconds) in measure(Path(tmp), source, side).items():
                    rows.append(dict(stage=stage, source=source, side=side,
                                     mpx=side * side / 1e6, peak_mib=round(mib, 1),
                                     seconds=round(seconds, 2)))  # fmt: skip
                    print(f"{stage:14s} {source:8s} {side:6d} {side * side / 1e6:8.2f} Mpx "
                          f"{mib:8.1f} MiB {seconds:7.2f} s", flush=True)  # fmt: skip
    fits = {}
    for stage in ("align_labels", "shards", "channel_stats"):
        for source in BANDS:
            mine = [r for r in rows if r["stage"] == stage and r["source"] == source]
            a, b = fit([(r["mpx"], r["peak_mib"]) for r in mine])
            worst = max(r["peak_mib"] * 1.048576 / mem_mb(stage, r["mpx"] * 1e6, source)
                        for r in mine)  # fmt: skip
            fits[f"{stage}_{source}"] = dict(a_mib=round(a, 1), b_mib_per_mpx=round(b, 3),
                                             peak_over_request=round(worst, 3))  # fmt: skip
            print(f"{stage:14s} {source:8s} peak = {a:7.1f} + {b:6.3f} * Mpx MiB; "
                  f"largest peak / request {worst:.3f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "fits": fits}, indent=2) + "\n")


if __name__ == "__main__":
    main()
