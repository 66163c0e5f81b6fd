"""A user's labelled sample estimated for one run's maps, at the design's level and coarser.

When the run's maps are the very maps the sample was designed on (the record's digests), the
strata are the map's classes: Olofsson et al. 2014 at the design's level, and Stehman 2014 at
the coarser levels (strata then differ from those levels' classes). When they are other maps
(another run's, over the same regions), the strata are still the design's, and each point's
class on this run's map is read: Stehman's general estimator, so one labelled sample compares
every run (a point where this map has no data, as another source's may, counts as mapped "no
data": an error of the map, a class of its own in the table). A level finer than the design's
cannot be estimated (its reference is not known).
Unlabelled units are left out of their strata's samples (the strata sizes stay the design's):
valid when labels are missing at random within a stratum, which the stage says beside the
figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emb.classes import N_L1, N_L2, N_L3, ClassMap
from emb.estimation.estimators import AreaEstimates, olofsson, stehman
from emb.estimation.population import count_classes, level_table, map_classes_at
from emb.estimation.sample_files import LabelledSample
from emb.provenance import digest_file

SIZES = {1: N_L1, 2: N_L2, 3: N_L3}
NO_DATA_L3 = N_L3  # another map's "no data" at a sample point, one class past the L3 ids


def coarser(ids: np.ndarray, level_from: int, level_to: int, cmap: ClassMap) -> np.ndarray:
    """Class ids at ``level_from`` as ids at the coarser ``level_to`` (the hierarchy of
    config/classes.csv); the ids themselves when the levels are one."""
    if level_to == level_from:
        return np.asarray(ids, np.int64)
    if level_to > level_from:
        raise ValueError(f"level {level_to} is finer than {level_from}: not derivable")
    if level_from == 3:
        return level_table(level_to, cmap)[np.asarray(ids)].astype(np.int64)
    l2_to_l1 = np.zeros(N_L2, np.int64)  # from 2 to 1: through any L3 of each L2 group
    l2_to_l1[cmap.l3_to_l2[:N_L3]] = cmap.l3_to_l1[:N_L3]
    return l2_to_l1[np.asarray(ids)]


@dataclass(frozen=True)
class SampleEstimate:
    """One level's estimates of a user's sample for one run; ``same_maps``: the run's maps are
    those the sample was designed on."""

    level: int
    estimates: AreaEstimates
    same_maps: bool


def designed_on(sample: LabelledSample, maps: Mapping[str, Path]) -> bool:
    """Whether ``maps`` (region -> file) are, byte for byte, the maps of the sample's design:
    every region's (one region's match alone would put Olofsson's estimator on another map)."""
    return all(
        m.region in maps and Path(maps[m.region]).is_file()
        and digest_file(Path(maps[m.region])) == m.sha256
        for m in sample.record.maps
    )  # fmt: skip


def estimate_sample(
    sample: LabelledSample, maps: Mapping[str, Path], cmap: ClassMap,
    confidence: float | None = None,
) -> list[SampleEstimate]:  # fmt: skip
    """The sample's estimates on ``maps`` (region -> the run's map of each design region) at
    the design's level and each coarser one, with every figure's interval at ``confidence``."""
    design = sample.record
    strata_px = np.asarray(design.strata_px, np.int64)
    regions = [m.region for m in design.maps]
    same = designed_on(sample, maps)
    on_map = None if same else map_classes_at(sample.points, dict(maps), 3, cmap, NO_DATA_L3)
    out = []
    for level in range(design.level, 0, -1):
        k = SIZES[level]
        mapped_px = np.sum([count_classes(maps[r], level, cmap) for r in regions], axis=0)
        if not same:  # a point where this map has no data is mapped as "no data" (class k)
            mapped_px = np.append(mapped_px, max(int(strata_px.sum() - mapped_px.sum()), 0))
        reference = coarser(sample.reference, design.level, level, cmap)
        if same and level == design.level:
            matrix = np.zeros((k, k), np.int64)
            np.add.at(matrix, (sample.stratum, reference), 1)
            est = olofsson(strata_px, matrix, confidence)
        elif same:
            mapped = coarser(sample.stratum, design.level, level, cmap)
            joint = np.zeros((len(strata_px), k), np.int64)  # stratum h is one class there
            joint[np.arange(len(strata_px)), coarser(np.arange(len(strata_px)), design.level,
                                                     level, cmap)] = strata_px  # fmt: skip
            est = stehman(
                strata_px, sample.stratum, mapped, reference, mapped_px, joint, confidence
            )
        else:
            mapped = np.where(on_map == NO_DATA_L3, k, coarser(on_map % NO_DATA_L3, 3, level,
                                                                cmap))  # fmt: skip
            est = stehman(
                strata_px, sample.stratum, mapped, reference, mapped_px, confidence=confidence
            )
        out.append(SampleEstimate(level, est, same))
    return out
