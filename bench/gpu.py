"""GPU bench (issue 31 item 4): what emb's training and prediction reach on one GPU.

Three parts, each in a module of its own:

- (a) ``steps`` (bench/gpu_steps.py): ``Trainer.train_step`` against a bare bf16 loop for the
  four standard runs at their recipe batch, eager / channels_last / ``torch.compile``: ms,
  samples/s, TFLOP/s, share of the device's peak, peak memory, a sync-free check.
- (b) ``loop`` (bench/gpu_loop.py): the real training module through the launcher, as the
  ``train`` rule starts it, on synthetic full-size shards written directly (256 px, AEF 64
  bands, TESSERA 128), 240 steps: the loop's own samples/s and data-wait share from its log,
  and its samples/s over the fastest bare step of (a) for the same run.
- (c) ``predict`` (bench/gpu_predict.py): ``predict`` megapixels/s on one GPU, the rule's job
  form, with the checkpoint of an AEF run of (b).

``--quick`` (the GPU window's check: under 6 minutes on one H100, so a 15-minute window holds it
twice): all three parts, the four runs in (a) with the trainer's ``torch.compile`` row, one run
(aef_segformer, 120 steps) in (b), a 4096 px map in (c).

Without a GPU it says so and exits 0; ``--device cpu --tiny`` runs every part with tiny models,
32 px tiles and a few steps (the CI test, tests/bench/test_gpu_bench.py). Usage:
``python bench/gpu.py [--device cuda|cpu] [--tiny] [--quick] [--parts steps loop predict]
[--blocks N] [--peak TFLOPS] [--loop-runs RUN ...] [--predict-size S] [--json PATH] [--workdir DIR]
[--keep]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from gpu_loop import RUNS, TINY, LoopSpec, bench_loop, of_bare, print_loop
from gpu_predict import bench_predict, print_predict

PARTS = ("steps", "loop", "predict")  # (a), (b), (c)


def loop_spec(args: argparse.Namespace) -> LoopSpec:
    """Part (b)'s shards and run length: full size, or tiny for CI."""
    cpu = args.device == "cpu"
    if args.tiny:
        return LoopSpec(32, 48, 8, 4, 8, 12, 4, args.loop_threads, cpu, TINY)
    steps = args.loop_steps
    return LoopSpec(256, args.loop_tiles, 64, 16, 64, steps, steps // 6, args.loop_threads, cpu)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models, 32 px, few steps")
    parser.add_argument("--quick", action="store_true", help="every part, short: < 6 min")
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS),
        help="(a) steps, (b) loop, (c) predict (which maps with an AEF run of (b))",
    )  # fmt: skip
    parser.add_argument("--blocks", type=int, default=5, help="interleaved blocks per contender")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--peak", type=float, help="the device's dense bf16 TFLOP/s")
    parser.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=list(RUNS))
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument(
        "--loop-runs", nargs="+", choices=sorted(RUNS), default=["aef_segformer", "tessera_deeplab"]
    )
    parser.add_argument("--loop-steps", type=int, default=240, help="optimizer steps per run")
    parser.add_argument("--loop-tiles", type=int, default=1024, help="training tiles a source")
    parser.add_argument("--loop-threads", type=int, default=1, help="config launch.threads")
    parser.add_argument("--predict-size", type=int, default=4096, help="the region's side, px")
    parser.add_argument("--json", type=Path, help="write every row as JSON")
    parser.add_argument("--workdir", type=Path, help="where shards, runs and maps go (a temp)")
    parser.add_argument("--keep", action="store_true", help="keep them")
    args = parser.parse_args(argv)
    if args.quick:  # fewer blocks and steps, one run in (b), as the GPU window allows
        args.blocks, args.steps = min(args.blocks, 3), min(args.steps, 5)
        args.loop_runs, args.loop_steps = ["aef_segformer"], min(args.loop_steps, 120)
        args.loop_tiles = min(args.loop_tiles, 512)
    aef_run = "loop" in args.parts and any(r.startswith("aef") for r in args.loop_runs)
    if "predict" in args.parts and not aef_run:
        parser.error(
            "--parts predict maps with an AEF run of part (b): expected loop in --parts and an "
            f"aef_* run in --loop-runs, found parts {args.parts}, loop runs {args.loop_runs}"
        )
    if args.loop_steps < 12:
        parser.error(f"--loop-steps: expected at least 12 (6 windows), found {args.loop_steps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py: no GPU visible (torch.cuda.is_available() is False); nothing run")
        return 0
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (not a GPU)"
    out: dict = {"device": name, "torch": torch.__version__, "tiny": args.tiny}
    if "steps" in args.parts:  # imported here: only (a) uses emb's Trainer itself
        from gpu_steps import bench_run, print_steps  # noqa: PLC0415

        out["steps"] = [row for run in args.runs for row in bench_run(run, args, device)]
        if device.type == "cuda":  # the training and predict jobs get the whole GPU
            torch.cuda.empty_cache()
    root = Path(tempfile.mkdtemp(prefix="emb-gpu-", dir=args.workdir)).resolve()
    try:
        if "loop" in args.parts:
            spec = loop_spec(args)
            out["loop"], out["loop_shards_write_s"] = bench_loop(args.loop_runs, root, spec)
            of_bare(out["loop"], out.get("steps", []))
        if "predict" in args.parts:
            run = next(r for r in out["loop"] if r["run"].startswith("aef"))
            size = 128 if args.tiny else args.predict_size
            out["predict"] = bench_predict(Path(run["run_dir"]), root, size, args.device == "cpu")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"device: {name}; torch {torch.__version__}")
    if "steps" in out:
        print_steps(out["steps"])  # noqa: F821 - imported with part (a)
    if "loop" in out:
        print_loop(out["loop"])
    if "predict" in out:
        print_predict(out["predict"])
    if args.keep:
        print(f"shards, runs, maps and logs kept in {root}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
