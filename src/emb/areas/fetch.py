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
from pathlib import Path

from emb import cli
from emb.areas import AreasError
from emb.areas.checks import check_tile
from emb.areas.plan import Tile, plan_areas
from emb.io import atomic_path
from emb.progress import Progress

log = logging.getLogger(__name__)
CHUNK = 1 << 20
ATTEMPTS = 4


class FetchError(OSError):
    """A tile that could not be downloaded whole (its URL and what the server did)."""


def tile_url(base: str, key: str) -> str:
    return base.rstrip("/") + "/" + urllib.parse.quote(key)


def download(url: str, dest: Path, timeout: float = 60.0) -> int:
    """``url`` into ``dest`` through ``dest.part`` (continued where a previous try stopped);
    returns the bytes received now. Raises FetchError when the length does not add up."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - configured URL
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # the part is already whole
            os.replace(part, dest)
            return 0
        raise FetchError(f"{url}: HTTP {err.code} {err.reason}") from None
    with response:
        resumed = response.status == 206
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
    os.replace(part, dest)
    return received


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
                    raise FetchError(f"{tile.path}: cannot fetch {url}: {err}") from None
                time.sleep(2**attempt * 0.5)
        check_tile(f"fetched from {url}", source, tile, listed_in, fetching=False)
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
