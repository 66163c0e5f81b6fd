"""What produced a result: code (git commit, dirty tree), library versions, the digests of the
resolved training config, of the manifest and of the channel statistics, host and device.

Every result file carries this block (``train.json``, ``metrics.json``, checkpoints, map tags,
``summary.csv``), so two numbers from runs weeks apart can be traced to the code and data that
made them. Nothing here may fail a run: what cannot be found is ``"unknown"``.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("emb", "torch", "snakemake", "rasterio", "numpy")
UNKNOWN = "unknown"
UNUSED = "unused"  # the stats digest of a run that does not normalize (data.normalize: false)
STATS_FILES = ("channel_mean.npy", "channel_std.npy")


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_file(path: Path | str) -> str:
    """sha256 of a file's bytes (the manifest lists every shard, so it stands for the data)."""
    hasher = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def digest_stats(stats_dir: Path | str | None) -> str:
    """sha256 of the channel statistics a run normalizes with (mean then std file bytes), or
    ``"unused"`` for ``None`` (a run without normalization: its statistics cannot matter)."""
    if stats_dir is None:
        return UNUSED
    hasher = hashlib.sha256()
    try:
        for name in STATS_FILES:
            hasher.update(name.encode())
            hasher.update(bytes.fromhex(digest_file(Path(stats_dir) / name)))
    except OSError:
        return UNKNOWN  # a missing file is reported by the stage that reads it
    return hasher.hexdigest()


def digest_config(config: dict[str, Any]) -> str:
    """sha256 of the config as canonical JSON: the same settings give the same digest whatever
    the key order or the YAML spelling."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return digest_bytes(text.encode())


@cache
def code_version() -> dict[str, str]:
    """The git commit of the checkout emb runs from and whether its tree had changes."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "src" / "emb").is_dir():  # installed, not a checkout: no commit to name
        return {"git_commit": UNKNOWN, "git_dirty": UNKNOWN}
    try:
        commit = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": UNKNOWN, "git_dirty": UNKNOWN}
    return {"git_commit": commit, "git_dirty": str(dirty).lower()}


def _git(root: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
    )
    return result.stdout.strip()


@cache
def versions() -> dict[str, str]:
    """Installed versions of the libraries that decide the numbers."""
    found = {}
    for name in PACKAGES:
        try:
            found[f"{name}_version"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[f"{name}_version"] = UNKNOWN
    return found


def device_name(device: Any = None) -> str:
    """``cuda:0 (NVIDIA H100 80GB HBM3)``, ``cpu``; the device that computed the result."""
    if device is None:
        return "cpu"
    text = str(device)
    if text.startswith("cuda"):
        import torch

        try:
            return f"{text} ({torch.cuda.get_device_name(device)})"
        except (RuntimeError, AssertionError):
            return text
    return text


def provenance(
    *,
    config_digest: str | None = None,
    manifest_digest: str | None = None,
    stats_digest: str | None = None,
    device: Any = None,
) -> dict[str, str]:
    """The provenance block: flat ``str -> str`` (GeoTIFF tags and CSV columns take it as is)."""
    return {
        **code_version(),
        **versions(),
        "config_digest": config_digest or UNKNOWN,
        "manifest_digest": manifest_digest or UNKNOWN,
        "stats_digest": stats_digest or UNKNOWN,
        "host": socket.gethostname(),
        "device": device_name(device),
    }
