"""A shard build that fails for real (a full tmpfs, a read-only mount, SIGTERM from outside)
removes its staging folder, exits with its own code and one line, and leaves the previous
build's shards, sidecars and index byte-identical."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TinyDemo, venv_env
from fault_runs import small_tmpfs, tree_hashes

pytestmark = pytest.mark.reliability


def shards_command(demo: TinyDemo, out_dir: Path, source: str, max_samples: int) -> list[str]:
    files = demo.rasters["demo_a"]
    return [
        sys.executable, "-m", "emb.prep.shards", f"--source={source}", "--region=demo_a",
        f"--emb={files[source]}", f"--labels={demo.labels[(source, 'demo_a')]}",
        f"--index={out_dir / 'index.json'}", "--tile-size=32", "--block-m=320",
        f"--max-samples={max_samples}",
    ]  # fmt: skip


def build(demo: TinyDemo, out_dir: Path, source: str = "aef", max_samples: int = 4):
    return subprocess.run(
        shards_command(demo, out_dir, source, max_samples),
        capture_output=True, text=True, env=venv_env(), timeout=300,
    )  # fmt: skip


def staging_left(out_dir: Path) -> list[str]:
    return [p.name for p in out_dir.glob(".staging-*")]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


@pytest.fixture
def small_disk(tmp_path: Path):
    with small_tmpfs(tmp_path / "disk", "16m") as disk:
        yield disk


@pytest.mark.check("disk_full")
@pytest.mark.parametrize("source", ["aef", "tessera"])  # tessera: quantizing threads too
def test_disk_full_during_a_shard_build_removes_staging_and_keeps_the_old_shards(
    tiny_demo: TinyDemo, small_disk: Path, source: str
) -> None:
    out = small_disk / "shards" / source / "demo_a"
    assert build(tiny_demo, out, source).returncode == 0
    before = tree_hashes(out)
    st = os.statvfs(small_disk)
    with open(small_disk / "filler", "wb") as fh:  # leaves room for a few tiles
        os.posix_fallocate(fh.fileno(), 0, st.f_bavail * st.f_frsize - 200_000)
    result = build(tiny_demo, out, source, max_samples=3)
    assert result.returncode == 74, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    [line] = error_lines(result.stderr)
    assert "disk full (No space left on device)" in line and ".tar:" in line, line
    assert not staging_left(out)
    assert tree_hashes(out) == before


def test_a_read_only_output_folder_is_exit_73_naming_it_and_changes_nothing(
    tiny_demo: TinyDemo, small_disk: Path
) -> None:
    out = small_disk / "shards" / "aef" / "demo_a"
    assert build(tiny_demo, out).returncode == 0
    before = tree_hashes(out)
    remount = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True)
    assert remount.returncode == 0, remount.stderr
    result = build(tiny_demo, out, max_samples=3)
    assert result.returncode == 73, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    [line] = error_lines(result.stderr)
    assert f"{out}/.staging-" in line and "Read-only file system" in line, line
    assert tree_hashes(out) == before


def test_sigterm_mid_build_removes_staging_and_keeps_the_old_shards(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    out = tmp_path / "shards" / "tessera" / "demo_a"
    assert build(tiny_demo, out, "tessera").returncode == 0
    before = tree_hashes(out)
    for _attempt in range(5):  # caught mid-build: stopped while its staging holds a shard
        proc = subprocess.Popen(
            shards_command(tiny_demo, out, "tessera", max_samples=1),
            stderr=subprocess.PIPE, text=True, env=venv_env(),
        )  # fmt: skip
        while proc.poll() is None and not any(out.glob(".staging-*/*.tar")):
            time.sleep(0.001)
        proc.send_signal(signal.SIGSTOP)
        if proc.poll() is None and any(out.glob(".staging-*/*.tar")):
            break
        proc.send_signal(signal.SIGCONT)
        proc.communicate(timeout=60)
    else:
        pytest.fail("the build ended five times before it could be stopped mid-way")
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr
    [line] = error_lines(stderr)
    assert "interrupted by SIGTERM" in line, line
    assert not staging_left(out)
    assert tree_hashes(out) == before


def test_labels_into_a_read_only_folder_are_exit_73_naming_the_file(
    tiny_demo: TinyDemo, small_disk: Path
) -> None:
    files = tiny_demo.rasters["demo_a"]
    out = small_disk / "labels" / "demo_a.tif"
    out.parent.mkdir(parents=True)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    result = subprocess.run(
        [sys.executable, "-m", "emb.prep.align_labels", f"--emb={files['aef']}",
         f"--cdl={files['cdl']}", "--classes=config/classes.csv", f"--out={out}",
         f"--report={out.with_suffix('.json')}"],
        capture_output=True, text=True, env=venv_env(), timeout=300,
    )  # fmt: skip
    assert result.returncode == 73, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    [line] = error_lines(result.stderr)
    assert f"{out}: Read-only file system" in line, line
