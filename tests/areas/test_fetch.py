"""Fetching exactly the tiles the areas need from a base URL: a real HTTP server on
127.0.0.1 serving the synthesized tiles (Range requests as object stores answer them)."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from areas_collection import YEAR, Collection, make_collection, run_snakemake
from conftest import REPO
from test_plan import ground_points, values_at

from emb import cli
from emb.areas import AreasError
from emb.areas.fetch import FetchError, fetch

NEEDED = ["14N/x0y1", "15N/x1y2", "15N/x0y0"]  # tiles the area's parts meet


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with ``Range: bytes=N-`` (206), a log of what was asked, and faults."""

    requests: list[tuple[str, str]] = []
    truncate: set[str] = set()  # names answered with half their bytes
    html: set[str] = set()  # names answered 200 with a sign-in page
    whole: set[str] = set()  # names whose Range requests are answered 206 with every byte

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        type(self).requests.append((self.path, self.headers.get("Range", "")))
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        data = path.read_bytes()
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
    assert cli.exit_code(err.value) == cli.EXIT_INPUT  # one line, not a bug's traceback
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


def test_a_sign_in_page_never_reaches_the_tile_path(served, tmp_path: Path) -> None:
    c, url = served
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    name = f"{NEEDED[1].split('/')[1]}-0000000000-0000000000.tiff"
    RangeHandler.html = {name}
    try:
        with pytest.raises(AreasError, match=name):
            fetch(c.areas, collections, "aef", workers=1, out=tmp_path / "f.tsv")
    finally:
        RangeHandler.html = set()
    final = tile(tmp_path / "aef", NEEDED[1])
    assert not final.exists() and not final.with_name(name + ".part").exists()


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
