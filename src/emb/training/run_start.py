"""Where a run starts, and what becomes of an earlier run's files in its folder.

- ``train.resume_from: last`` (the default): an interrupted run (``last.pt`` not marked
  finished) resumes from ``last.pt``; a finished one starts over, so a forced rerun (or a rerun
  after its config changed) retrains instead of re-validating a finished model.
- ``best``, ``epoch_N`` (this run's ``epoch_NNNN.pt``) or a path: resume from that checkpoint.
  Once this run has written ``last.pt`` under the same setting, a restart (SLURM's retry after
  a time limit) continues from ``last.pt`` instead of going back again.
- ``train.restart: false``: start over (from ``train.init_from``'s weights when set).
- An unfinished ``last.pt`` trained on other data (its manifest digest is not the current
  manifest's) is not resumed: the run starts over, the earlier files kept in ``previous/``.

Starting over moves the earlier run's files into ``previous/<time>/``; resuming from a chosen
checkpoint hard-links them there first (the run then replaces them as it goes). Nothing is
deleted: ``train.json``, which Snakemake deletes before it reruns the job, is restored there
from its copy ``ranks/train.json``. Only rank 0 touches files; every rank reads the same
checkpoint and so decides alike.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from emb.provenance import UNKNOWN
from emb.training import checkpoint_file
from emb.training.checkpoint_policy import Checkpointer
from emb.training.distributed import barrier
from emb.training.run_config import ConfigError, TrainConfig

RUN_FILES = ("*.pt", "*.pt.sha256", "history.csv", "train.json", "tb", "ranks", "keys", "wandb")
# train.json's copy (emb.training.train): Snakemake deletes the declared train.json before a
# rerun (--forcerun train, a changed config), so the set-aside restores it from this copy
SUMMARY_COPY = Path("ranks") / "train.json"


@dataclass(frozen=True)
class Start:
    """How a run starts: ``resume`` (with its loaded ``state``) or fresh, and the earlier
    run's files ``aside``: "move" (starting over), "link" (kept, then replaced) or None."""

    resume: Path | None
    state: dict[str, Any] | None
    aside: str | None
    note: str


def chosen_checkpoint(setting: str, run_dir: Path) -> Path:
    """The file ``train.resume_from`` names: last, best, epoch_N or a path."""
    if setting in ("last", "best"):
        return run_dir / f"{setting}.pt"
    if setting.startswith("epoch_") and setting[6:].isdigit():
        return run_dir / f"epoch_{int(setting[6:]):04d}.pt"
    return Path(setting)


def earlier_files(run_dir: Path) -> list[Path]:
    """What an earlier run left in ``run_dir`` (not its config, not ``previous/``)."""
    return sorted({p for pattern in RUN_FILES for p in run_dir.glob(pattern)})


def has_earlier_run(run_dir: Path) -> bool:
    """A checkpoint or a history: a run worth keeping (logs of a run that never validated or
    saved are not set aside)."""
    return any(run_dir.glob("*.pt")) or (run_dir / "history.csv").exists()


def data_change(state: dict[str, Any], current: dict[str, str] | None) -> str | None:
    """How the data a checkpoint was trained on differs from this run's (by manifest digest),
    or None when they are the same or either digest is unknown (checkpoints before digests)."""
    old = state.get("provenance", {}).get("manifest_digest", UNKNOWN)
    new = (current or {}).get("manifest_digest", UNKNOWN)
    if UNKNOWN in (old, new) or old == new:
        return None
    return f"manifest digest {old[:12]} in the checkpoint, {new[:12]} now"


def plan_start(cfg: TrainConfig, run_dir: Path, current: dict[str, str] | None = None) -> Start:
    """Decide how this run starts; reads (never writes) the checkpoints it names. ``current``
    is this run's provenance: an unfinished ``last.pt`` of other data is not resumed (its
    steps would continue a schedule on data it never saw); the run starts over instead and
    the earlier files are kept in ``previous/``."""
    setting, last = cfg.train.resume_from, run_dir / "last.pt"
    kept = "move" if has_earlier_run(run_dir) else None
    if not cfg.train.restart:
        return Start(None, None, kept, "train.restart is false: starting over")
    state = checkpoint_file.load(last) if last.exists() else None
    finished = state is not None and bool(state.get("finished"))
    if state is not None and not finished:
        written_under = state.get("config", {}).get("train", {}).get("resume_from", "last")
        changed = data_change(state, current)
        if changed and (setting == "last" or written_under == setting):
            why = f"{last} was trained on other data ({cfg.data.manifest}: {changed})"
            return Start(None, None, kept, f"{why}: starting over")
        if setting == "last" or written_under == setting:
            return Start(last, state, None, f"resuming {last}")
    if setting == "last":
        why = f"{last} is a finished run: starting over" if finished else "starting"
        return Start(None, None, kept, why)
    chosen = chosen_checkpoint(setting, run_dir)
    if not chosen.is_file():
        held = ", ".join(p.name for p in sorted(run_dir.glob("*.pt"))) or "no checkpoint"
        raise ConfigError(
            f"{run_dir / 'config.yaml'}: train.resume_from: expected an existing checkpoint, "
            f"found {setting!r} -> {chosen}, which does not exist ({run_dir} holds {held})"
        )
    return Start(
        chosen, checkpoint_file.load(chosen), "link" if kept else None, f"resuming {chosen}"
    )


def begin(cfg: TrainConfig, run_dir: Path, rank: int, checkpointer: Checkpointer) -> tuple[
    Start, list[str]
]:  # fmt: skip
    """Start as :func:`plan_start` decides: restore the checkpoint (or ``train.init_from``'s
    weights), then set the earlier run's files aside. Every rank calls it; returns the start
    and the lines to log (there is no run log yet: it is opened after the files moved)."""
    notes = [f"removed {p.name}, left by a checkpoint write that was killed"
             for p in checkpointer.clean_leftovers()]  # fmt: skip
    current = checkpointer.identity.get("provenance")
    start = plan_start(cfg, run_dir, current)
    position = checkpointer.position
    if start.resume is not None:
        checkpointer.resume(start.resume, start.state)
        notes.append(f"resumed from {start.resume} at epoch {position.epoch}, "
                     f"batch {position.batch}")  # fmt: skip
        notes += config_change(start.state, cfg.resolved, current)
    elif cfg.train.init_from:
        chosen = checkpointer.init_weights(Path(cfg.train.init_from))
        notes.append(f"initialized weights from {cfg.train.init_from} ({chosen} weights; "
                     "fine-tuning)")  # fmt: skip
    barrier()  # every rank has decided on the same files, and none has written yet
    if start.aside and rank == 0:
        folder = set_aside(run_dir, start.aside)
        done = "moved to" if start.aside == "move" else "kept (hard links) in"
        notes.append(f"{start.note}; the earlier run's files are {done} {folder}")
    barrier()  # no rank writes before they are set aside
    return start, notes


def config_change(
    state: dict[str, Any], config: dict[str, Any], current: dict[str, str] | None
) -> list[str]:
    """A line naming the keys a resumed checkpoint's config differs in (those that change the
    math were refused before this), with both digests; none when the configs are equal."""
    keys = checkpoint_file.differing_keys(state.get("config", {}), config, ("",))
    if not keys:
        return []
    old = state.get("provenance", {}).get("config_digest", UNKNOWN)
    new = (current or {}).get("config_digest", UNKNOWN)
    return [f"config digest {new[:12]} differs from the checkpoint's {old[:12]} in "
            f"{', '.join(keys)} (none changes what the next steps compute)"]  # fmt: skip


def set_aside(run_dir: Path, how: str) -> Path:
    """Move (``how="move"``) or hard-link (copy where links fail) the earlier run's files into
    a new ``previous/<time>/`` folder of ``run_dir``; returns that folder."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = run_dir / "previous" / stamp
    n = 1
    while target.exists():
        n += 1
        target = run_dir / "previous" / f"{stamp}-{n}"
    target.mkdir(parents=True)
    for path in earlier_files(run_dir):
        if how == "move":
            path.rename(target / path.name)
        elif path.is_dir():
            shutil.copytree(path, target / path.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(path, target / path.name)
    copy = target / SUMMARY_COPY
    if copy.is_file() and not (target / "train.json").exists():
        _link_or_copy(copy, target / "train.json")  # the train.json Snakemake deleted
    return target


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
