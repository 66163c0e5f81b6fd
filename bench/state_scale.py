"""The area stages at the scale of a state (issue 58, item 5): the sample design and the test
split's check over 1,000 regions of 1024 x 1024 px maps (1.05 Gpx) and 100 districts, against
reading the maps once.

Writes a synthetic collection into a temporary folder: per region a class map (L3 ids, fields
of 32 px in 40 classes, 5% speckle, a nodata border; tiled GeoTIFF, 512 px blocks, DEFLATE, as
predict writes the full resolution of its COGs), its CDL labels (the map with a fifth of its fields
given another class, and an unlabelled border) and an ``index.json`` whose test tiles (64 px,
stride 64, as ``config/config.yaml``) cover ``--test-share`` of the region (default all of it:
the check's worst case, a test split of 1.05 Gpx, which the check before issue 58 held as
per-pixel arrays: about 20 GB). The regions lie side by side on a square grid (UTM 15N). To save
time, they share ``--distinct`` (4) rasters, copied under each region's name and placed at its
own corner (the georeferencing tags only); a region's files are opened, decoded and counted as
its own. The districts (``districts.geojson``) are as counties come: 100 of them, a 10 x 10
grid over the regions' extent whose edges cross regions (about 10 regions a district, a region
in one to four), each edge a vertex every 100 m, in WGS84, so each stage moves them onto the
maps' CRS and burns them.

Then, each in a fresh process (so one peak cannot hide another), timed from its first read
(imports and reading the districts file excluded) and its peak RSS measured by the parent of
that one process (``getrusage(RUSAGE_CHILDREN).ru_maxrss``, interpreter and imports included):

- read: every map read once, block by block (rasterio), the yardstick;
- check: as the stage runs it with ``area_estimates.districts`` set: the population per
  district (``holdout_counts.read_population(..., districts)``, map and labels), ``check``
  with ``--draws`` (200) draws, then ``district_check.check_districts`` with
  ``--district-draws`` (default ``--draws``; its draws are a fixed cost, ~1-4 s each, apart
  from the pixels: the report gives the population pass and each part of the draws);
- design: ``design.draw_points(..., districts)`` over every map (two streaming passes and a
  SHA-256 each; strata district x class, n raised to every stratum's minimum, as the check
  by district raises it: a sample of ~80,000 units at 1,000 regions, the second pass reading
  every strip). With ``EMB_STATE_SCALE_POINTS=PATH`` the drawn points are written there (to
  compare two trees' designs).

The files are fresh in the page cache for all three (hot reads). Goals: RSS < 2 GiB, design
and check each within 3x the read. ``--threads`` (default 2, as the rules declare) is the cores
the check and the design use: worker processes (:mod:`emb.forks`: the check's regions in shares,
then its draws by district in ranges; the design's maps in one share a worker through both
passes), on Linux; the read, the yardstick, stays one process. Each part's peak memory is given
as the largest process's RSS (``rss``) and as its process tree's, sampled (``tree_rss``: the
sum of RSS, pages a fork shares counted in each process, an upper bound; ``tree_pss``: shared
pages split), and its CPU time (user + system, the process and its workers) beside its wall
time.

MEASURED, 2026-12-07 evening, this 2-core machine (load ~1), 1,000 regions (1.05 Gpx, 100
districts, a sample of 80,800 units, 200 draws), three rounds alternated with the tree before
(3f6945a: a reader thread beside the counting), each tree its own read:

  round | read        | check (x read)      | design (x read)
        | 3f6945a/this| 3f6945a | this      | 3f6945a | this
  1     | 5.42 / 4.26 | 19.27   | 10.93 2.6 | 14.58   | 10.92 2.6
  2     | 4.43 / 4.28 | 18.31   | 10.53 2.5 | 16.35   | 10.74 2.5
  3     | 4.42 / 4.94 | 18.40   | 12.72 2.6 | 17.49   | 10.96 2.2

(seconds). The check: population pass 7.8-9.6 s against 13.7-15.0 s, draws by district 2.2-2.8
s against 3.8-4.4 s; CPU 21.2-25.3 s against 24.8-25.2 s. The design: CPU 21.3-22.3 s against
22.1-24.7 s. This tree is 0.57-0.69x the one before in the check, 0.63-0.75x in the design, and
within 2.2-2.6x the read; three more rounds an hour before (the same code): check 2.6-3.3x,
design 2.5-3.0x (the read 3.7-4.9 s: the yardstick moves the most). Memory: the largest process
385 / 328 MiB, the process tree 817-861 MiB (RSS summed) or 438-548 MiB (PSS), against 430-500
MiB in one process before.

History. 2026-12-06: check 51.0 s (per-pixel arrays gone, the draws by district 30.4 s), design
27.4 s, read 2.6 s. 2026-12-07 morning: the design's passes as compiled loops (numba,
:mod:`emb.estimation.strata_scan`), the check's census too (:mod:`emb.estimation.cell_census`):
check 23.0 s (7.4x), design 28.1 s (9.1x) in one thread; then a reader thread a few strips
ahead of the counting (burning the districts there): design 9.1-9.8 s (3.3x), check 11.1-11.3 s
(3.8x). Threads went no further: what holds the GIL (rasterio's opens, ~1.2 ms each, most of it
PROJ building a CRS; the district burns, 2.3-4.5 ms a region crossing a district edge) runs one
thread at a time, and two burns at once crashed once (GEOS preparing shared polygons). Measured
then: the collection's two halves as two 1-thread processes side by side took check 8.0-9.1 s,
design 6.7-6.9 s, against 14.3 / 10.1-10.6 s whole, which is the way taken since. What a
worker still spends, a map (profiled): an open ~1-2 ms (``GTIFF_SRS_SOURCE=GEOKEYS`` would save
~0.4 ms of it, not taken: it changes how a file's CRS is read), decoding ~1.7 ms, a burn ~3.5 ms
where a district edge crosses the map, the census or the pick ~2 ms; each process's first
compiled call ~0.6-0.9 s (numba's set-up, half of it importing scipy.linalg for its BLAS
check), made once before the fork.

The bench run whole the same hour (``python bench/state_scale.py``): read 4.79 s; check 12.28 s,
2.56x (population 9.47 s, by district 2.56 s); design 11.84 s, 2.47x; tree RSS 815 / 861 MiB.

Usage: ``python bench/state_scale.py [--regions 1000] [--size 1024] [--test-share 1.0]
[--draws 200] [--district-draws N] [--distinct 4] [--threads 2] [--json PATH] [--workdir DIR]
[--keep]``;
the default path in its smallest mode (tests/bench): ``--regions 4 --size 256 --draws 2``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import psutil
import rasterio
from rasterio.crs import CRS
from rasterio.transform import from_origin

if TYPE_CHECKING:
    from emb.estimation.districts import Districts

REPO = Path(__file__).resolve().parents[1]
CLASSES = REPO / "config" / "classes.csv"
FIELD, NOISE, WRONG = 32, 0.05, 0.2  # field side (px), speckle, share of fields the map errs on
CLASSES_USED = 40  # L3 ids 0..39: 40 strata x the minimum of 20 fit the default n of 1000
TILE = 64  # test tile side and stride (config/config.yaml: tiles)
DISTRICTS = 100  # a 10 x 10 grid over the regions, written in WGS84
EDGE_M = 100.0  # a district edge's vertices, every 100 m
X0, Y0, PIXEL_M = 300_000.0, 4_500_000.0, 10.0  # the first region's corner (UTM 15N), its pixel
POINTS_ENV = "EMB_STATE_SCALE_POINTS"  # a file for the design's points (compare trees)
GOALS = {"rss_mib": 2048.0, "ratio": 3.0}


def raster(path: Path, data: np.ndarray) -> None:
    """A uint8 GeoTIFF as predict writes a map's full resolution (512 px blocks, DEFLATE)."""
    block = min(512, max(16, data.shape[0] // 16 * 16))
    profile = {
        "driver": "GTiff", "width": data.shape[1], "height": data.shape[0], "count": 1,
        "dtype": "uint8", "crs": CRS.from_epsg(32615), "nodata": 255, "tiled": True,
        "transform": from_origin(X0, Y0, PIXEL_M, PIXEL_M), "compress": "deflate",
        "blockxsize": block, "blockysize": block,
    }  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data, 1)


def scene(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(map, labels) of one region: fields of L3 classes, errors by whole fields, speckle."""
    rng = np.random.default_rng(seed)
    fields = -(-size // FIELD)
    grow = np.ones((FIELD, FIELD), np.uint8)
    truth = np.kron(rng.integers(0, CLASSES_USED, (fields, fields), dtype=np.uint8), grow)[
        :size, :size
    ]
    wrong = np.kron(rng.random((fields, fields)) < WRONG, grow)[:size, :size].astype(bool)
    other = np.kron(rng.integers(0, CLASSES_USED, (fields, fields), dtype=np.uint8), grow)[
        :size, :size
    ]
    mapped = np.where(wrong, other, truth)
    speckle = rng.random((size, size)) < NOISE
    mapped = np.where(speckle, rng.integers(0, CLASSES_USED, (size, size), dtype=np.uint8), mapped)
    border = max(1, size // 32)
    mapped[:border], truth[:, :border] = 255, 255  # the map's nodata, the CDL's unlabelled
    return mapped.astype(np.uint8), truth.astype(np.uint8)


def write_collection(root: Path, regions: int, size: int, share: float, distinct: int) -> dict:
    """Maps, labels and indexes of ``regions`` regions side by side on a grid (``distinct``
    rasters, copied and placed), and the districts over them."""
    rng = np.random.default_rng(0)
    (root / "distinct").mkdir(parents=True)
    for d in range(min(distinct, regions)):
        mapped, labels = scene(size, d)
        raster(root / "distinct" / f"map{d}.tif", mapped)
        raster(root / "distinct" / f"labels{d}.tif", labels)
    files: dict[str, dict[str, str]] = {"maps": {}, "labels": {}, "indexes": {}}
    grid = [(r, c) for r in range(0, size, TILE) for c in range(0, size, TILE)]
    columns, span = math.ceil(math.sqrt(regions)), size * PIXEL_M
    for i in range(regions):
        region, d = f"r{i:04d}", i % distinct
        folder = root / region
        folder.mkdir()
        origin = from_origin(X0 + i % columns * span, Y0 - i // columns * span, PIXEL_M, PIXEL_M)
        for kind, name in (("maps", f"{region}.tif"), ("labels", "labels.tif")):
            source = root / "distinct" / f"{'map' if kind == 'maps' else 'labels'}{d}.tif"
            shutil.copyfile(source, folder / name)
            with rasterio.open(folder / name, "r+") as dst:
                dst.transform = origin  # the region's own place (tags only: data untouched)
            files[kind][region] = str(folder / name)
        test = [grid[j] for j in np.flatnonzero(rng.random(len(grid)) < share)] or grid[:1]
        index = {"region": region, "tile_size": TILE,
                 "splits": {"test": {"blocks": {f"{region}_{r}_{c}": f"{region}:{r},{c}"
                                                for r, c in test}}}}  # fmt: skip
        (folder / "index.json").write_text(json.dumps(index))
        files["indexes"][region] = str(folder / "index.json")
    rows = -(-regions // columns)
    write_districts(root / "districts.geojson", (X0, Y0 - rows * span, X0 + columns * span, Y0))
    (root / "files.json").write_text(json.dumps(files))
    return files


def write_districts(path: Path, bounds: tuple[float, float, float, float]) -> None:
    """``DISTRICTS`` districts as counties come: a 10 x 10 grid of rectangles over the
    regions' extent (so their edges cross regions, about 10 regions a district), each edge cut
    every ``EDGE_M`` (a surveyed border's vertices), in WGS84 (moved onto the maps' UTM)."""
    import shapely  # noqa: PLC0415 - the districts' one use
    from pyproj import Transformer  # noqa: PLC0415

    side = math.isqrt(DISTRICTS)
    xs = np.linspace(bounds[0], bounds[2], side + 1)
    ys = np.linspace(bounds[3], bounds[1], side + 1)
    to_wgs84 = Transformer.from_crs(32615, 4326, always_xy=True)
    features = []
    for j in range(DISTRICTS):
        box = shapely.box(xs[j % side], ys[j // side + 1], xs[j % side + 1], ys[j // side])
        ring = shapely.get_coordinates(shapely.segmentize(box, EDGE_M))
        lon, lat = to_wgs84.transform(ring[:, 0], ring[:, 1])
        ring = np.column_stack([lon, lat]).tolist()
        features.append({"type": "Feature", "properties": {"name": f"d{j:03d}"},
                         "geometry": {"type": "Polygon", "coordinates": [ring]}})  # fmt: skip
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))


# --- the contenders, each in a child process (``--child NAME FILES DRAWS``) ---------------


def child_read(files: dict, draws: int, district_draws: int, threads: int) -> dict:
    """Every map read once, block by block, in one thread (whatever ``--threads``): the
    yardstick."""
    start, pixels = time.perf_counter(), 0
    for path in files["maps"].values():
        with rasterio.open(path) as src:
            for _, win in src.block_windows(1):
                pixels += src.read(1, window=win).size
    return {"s": time.perf_counter() - start, "pixels": pixels}


def districts_of(files: dict) -> Districts:
    """The collection's districts (read as the stage reads them; their time not counted)."""
    from emb.estimation.districts import read_districts  # noqa: PLC0415

    return read_districts(Path(files["indexes"][next(iter(files["indexes"]))]).parents[1]
                          / "districts.geojson", "name")  # fmt: skip


def child_check(files: dict, draws: int, district_draws: int, threads: int) -> dict:
    """The test split's check as the stage runs it with districts: the population (per
    district), the whole's draws, then the districts' draws."""
    from emb.classes import load_class_map  # noqa: PLC0415 - imports are not the stage's time
    from emb.estimation.district_check import check_districts  # noqa: PLC0415
    from emb.estimation.holdout_check import check  # noqa: PLC0415
    from emb.estimation.holdout_counts import read_population  # noqa: PLC0415
    from emb.estimation.settings import from_json  # noqa: PLC0415

    cmap, settings = load_class_map(CLASSES), from_json(json.dumps({"draws": draws}))
    districts = districts_of(files)
    start = time.perf_counter()
    population = read_population(files["maps"], files["labels"], files["indexes"], districts,
                                 threads)  # fmt: skip
    read_s = time.perf_counter() - start
    checks = check(population, cmap, settings)
    whole_s = time.perf_counter() - start - read_s
    by_district = check_districts(population, cmap, replace(settings, draws=district_draws),
                                  int(settings.n), threads=threads)  # fmt: skip
    end = time.perf_counter()
    return {"s": end - start, "population_s": read_s, "draws_s": whole_s,
            "district_draws_s": end - start - read_s - whole_s, "district_draws": district_draws,
            "test_px": population.pixels,
            "levels": len(checks), "domains": len(by_district.domains)}  # fmt: skip


def child_design(files: dict, draws: int, district_draws: int, threads: int) -> dict:
    """The sample design over every map with districts (strata district x class), with the
    schema's settings."""
    from emb.classes import load_class_map  # noqa: PLC0415
    from emb.estimation.design import draw_points  # noqa: PLC0415
    from emb.estimation.settings import from_json  # noqa: PLC0415

    cmap, settings = load_class_map(CLASSES), from_json("{}")
    districts = districts_of(files)
    maps = [Path(p) for p in files["maps"].values()]
    # n: every district x class stratum's minimum at least (the check by district raises n
    # so too; the schema's n of 1000 is below 100 x 40 minimums, which the design refuses)
    n = max(int(settings.n), (DISTRICTS + 1) * CLASSES_USED * settings.min_per_class)
    start = time.perf_counter()
    design = draw_points(maps, settings.level, cmap, n, settings.min_per_class, settings.seed,
                         districts=districts, threads=threads)  # fmt: skip
    out = {"s": time.perf_counter() - start, "units": int(design.record.n_drawn)}
    if os.environ.get(POINTS_ENV):  # the drawn points, to compare two trees' designs
        Path(os.environ[POINTS_ENV]).write_text(json.dumps(
            {"x": design.points.x.tolist(), "y": design.points.y.tolist(),
             "region": design.points.region.tolist(), "district": design.district.tolist(),
             "class": design.map_class.tolist()}))  # fmt: skip
    return out


CHILDREN = {"read": child_read, "check": child_check, "design": child_design}


def measure(name: str, files_json: Path, draws: int, district_draws: int, threads: int) -> dict:
    """One contender in a fresh process: its own figures, its wall time from start to exit,
    its peak RSS as one process (the only child this process has waited for, so
    RUSAGE_CHILDREN is its, or its largest worker's) and the peak of its whole process tree's
    (itself and its worker processes), sampled (:func:`sample_tree`): the sum of their RSS
    (pages a fork shares counted once a process: an upper bound) and of their PSS (shared
    pages split)."""
    cmd = [sys.executable, __file__, "--child", name, str(files_json), str(draws),
           str(district_draws), str(threads)]  # fmt: skip
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = {"rss": 0, "pss": 0}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_tree, args=(child.pid, peaks, stop))
    sampler.start()
    out, err = child.communicate()
    stop.set()
    sampler.join()
    if child.returncode:
        raise SystemExit(f"{name}: exit {child.returncode}\n{err[-3000:]}")
    figures = json.loads(out.strip().splitlines()[-1])
    figures["wall_s"] = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures["rss_mib"] = usage.ru_maxrss / 1024
    figures["tree_rss_mib"] = peaks["rss"] / 2**20
    figures["tree_pss_mib"] = peaks["pss"] / 2**20 if peaks["pss"] else math.nan  # unsampled
    figures["cpu_s"] = usage.ru_utime + usage.ru_stime  # the process's, imports included
    return figures


def sample_tree(pid: int, peaks: dict, stop: threading.Event) -> None:
    """Keep in ``peaks`` the largest sums of RSS (every 50 ms: /proc's statm, cheap) and of
    PSS (every 0.5 s: smaps_rollup walks the page tables, a few ms a process, on the cores the
    contender runs on) of the process ``pid`` and its descendants seen, until ``stop``."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    tick = 0
    while not stop.wait(0.05):
        tick += 1
        full, rss, pss = tick % 10 == 1, 0, 0  # the first sample full too: a short part
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in tree:
            try:
                info = process.memory_full_info() if full else process.memory_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            rss, pss = rss + info.rss, pss + getattr(info, "pss", 0)
        peaks["rss"] = max(peaks["rss"], rss)
        if full:
            peaks["pss"] = max(peaks["pss"], pss)


def run(work: Path, args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    write_collection(work, args.regions, args.size, args.test_share, args.distinct)
    figures: dict = {"regions": args.regions, "size": args.size, "test_share": args.test_share,
                     "gpx": args.regions * args.size**2 / 1e9, "draws": args.draws,
                     "threads": args.threads,
                     "generate_s": time.perf_counter() - start}  # fmt: skip
    district_draws = args.draws if args.district_draws is None else args.district_draws
    for name in CHILDREN:  # each measured by a process of its own (a fresh RUSAGE_CHILDREN)
        cmd = [sys.executable, __file__, "--measure", name, str(work / "files.json"),
               str(args.draws), str(district_draws), str(args.threads)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
        figures[name] = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("check", "design"):
        figures[name]["ratio"] = figures[name]["s"] / figures["read"]["s"]
    return figures


def report(figures: dict) -> None:
    print(f"{figures['regions']} regions of {figures['size']} px ({figures['gpx']:.3f} Gpx), "
          f"test share {figures['test_share']:g}, {figures['draws']} draws, "
          f"{figures['threads']} thread(s) (the read: one); generated in "
          f"{figures['generate_s']:.1f} s")  # fmt: skip
    print(
        f"{'part':8s} {'s':>8s} {'wall_s':>8s} {'cpu_s':>8s} {'rss_mib':>8s} {'tree_rss':>8s} "
        f"{'tree_pss':>8s} {'x read':>7s}  goals"
    )
    for name in CHILDREN:
        f = figures[name]
        ratio = f.get("ratio")
        met = (
            ""
            if ratio is None
            else (f"x read < {GOALS['ratio']:g}: {'met' if ratio < GOALS['ratio'] else 'MISSED'}; ")
        )
        met += (
            f"tree rss < {GOALS['rss_mib']:g}: "
            f"{'met' if f['tree_rss_mib'] < GOALS['rss_mib'] else 'MISSED'}"
        )
        shown = "" if ratio is None else f"{ratio:7.2f}"
        print(f"{name:8s} {f['s']:8.2f} {f['wall_s']:8.2f} {f['cpu_s']:8.2f} {f['rss_mib']:8.1f} "
              f"{f['tree_rss_mib']:8.1f} {f['tree_pss_mib']:8.1f} {shown:>7s}  {met}")  # fmt: skip
    check = figures["check"]
    print(
        f"check: population {check['population_s']:.2f} s ({check['test_px']} test px, "
        f"{DISTRICTS} districts), {figures['draws']} draws {check['draws_s']:.2f} s, by "
        f"district ({check['district_draws']} draws) {check['district_draws_s']:.2f} s "
        f"({check['domains']} domains)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regions", type=int, default=1000)
    parser.add_argument("--size", type=int, default=1024, help="pixels per side of a region")
    parser.add_argument("--test-share", type=float, default=1.0,
                        help="share of a region's tiles in the test split")  # fmt: skip
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--distinct", type=int, default=4, help="distinct rasters, hard-linked")
    parser.add_argument("--json", type=Path, help="write all figures as one JSON object")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--district-draws", type=int, default=None,
                        help="the check by district's draws (default: --draws)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2,
                        help="cores of the check and the design: worker processes (2: 0.6-0.75x "
                        "the wall time of one process on 2 free cores, 2026-12-07); the read "
                        "stays in one")  # fmt: skip
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child or args.measure:
        name, files_json, draws, district_draws, threads = args.child or args.measure
        numbers = int(draws), int(district_draws), int(threads)
        if args.measure:
            print(json.dumps(measure(name, Path(files_json), *numbers)))
        else:
            files = json.loads(Path(files_json).read_text())
            print(json.dumps(CHILDREN[name](files, *numbers)))
        return
    work = Path(tempfile.mkdtemp(prefix="emb-state-", dir=args.workdir))
    try:
        figures = run(work, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
