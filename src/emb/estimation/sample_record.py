"""``sample.json``: the record of a drawn sample, written by the design and read back by the
estimate. One dataclass, one format, writer and reader together.

The record holds what the estimate needs (the strata's pixels, each stratum's allocation, the
level and its class names, the pixel area) and what reproduces the draw (the maps and their
digests, n, min_per_class, the seed, the scan order). Keys the reader needs are those of
``RECORD_KEYS`` (and of each map and stratum); records written before the maps carried their
own pixel area and size still read (the record's ``pixel_ha``, sizes 0), and so do records
without districts (strata = the classes, as every record was before districts).

A design over districts records them (``districts``: the file, its digest, the name field and
the names in the file's order, so ids 1..D) and has (D + 1) * K strata, district-major: stratum
``district * K + class``, district 0 the outside; each stratum names its district.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emb.classes import ClassMap
from emb.estimation.districts import OUTSIDE, Districts
from emb.estimation.population import level_names
from emb.io import json_text
from emb.provenance import digest_file

METHOD = "stratified random sample of map pixels; strata = map classes (Olofsson et al. 2014)"
DISTRICT_METHOD = (
    "stratified random sample of map pixels; strata = (district, map class) pairs, district 0 "
    "the pixels no district holds (Olofsson et al. 2014 within each district)"
)
SCAN_ORDER = (
    "maps in the order listed, each row-major from its top row; a stratum's units are its "
    "pixels whose 0-based rank in this order was drawn"
)
# The sample's CSV columns (the CSV and the GeoPackage hold them; the record lists them).
COLUMNS = ("id", "region", "x", "y", "crs", "lon", "lat", "map_class", "map_name", "reference")
DISTRICT_COLUMN = "district"  # after region, in a design over districts: the district's name
RECORD_KEYS = ("level", "class_names", "maps", "strata", "n_drawn", "seed", "pixel_ha")
MAP_KEYS = ("region", "path", "sha256", "crs")
STRATUM_KEYS = ("class", "pixels", "allocated")
DISTRICTS_KEYS = ("path", "sha256", "name_field", "names")


def columns(districts: bool) -> tuple[str, ...]:
    """The sample's CSV columns: ``COLUMNS``, with ``district`` after ``region`` in a design
    over districts (a design without them keeps the columns every earlier sample has)."""
    if not districts:
        return COLUMNS
    at = COLUMNS.index("region") + 1
    return (*COLUMNS[:at], DISTRICT_COLUMN, *COLUMNS[at:])


class SampleRecordError(ValueError):
    """A ``sample.json`` that cannot be read back as a design's record."""


@dataclass(frozen=True)
class MapRecord:
    """One map file of a design: ``pixels`` = its mapped (not nodata) pixels."""

    region: str
    path: str
    sha256: str
    crs: str
    pixel_ha: float
    width: int
    height: int
    pixels: int


@dataclass(frozen=True)
class StrataDistricts:
    """The districts a design was stratified by: ``names`` in the file's order (id = index +
    1), ``path``, ``sha256`` and ``name_field`` to read them again."""

    path: str
    sha256: str
    name_field: str
    names: tuple[str, ...]

    @classmethod
    def of(cls, districts: Districts) -> StrataDistricts:
        """The record of ``districts``; the regions' footprints (``path`` their maps' folder)
        have no file of their own: the maps' digests in the record pin them (sha256 "")."""
        path = Path(districts.path)
        return cls(str(path), digest_file(path) if path.is_file() else "",
                   districts.name_field, tuple(districts.names))  # fmt: skip

    def names_by_id(self) -> tuple[str, ...]:
        """Domain names indexed by id: ``outside`` at 0, then the districts."""
        return (OUTSIDE, *self.names)


@dataclass(frozen=True)
class SampleRecord:
    """A design as ``sample.json`` holds it: ``strata_px`` (K,) int64 N_h and ``allocation``
    (K,) int64 n_h over the K classes of ``level``; units carry ids 1..``n_drawn``; ``n`` is the
    n asked for. ``path``: the file it was read from (None for a record not yet written)."""

    level: int
    class_names: tuple[str, ...]
    maps: tuple[MapRecord, ...]
    strata_px: np.ndarray
    allocation: np.ndarray
    n: int | str
    n_drawn: int
    min_per_class: int
    seed: int
    pixel_ha: float
    path: Path | None = None
    target: float | None = None  # n "auto": the relative half-width aimed at
    expected_half_width: tuple[float | None, ...] | None = None  # per class, where targeted
    districts: StrataDistricts | None = None  # strata (district, class): (D + 1) * K of them

    @property
    def n_districts(self) -> int:
        """Domains the strata are split by: D + 1 with districts (the outside too), else 1."""
        return 1 if self.districts is None else len(self.districts.names) + 1

    def stratum_class(self) -> np.ndarray:
        """(H,) int64 the class at the level of each stratum."""
        return np.tile(np.arange(len(self.class_names), dtype=np.int64), self.n_districts)

    def stratum_district(self) -> np.ndarray:
        """(H,) int64 the district of each stratum (all 0 without districts)."""
        return np.repeat(np.arange(self.n_districts, dtype=np.int64), len(self.class_names))

    def stratum_name(self, h: int) -> str:
        """Stratum ``h`` as messages name it: its id and class, and its district if any."""
        k = len(self.class_names)
        named = f"{h} {self.class_names[h % k]!r}"
        if self.districts is None:
            return named
        return f"{named} of district {self.districts.names_by_id()[h // k]!r}"

    def to_json(self) -> dict:
        """The record's JSON object, keys in the file's order."""
        k = len(self.class_names)
        names = None if self.districts is None else self.districts.names_by_id()
        strata = [
            {"class": h % k, "name": self.class_names[h % k], "pixels": int(px),
             "allocated": int(n), **({} if names is None else
                                     {"district": h // k, "district_name": names[h // k]})}
            for h, (px, n) in enumerate(zip(self.strata_px, self.allocation, strict=True))
        ]  # fmt: skip
        return {
            "method": METHOD if self.districts is None else DISTRICT_METHOD,
            "level": self.level,
            "class_names": list(self.class_names),
            "maps": [vars(r) for r in self.maps],
            "strata": strata,
            "n": self.n,
            "n_drawn": self.n_drawn,
            "min_per_class": self.min_per_class,
            "seed": self.seed,
            "pixel_ha": self.pixel_ha,
            "total_pixels": int(self.strata_px.sum()),
            "scan_order": SCAN_ORDER,
            "numpy": np.__version__,
            "columns": list(columns(self.districts is not None)),
            **({} if self.districts is None else {"districts": vars(self.districts)}),
            **({} if self.target is None else {
                "target": self.target, "expected_half_width": list(self.expected_half_width or ())
            }),
        }  # fmt: skip

    def text(self) -> str:
        """The file's text (indented JSON, one newline at the end)."""
        return json_text(self.to_json(), indent=2) + "\n"


def read_record(path: Path | str, cmap: ClassMap, sample: Path | str | None = None) -> SampleRecord:
    """The record at ``path``, checked for its keys and for class names that are the config's
    at its level (else its stratum ids would name other classes); ``sample``: the labelled CSV
    it is read for, named in a refusal."""
    path = Path(path)
    about = f"{sample}: " if sample else ""
    if not path.is_file():
        raise SampleRecordError(
            f"{about}no design record at {path}: a sample is estimated only with the record "
            f"its design wrote beside it (sample.json)"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SampleRecordError(f"{path}: not a JSON design record ({err})") from err
    if not isinstance(data, dict):
        raise SampleRecordError(f"{path}: expected a JSON object, found {type(data).__name__}")
    _need(path, "the record", data, RECORD_KEYS)
    for i, entry in enumerate(data["maps"]):
        _need(path, f"maps[{i}]", entry, MAP_KEYS)
    for i, entry in enumerate(data["strata"]):
        _need(path, f"strata[{i}]", entry, STRATUM_KEYS)
    level = data["level"]
    try:
        names = level_names(level, cmap)
    except ValueError as err:
        raise SampleRecordError(f"{path}: key level: {err}") from err
    if tuple(data["class_names"]) != names:
        raise SampleRecordError(
            f"{path}: class_names of level {level} differ from the class table's "
            f"(expected {list(names)}, found {data['class_names']})"
        )
    districts = _districts(path, data.get("districts"))
    domains = 1 if districts is None else len(districts.names) + 1
    classes = [s["class"] for s in data["strata"]]
    if classes != list(range(len(names))) * domains:
        per = "" if districts is None else f", once per district and the outside ({domains})"
        raise SampleRecordError(
            f"{path}: strata must list classes 0..{len(names) - 1} in order{per}, found {classes}"
        )
    if districts is not None:
        found = [s.get("district") for s in data["strata"]]
        if found != [d for d in range(domains) for _ in names]:
            raise SampleRecordError(
                f"{path}: strata must name their districts 0..{domains - 1} in order, "
                f"{len(names)} classes each, found {found}"
            )
    maps = tuple(
        MapRecord(
            region=m["region"],
            path=m["path"],
            sha256=m["sha256"],
            crs=m["crs"],
            pixel_ha=float(m.get("pixel_ha", data["pixel_ha"])),
            width=int(m.get("width", 0)),
            height=int(m.get("height", 0)),
            pixels=int(m.get("pixels", 0)),
        )  # fmt: skip
        for m in data["maps"]
    )
    n_drawn = int(data["n_drawn"])
    n = data.get("n", n_drawn)
    return SampleRecord(
        level=level, class_names=names, maps=maps,
        strata_px=np.array([s["pixels"] for s in data["strata"]], np.int64),
        allocation=np.array([s["allocated"] for s in data["strata"]], np.int64),
        n=n if n == "auto" else int(n), n_drawn=n_drawn,
        min_per_class=int(data.get("min_per_class", 0)), seed=int(data["seed"]),
        pixel_ha=float(data["pixel_ha"]), path=path, districts=districts,
    )  # fmt: skip


def _districts(path: Path, data: object) -> StrataDistricts | None:
    """The record's districts (None in a record without them), checked for their keys."""
    if data is None:
        return None
    _need(path, "districts", data, DISTRICTS_KEYS)
    assert isinstance(data, dict)  # _need refused anything else
    names = data["names"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise SampleRecordError(
            f"{path}: districts.names: expected a list of names, found {names!r}"
        )
    return StrataDistricts(str(data["path"]), str(data["sha256"]), str(data["name_field"]),
                           tuple(names))  # fmt: skip


def _need(path: Path, where: str, data: object, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise SampleRecordError(f"{path}: {where} lacks keys {missing} of a design record")
