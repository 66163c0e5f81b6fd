"""Fetching exactly the tiles the areas need from a base URL: a real HTTP server on
127.0.0.1 serving the synthesized tiles (Range requests as object stores answer them, the
digests GCS and S3 send, and the faults of real servers)."""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import http.server
import logging
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import rasterio
import yaml
from areas_collection import YEAR, Collection, make_collection, run_snakemake
from conftest import REPO
from test_plan import ground_points, values_at

import emb.areas.fetch
from emb import stage_runner
from emb.areas import AreasError
from emb.areas.fetch import FetchError, fetch

NEEDED = ["14N/x0y1", "15N/x1y2", "15N/x0y0"]  # tiles the area's parts meet


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with ``Range: bytes=N-`` (206), a log of what was asked, and faults."""

    requests: list[tuple[str, str]] = []
    truncate: set[str] = set()  # names answered with half their bytes
    html: set[str] = set()  # names answered 200 with a sign-in page
    whole: set[str] = set()  # names whose Range requests are answered 206 with every byte
    digest: str = ""  # "goog": x-goog-hash crc32c and md5 of the stored object; "etag": MD5 ETag
    garbage: dict[str, tuple[int, int]] = {}  # name -> (offset, length) sent inverted
    encoded: dict[str, str] = {}  # name -> the Content-Encoding it is sent with
    unavailable: dict[str, int] = {}  # name -> how many more requests get 503
    stall: set[str] = set()  # names answered with nothing (the client times out)

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        type(self).requests.append((self.path, self.headers.get("Range", "")))
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        if path.name in type(self).stall:
            time.sleep(1.0)
            return
        if type(self).unavailable.get(path.name, 0) > 0:
            type(self).unavailable[path.name] -= 1
            self.send_error(503, "Service Unavailable")
            return
        stored = path.read_bytes()
        encoding = type(self).encoded.get(path.name, "")
        if encoding:  # stored compressed, as a bucket holds an object uploaded gzipped
            stored = gzip.compress(stored) if encoding == "gzip" else stored[::-1]
        data = stored
        if path.name in type(self).garbage:  # same length, some bytes wrong on the wire
            offset, length = type(self).garbage[path.name]
            wrong = bytes(255 - b for b in data[offset : offset + length])
            data = data[:offset] + wrong + data[offset + length :]
        start = 0
        if path.name in type(self).html:
            data = b"<html><body>Sign in</body></html>" * 50
            self.send_response(200)
        elif path.name in type(self).whole and self.headers.get("Range"):
            self.send_response(206)
            self.send_header("Content-Range", f"bytes 0-{len(data) - 1}/{len(data)}")
        elif self.headers.get("Range", "").startswith("bytes="):
            start = int(self.headers["Range"][6:].split("-")[0])
            if start >= len(data):
                self.send_error(416, "Range Not Satisfiable")
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        md5 = hashlib.md5(stored).digest()  # of the object as stored, whatever was sent
        if type(self).digest == "goog":
            crc = google_crc32c.value(stored).to_bytes(4, "big")
            self.send_header("x-goog-hash", "crc32c=" + base64.b64encode(crc).decode())
            self.send_header("x-goog-hash", "md5=" + base64.b64encode(md5).decode())
        elif type(self).digest == "etag":
            self.send_header("ETag", f'"{md5.hex()}"')
        if encoding:
            self.send_header("Content-Encoding", encoding)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if path.name in type(self).truncate:
            body = body[: len(body) // 2]  # the connection drops midway
        self.wfile.write(body)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Collection, str]]:
    c = make_collection(tmp_path_factory.mktemp("served"))
    handler = functools.partial(RangeHandler, directory=str(c.aef))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield c, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(autouse=True)
def healthy_server() -> Iterator[None]:
    """Every fault off again after a test, whatever it set."""
    yield
    RangeHandler.truncate, RangeHandler.html, RangeHandler.whole = set(), set(), set()
    RangeHandler.digest, RangeHandler.garbage, RangeHandler.encoded = "", {}, {}
    RangeHandler.unavailable, RangeHandler.stall = {}, set()


def name_of(key: str) -> str:
    return f"{key.split('/')[1]}-0000000000-0000000000.tiff"


class Killed(BaseException):
    """The process stopped mid-verification (a kill, a power cut): no handler runs."""


def final_path(checked: Path) -> Path:
    """The tile's path for a file being checked (``x.tiff.part``, ``x.tiff.part.gunzip``)."""
    return checked.with_name(checked.name.split(".part")[0])


def tile(root: Path, key: str) -> Path:
    zone, name = key.split("/")
    return root / str(YEAR) / zone / f"{name}-0000000000-0000000000.tiff"


def local_copy(c: Collection, root: Path) -> dict:
    """The collection without the NEEDED tiles, one of them half downloaded."""
    shutil.copytree(c.aef, root / "aef")
    for key in NEEDED:
        tile(root / "aef", key).unlink()
    half = tile(c.aef, NEEDED[0]).read_bytes()
    part = tile(root / "aef", NEEDED[0])
    part.with_name(part.name + ".part").write_bytes(half[: len(half) // 3])
    return {"aef": {"folder": str(root / "aef"), "index": str(root / "aef/aef_index.parquet")}}


def test_fetch_downloads_exactly_the_missing_tiles_and_resumes_a_partial_one(
    served, tmp_path: Path
) -> None:
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    RangeHandler.requests.clear()
    out = tmp_path / "fetched.tsv"
    records = fetch(c.areas, collections, "aef", workers=3, out=out)
    assert sorted(r["key"] for r in records) == sorted(
        f"{YEAR}/{k.split('/')[0]}/{k.split('/')[1]}-0000000000-0000000000.tiff" for k in NEEDED
    )
    for key in NEEDED:
        assert tile(tmp_path / "aef", key).read_bytes() == tile(c.aef, key).read_bytes()
    asked = Counter(path for path, _ in RangeHandler.requests)
    assert asked == {f"/{YEAR}/{key}-0000000000-0000000000.tiff": 1 for key in NEEDED}
    third = len(tile(c.aef, NEEDED[0]).read_bytes()) // 3  # what local_copy left as the part
    resumed = [r for p, r in RangeHandler.requests if NEEDED[0].split("/")[1] in p]
    assert resumed == [f"bytes={third}-"]  # continued where the part ends, once
    assert out.read_text().count("\n") == len(NEEDED) + 1
    RangeHandler.requests.clear()
    assert fetch(c.areas, collections, "aef", workers=3, out=out) == []
    assert RangeHandler.requests == []


def test_a_missing_object_and_a_dropped_connection_are_named(served, tmp_path: Path) -> None:
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url + "/nowhere"
    with pytest.raises(FetchError) as err:
        fetch(c.areas, collections, "aef", workers=2, out=tmp_path / "f.tsv")
    assert "HTTP 404" in str(err.value) and "/nowhere/2024/" in str(err.value)
    assert "\n" not in str(err.value)
    collections["aef"]["url"] = url
    name = f"{NEEDED[1].split('/')[1]}-0000000000-0000000000.tiff"
    RangeHandler.truncate = {name}
    try:
        with pytest.raises(FetchError) as err:
            fetch(c.areas, collections, "aef", workers=2, out=tmp_path / "f.tsv")
    finally:
        RangeHandler.truncate = set()
    assert name in str(err.value) and "a rerun resumes" in str(err.value)
    assert (
        stage_runner.exit_code(err.value) == stage_runner.EXIT_INPUT
    )  # one line, not a bug's traceback
    assert not tile(tmp_path / "aef", NEEDED[1]).exists()  # never a partial file in its place
    assert not (tmp_path / "f.tsv").exists()


def test_an_index_row_outside_the_folder_is_refused_before_any_request(
    served, tmp_path: Path
) -> None:
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    index = Path(collections["aef"]["index"])
    table = pq.read_table(index)
    paths = table.column("path").to_pylist()
    row = next(i for i, p in enumerate(paths) if NEEDED[1].split("/")[1] in p)
    paths[row] = "../../../escaped.tiff"
    pq.write_table(
        table.set_column(table.column_names.index("path"), "path", pa.array(paths)), index
    )
    RangeHandler.requests.clear()
    with pytest.raises(AreasError, match=r"index row '\.\./\.\./\.\./escaped\.tiff'.*outside"):
        fetch(c.areas, collections, "aef", workers=2, out=tmp_path / "f.tsv")
    assert RangeHandler.requests == []


def test_a_sign_in_page_never_reaches_the_tile_path(
    served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the moment the page is checked it is the part, never the tile's path; it is refused
    as no raster, asked for once (a 200 answer is not retried) and deleted, so the next run
    starts that tile from byte 0 instead of resuming the page."""
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    name = name_of(NEEDED[1])
    final = tile(tmp_path / "aef", NEEDED[1])
    seen: list[tuple[str, bool]] = []
    check_tile = emb.areas.fetch.check_tile

    def watched(where, source, t, listed_in, fetching):  # what is on disk as it is checked
        seen.append((t.path.name, final_path(t.path).exists()))
        return check_tile(where, source, t, listed_in, fetching)

    monkeypatch.setattr(emb.areas.fetch, "check_tile", watched)
    RangeHandler.html = {name}
    RangeHandler.requests.clear()
    with pytest.raises(AreasError, match=f"{name}.*cannot read the tile as a raster"):
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    assert (name + ".part", False) in seen and not any(there for _, there in seen)
    assert [p for p, _ in RangeHandler.requests].count(
        f"/{YEAR}/{NEEDED[1]}-0000000000-0000000000.tiff"
    ) == 1
    assert not final.exists() and not final.with_name(name + ".part").exists()
    RangeHandler.html = set()
    RangeHandler.requests.clear()
    fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    again = [r for p, r in RangeHandler.requests if name in p]
    assert again == [""]  # from zero: the page was not kept as a part to continue
    assert final.read_bytes() == tile(c.aef, NEEDED[1]).read_bytes()


def test_a_tile_killed_mid_check_is_not_at_its_path_and_the_next_run_checks_it(
    served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash while a download is verified leaves the part, never a file at the tile's path
    (which the next plan would trust); the next run verifies the part before it moves it."""
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    final = tile(tmp_path / "aef", NEEDED[1])
    check_tile = emb.areas.fetch.check_tile

    def killed(where, source, t, listed_in, fetching):
        if final_path(t.path) == final:
            raise Killed
        return check_tile(where, source, t, listed_in, fetching)

    monkeypatch.setattr(emb.areas.fetch, "check_tile", killed)
    with pytest.raises(Killed):
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    assert not final.exists()  # a rename before the check would have left it here
    assert (
        final.with_name(final.name + ".part").stat().st_size
        == final_path(tile(c.aef, NEEDED[1])).stat().st_size
    )
    checked: list[str] = []

    def counted(where, source, t, listed_in, fetching):
        checked.append(t.path.name)
        return check_tile(where, source, t, listed_in, fetching)

    monkeypatch.setattr(emb.areas.fetch, "check_tile", counted)
    RangeHandler.garbage = {}
    fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    assert final.name + ".part" in checked
    assert final.read_bytes() == tile(c.aef, NEEDED[1]).read_bytes()


def block_bytes(path: Path) -> tuple[int, int]:
    """(offset, length) inside the file of the start of the first block's deflate stream: a
    block other than the last, so only a check of the whole file can see it changed (its
    header: bytes inside a stored deflate block decode whatever they are)."""
    with rasterio.open(path) as src:
        offset = int(src.get_tag_item("BLOCK_OFFSET_0_0", "TIFF", bidx=1))
    return offset, 16


@pytest.mark.parametrize(("digest", "named"), [("goog", "x-goog-hash md5"), ("etag", "ETag")])
def test_a_corrupt_tile_of_the_right_size_is_refused_by_the_servers_md5(
    served, tmp_path: Path, digest: str, named: str
) -> None:
    """Same length, header and last block intact, bytes wrong inside: the MD5 the server
    states refuses it; nothing at its path, no part left to resume."""
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    name = name_of(NEEDED[1])
    RangeHandler.digest = digest
    RangeHandler.garbage = {name: block_bytes(tile(c.aef, NEEDED[1]))}
    with pytest.raises(AreasError) as err:
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    assert name in str(err.value) and f"server's {named} says" in str(err.value)
    final = tile(tmp_path / "aef", NEEDED[1])
    assert not final.exists() and not final.with_name(name + ".part").exists()
    RangeHandler.garbage = {}
    fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    for key in NEEDED:  # the intact answers pass the same check
        assert tile(tmp_path / "aef", key).read_bytes() == tile(c.aef, key).read_bytes()


def test_without_a_digest_a_corrupt_tile_is_refused_by_a_full_decode(
    served, tmp_path: Path
) -> None:
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    name = name_of(NEEDED[1])
    RangeHandler.garbage = {name: block_bytes(tile(c.aef, NEEDED[1]))}
    with pytest.raises(AreasError, match=f"{name}.*no MD5 from the server.*does not decode"):
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    final = tile(tmp_path / "aef", NEEDED[1])
    assert not final.exists() and not final.with_name(name + ".part").exists()


def test_a_gzip_encoded_tile_is_decoded_and_another_encoding_named(served, tmp_path: Path) -> None:
    """``Content-Encoding: gzip`` is the same object compressed on the wire (its MD5 is of the
    compressed bytes, as GCS states it): decoded, checked, stored as the plain tile."""
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    RangeHandler.digest = "goog"
    RangeHandler.encoded = {name_of(k): "gzip" for k in NEEDED}
    RangeHandler.requests.clear()
    fetch(c.areas, collections, "aef", workers=2, out=tmp_path / "f.tsv")
    third = len(tile(c.aef, NEEDED[0]).read_bytes()) // 3  # the part left by a plain transfer
    asked = [r for p, r in RangeHandler.requests if name_of(NEEDED[0]) in p]
    assert asked == [f"bytes={third}-", ""]  # an encoded range does not continue it: from 0
    for key in NEEDED:
        got = tile(tmp_path / "aef", key)
        assert got.read_bytes() == tile(c.aef, key).read_bytes()
        assert not list(got.parent.glob(got.name + ".part*"))
    collections = local_copy(c, tmp_path / "br")
    collections["aef"]["url"] = url
    name = name_of(NEEDED[2])
    RangeHandler.encoded = {name: "br"}
    with pytest.raises(AreasError, match=f"{name}.*Content-Encoding: br"):
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    assert not tile(tmp_path / "br/aef", NEEDED[2]).exists()


def test_a_whole_gzip_part_answered_416_is_decoded_not_fetched_again(
    served, tmp_path: Path
) -> None:
    """A run stopped after the last byte of a gzip answer and before its check leaves the
    whole ``.part``; the next run's Range asks past its end and gets 416, with no
    Content-Encoding: the part's magic bytes say gzip, so it is decoded and kept (one request),
    not checked as a tile, refused and fetched again."""
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    name = name_of(NEEDED[1])
    RangeHandler.encoded = {name: "gzip"}
    final = tile(tmp_path / "aef", NEEDED[1])
    sent = gzip.compress(tile(c.aef, NEEDED[1]).read_bytes())  # as the server sends it
    final.with_name(name + ".part").write_bytes(sent)
    RangeHandler.requests.clear()
    fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    assert [r for p, r in RangeHandler.requests if name in p] == [f"bytes={len(sent)}-"]
    assert final.read_bytes() == tile(c.aef, NEEDED[1]).read_bytes()
    assert not list(final.parent.glob(name + ".part*"))


def test_each_retry_is_logged_with_its_wait(
    served, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server answering 503 twice, then the tile: two lines, each with the wait before the
    next try; a stalled server: a line per attempt, then the error names the attempts."""
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    name = name_of(NEEDED[1])
    RangeHandler.unavailable = {name: 2}
    caplog.set_level(logging.WARNING, logger="emb.areas.fetch")
    fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv", backoff=0.1)
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(lines) == 2, lines
    assert "attempt 1 of 4 failed (" in lines[0] and "HTTP 503" in lines[0]
    assert lines[0].endswith("retrying in 0.1 s") and lines[1].endswith("retrying in 0.2 s")
    assert tile(tmp_path / "aef", NEEDED[1]).read_bytes() == tile(c.aef, NEEDED[1]).read_bytes()
    caplog.clear()
    collections = local_copy(c, tmp_path / "stalled")
    collections["aef"]["url"] = url
    name = name_of(NEEDED[2])
    RangeHandler.stall = {name}
    began = time.monotonic()
    with pytest.raises(FetchError, match=f"{name}.*after 4 attempts.*timed out"):
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv",
              timeout=0.3, backoff=0.1)  # fmt: skip
    assert time.monotonic() - began < 10
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert [re.search(r"attempt (\d) of 4 failed", line)[1] for line in lines] == ["1", "2", "3"]
    assert all("timed out" in line for line in lines), lines
    assert [line.split("; ")[-1] for line in lines] == [
        f"retrying in {w} s" for w in ("0.1", "0.2", "0.4")
    ]


def test_a_range_answered_with_the_whole_object_restarts_from_zero(served, tmp_path: Path) -> None:
    c, url = served
    collections = local_copy(c, tmp_path)  # NEEDED[0] is a third downloaded
    collections["aef"]["url"] = url
    name = f"{NEEDED[0].split('/')[1]}-0000000000-0000000000.tiff"
    RangeHandler.whole = {name}
    try:
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    finally:
        RangeHandler.whole = set()
    assert tile(tmp_path / "aef", NEEDED[0]).read_bytes() == tile(c.aef, NEEDED[0]).read_bytes()


def test_snakemake_fetches_then_writes_the_vrts(served, tmp_path: Path) -> None:
    """Then another mirror and other download threads rerun nothing: not the fetch, not the
    VRTs and the table (every rule after them would rerun otherwise); another CDL path, which
    is the regions' content, reruns rule areas."""
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    collections["cdl"] = {"path": str(c.cdl_one).replace(str(YEAR), "{year}")}
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    settings = {
        "regions": "",
        "areas": str(c.areas),
        "collections": collections,
        "runs": ["aef_segformer"],
    }
    (work / "areas.yaml").write_text(yaml.safe_dump(settings))
    result = run_snakemake(work, ["areas.yaml"], "--cores", "1", "results/areas/regions.tsv")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rule fetch_tiles:" in result.stdout + result.stderr
    log = (work / "logs/areas/fetch_aef.log").read_text()
    assert "fetch aef: 3 tiles missing" in log and "fetch aef: 3 tiles," in log
    table = (work / "results/areas/regions.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in table] == [
        "region",
        "field_trial_14n",
        "field_trial_15n",
    ]
    for zone in ("14N", "15N"):  # the VRT reads the served tiles' pixels at their ground
        lon, lat = ground_points(zone)
        by_tile = [values_at(p, lon, lat) for p in sorted((c.aef / str(YEAR) / zone).glob("*"))]
        expected = np.fmax.reduce(np.nan_to_num(by_tile, nan=-999), axis=0)  # one tile a point
        assert (expected > -999).all()
        got = values_at(work / f"resources/areas/field_trial_{zone.lower()}/aef.vrt", lon, lat)
        assert np.array_equal(got, expected) and (got != -128).sum() > 500
    outputs = sorted((work / "resources/areas").rglob("*.vrt")) + [
        work / "results/areas/regions.tsv"
    ]
    before = {p: p.stat().st_mtime_ns for p in outputs}
    handler = functools.partial(RangeHandler, directory=str(c.aef))
    mirror = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=mirror.serve_forever, daemon=True).start()
    try:
        collections["aef"]["url"] = f"http://127.0.0.1:{mirror.server_address[1]}/"
        collections["workers"] = 2
        (work / "areas.yaml").write_text(yaml.safe_dump({**settings, "collections": collections}))
        dry = run_snakemake(work, ["areas.yaml"], "-n", "results/areas/regions.tsv")
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert "Nothing to be done" in dry.stdout, dry.stdout[-3000:]
        RangeHandler.requests.clear()
        again = run_snakemake(work, ["areas.yaml"], "--cores", "1", "results/areas/regions.tsv")
        assert again.returncode == 0, again.stderr[-3000:]
        assert "rule areas:" not in again.stdout + again.stderr
        assert RangeHandler.requests == []  # every tile is there: the new mirror is not asked
        assert {p: p.stat().st_mtime_ns for p in outputs} == before
    finally:
        mirror.shutdown()
    shutil.copy(c.cdl_one, tmp_path / c.cdl_one.name)  # the same CDL elsewhere: new content
    collections["cdl"] = {"path": str(tmp_path / c.cdl_one.name).replace(str(YEAR), "{year}")}
    (work / "areas.yaml").write_text(yaml.safe_dump({**settings, "collections": collections}))
    dry = run_snakemake(work, ["areas.yaml"], "-n", "results/areas/regions.tsv")
    assert dry.returncode == 0 and "rule areas:" in dry.stdout, dry.stdout[-3000:]
    assert "rule fetch_tiles:" not in dry.stdout  # the CDL is not what it fetches
