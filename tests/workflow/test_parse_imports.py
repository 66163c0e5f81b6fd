"""The parse imports no torch, matplotlib or numba (issue 58 item 6): every module of
emb.workflow, which the rule files import at parse time, is imported in a fresh interpreter
and none may leave them in ``sys.modules``. They cost a quarter of a 100-region dry run when
a torch-free name was imported from a module beside the device code (``PredictSpec`` from
``emb.evaluation.windows``), and numba's compiler 0.4-0.7 s of every parse when a type used
only in annotations (``Design``) came from the module of the design's compiled loops; a
torch-free piece lives in a torch-free module."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, venv_env

UNWANTED = ("torch", "matplotlib", "numba")

# Imports every emb.workflow module in turn and prints, for each unwanted package that got
# loaded, the workflow module whose import first brought it in.
SCRIPT = """
import importlib, json, pkgutil, sys
import emb.workflow
unwanted = sys.argv[1:]
first = {}
for info in sorted(pkgutil.iter_modules(emb.workflow.__path__), key=lambda m: m.name):
    importlib.import_module(f"emb.workflow.{info.name}")
    for name in unwanted:
        if name in sys.modules:
            first.setdefault(name, f"emb.workflow.{info.name}")
print(json.dumps(first))
"""


def test_importing_the_workflow_imports_no_torch_matplotlib_or_numba() -> None:
    env = venv_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *UNWANTED], capture_output=True, text=True, env=env,
        cwd=REPO, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert not loaded, (
        f"imported at parse time (package: the emb.workflow module that first loads it): "
        f"{loaded}; python -X importtime -c 'import <that module>' shows the chain"
    )
