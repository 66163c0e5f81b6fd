"""Stage: download exactly the tiles the areas need and the folder lacks, from a collection's
base URL (``collections.{source}.url``, the bucket's layout below it): parallel, resumable,
each file checked by its length and, once complete, by its header against the index.

Runs where Snakemake runs (a local rule): compute nodes often have no internet. A partial
download stays as ``{tile}.part`` and is continued with an HTTP Range request next time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import rasterio
from rasterio.errors import RasterioError
from rasterio.windows import Window

from emb import cli
from emb.areas import AreasError
from emb.areas.checks import check_tile
from emb.areas.index import Tile
from emb.areas.plan import plan_areas
from emb.io import atomic_path
from emb.progress import Progress

log = logging.getLogger(__name__)
CHUNK = 1 << 20
ATTEMPTS = 4


class FetchError(AreasError):
    """A tile that could not be downloaded whole (its URL and what the server did): a known
    error (one line, exit code 2), not a bug; a rerun resumes."""


def check_inside(folder: Path, tiles: list[Tile], listed_in: str) -> None:
    """Every destination inside ``folder`` (after ``..`` and symlinks), before any request:
    an index row such as ``../../x.tiff`` must not write outside the collection."""
    root = folder.resolve()
    for tile in tiles:
        if not tile.path.resolve().is_relative_to(root):
            raise AreasError(
                f"{listed_in}: index row {tile.key!r} would be written to "
                f"{tile.path.resolve()}, outside the collection folder {root}: refused"
            )


def tile_url(base: str, key: str) -> str:
    return base.rstrip("/") + "/" + urllib.parse.quote(key)


def download(url: str, dest: Path, timeout: float = 60.0) -> int:
    """``url`` into ``dest.part`` (continued where a previous try stopped); returns the bytes
    received now. The caller verifies the part and renames it: nothing unverified reaches
    ``dest``. Raises FetchError when the length does not add up."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    return _receive(url, request, part, dest, have, timeout)


def _resumes_at(content_range: str | None, have: int) -> bool:
    """A 206 answer continues the part only if its ``Content-Range`` starts where it ends."""
    if not content_range or not content_range.startswith("bytes "):
        return False
    try:
        return int(content_range[6:].split("-")[0]) == have
    except ValueError:
        return False


def _receive(
    url: str, request: urllib.request.Request, part: Path, dest: Path, have: int, timeout: float
) -> int:
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - configured URL
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # the part is already whole
            return 0
        raise FetchError(f"{url}: HTTP {err.code} {err.reason}") from None
    with response:
        resumed = response.status == 206 and have > 0
        if resumed and not _resumes_at(response.headers.get("Content-Range"), have):
            log.warning(
                "%s: Range answered with %s; restarting from zero",
                url,
                response.headers.get("Content-Range"),
            )
            response.close()
            part.unlink()
            return download(url, dest, timeout)
        length = response.headers.get("Content-Length")
        total = (have if resumed else 0) + int(length) if length is not None else None
        received = 0
        with open(part, "ab" if resumed else "wb") as fh:
            while chunk := response.read(CHUNK):
                fh.write(chunk)
                received += len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    size = part.stat().st_size
    if total is not None and size != total:
        raise FetchError(f"{url}: received {size} of {total} bytes (Content-Length); run again")
    return received


def check_readable(path: Path) -> None:
    """The last block of band 1 decodes: a file cut short or corrupt at its end is refused."""
    try:
        with rasterio.open(path) as src:
            rows, cols = src.block_shapes[0]
            row = (src.height - 1) // rows * rows
            col = (src.width - 1) // cols * cols
            window = Window(col, row, src.width - col, src.height - row)
            src.read(1, window=window)
    except RasterioError as err:
        raise AreasError(
            f"{path}: the downloaded tile's last block cannot be read ({err})"
        ) from None


def fetch_tiles(
    tiles: list[Tile], base: str, source: str, workers: int, listed_in: str
) -> list[dict]:
    """Every tile downloaded (retried, with backoff) and its header checked; one record each."""
    lock = threading.Lock()
    records: list[dict] = []
    progress = Progress(len(tiles), "tiles", f"fetch {source}", log)
    totals = {"bytes": 0}

    def one(tile: Tile) -> None:
        url = tile_url(base, tile.key)
        for attempt in range(ATTEMPTS):
            try:
                received = download(url, tile.path)
                break
            except (FetchError, OSError, http.client.HTTPException) as err:
                if attempt == ATTEMPTS - 1 or "HTTP 4" in str(err):
                    raise FetchError(
                        f"{tile.path}: cannot fetch {url}: {err}; a rerun resumes where it stopped"
                    ) from None
                time.sleep(2**attempt * 0.5)
        part = tile.path.with_name(tile.path.name + ".part")
        try:  # the part, not the final path, is checked: a bad file never takes its place
            check_tile(
                f"fetched from {url}", source, replace(tile, path=part), listed_in, fetching=False
            )
            check_readable(part)
        except AreasError:
            part.unlink(missing_ok=True)  # a sign-in page or another file: start over next time
            raise
        os.replace(part, tile.path)
        with lock:
            totals["bytes"] += received
            records.append(
                {"key": tile.key, "path": str(tile.path), "bytes": tile.path.stat().st_size}
            )
            progress.advance()

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for future in [pool.submit(one, t) for t in tiles]:
            future.result()
    progress.done()
    log.info("fetch %s: %d tiles, %.1f MB received", source, len(tiles), totals["bytes"] / 1e6)
    return records


def fetch(areas: Path, collections: dict, source: str, workers: int, out: Path) -> list[dict]:
    collection = collections.get(source) or {}
    base = collection.get("url")
    if not base:
        raise AreasError(f"collections.{source}.url: not set, nothing to fetch from")
    plan = plan_areas(areas, collections)
    missing = plan.missing(source)
    listed_in = collection.get("index") or collection.get("registry") or collection["folder"]
    check_inside(Path(collection["folder"]), missing, listed_in)
    log.info("fetch %s: %d tiles missing of the areas' tiles, from %s", source, len(missing), base)
    records = fetch_tiles(missing, base, source, workers, listed_in)
    with atomic_path(out) as tmp:
        lines = ["key\tpath\tbytes"] + [f"{r['key']}\t{r['path']}\t{r['bytes']}" for r in records]
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return records


@cli.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--areas", type=Path, required=True)
    parser.add_argument("--collections", required=True, help="config collections: as JSON")
    parser.add_argument("--source", choices=("aef", "tessera"), required=True)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True, help="the record of what was fetched")
    args = parser.parse_args(argv)
    fetch(args.areas, json.loads(args.collections), args.source, args.workers, args.out)


if __name__ == "__main__":
    main()
