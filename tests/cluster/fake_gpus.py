"""Run a module's real command line as if the machine had N GPUs (CI has none).

``python -c FAKE_GPUS N MODULE ARGS...`` replaces ``torch.cuda.device_count`` (and device
names) in that one subprocess, then runs ``MODULE`` as ``python -m`` would.
"""

from __future__ import annotations

import sys

FAKE_GPUS = (
    "import runpy, sys, torch\n"
    "n = int(sys.argv.pop(1))\n"
    "torch.cuda.device_count = lambda: n\n"
    "torch.cuda.get_device_name = lambda i=0: f'fake GPU {i}'\n"
    "module = sys.argv.pop(1)\n"
    "sys.argv[0] = module\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


def fake_gpu_command(gpus: int, module: str, *args: str) -> list[str]:
    """``module``'s command line on a machine showing ``gpus`` GPUs."""
    return [sys.executable, "-c", FAKE_GPUS, str(gpus), module, *args]
