"""Cluster dry-run benchmark: how many SLURM jobs a big region table becomes, and how the time
to plan them grows with the table.

For each size (default 100 and 1,000 regions of tiny distinct rasters, as
``tests/cluster/test_scale_dry_run.py`` builds them) and each profile (lumi, betzy), runs
``snakemake -n --profile profiles/<cluster> --config regions=...`` on a machine without SLURM,
alternating the sizes so both see the same machine, and keeps each one's best time.

- slurm_jobs_{cluster}_{n}: "Group job" entries plus jobs of rules neither grouped nor local
  (goal for 1,000 regions x 4 runs: <= 100).
- dry_run_s_{cluster}_{n}: seconds of the whole dry run (goal for 1,000: < 20 s). 2026-11-28,
  this shared 2-core machine, --repeats 1: lumi 25.0 -> 22.3 s, betzy 28.8 -> 22.5 s once the
  regions check read its rasters in threads (each opened once) and the resource functions
  became lookups (issue 52; the bench's CPU time 69 -> 56 s). 2026-12-06 (issue 58), the same
  machine under a load of 4-9, so CPU seconds of the snakemake process, before/after
  alternated: the parse alone (``--list-rules``, 1,000 regions, lumi; median of 3) 22.1 ->
  19.1 s once YAML went through libyaml and the footprints were reprojected one CRS at a time;
  whole dry runs, two alternated rounds: lumi 100: 9.8 -> 9.2, 14.6 -> 14.6; lumi 1,000:
  34.0 -> 41.5, 59.9 -> 59.2; betzy 100: 12.4 -> 11.6, 12.7 -> 11.8; betzy 1,000: 50.3 ->
  43.7, 49.0 -> 40.2 s: the load's noise is larger than the change (~1 s). Where a
  1,000-region dry run goes (pyinstrument, lumi): the parse 30% (the regions check 15%, of
  it reading 3,000 rasters in threads 8%; torch and matplotlib imported through
  emb.evaluation.windows 8%; the 8 train-config resolutions 4%), Snakemake building the DAG
  26% (input functions, params, needrun), its ready check of group jobs 7% (quadratic in a
  group's 100 members), printing the jobs 27% (resources evaluated per job, each callable's
  ``inspect.signature`` 8% over the run, the profile's string resources ``eval``-ed per job;
  the log handler's flush per line 8%). At 100 regions the fixed cost: the windows import
  25%, the train-config resolutions 14%, Snakemake's imports 11%, the regions table's
  row-by-row validation 8%. 2026-12-07 (issue 58 item 6; load 6-11, a full suite running):
  a 1,000-region lumi dry run under cProfile (CPU clock, 266 s profiled): printing the job
  list 29% (each job's resources evaluated 14%, its shell command formatted three times 7%,
  file lists 4%, logging 2%), building the DAG 30%, the group jobs' ready check 17% (inside
  both: quadratic in a group's 100 members, each member's computed twice per pass, once for a
  debug f-string), ``inspect.signature`` 9%: all Snakemake's. Ours: the parse 13% (the
  regions check 8%, a realpath per raster 2% of it; the 8 train-config resolutions 2%; the
  table's validation 1%). The regions check now knows a file by its reader's stat and reads
  its rows as dicts; a memo of Snakemake's signature lookups (a patch of three of its modules)
  cut lumi 1,000's CPU seconds to ~0.86 of main's and was left out: it patches Snakemake's
  internals for ~14%, and the goal needs ~50%. Without it: 45.0, 40.8 CPU s against main's
  40.9-46.1 (noise). Under 20 s for 1,000 regions needs Snakemake's per-job costs cut, not
  ours. 2026-12-07, later (issue 58 item 6, round 2; load 9-15, a test suite running; CPU s,
  this tree / main's, one alternated run each): lumi 100: 7.56 / 8.03 (0.94), lumi 1,000:
  40.0 / 47.1 (0.85), betzy 100: 7.38 / 8.06 (0.92), betzy 1,000: 49.5 / 50.5 (0.98); wall
  ratios 1.31, 0.95, 0.90, 1.02 (the load's); once more at a load of 2-3 (one workflow test
  running), CPU then wall: lumi 1,000 44.0 / 50.1 (0.88), 58.8 / 60.6 s; betzy 1,000 35.4 /
  42.1 (0.84), 38.2 / 47.6 s (0.80); lumi 100 6.64 / 6.56 (1.01), 6.71 / 6.73 s. Changed:
  the per-region rules take the profile's account and partition as plain values (a
  profile's string resource is ``eval``-ed per job; 2 of the 6 resources evaluated per job),
  their functions carry their parameters
  (emb.workflow.signatures: ~10 of a job's 27 ``inspect.signature`` calls; alone ~0.93 of
  main's CPU in two rounds), the region wildcard is the schema's id pattern, not 1,000 names
  joined (alone within the noise, ~0.98), and each run's config is resolved once while
  parsing, not twice (4 schema validations at any size). Measured, not changed (lumi 1,000,
  two alternated rounds against main's 48.2 and 45.4 CPU s): ``group-components`` prep 25
  instead of 50: 40.3, 43.3 (~0.91; the ready check is quadratic in a group's members) for 99
  SLURM jobs instead of 59, at the goal's 100; one job doing align_labels and shards of a
  (source, region) (2,000 jobs fewer; a prototype): 37.2, 34.0 (~0.76). Left alone: the
  shards command's 20 fields (a changed shell command or params reruns every shards job and
  all after it: Snakemake's code and params triggers) and printshellcmds (Snakemake formats
  each job's command three times whether it prints it or not). 2026-12-07, round 3 (issue 58
  item 6; load 7-9, three helpers and a test suite running): rules align_labels and shards
  merged into one rule shards (one job per (source, region) runs both stages). A 1,000-region
  x 4-run DAG: 4,034 jobs (align_labels 2,000, shards 2,000, 34 others) -> 2,034; SLURM jobs
  59 either way (40 prep groups of 50 shards jobs, was of 50 pairs). ``--sizes 100 1000
  --repeats 1 --baseline`` main, this tree / main's, CPU s then wall s: lumi 100: 5.31 / 6.25
  (0.85), 12.99 / 11.39 (1.14); lumi 1,000: 21.64 / 32.28 (0.67), 60.83 / 99.08 (0.61); betzy
  100: 4.97 / 6.29 (0.79), 14.52 / 11.82 (1.23); betzy 1,000: 21.25 / 29.99 (0.71), 45.54 /
  78.24 (0.58); growth 4.7 / 8.7 (lumi), 3.1 / 6.6 (betzy). From main's ~23 s quiet, ~0.7 of
  it is ~16 s for 1,000 regions: under the 20 s goal (estimated; no quiet machine to measure
  on). The widest prep group asks for 50 cores, ~28,000 MB and 20 min as before (each member
  the larger of the two stages' memory and both their times; the group's two layers of 50
  summed the same). Measured quiet the same day (load ~1, this tree alone, ``--sizes 100 1000
  --repeats 1``, twice): lumi 100 5.09 s, 1,000 19.31 s (CPU 20.1 s); betzy 100 4.84, 5.59 s,
  1,000 20.33, 21.39 s (CPU 21.1, 22.2 s): at the 20 s goal, not under it with room. Of a
  1,000-region dry run the regions check takes ~8 s (``region_checks.check_regions``: 3,000
  rasters, ~1 ms a rasterio open of a 128-band TESSERA file, ~0.5 ms its first one-pixel
  read, in 4 reader threads: 7.8-9.5 s with 2, 4 or 8 of them), the next thing to look at.
  2026-12-07, round 4 (issue 58 item 6; load 1-5, other helpers running): the regions check.
  Per row of 3 rasters, one after another (perf, cProfile): 3 opens ~3 ms (half of each open
  GDAL building the GeoTIFF's CRS, rasterio holding the GIL), the first pixel's read() ~1.4 ms
  (it looks up every band's mask flags first: 128 of them for TESSERA), the grid checks ~0.8
  ms, the labels check ~0.4 ms per source. Changed: the first pixel read as its checksum (0.02
  ms, catches the same unreadable data), the labels checked once per row where both sources
  share an extent, a CRS's name looked up once per CRS, and from 200 rows on the rows read in
  forked processes (emb.workflow.forked_reads, one per core up to 4: 4 threads ran ~1 core).
  The check inside a 1,000-region lumi dry run (timed in the snakemake process, alternated
  with e06da81's, load 1.4-2.7): wall 10.62, 10.99 -> 4.19, 3.41 s, CPU (workers too) 11.42,
  11.85 -> 7.51, 6.00 s; the whole dry run 26.27, 25.29 -> 18.63, 19.92 s. ``--sizes 100 1000
  --repeats 1 --baseline`` e06da81, this tree / e06da81's, wall then CPU s (load 2-3): lumi
  100 4.55 / 4.62, 4.46 / 4.49; lumi 1,000 18.12 / 19.00 (0.95), 17.69 / 18.68; betzy 100
  4.68 / 5.43, 4.59 / 5.37; betzy 1,000 18.92 / 21.62 (0.87), 20.02 / 21.88 (0.91); again
  at load ~1: lumi 100 5.40 / 6.49, 5.57 / 6.68; lumi 1,000 18.18 / 24.77 (0.73), 21.86 /
  25.72 (0.85); betzy 100 5.67 / 5.40, 5.82 / 5.56; betzy 1,000 22.46 / 28.15 (0.80), 25.94 /
  29.12 (0.89). Then the parse without numba (its compiler came in through
  emb.workflow.samples -> sample_files -> design -> strata_scan, ~0.4-0.7 s). Measured quiet
  the same day (load 0.5-1, nothing else running), ``--sizes 100 1000 --repeats 1 --baseline``
  e06da81, this tree / e06da81's, wall then CPU s: lumi 100 6.04 / 6.67, 6.18 / 6.78; lumi
  1,000 **19.26** / 26.03 (0.74), 22.74 / 26.88 (0.85); betzy 100 5.99 / 5.61, 6.17 / 5.78;
  betzy 1,000 **17.80** / 25.86 (0.69), 20.85 / 26.83 (0.78); growth 3.2 / 3.9 (lumi), 3.0 /
  4.6 (betzy). Under the 20 s goal; the machine was slower that hour than the day's first
  quiet runs (e06da81's 1,000 regions 26 s against 19.3-21.4 s the morning).
- growth_{cluster}: time for the large table / time for the small one; ~10 for 10x the
  regions is linear, more means something quadratic in the DAG is back.
- group_{cluster}_{n}: the widest group job as Snakemake submits it (its side-by-side members
  summed, ``tests/cluster/listed_groups.py``) next to a node of its partition as the profile
  states it: cores, MB and minutes asked / the node's (each must be <= 1).

- cpu_s_{cluster}_{n}: CPU seconds of the dry run's processes (user + system): steadier than
  wall time on a loaded machine.
- with ``--baseline CHECKOUT`` (another checkout, e.g. main's): the same dry runs of its
  Snakefile, profiles and src, each run of this tree's right after the baseline's (both see
  the same minute), and ``ratio_{cluster}_{n}``: this tree's best / the baseline's, wall and CPU.

Usage: ``python bench/dry_run.py [--sizes 100 1000] [--repeats 2] [--baseline DIR] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "cluster")]  # the tests' table builder

from listed_groups import group_requests  # noqa: E402
from test_profiles import cluster_env  # noqa: E402
from test_scale_dry_run import many_regions, submitted  # noqa: E402

CLUSTERS = ("lumi", "betzy")


def widest_group(stdout: str) -> dict[str, object]:
    """The widest listed group's request and the ratios to its node (<= 1: it fits)."""
    name, request, node = max(group_requests(stdout), key=lambda g: (g[1].cores, g[1].mem_mb))
    return {
        "group": name,
        "partition": node.partition,
        "asked": f"{request.cores} cores, {request.mem_mb} MB, {request.runtime} min",
        "node": f"{node.cores} cores, {node.mem_mb} MB, {node.max_runtime} min",
        "cores_ratio": round(request.cores / node.cores, 3),
        "mem_ratio": round(request.mem_mb / node.mem_mb, 3),
        "runtime_ratio": round(request.runtime / node.max_runtime, 3) if node.max_runtime else 0,
    }


def dry_run(tree: Path, work: Path, cluster: str, table: Path) -> tuple[str, float, float]:
    """The tests' cluster dry run (tests/cluster/test_profiles.dry_run) of ``tree``'s Snakefile,
    profile and src: its listing, wall and CPU seconds."""
    work.mkdir()
    shutil.copytree(tree / "config", work / "config")
    env = {**cluster_env(work), "PYTHONPATH": str(tree / "src")}  # that tree's code, not the venv's
    profile = tree / "profiles" / cluster
    cmd = ["snakemake", "-s", str(tree / "Snakefile"), "-d", str(work), "-n", "--profile",
           str(profile), "--cores", "64", "--config", f"regions={table}"]  # fmt: skip
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{tree}, {cluster}, {table}: {done.stderr[-3000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return done.stdout, wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--baseline", type=Path, help="another checkout, run alternately")
    args = parser.parse_args()
    trees = {"": REPO, **({"baseline_": args.baseline.resolve()} if args.baseline else {})}
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tables = {n: many_regions(root / f"inputs{n}", n) for n in args.sizes}
        for cluster in CLUSTERS:
            best = {(t, n, k): float("inf") for t in trees for n in args.sizes for k in "wc"}
            for repeat in range(args.repeats):
                for n, table in tables.items():
                    for tag, tree in reversed(trees.items()):  # the baseline first
                        work = root / f"{tag}{cluster}-{n}-{repeat}"
                        stdout, wall, cpu = dry_run(tree, work, cluster, table)
                        best[tag, n, "w"] = min(best[tag, n, "w"], wall)
                        best[tag, n, "c"] = min(best[tag, n, "c"], cpu)
                        results[f"{tag}slurm_jobs_{cluster}_{n}"] = sum(submitted(stdout).values())
                        if not tag:
                            results[f"group_{cluster}_{n}"] = widest_group(stdout)
            small, large = args.sizes
            for tag in trees:
                for n in args.sizes:
                    results[f"{tag}dry_run_s_{cluster}_{n}"] = round(best[tag, n, "w"], 2)
                    results[f"{tag}cpu_s_{cluster}_{n}"] = round(best[tag, n, "c"], 2)
                growth = best[tag, large, "w"] / best[tag, small, "w"]
                results[f"{tag}growth_{cluster}"] = round(growth, 2)
            if args.baseline:
                for n in args.sizes:
                    results[f"ratio_{cluster}_{n}"] = {
                        k: round(best["", n, x] / best["baseline_", n, x], 2)
                        for k, x in (("wall", "w"), ("cpu", "c"))
                    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
