"""Stage: train one run, as ``torchrun [...] -m emb.training.train --config RUN_DIR/config.yaml``.

The glue around :func:`emb.training.loop.run`: torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE), the job's deadline (``SLURM_JOB_END_TIME``, which the launcher sets, or
``train.time_limit_s``), the SIGUSR1/SIGTERM flag and exit codes. Rank 0 alone writes
``history.csv``, TensorBoard logs and checkpoints; every rank writes ``ranks/rank{r}.json``
(shards read, batches per epoch, a digest of its parameters) so tests can check DDP from the
outside. The declared output ``train.json`` is written last, and only beside ``best.pt``; a
validation split no rank can score is refused before anything starts.

Exit codes (:mod:`emb.stage_runner`): 0 done; 2 bad input or config; 3 diverged; 66 an input
missing; 73 an output not writable; 74 disk full (the previous checkpoint
is intact); 75 stopped early with a checkpoint (signal or deadline): running the job again
resumes. Collectives time out after ``train.collective_timeout_s``, so a lost rank fails the
job instead of hanging it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from emb import stage_runner
from emb.io import is_disk_full, write_json
from emb.models.runtime import Host, Runtime
from emb.training.loop import Stopped, read_checked_manifest, run
from emb.training.run_config import ConfigError, TrainConfig, load
from emb.training.run_start import SUMMARY_COPY
from emb.training.stop_request import EXIT_STOPPED, StopRequest
from emb.training.trainer import TrainingDiverged

EXIT_CONFIG, EXIT_DIVERGED, EXIT_DISK_FULL = 2, 3, 74  # 74: EX_IOERR
log = logging.getLogger(__name__)


class NotValidated(ValueError):
    """Training ended without a validated checkpoint (``best.pt``): nothing to evaluate."""


def job_deadline(cfg: TrainConfig, env: dict[str, str], started: float) -> float | None:
    """The earlier of the job's end and ``train.time_limit_s`` after ``started``.

    The job's end comes in ``SLURM_JOB_END_TIME`` (Unix seconds): set by SLURM itself, or by
    the launcher (:func:`emb.cluster.launch.prepare` asks ``squeue`` once per job, outside the
    container); training never asks SLURM."""
    candidates = []
    if env.get("SLURM_JOB_END_TIME", "").isdigit():
        candidates.append(float(env["SLURM_JOB_END_TIME"]))
    if cfg.train.time_limit_s:
        candidates.append(started + cfg.train.time_limit_s)
    return min(candidates) if candidates else None


def train(config: Path, env: dict[str, str], started: float, stop: StopRequest) -> None:
    """Resolve the process's runtime, set up the process group, then train; raises on every
    failure."""
    rank, world = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    cfg = load(config)
    runtime = Runtime.resolve(cfg.train, cfg.model.arch, Host.here(env), training=True)
    runtime.occupy()
    # before the process group and before anything is set aside: a validation split that no
    # rank can score is refused now, not found after training (a run that never validated)
    read_checked_manifest(cfg, world)
    if world > 1:
        dist.init_process_group(
            "nccl" if runtime.device.type == "cuda" else "gloo",
            timeout=timedelta(seconds=cfg.train.collective_timeout_s),
        )
    stop.deadline, stop.margin_s = job_deadline(cfg, env, started), cfg.train.stop_margin_s
    summary = run(cfg, config.parent, rank, world, runtime, stop)
    if rank == 0:
        write_summary(config.parent, summary)


def write_summary(run_dir: Path, summary: dict) -> None:
    """``train.json``, written only beside the ``best.pt`` evaluate reads (else a run that
    never validated would look finished), and its copy ``ranks/train.json`` first: Snakemake
    deletes the declared ``train.json`` before a rerun starts, and the copy is what
    :func:`emb.training.run_start.set_aside` keeps of it in ``previous/``."""
    best = run_dir / "best.pt"
    if not best.is_file():
        raise NotValidated(
            f"{run_dir}: training ended at optimizer step {summary['steps']} without {best.name} "
            f"(best val_miou_l3 {summary['best_val_miou_l3']}: no validation gave a score to "
            f"keep; see {run_dir / 'history.csv'}); {run_dir / 'train.json'} is not written, "
            "so evaluate does not start on a run with no model"
        )
    write_json(run_dir / SUMMARY_COPY, summary)
    write_json(run_dir / "train.json", summary)


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="resolved run config.yaml")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    code = 0
    stop = StopRequest()
    stop.install()  # before the process group: a signal during set-up is not lost
    try:
        train(args.config, env, started, stop)
    except Stopped:
        code = EXIT_STOPPED
    except TrainingDiverged as err:
        log.error("%s: %s", args.config, err)
        code = EXIT_DIVERGED
    except (ConfigError, ValueError) as err:  # any ValueError: the stage's contract since v1
        log.error("%s", " ".join(str(err).split()))
        code = EXIT_CONFIG
    except OSError as err:
        if not is_disk_full(err):
            raise  # emb.stage_runner: a missing input 66, a read-only output 73, else a traceback
        log.error(
            "disk full: cannot write %s (%s); the previous checkpoint is intact: free space "
            "and run the job again to resume", err.filename, err.strerror,
        )  # fmt: skip
        code = EXIT_DISK_FULL
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if code == EXIT_STOPPED and int(env.get("WORLD_SIZE", 1)) > 1:
        # torchrun SIGTERMs the ranks still alive once one rank has exited non-zero; a rank in
        # interpreter shutdown has lost its SIGTERM handler and would die with -15, not 75.
        # Everything is written and closed by now: leave without the shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
