"""The strips as the streaming passes read them (issue 58, item 5): a reader thread a few strips
ahead of the counting (same items, same order, its error in its place, stopped when the
counting stops, burning the districts there), strips read into uint8 planes of a ring counted
by a compiled loop (buffers reused from strip to strip), all under one GDAL environment; each
set against a whole-array count or a pass without them."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio
from test_design import write_map
from test_streams import ORIGIN, regions_and_their_count, wavy_districts

from emb import forks
from emb.classes import N_L3, ClassMap
from emb.estimation import design, holdout_counts, population
from emb.estimation.design import draw_points
from emb.estimation.districts import Districts, read_districts
from emb.estimation.holdout_counts import box_bands, read_population
from emb.estimation.population import AHEAD, PlaneRing, one_env, read_ahead


@pytest.fixture
def districts(tmp_path: Path) -> Districts:
    return read_districts(wavy_districts(tmp_path / "districts.geojson", 3, 5000.0, 1), "name")


def test_a_reader_thread_hands_the_items_in_order_and_its_error_in_its_place() -> None:
    def items() -> Iterator[int]:
        yield from range(10)
        raise ValueError("the eleventh read failed")

    got = []
    with pytest.raises(ValueError, match="the eleventh read failed"):
        for item in read_ahead(items(), threads=2):
            got.append(item)
    assert got == list(range(10))


def test_a_reader_thread_stops_when_the_counting_stops() -> None:
    closed, closer = threading.Event(), []

    def endless() -> Iterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closer.append(threading.current_thread().name)
            closed.set()

    taken = read_ahead(endless(), threads=2)
    assert [next(taken) for _ in range(3)] == [0, 1, 2]
    taken.close()
    assert closed.wait(5)
    assert closer == ["read-ahead"]  # the reads' files closed by the thread that opened them
    assert not any(t.name == "read-ahead" and t.is_alive() for t in threading.enumerate())


def test_tiles_side_by_side_are_one_read() -> None:
    """A grid of tiles, in any order, one over another: one band, one span (one read)."""
    boxes = np.array([(r, r + 64, c, c + 64) for c in (192, 0, 64, 128) for r in (64, 0, 128)]
                     + [(0, 64, 0, 64)])  # fmt: skip
    assert list(box_bands(boxes, 200, 300)) == [(0, 192, [(0, 256)])]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_population_in_thin_strips_is_a_whole_array_count(
    tmp_path: Path, districts: Districts, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Strips of 9 rows (planes reused: strips across districts, then in one, then across),
    tiles with gaps between them, a reader thread (buffers in turn) or none: per (domain, map,
    CDL) the pixels a whole-array count gives."""
    monkeypatch.setattr(holdout_counts, "STRIP_BYTES", 9 * 256 * holdout_counts.PLANE_BYTES)
    tiles = [(0, 0), (0, 128), (32, 32), (100, 192), (192, 0), (192, 128), (150, 60)]
    (maps, labels, indexes), want = regions_and_their_count(
        tmp_path, districts, 6, (ORIGIN[0] + 2560.0, ORIGIN[1] - 1280.0), tiles)  # fmt: skip
    got = read_population(maps, labels, indexes, districts, threads=threads)
    assert (want.sum((1, 2)) > 0).sum() >= 4
    assert np.array_equal(got.domains, want)


def test_the_design_draws_the_same_points_in_thin_strips_and_with_a_reader_thread(
    tmp_path: Path, districts: Districts, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Strips of 16 rows (one int64 buffer reused through strips across districts and strips
    in one), a reader thread or none: the same points as whole-map strips draw."""
    rng = np.random.default_rng(3)
    maps = []
    for name, origin in (("a", ORIGIN), ("b", (ORIGIN[0] + 1000.0, ORIGIN[1] - 2600.0))):
        values = rng.integers(0, N_L3, (300, 260), dtype=np.uint8)
        values[rng.random(values.shape) < 0.1] = 255
        maps.append(write_map(tmp_path / f"{name}.tif", values, origin=origin))

    def points(threads: int) -> list:
        design = draw_points(maps, 2, class_map, 900, 5, 11, districts=districts,
                             threads=threads)  # fmt: skip
        return list(zip(design.points.region.tolist(), design.points.x.tolist(),
                        design.points.y.tolist(), design.district.tolist(),
                        design.map_class.tolist(), strict=True))  # fmt: skip

    whole = points(1)
    monkeypatch.setattr(population, "STRIP_BYTES", 16 * 260)
    assert points(1) == whole
    assert points(2) == whole
    assert len(whole) == 900


def test_a_plane_ring_hands_out_its_sets_in_turn_grown_when_small() -> None:
    """Three sets of two planes: each set's planes apart and contiguous (a raster reads
    straight into one), the sets apart, the fourth the first again; a larger strip grows
    the set it gets; one set for one thread, AHEAD + 2 with a reader thread."""
    ring = PlaneRing(3, planes=2)
    sets = [ring.next(4, 5) for _ in range(3)]
    planes = [p for one in sets for p in one]
    assert all(p.shape == (4, 5) and p.dtype == np.uint8 and p.flags.c_contiguous for p in planes)
    assert not any(np.shares_memory(a, b) for i, a in enumerate(planes) for b in planes[i + 1 :])
    again = ring.next(4, 5)
    assert np.shares_memory(again[0], sets[0][0]) and np.shares_memory(again[1], sets[0][1])
    grown = ring.next(10, 7)
    assert grown[0].shape == (10, 7) and not np.shares_memory(grown[0], grown[1])
    assert len(PlaneRing.for_threads(1).flats) == 1
    assert len(PlaneRing.for_threads(2).flats) == AHEAD + 2


def test_the_reads_are_made_under_one_gdal_environment() -> None:
    """A rasterio.open inside finds an environment (none of its own set up each time)."""

    def found() -> Iterator[bool]:
        yield rasterio.env.hasenv()

    assert not rasterio.env.hasenv()
    assert list(one_env(found())) == [True]
    assert list(read_ahead(one_env(found()), threads=2)) == [True]


def test_with_a_reader_thread_the_districts_are_burned_there(
    tmp_path: Path, districts: Districts, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no worker process can be forked: the design's two passes (no burn kept, so the
    second burns again) and the check's population: every district burn made by the reader
    thread, the counting thread left with the compiled loops (which let go of the GIL)."""
    burners: list[str] = []
    monkeypatch.setattr(forks, "fork_allowed", lambda: False)

    def recorded(burn):  # noqa: ANN001, ANN202 - a wrapper of district_burn
        def burned(*args):  # noqa: ANN002, ANN202
            burners.append(threading.current_thread().name)
            return burn(*args)

        return burned

    for module in (design, holdout_counts):
        monkeypatch.setattr(module, "district_burn", recorded(module.district_burn))
    monkeypatch.setattr(design, "KEPT_RUN_PIXELS", 10**9)  # only one-district strips kept
    monkeypatch.setattr(population, "STRIP_BYTES", 16 * 260)
    values = np.random.default_rng(5).integers(0, N_L3, (300, 260), dtype=np.uint8)
    maps = [write_map(tmp_path / "a.tif", values, origin=ORIGIN)]
    draw_points(maps, 2, class_map, 900, 5, 11, districts=districts, threads=2)
    design_burns = len(burners)
    strips = -(-300 // 16)
    assert design_burns > strips  # the second pass burned too
    (tmp_path / "check").mkdir()
    (found, labels, indexes), _ = regions_and_their_count(
        tmp_path / "check", districts, 6, (ORIGIN[0] + 2560.0, ORIGIN[1]), [(0, 0), (64, 128)]
    )  # fmt: skip
    read_population(found, labels, indexes, districts, threads=2)
    assert len(burners) > design_burns
    assert set(burners) == {"read-ahead"}


def test_with_two_threads_the_maps_are_counted_in_worker_processes(
    tmp_path: Path, districts: Districts, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two cores, two maps or regions: the design's two passes and the check's population
    each counted in forked workers, not here (what holds the GIL, opens and burns, then runs
    on both cores), with the points and counts that counting here gives."""
    monkeypatch.setattr(forks, "cores", lambda most: min(most, 2))
    log = tmp_path / "pids.txt"

    def recorded(fn, name: str):  # noqa: ANN001, ANN202 - a wrapper that notes its process
        def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            with log.open("a") as out:
                out.write(f"{name} {os.getpid()}\n")
            return fn(*args, **kwargs)

        return counted

    rng = np.random.default_rng(4)
    maps = []
    for name, origin in (("a", ORIGIN), ("b", (ORIGIN[0] + 1000.0, ORIGIN[1] - 2600.0))):
        values = rng.integers(0, N_L3, (300, 260), dtype=np.uint8)
        maps.append(write_map(tmp_path / f"{name}.tif", values, origin=origin))
    (tmp_path / "check").mkdir()
    regions, want = regions_and_their_count(
        tmp_path / "check", districts, 6, (ORIGIN[0] + 2560.0, ORIGIN[1]), [(0, 0), (64, 128)]
    )  # fmt: skip
    here = draw_points(maps, 2, class_map, 900, 5, 11, districts=districts, threads=1)
    for module, name in ((design, "_records_in_turn"), (design, "_pick_ranked"),
                         (holdout_counts, "_count_regions")):  # fmt: skip
        monkeypatch.setattr(module, name, recorded(getattr(module, name), name))
    forked = draw_points(maps, 2, class_map, 900, 5, 11, districts=districts, threads=2)
    population = read_population(*regions, districts, threads=2)
    calls = [line.split() for line in log.read_text().splitlines()]
    assert sorted({name for name, _ in calls}) == ["_count_regions", "_pick_ranked",
                                                   "_records_in_turn"]  # fmt: skip
    assert len(calls) == 6  # one call a map or region and a pass
    assert str(os.getpid()) not in {pid for _, pid in calls}
    assert np.array_equal(forked.points.x, here.points.x)
    assert np.array_equal(forked.points.y, here.points.y)
    assert np.array_equal(forked.record.strata_px, here.record.strata_px)
    assert np.array_equal(population.domains, want)
