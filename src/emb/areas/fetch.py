"""Stage: download exactly the tiles the areas need and the folder lacks, from a collection's
base URL (``collections.{source}.url``, the bucket's layout below it): parallel, resumable,
each file checked by its length and, once complete, against what the server says the object
is (the CRC32C and MD5 of ``x-goog-hash``, or an MD5 ETag; with neither, every block decoded)
and by its header against the index. Only then is it renamed to the tile's path: a file there
is always whole.

Runs where Snakemake runs (a local rule): compute nodes often have no internet. A partial
download stays as ``{tile}.part`` and is continued with an HTTP Range request next time.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import google_crc32c
import rasterio
from rasterio.errors import RasterioError
from rasterio.windows import Window

from emb import stage_runner
from emb.areas import AreasError
from emb.areas.checks import check_tile
from emb.areas.index import CollectionTile, check_in_folder
from emb.areas.plan import plan_areas
from emb.config_schema import config_option
from emb.io import atomic_path
from emb.progress import Progress

log = logging.getLogger(__name__)
CHUNK = 1 << 20
ATTEMPTS = 4
TIMEOUT_S = 60.0  # a read that stalls this long fails the attempt
BACKOFF_S = 0.5  # the wait before retry n is BACKOFF_S * 2**(n - 1)
MD5_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})"?$')  # a single-part object's ETag is its MD5
GZIP_MAGIC = b"\x1f\x8b"


class FetchError(AreasError):
    """A tile that could not be downloaded whole (its URL and what the server did): a known
    error (one line, exit code 2), not a bug; a rerun resumes."""


def check_inside(folder: Path, tiles: list[CollectionTile], listed_in: str) -> None:
    """Every destination inside ``folder``, before any request (the plan refused such rows
    already, while the workflow was parsed; a stage run by hand checks again)."""
    for tile in tiles:
        check_in_folder(folder, tile, listed_in)


def tile_url(base: str, key: str) -> str:
    return base.rstrip("/") + "/" + urllib.parse.quote(key)


DIGEST_BYTES = {"md5": 16, "crc32c": 4}  # what x-goog-hash may state, and each one's length
DIGEST_NAMES = {"md5": "MD5", "crc32c": "CRC32C"}


@dataclass(frozen=True)
class Digest:
    """A digest the server states for the object: its ``kind`` (md5, crc32c), its bytes (a
    CRC32C big-endian, as GCS sends it) and the header it came from."""

    kind: str
    value: bytes
    header: str


@dataclass(frozen=True)
class Served:
    """What the last answer said of the object: the bytes received now, the digests the
    server states (``x-goog-hash`` md5 and crc32c, or an ETag that is an MD5) and its
    ``Content-Encoding`` ("" when none)."""

    received: int
    digests: tuple[Digest, ...] = ()
    encoding: str = ""


def served_digests(headers) -> tuple[Digest, ...]:
    """The object's digests as the server states them: GCS sends ``x-goog-hash: crc32c=...,
    md5=...`` (base64; a composite object has the CRC32C alone); S3 and most stores send the
    MD5 hex as a strong ETag (a multipart ETag ``"...-N"`` or a weak ``W/`` one is not)."""
    found: dict[str, Digest] = {}
    for value in headers.get_all("x-goog-hash") or []:
        for item in value.split(","):
            kind, _, text = item.strip().partition("=")
            kind = kind.strip().lower()
            if kind not in DIGEST_BYTES or kind in found:
                continue
            try:
                digest = base64.b64decode(text.strip(), validate=True)
            except ValueError:
                continue
            if len(digest) == DIGEST_BYTES[kind]:
                found[kind] = Digest(kind, digest, f"x-goog-hash {kind}")
    etag = (headers.get("ETag") or "").strip()
    if "md5" not in found and (match := MD5_ETAG.match(etag)) is not None:
        found["md5"] = Digest("md5", bytes.fromhex(match.group(1)), "ETag")
    return tuple(found[kind] for kind in DIGEST_BYTES if kind in found)  # a mismatch names MD5


def download(url: str, dest: Path, timeout: float = TIMEOUT_S) -> Served:
    """``url`` into ``dest.part`` (continued where a previous try stopped); returns what was
    received and what the server said the object is. The caller verifies the part and renames
    it: nothing unverified reaches ``dest``. Raises FetchError when the length does not add
    up."""
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


def _served(received: int, headers) -> Served:
    encoding = (headers.get("Content-Encoding") or "").strip().lower()
    return Served(received, served_digests(headers), "" if encoding == "identity" else encoding)


def _receive(
    url: str, request: urllib.request.Request, part: Path, dest: Path, have: int, timeout: float
) -> Served:
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - configured URL
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # the part is already whole
            return _served(0, err.headers)
        raise FetchError(f"{url}: HTTP {err.code} {err.reason}") from None
    with response:
        resumed = response.status == 206 and have > 0
        encoding = _served(0, response.headers).encoding
        if resumed and (encoding or not _resumes_at(response.headers.get("Content-Range"), have)):
            # a range of an encoded answer need not continue a part received plain
            log.warning(
                "%s: Range answered with %s%s; restarting from zero",
                url,
                response.headers.get("Content-Range"),
                f" and Content-Encoding: {encoding}" if encoding else "",
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
        served = _served(received, response.headers)
    size = part.stat().st_size
    if total is not None and size != total:
        raise FetchError(f"{url}: received {size} of {total} bytes (Content-Length); run again")
    return served


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


def check_decodes(path: Path, url: str) -> None:
    """Every block of every band decodes: without a digest from the server, the only check of
    the bytes inside (a compressed tile with garbage in it fails to decompress; garbage that
    still decompresses passes, which a digest would have refused)."""
    try:
        with rasterio.open(path) as src:
            for _, window in src.block_windows(1):
                src.read(window=window)
    except RasterioError as err:
        raise AreasError(
            f"{path}: fetched from {url} (no MD5 from the server, nor a CRC32C): a block does not "
            f"decode ({err}): corrupt in transit; removed, a rerun fetches it again"
        ) from None


def digests_of(path: Path, kinds: set[str]) -> dict[str, bytes]:
    """The ``kinds`` of digest (md5, crc32c) of the file at ``path``, in one read. CRC32C by
    google-crc32c, in its C extension where the wheel has one (``implementation == "c"``)."""
    md5 = hashlib.md5(usedforsecurity=False) if "md5" in kinds else None
    crc = google_crc32c.Checksum() if "crc32c" in kinds else None
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            if md5 is not None:
                md5.update(chunk)
            if crc is not None:
                crc.update(chunk)
    found = {"md5": md5.digest() if md5 is not None else b""}
    found["crc32c"] = crc.digest() if crc is not None else b""
    return {kind: found[kind] for kind in kinds}


def _decoded(part: Path, served: Served, url: str) -> tuple[Path, str]:
    """The tile's bytes and the encoding they came in: the part itself, or the part
    gunzipped beside it when the server sent it with ``Content-Encoding: gzip`` (the same
    object, compressed on the wire). Another encoding is named, not guessed at."""
    encoding = served.encoding
    if not encoding:
        with open(part, "rb") as fh:  # a part completed earlier: no header came this time
            encoding = "gzip" if fh.read(2) == GZIP_MAGIC else ""
    if not encoding:
        return part, ""
    if encoding not in ("gzip", "x-gzip"):
        raise AreasError(
            f"{part}: fetched from {url}: served with Content-Encoding: {encoding}, which the "
            "fetch does not decode (it decodes gzip): point url at a server that sends the "
            "object as it is stored"
        )
    plain = part.with_name(part.name + ".gunzip")
    try:
        with gzip.open(part, "rb") as src, open(plain, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK)
    except (OSError, EOFError) as err:  # gzip.BadGzipFile, zlib.error are OSErrors
        plain.unlink(missing_ok=True)
        raise AreasError(
            f"{part}: fetched from {url}: served with Content-Encoding: gzip, but it does not "
            f"decompress ({err}); removed, a rerun fetches it again"
        ) from None
    return plain, encoding


def check_digests(tile: CollectionTile, part: Path, ready: Path, encoding: str, served: Served,
                  url: str) -> None:  # fmt: skip
    """Every digest the server states matches the bytes as received, or (for an encoded
    answer) the decoded bytes: servers differ in which they hash (GCS the stored object, which
    may be the gzipped one; others the content). Raises AreasError naming the digest, the
    encoding and both values where neither matches."""
    kinds = {d.kind for d in served.digests}
    received = digests_of(part, kinds)
    if all(received[d.kind] == d.value for d in served.digests):
        return
    decoded = digests_of(ready, kinds) if ready != part else None
    if decoded is not None and all(decoded[d.kind] == d.value for d in served.digests):
        return
    wrong = [d for d in served.digests if received[d.kind] != d.value]
    # the digest that matches neither form, not one the decoded bytes match
    d = next((d for d in wrong if decoded is None or decoded[d.kind] != d.value), wrong[0])
    name = DIGEST_NAMES[d.kind]
    have = f"its bytes have {name} {received[d.kind].hex()}"
    if decoded is not None:
        have = (f"its bytes as received (Content-Encoding: {encoding}) have {name} "
                f"{received[d.kind].hex()}, decoded {decoded[d.kind].hex()}")  # fmt: skip
    raise AreasError(
        f"{tile.path}: fetched from {url}: {have}, but the server's {d.header} says "
        f"{d.value.hex()}: corrupt in transit; removed, a rerun fetches it again"
    )


def verify(
    tile: CollectionTile, part: Path, served: Served, url: str, source: str, listed_in
) -> Path:
    """The downloaded part checked, before it may take the tile's path: decoded if sent
    gzipped, its bytes against every digest the server states (CRC32C, MD5; or, with
    neither, every block decoded), its header against the index row. Returns the file to
    rename into place."""
    ready, encoding = _decoded(part, served, url)
    if served.digests:
        check_digests(tile, part, ready, encoding, served, url)
    check_tile(f"fetched from {url}", source, replace(tile, path=ready), listed_in, fetching=False)
    if served.digests:
        check_readable(ready)
    else:
        check_decodes(ready, url)
    return ready


def fetch_tiles(
    tiles: list[CollectionTile],
    base: str,
    source: str,
    workers: int,
    listed_in: str,
    timeout: float = TIMEOUT_S,
    backoff: float = BACKOFF_S,
) -> list[dict]:
    """Every tile downloaded (retried, with backoff, each retry logged with its wait) and
    verified; one record each."""
    lock = threading.Lock()
    records: list[dict] = []
    progress = Progress(len(tiles), "tiles", f"fetch {source}", log)
    totals = {"bytes": 0}

    def one(tile: CollectionTile) -> None:
        url = tile_url(base, tile.key)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                served = download(url, tile.path, timeout)
                break
            except (FetchError, OSError, http.client.HTTPException) as err:
                if attempt == ATTEMPTS or "HTTP 4" in str(err):
                    tries = f" (after {attempt} attempts)" if attempt > 1 else ""
                    raise FetchError(
                        f"{tile.path}: cannot fetch {url}{tries}: {err}; a rerun resumes where "
                        "it stopped"
                    ) from None
                wait = backoff * 2 ** (attempt - 1)
                log.warning(
                    "%s: attempt %d of %d failed (%s); retrying in %.1f s",
                    url,
                    attempt,
                    ATTEMPTS,
                    err or type(err).__name__,
                    wait,
                )
                time.sleep(wait)
        part = tile.path.with_name(tile.path.name + ".part")
        plain = part.with_name(part.name + ".gunzip")
        try:  # the part, not the final path, is checked: a bad file never takes its place
            ready = verify(tile, part, served, url, source, listed_in)
        except AreasError:
            part.unlink(missing_ok=True)  # a sign-in page or another file: start over next time
            plain.unlink(missing_ok=True)
            raise
        os.replace(ready, tile.path)
        part.unlink(missing_ok=True)  # left when a gunzipped copy took the path
        with lock:
            totals["bytes"] += served.received
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


def fetch(
    areas: Path,
    collections: dict,
    source: str,
    workers: int,
    out: Path,
    timeout: float = TIMEOUT_S,
    backoff: float = BACKOFF_S,
) -> list[dict]:
    collection = collections.get(source) or {}
    base = collection.get("url")
    if not base:
        raise AreasError(f"collections.{source}.url: not set, nothing to fetch from")
    plan = plan_areas(areas, collections)
    missing = plan.missing(source)
    listed_in = collection.get("index") or collection.get("registry") or collection["folder"]
    check_inside(Path(collection["folder"]), missing, listed_in)
    log.info("fetch %s: %d tiles missing of the areas' tiles, from %s", source, len(missing), base)
    records = fetch_tiles(missing, base, source, workers, listed_in, timeout, backoff)
    with atomic_path(out) as tmp:
        lines = ["key\tpath\tbytes"] + [f"{r['key']}\t{r['path']}\t{r['bytes']}" for r in records]
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return records


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--areas", type=Path, required=True)
    parser.add_argument("--collections", required=True, help="config collections: as JSON")
    parser.add_argument("--source", choices=("aef", "tessera"), required=True)
    parser.add_argument(
        "--url", help="collections.{source}.url (given apart: no reason for rules to rerun)"
    )
    parser.add_argument("--workers", type=int, **config_option("collections.workers"))
    parser.add_argument("--out", type=Path, required=True, help="the record of what was fetched")
    args = parser.parse_args(argv)
    collections = json.loads(args.collections)
    if args.url:
        collections[args.source] = {**(collections.get(args.source) or {}), "url": args.url}
    fetch(args.areas, collections, args.source, args.workers, args.out)


if __name__ == "__main__":
    main()
