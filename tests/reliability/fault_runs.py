"""Helpers for the fault-injection trials: launch the training stage (optionally through
``fault_launcher.py``), read torchrun's per-worker exit codes, hash files, mount a small tmpfs."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import venv_env

LAUNCHER = Path(__file__).with_name("fault_launcher.py")


def command(config: Path, nproc: int = 2, fault: bool = False) -> list[str]:
    """torchrun (nproc > 1) or a plain process: ``emb.training.train`` or the fault launcher."""
    target = [str(LAUNCHER)] if fault else ["-m", "emb.training.train"]
    if nproc == 1:
        return [sys.executable, *target, "--config", str(config)]
    return ["torchrun", "--standalone", f"--nproc_per_node={nproc}", *target,
            "--config", str(config)]  # fmt: skip


def environment(fault: str | None = None) -> dict[str, str]:
    env = venv_env()
    if fault:
        env["EMB_FAULT"] = fault
    return env


def launch(config: Path, log: Path, nproc: int = 2, fault: str | None = None) -> subprocess.Popen:
    with open(log, "w") as fh:
        return subprocess.Popen(
            command(config, nproc, fault is not None), env=environment(fault), stdout=fh,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def run(
    config: Path, nproc: int = 2, fault: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(config, nproc, fault is not None), env=environment(fault), capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip


def worker_exit_codes(output: str) -> dict[int, int]:
    """{rank: exit code} of the failed workers in torchrun's failure summary."""
    codes = {}
    for block in re.split(r"\n\s*\[\d+\]:\n", output):
        rank = re.search(r"rank\s*:\s*(\d+)", block)
        code = re.search(r"exitcode\s*:\s*(-?\d+)", block)
        if rank and code:
            codes[int(rank.group(1))] = int(code.group(1))
    return codes


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_hashes(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``root``."""
    return {str(p.relative_to(root)): sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``path``; returns why not when this machine refuses."""
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True, text=True)  # fmt: skip
    return None if result.returncode == 0 else (result.stderr.strip() or "mount failed")


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real file system of ``size`` at ``path`` to fill up; the test is skipped where this
    machine refuses the mount (it needs root, as in CI)."""
    why = mount_tmpfs(path, size)
    if why:
        pytest.skip(f"cannot mount a tmpfs here ({why}): needs root, as in CI")
    try:
        yield path
    finally:
        unmount(path)
