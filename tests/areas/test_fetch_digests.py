"""Every download verified the way its server publishes it (issue 51, items 8 and 10): the
CRC32C of ``x-goog-hash`` (GCS composite objects state nothing else), the MD5 where stated, a
full decode only where neither is; a gzip answer matched against the digest of the bytes
received or of the decoded bytes; an index row that climbs out of the collection refused when
the plan is made (while the workflow parses), before any request. A real HTTP server on
127.0.0.1 serves the synthesized tiles with the headers each case needs."""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from areas_collection import Collection, make_collection
from test_fetch import NEEDED, local_copy, name_of, tile

from emb.areas import AreasError
from emb.areas.fetch import check_decodes, fetch, served_digests
from emb.workflow.area_plan import plan_from_config


def crc32c(data: bytes) -> bytes:
    return google_crc32c.value(data).to_bytes(4, "big")


OTHER = b"another object"
DIGESTS = {"md5": lambda data: hashlib.md5(data).digest(), "crc32c": crc32c}


class DigestHandler(http.server.SimpleHTTPRequestHandler):
    """Whole files, each answered as ``answers[name]`` says: ``gzip`` (sent with
    Content-Encoding: gzip), ``flip`` (a byte offset sent inverted), and per digest kind
    (md5, crc32c) which bytes ``x-goog-hash`` states it of: "received" (the body as sent,
    flip aside), "decoded" (the tile itself), "other" (another object) or absent (none)."""

    answers: dict[str, dict] = {}
    asked: list[str] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        type(self).asked.append(self.path)
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        how = type(self).answers.get(path.name, {})
        stored = path.read_bytes()
        body = gzip.compress(stored, mtime=0) if how.get("gzip") else stored
        of = {"received": body, "decoded": stored, "other": OTHER}
        if "flip" in how:  # same length, one byte wrong on the wire
            at = how["flip"]
            body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1 :]
        stated = [f"{kind}={base64.b64encode(DIGESTS[kind](of[how[kind]])).decode()}"
                  for kind in ("crc32c", "md5") if how.get(kind)]  # fmt: skip
        self.send_response(200)
        if stated:
            self.send_header("x-goog-hash", ", ".join(stated))
        if how.get("gzip"):
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Collection, str]]:
    c = make_collection(tmp_path_factory.mktemp("digests"))
    handler = functools.partial(DigestHandler, directory=str(c.aef))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield c, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(autouse=True)
def plain_answers() -> Iterator[None]:
    yield
    DigestHandler.answers, DigestHandler.asked = {}, []


def copy_to_fetch(c: Collection, root: Path, url: str) -> dict:
    """The collection without the NEEDED tiles (and no part left), fetching from ``url``."""
    collections = local_copy(c, root)
    for part in (root / "aef").rglob("*.part"):
        part.unlink()
    collections["aef"]["url"] = url
    return collections


@pytest.fixture(scope="module")
def silent_flip(server, tmp_path_factory: pytest.TempPathFactory) -> int:
    """A byte of NEEDED[1] whose inversion every block still decodes (deflate without its
    checksum read): garbage a full decode lets through. Found by the real check."""
    c, _ = server
    original = tile(c.aef, NEEDED[1]).read_bytes()
    probe = tmp_path_factory.mktemp("probe") / "probe.tiff"
    for at in range(len(original) // 20, len(original), 997):
        probe.write_bytes(original[:at] + bytes([original[at] ^ 0xFF]) + original[at + 1 :])
        try:
            check_decodes(probe, "probe")
        except AreasError:
            continue
        return at
    pytest.fail("no byte of the tile decodes when inverted")


def test_a_crc32c_alone_refuses_garbage_a_full_decode_lets_through(
    server, silent_flip: int, tmp_path: Path
) -> None:
    """A composite object (x-goog-hash crc32c, no md5): before, a full decode was the only
    check, and it kept this tile with a byte wrong."""
    c, url = server
    name = name_of(NEEDED[1])
    DigestHandler.answers = {name: {"flip": silent_flip}}  # no digest: the decode's gap
    collections = copy_to_fetch(c, tmp_path / "nothing", url)
    fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    kept = tile(tmp_path / "nothing/aef", NEEDED[1]).read_bytes()
    assert kept != tile(c.aef, NEEDED[1]).read_bytes()  # what the decode let through

    DigestHandler.answers = {name: {"flip": silent_flip, "crc32c": "received"}}
    collections = copy_to_fetch(c, tmp_path / "crc", url)
    with pytest.raises(AreasError) as err:
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    text = str(err.value)
    assert name in text and "its bytes have CRC32C " in text, text
    true_crc = crc32c(tile(c.aef, NEEDED[1]).read_bytes()).hex()
    assert f"server's x-goog-hash crc32c says {true_crc}: corrupt in transit" in text, text
    final = tile(tmp_path / "crc/aef", NEEDED[1])
    assert not final.exists() and not final.with_name(final.name + ".part").exists()
    DigestHandler.answers = {name: {"crc32c": "received"}}
    fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    assert final.read_bytes() == tile(c.aef, NEEDED[1]).read_bytes()


def test_with_a_digest_no_full_decode_is_made(
    server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode of every block is the fallback only: a stated digest (either kind) is the
    check, and the last block's read (truncation) the only decoding."""
    c, url = server
    decoded: list[Path] = []
    monkeypatch.setattr("emb.areas.fetch.check_decodes", lambda path, _url: decoded.append(path))
    for kind in ("crc32c", "md5"):
        DigestHandler.answers = {name_of(k): {kind: "received"} for k in NEEDED}
        fetch(c.areas, copy_to_fetch(c, tmp_path / kind, url), "aef", workers=2,
              out=tmp_path / "f.tsv")  # fmt: skip
    assert decoded == []
    DigestHandler.answers = {}
    fetch(c.areas, copy_to_fetch(c, tmp_path / "none", url), "aef", workers=2,
          out=tmp_path / "f.tsv")  # fmt: skip
    assert len(decoded) == len(NEEDED)


@pytest.mark.parametrize("hashed", ["received", "decoded"])
def test_a_gzip_answer_matches_a_digest_of_the_bytes_received_or_decoded(
    server, tmp_path: Path, hashed: str
) -> None:
    """GCS hashes the stored object (gzipped here); other servers hash the content: both
    are a match, for MD5 and CRC32C alike, and the tile is stored decoded."""
    c, url = server
    DigestHandler.answers = {name_of(k): {"gzip": True, "md5": hashed, "crc32c": hashed}
                             for k in NEEDED}  # fmt: skip
    collections = copy_to_fetch(c, tmp_path, url)
    fetch(c.areas, collections, "aef", workers=2, out=tmp_path / "f.tsv")
    for key in NEEDED:
        got = tile(tmp_path / "aef", key)
        assert got.read_bytes() == tile(c.aef, key).read_bytes()
        assert not list(got.parent.glob(got.name + ".part*"))


def test_a_gzip_answer_matching_neither_names_the_encoding_and_both_digests(
    server, tmp_path: Path
) -> None:
    c, url = server
    name = name_of(NEEDED[2])
    DigestHandler.answers = {name: {"gzip": True, "md5": "other"}}
    collections = copy_to_fetch(c, tmp_path, url)
    with pytest.raises(AreasError) as err:
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    stored = tile(c.aef, NEEDED[2]).read_bytes()
    received = hashlib.md5(gzip.compress(stored, mtime=0)).hexdigest()
    expected = (f"{name}: fetched from {url}/2024/{NEEDED[2]}-0000000000-0000000000.tiff: its "
                f"bytes as received (Content-Encoding: gzip) have MD5 {received}, decoded "
                f"{hashlib.md5(stored).hexdigest()}, but the server's x-goog-hash md5 says "
                f"{hashlib.md5(OTHER).hexdigest()}: corrupt in transit")  # fmt: skip
    assert expected in str(err.value), str(err.value)
    final = tile(tmp_path / "aef", NEEDED[2])
    assert not final.exists() and not list(final.parent.glob(final.name + ".part*"))


def test_served_digests_reads_gcs_and_s3_forms() -> None:
    class Headers(dict):
        def get_all(self, name: str) -> list[str]:
            return [v for k, v in self.items() if k.lower() == name.lower()]

    md5, crc = hashlib.md5(b"x").digest(), crc32c(b"x")
    gcs = Headers({"x-goog-hash": f"crc32c={base64.b64encode(crc).decode()},md5="
                                  f"{base64.b64encode(md5).decode()}"})  # fmt: skip
    assert [(d.kind, d.value, d.header) for d in served_digests(gcs)] == [
        ("md5", md5, "x-goog-hash md5"), ("crc32c", crc, "x-goog-hash crc32c")]  # fmt: skip
    composite = Headers({"x-goog-hash": f"crc32c={base64.b64encode(crc).decode()}"})
    assert [d.kind for d in served_digests(composite)] == ["crc32c"]
    s3 = Headers({"ETag": f'"{md5.hex()}"'})
    assert [(d.kind, d.header) for d in served_digests(s3)] == [("md5", "ETag")]
    assert served_digests(Headers({"ETag": f'"{md5.hex()}-3"'})) == ()  # multipart: no MD5
    assert served_digests(Headers({"x-goog-hash": "crc32c=!!"})) == ()
    assert google_crc32c.implementation == "c"  # the C extension, not the slow fallback


def test_an_index_row_outside_the_collection_is_refused_when_the_plan_is_made(
    server, tmp_path: Path
) -> None:
    """As the workflow parses (emb.workflow.area_plan.plan_from_config), before any request:
    like every other index problem, not only when the fetch job starts."""
    c, url = server
    collections = copy_to_fetch(c, tmp_path, url)
    index = Path(collections["aef"]["index"])
    table = pq.read_table(index)
    paths = table.column("path").to_pylist()
    row = next(i for i, p in enumerate(paths) if NEEDED[1].split("/")[1] in p)
    paths[row] = "../../../escaped.tiff"
    pq.write_table(
        table.set_column(table.column_names.index("path"), "path", pa.array(paths)), index
    )
    with pytest.raises(AreasError) as err:
        plan_from_config({"areas": str(c.areas), "collections": collections})
    text = str(err.value)
    assert text.startswith(f"{index}: index row '../../../escaped.tiff' would be read from or "
                           "fetched to ") and "outside the collection folder" in text  # fmt: skip
    assert DigestHandler.asked == []
    assert not (tmp_path / "escaped.tiff").exists()


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_a_matching_md5_does_not_excuse_a_crc32c_that_disagrees(
    server, tmp_path: Path, gzipped: bool
) -> None:
    """Every digest the server states must match, not any one: an MD5 of the right bytes
    beside a CRC32C of another object is refused (as received, and as decoded from gzip),
    naming the CRC32C."""
    c, url = server
    name = name_of(NEEDED[1])
    md5_of = "decoded" if gzipped else "received"
    DigestHandler.answers = {name: {"gzip": gzipped, "md5": md5_of, "crc32c": "other"}}
    collections = copy_to_fetch(c, tmp_path, url)
    with pytest.raises(AreasError) as err:
        fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    text = str(err.value)
    assert f"server's x-goog-hash crc32c says {crc32c(OTHER).hex()}" in text, text
    final = tile(tmp_path / "aef", NEEDED[1])
    assert not final.exists() and not list(final.parent.glob(final.name + ".part*"))
