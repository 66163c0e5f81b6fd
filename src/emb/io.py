"""Atomic file writes (a partially written file never appears under its final name), and read
errors that name their file."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from rasterio.errors import RasterioIOError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left; disk quota exceeded
CANT_WRITE = (errno.EROFS, errno.EACCES, errno.EPERM)  # read-only file system; permission


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_FULL


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; on success fsync it and rename it over ``path``.

    On an exception the temporary file is removed and whatever was at ``path`` stays intact.
    A full disk (ENOSPC/EDQUOT) or a folder we may not write in (EROFS, EACCES) raises an
    ``OSError`` naming ``path``, even when the failing call was a ``write`` that knew no file
    name or a GDAL call that knew no errno.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        # Created here, so that a read-only or full folder fails as an OSError naming the file
        # (GDAL, which writes rasters into it, would fail with a message naming no errno).
        tmp.touch()
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # the rename itself survives a crash only once the dir is synced
    except OSError as err:
        about_tmp = err.filename is None or os.fspath(err.filename) == os.fspath(tmp)
        if about_tmp and (is_disk_full(err) or err.errno in CANT_WRITE):
            raise OSError(err.errno, err.strerror, str(path)) from err  # its subclass, by errno
        raise
    finally:
        with contextlib.suppress(OSError):  # on a read-only folder unlink fails (EROFS) too
            tmp.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def json_ready(data: Any) -> Any:
    """``data`` with every non-finite float (NaN, inf: a missing value, e.g. the bound of a
    class absent from a split) replaced by None, through dicts, lists and tuples."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_ready(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_ready(v) for v in data]
    return data


def json_text(data: Any, **kwargs: Any) -> str:
    """Strict JSON of ``data``: missing values (NaN, inf) as ``null``, never the bare ``NaN``
    that Python's json writes by default and that strict readers (``JSON.parse``, ``jq``)
    refuse; anything else not JSON (a numpy scalar, a set) raises ``TypeError``."""
    return json.dumps(json_ready(data), allow_nan=False, **kwargs)


def write_json(path: Path | str, data: Any) -> None:
    """Write ``data`` as indented strict JSON (:func:`json_text`), atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json_text(data, indent=2, sort_keys=False) + "\n")


class JSONFileError(ValueError):
    """A JSON file emb wrote that cannot be parsed now (cut short by an interrupted copy,
    edited by hand, another file under its name): one line naming it (exit code 2)."""


def read_json(path: Path | str, what: str = "JSON file", fix: str = "rebuild it") -> Any:
    """The JSON document at ``path``; a file that is not one is refused in one line naming
    it, ``what`` it should be, where the parse stopped and its size, and ``fix`` (how to make
    it again). A missing file raises ``FileNotFoundError`` (exit code 66, named)."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        why = f"byte {err.start} is not UTF-8"
    except json.JSONDecodeError as err:
        why = f"{err.msg} at line {err.lineno}, column {err.colno}"
    raise JSONFileError(
        f"{path}: not a {what} ({why}; {len(data)} bytes: cut short, or not JSON); {fix}"
    )


# libyaml's parser where PyYAML was built with it (its wheels are): the same documents as the
# pure-Python SafeLoader, about ten times faster. The workflow parses its schemas and every
# run's config files each time it starts (a dry run too), which the Python parser made seconds.
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with :data:`SafeLoader`: the same errors, raised faster."""
    return yaml.load(text, Loader=SafeLoader)


class YAMLFileError(ValueError):
    """A YAML file that cannot be parsed (a tab in the indentation, an unclosed bracket, a file
    that is not text): one line naming it, the line and column (exit code 2)."""


def read_yaml(path: Path | str, error: type[ValueError] = YAMLFileError) -> Any:
    """The YAML document at ``path``; a file that does not parse raises ``error`` naming it,
    the line and column where the parse stopped and the problem. A missing file raises
    ``FileNotFoundError`` (exit code 66, named)."""
    try:
        return parse_yaml(Path(path).read_text())
    except UnicodeDecodeError as err:
        raise error(f"{path}: not a UTF-8 text file ({err})") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}:" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise error(f"{path}:{where} not valid YAML: {problem}") from err


@contextmanager
def reading(path: Path | str) -> Iterator[None]:
    """Name ``path`` in a read error: rasterio says only "Read failed. See previous exception",
    and GDAL's cause names the file's base name (every region's is ``aef.tif``)."""
    try:
        yield
    except RasterioIOError as err:
        detail = " ".join(str(err.__cause__ or err.__context__ or err).split())
        raise RasterioIOError(f"{path}: cannot read it ({detail})") from err
