"""Checks the cluster profiles run while Snakemake reads them, before any job is submitted.

``profiles/<cluster>/config.v8+.yaml`` are YTE templates (``__use_yte__: true``) that import
these functions, so a missing account variable, a GPU count the nodes do not have or a missing
container image stops ``snakemake --profile ...`` with one clear line instead of a rejected
``sbatch`` (or a job that waits a day in the queue and then fails).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


class ProfileError(ValueError):
    """A cluster profile that cannot work as configured."""


def require_env(name: str, hint: str, env: Mapping[str, str] | None = None) -> str:
    """The value of environment variable ``name``; a clear error naming it when unset or empty."""
    value = (os.environ if env is None else env).get(name, "")
    if not value:
        raise ProfileError(f"environment variable {name} is not set: {hint}")
    return value


def gpus_per_node(asked: int, cluster: str, available: int) -> int:
    """``asked`` when the cluster's nodes have that many GPUs, else an error naming both."""
    if not 1 <= asked <= available:
        raise ProfileError(
            f"profile {cluster}: asks for {asked} GPUs per node, but {cluster} nodes have "
            f"{available} (1..{available} allowed)"
        )
    return asked


def container_image(path: str, variable: str) -> str:
    """``path`` (from ``variable``) when it is an existing image file, else an error."""
    if not Path(path).is_file():
        raise ProfileError(f"container image {path} (from {variable}) does not exist")
    return path
