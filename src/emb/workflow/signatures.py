"""The per-job functions' parameters, read once while the workflow parses.

Snakemake asks every input, params and resource function which of ``wildcards``, ``input``,
``attempt``, ... it takes by ``inspect.signature``, twice per call, for every job: 4,000 jobs
of a 1,000-region DAG, ~10 such calls per job from the per-region rules' own functions. A
function marked by :func:`known_parameters` carries its parameters, found once, in the
attribute Snakemake reads first (``snakemake.common.overwrite_function_params``: what its own
``subpath`` and ``prepend_param`` wrappers use); a 1,000-region dry run took ~5% less CPU
(bench/dry_run.py). Nothing of Snakemake is replaced: without that helper (another Snakemake)
the mark is skipped and each job inspects the signature, as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

try:
    from snakemake.common import overwrite_function_params
except ImportError:  # pragma: no cover - a Snakemake without it: slower, never wrong
    overwrite_function_params = None

F = TypeVar("F", bound=Callable[..., Any])


def known_parameters(func: F) -> F:
    """``func`` with its parameters marked as Snakemake reads them (its own signature's)."""
    if overwrite_function_params is not None:
        overwrite_function_params(func, inspect.signature(func).parameters)
    return func
