"""summary.html in a real browser: headless Chromium (Debian's ``chromium``) at 1400 px.

The page must lead with the runs table, fit the window without horizontal scrolling, and show
the forest plot. ``scripts/browser/chromium.sh`` finds Chromium, or installs it where this
runs as root with apt-get (CI's fresh Debian machine, as scripts/slurm/start.sh installs
SLURM); elsewhere the test is skipped and says why.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO
from test_report import blocks_run

from emb.report.summary import main as summary_main

WIDTH = 1400
# Measured once the page has loaded (the forest plot decoded), written into the DOM that
# Chromium's --dump-dom prints.
PROBE = """<script>
window.addEventListener('load', () => {
  const runs = document.getElementById('runs'), img = document.getElementById('forest');
  const tables = [...document.querySelectorAll('table')].map(t => t.id);
  const out = {view: window.innerWidth, page: document.documentElement.scrollWidth,
               runs_right: runs.getBoundingClientRect().right, runs_scroll: runs.scrollWidth,
               tables: tables, forest: img ? img.naturalWidth : 0,
               forest_right: img ? img.getBoundingClientRect().right : 0,
               cell: runs.querySelector('tbody td:nth-child(4)').textContent};
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="session")
def chromium() -> str:
    """The browser's path; the test is skipped (with the reason) where it cannot be had."""
    found = subprocess.run([str(REPO / "scripts/browser/chromium.sh")], capture_output=True,
                           text=True, timeout=900)  # fmt: skip
    if found.returncode == 3:
        pytest.skip(f"no headless browser: {found.stderr.strip()}")
    assert found.returncode == 0, f"scripts/browser/chromium.sh failed:\n{found.stderr[-3000:]}"
    return found.stdout.strip().splitlines()[-1]


def browse(chromium: str, page: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={WIDTH},1100", "--virtual-time-budget=5000", *args,
           page.as_uri()]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_summary_page_leads_with_the_runs_and_fits_1400_px(
    chromium: str, tmp_path: Path
) -> None:
    """Four runs with long names (12 shared blocks, one run on other ground): the runs table
    is the page's first table, no wider than the window, each cell a figure and its
    interval; the forest plot is on the page."""
    here, there = [f"r1_b{i}" for i in range(12)], [f"r9_b{i}" for i in range(12)]
    runs = {"aef_segformer_longer_name": ("aef", "segformer", here, 0.9),
            "tessera_segformer_longer_name": ("tessera", "segformer", here, 0.86),
            "aef_deeplab_longer_name": ("aef", "deeplab", here, 0.88),
            "tessera_deeplab_longer_name": ("tessera", "deeplab", there, 0.8)}  # fmt: skip
    paths = [blocks_run(tmp_path, run, *spec) for run, spec in runs.items()]
    html, forest = tmp_path / "summary.html", tmp_path / "pairs.png"
    summary_main(["--runs", *runs, "--metrics", *paths, "--out", str(tmp_path / "summary.csv"),
                  "--html", str(html), "--pairs-png", str(forest)])  # fmt: skip
    probed = tmp_path / "probed.html"
    probed.write_text(html.read_text().replace("</body>", PROBE + "</body>"))

    result = browse(chromium, probed, "--dump-dom")
    found = re.search(r"<pre id=\"probe\">(.*?)</pre>", result.stdout)
    assert found, f"no measurement from Chromium:\n{result.stderr[-3000:]}"
    m = json.loads(found.group(1).replace("&quot;", '"'))
    assert m["view"] == WIDTH
    assert m["tables"][0] == "runs"  # the runs first
    assert m["runs_right"] <= WIDTH and m["runs_scroll"] <= WIDTH and m["page"] <= WIDTH, m
    assert re.fullmatch(r"0\.\d{3} \[0\.\d{3}, 0\.\d{3}\]", m["cell"]), m["cell"]
    assert m["forest"] > 300 and m["forest_right"] <= WIDTH, m
    assert forest.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    shot = tmp_path / "summary_1400.png"  # what a reader sees first (kept for a look by hand)
    browse(chromium, html, f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 10_000
