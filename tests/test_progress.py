"""Long stages log progress (count, rate, ETA) with timestamps: emb.progress and the stage logs."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

from conftest import CLASSES_CSV, TinyDemo, venv_env

from emb.progress import Progress

STAMP = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO "


def test_a_line_every_five_percent_when_time_does_not_call_for_one(caplog) -> None:
    caplog.set_level(logging.INFO, "emb.test")
    progress = Progress(100, "tiles", "t", logging.getLogger("emb.test"), every_s=1e9)
    for _ in range(100):
        progress.advance()
    progress.done()
    counts = [
        int(m.group(1)) for r in caplog.records if (m := re.match(r"t: (\d+)/100", r.msg % r.args))
    ]
    assert counts == [*range(5, 101, 5)]  # 100: the closing line
    assert caplog.records[0].getMessage() == "t: 100 tiles to do"
    assert "ETA" in caplog.records[1].getMessage() and "took" in caplog.records[-1].getMessage()


def test_a_line_per_advance_when_the_interval_is_zero(caplog) -> None:
    caplog.set_level(logging.INFO, "emb.test")
    progress = Progress(1000, "blocks", "b", logging.getLogger("emb.test"), every_s=0)
    for _ in range(3):
        progress.advance(2)
    lines = [r.getMessage() for r in caplog.records][1:]
    assert [line.split(" ")[1] for line in lines] == ["2/1000", "4/1000", "6/1000"]
    assert all(re.search(r"blocks/s, ETA \d+:\d\d:\d\d$", line) for line in lines), lines


def progress_lines(stderr: str, logger: str, what: str) -> list[tuple[int, int]]:
    pattern = re.compile(STAMP + re.escape(f"{logger}: {what}: ") + r"(\d+)/(\d+) ")
    return [(int(m[1]), int(m[2])) for line in stderr.splitlines() if (m := pattern.match(line))]


def test_the_shard_build_logs_timestamped_progress(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    files = tiny_demo.rasters["demo_a"]
    result = subprocess.run(
        [sys.executable, "-m", "emb.prep.shards", "--source=aef", "--region=demo_a",
         f"--emb={files['aef']}", f"--labels={tiny_demo.labels[('aef', 'demo_a')]}",
         f"--index={tmp_path / 'index.json'}", "--tile-size=32", "--block-m=320"],
        capture_output=True, text=True, env={**venv_env(), "EMB_PROGRESS_EVERY_S": "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = progress_lines(result.stderr, "emb.prep.shards", "aef/demo_a shards")
    total = lines[0][1]
    assert total > 3 and [done for done, _ in lines] == [*range(1, total + 1)], lines


def test_label_alignment_and_stats_log_timestamped_progress(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    files = tiny_demo.rasters["demo_a"]
    env = {**venv_env(), "EMB_PROGRESS_EVERY_S": "0"}
    align = subprocess.run(
        [sys.executable, "-m", "emb.prep.align_labels", f"--emb={files['aef']}",
         f"--cdl={files['cdl']}", f"--classes={CLASSES_CSV}", f"--out={tmp_path / 'l.tif'}",
         f"--report={tmp_path / 'l.json'}", "--block=32"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert align.returncode == 0, align.stderr[-3000:]
    lines = progress_lines(align.stderr, "emb.prep.align_labels", "l.tif labels")
    assert [done for done, _ in lines] == [*range(1, 17)], lines  # 128 px / 32 = 4 x 4
    stats = subprocess.run(
        [sys.executable, "-m", "emb.prep.channel_stats",
         f"--manifest={tiny_demo.manifests['tessera']}", "--n-tiles=all",
         f"--out-dir={tmp_path / 'stats'}"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr[-3000:]
    lines = progress_lines(stats.stderr, "emb.prep.channel_stats", "tessera channel stats")
    assert len(lines) > 2 and lines[-1][0] == lines[-1][1], lines
