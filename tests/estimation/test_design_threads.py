"""The design with a pool of threads (several maps read, counted and walked at once): the
same points and record as one thread draws, with and without districts, maps in thin strips
(many per map, only some holding a drawn pixel) on two CRSs; a map changed between the
passes refused naming it, from whichever thread found it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_design import random_map, write_map
from test_streams import ORIGIN, wavy_districts

from emb.classes import ClassMap
from emb.estimation import design as design_module
from emb.estimation import population
from emb.estimation.design import Design, SampleDesignError, draw_points
from emb.estimation.districts import read_districts


def five_maps(folder: Path) -> list[Path]:
    """Five regions across the wavy districts' square (UTM 15N), the last in UTM 16N."""
    maps = []
    for i in range(5):
        origin = (ORIGIN[0] + 900.0 * i, ORIGIN[1] - 700.0 * i)
        maps.append(write_map(folder / f"r{i}.tif", random_map((120, 140), seed=20 + i),
                              epsg=32616 if i == 4 else 32615, origin=origin))  # fmt: skip
    return maps


def drawn(design: Design) -> tuple:
    """Everything a design's points and record say, to compare two draws."""
    p = design.points
    return (p.region.tolist(), p.x.tolist(), p.y.tolist(), design.district.tolist(),
            design.map_class.tolist(), design.record.strata_px.tolist(),
            [m.sha256 for m in design.record.maps])  # fmt: skip


@pytest.mark.parametrize("with_districts", [False, True])
def test_threads_draw_the_points_one_thread_draws(
    tmp_path: Path, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch, with_districts: bool
) -> None:
    monkeypatch.setattr(population, "STRIP_BYTES", 7 * 140)  # strips of 7 rows: 18 a map
    maps = five_maps(tmp_path)
    districts = (read_districts(wavy_districts(tmp_path / "d.geojson", 3, 5000.0, 1), "name")
                 if with_districts else None)  # fmt: skip
    n = 2000 if with_districts else 300

    def draw(threads: int) -> tuple:
        return drawn(draw_points(maps, 2, class_map, n, 3, 4, districts=districts,
                                 threads=threads))  # fmt: skip

    one = draw(1)
    assert len(one[0]) == n and len(set(one[0])) == 5
    assert draw(2) == one
    assert draw(3) == one


def test_a_map_changed_between_the_passes_is_refused_with_threads(
    tmp_path: Path, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fourth map's first-pass counts of its first strip moved by one pixel from one
    class to another, as a map rewritten between the passes would show."""
    maps = five_maps(tmp_path)
    counts = design_module.count_l3_strips

    def moved(path: Path) -> np.ndarray:
        per_strip = counts(path).copy()
        if Path(path).name == "r3.tif":
            held = np.flatnonzero(per_strip[0, :61])
            per_strip[0, held[0]] -= 1
            per_strip[0, held[1]] += 1
        return per_strip

    monkeypatch.setattr(design_module, "count_l3_strips", moved)
    with pytest.raises(SampleDesignError, match=r"r3.tif changed while the sample was drawn"):
        draw_points(maps, 3, class_map, 400, 1, 3, threads=2)
