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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import shapely

from emb.classes import N_L1, N_L2, N_L3, ClassMap
from emb.estimation.districts import Districts, district_counts, read_districts
from emb.estimation.districts import on_map as districts_on_map
from emb.estimation.estimators import AreaEstimates, Estimate, olofsson, stehman
from emb.estimation.population import (
    Points,
    collapse_counts,
    count_classes,
    level_table,
    map_classes_at,
)
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
    the design's level and each coarser one, with every figure's interval at ``confidence``.
    A design over districts gives the whole here: Stehman's estimator on its (district, class)
    strata, equal to the sum of :func:`estimate_by_district`'s districts."""
    design = sample.record
    regions = [m.region for m in design.maps]
    same = designed_on(sample, maps)
    on_map = None if same else map_classes_at(sample.points, dict(maps), 3, cmap, NO_DATA_L3)

    def mapped_px(level: int) -> np.ndarray:
        return np.sum([count_classes(maps[r], level, cmap) for r in regions], axis=0)

    return _levels(design.level, design.stratum_class(), np.asarray(design.strata_px, np.int64),
                   sample.stratum, sample.reference, on_map, mapped_px, cmap,
                   confidence)  # fmt: skip


def _levels(
    design_level: int, strata_class: np.ndarray, strata_px: np.ndarray, stratum: np.ndarray,
    reference: np.ndarray, on_map: np.ndarray | None, mapped_px_at: Callable[[int], np.ndarray],
    cmap: ClassMap, confidence: float | None,
) -> list[SampleEstimate]:  # fmt: skip
    """Estimates at the design's level and coarser for strata of ``strata_px`` pixels, each
    of the class ``strata_class`` (H,) at the design's level. ``on_map``: the assessed map's
    L3 class at each unit (None: the design's maps, whose classes are the strata's), its
    pixels per class at a level from ``mapped_px_at``."""
    plain = np.array_equal(strata_class, np.arange(SIZES[design_level]))  # strata = classes
    out = []
    for level in range(design_level, 0, -1):
        k = SIZES[level]
        ref = coarser(reference, design_level, level, cmap)
        if on_map is None:
            cls = coarser(strata_class, design_level, level, cmap)
            if plain and level == design_level:
                matrix = np.zeros((k, k), np.int64)
                np.add.at(matrix, (stratum, ref), 1)
                est = olofsson(strata_px, matrix, confidence)
            else:  # each stratum is one class at this level
                joint = np.zeros((len(strata_px), k), np.int64)
                joint[np.arange(len(strata_px)), cls] = strata_px
                est = stehman(strata_px, stratum, cls[stratum], ref, joint.sum(0), joint,
                              confidence)  # fmt: skip
        else:  # a point where this map has no data is mapped as "no data" (class k)
            mapped_px = mapped_px_at(level)
            mapped_px = np.append(mapped_px, max(int(strata_px.sum() - mapped_px.sum()), 0))
            mapped = np.where(on_map == NO_DATA_L3, k, coarser(on_map % NO_DATA_L3, 3, level,
                                                               cmap))  # fmt: skip
            est = stehman(strata_px, stratum, mapped, ref, mapped_px, confidence=confidence)
        out.append(SampleEstimate(level, est, on_map is None))
    return out


STRATIFIED_NOTE = (
    "sample stratified by district and map class: each district estimated within its own "
    "strata, the total the sum of the districts' (strata independent: its variance the sum "
    "of theirs)"
)
DOMAIN_NOTE = (
    "district as a domain of a sample stratified without districts (Stehman 2014): only the "
    "units that fell in it estimate it, so its intervals are wider than a sample stratified "
    "by district would give"
)


@dataclass(frozen=True)
class DistrictEstimates:
    """A sample's estimates per district and in all: ``districts`` domain id -> its
    estimates at the design's level and coarser (as :func:`estimate_sample` gives them; the
    outside, id 0, among them where it has pixels), ``total`` the whole (estimate_sample's),
    ``names`` by id (``outside`` at 0), ``stratified`` whether the design's strata were
    (district, class) pairs (else districts are domains, Stehman 2014), ``skipped`` domain
    id -> why it has no estimate, ``note`` how the district figures were made (for the
    table). Areas add up: a class's area (proportion x ``total_px``) summed over the
    districts is the total's."""

    names: tuple[str, ...]
    districts: dict[int, list[SampleEstimate]]
    total: list[SampleEstimate]
    stratified: bool
    skipped: dict[int, str]
    note: str


def estimate_by_district(
    sample: LabelledSample, maps: Mapping[str, Path], cmap: ClassMap,
    confidence: float | None = None, districts: Districts | None = None,
) -> DistrictEstimates:  # fmt: skip
    """The sample's estimates per district of ``districts`` and over all of them, on
    ``maps`` as :func:`estimate_sample` takes them. A design over districts is estimated
    within each district's strata (Olofsson et al. 2014 on that district's error matrix on
    the design's maps); ``districts`` may then be left out (the record's file is read) and,
    when given, must be the record's. A design without districts estimates each district as
    a domain (Stehman 2014): y = [reference = k and the unit in the district], the design's
    strata, a unit in the district whose polygon holds its point (:func:`point_districts`)."""
    design = sample.record
    if districts is None:
        if design.districts is None:
            raise ValueError(f"{design.path}: the design has no districts: name the districts "
                             "to estimate them as domains")  # fmt: skip
        districts = read_districts(design.districts.path, design.districts.name_field)
    if design.districts is not None and tuple(districts.names) != design.districts.names:
        raise ValueError(
            f"{districts.path}: districts {list(districts.names)} are not the design's "
            f"{list(design.districts.names)} ({design.districts.path}): a sample stratified by "
            "district is estimated by its own districts"
        )
    regions = [m.region for m in design.maps]
    same = designed_on(sample, maps)
    on_map = None if same else map_classes_at(sample.points, dict(maps), 3, cmap, NO_DATA_L3)
    total = estimate_sample(sample, maps, cmap, confidence)
    per_domain = np.sum([district_counts(maps[r], districts) for r in regions], axis=0)
    names = districts.names_by_id()
    if design.districts is not None:
        found, skipped = _stratified(sample, on_map, per_domain, cmap, confidence)
        note = STRATIFIED_NOTE
    else:
        inside = point_districts(sample.points, districts)
        found, skipped = _domains(sample, inside, on_map, per_domain, cmap, confidence)
        note = DOMAIN_NOTE
    return DistrictEstimates(names, found, total, design.districts is not None, skipped, note)


def _stratified(
    sample: LabelledSample, on_map: np.ndarray | None, per_domain: np.ndarray,
    cmap: ClassMap, confidence: float | None,
) -> tuple[dict[int, list[SampleEstimate]], dict[int, str]]:  # fmt: skip
    """Each district of a design over districts estimated from its own strata and units:
    its classes are its strata, as in a design of that district alone."""
    design = sample.record
    k = len(design.class_names)
    found, skipped = {}, {}
    for d in range(design.n_districts):
        strata = slice(d * k, (d + 1) * k)
        strata_px = np.asarray(design.strata_px[strata], np.int64)
        if strata_px.sum() == 0:
            skipped[d] = "no mapped pixel in it"
            continue
        units = sample.stratum // k == d
        found[d] = _levels(
            design.level, np.arange(k), strata_px, sample.stratum[units] - d * k,
            sample.reference[units], None if on_map is None else on_map[units],
            lambda level, d=d: collapse_counts(per_domain[d], level, cmap), cmap, confidence,
        )  # fmt: skip
    return found, skipped


def _domains(
    sample: LabelledSample, inside: np.ndarray, on_map: np.ndarray | None,
    per_domain: np.ndarray, cmap: ClassMap, confidence: float | None,
) -> tuple[dict[int, list[SampleEstimate]], dict[int, str]]:  # fmt: skip
    """Each district as a domain of a design stratified otherwise (Stehman 2014): the
    design's strata and every unit, y = 0 for the units outside the district."""
    design = sample.record
    strata_px = np.asarray(design.strata_px, np.int64)
    found, skipped = {}, {}
    for d in range(len(per_domain)):
        members = inside == d
        if not members.any():
            pixels = int(collapse_counts(per_domain[d], design.level, cmap).sum())
            if pixels:
                skipped[d] = f"no labelled unit in it ({pixels} mapped px)"
            else:
                skipped[d] = "no mapped pixel in it"
            continue
        levels = []
        for level in range(design.level, 0, -1):
            k = SIZES[level]
            ref = coarser(sample.reference, design.level, level, cmap)
            mapped_px = collapse_counts(per_domain[d], level, cmap)
            if on_map is None:
                mapped = coarser(sample.map_class, design.level, level, cmap)
            else:  # another map's "no data" at a point: a class of its own (px unknown: 0)
                mapped = np.where(on_map == NO_DATA_L3, k, coarser(on_map % NO_DATA_L3, 3,
                                                                   level, cmap))  # fmt: skip
                mapped_px = np.append(mapped_px, 0)
            est = domain_estimates(strata_px, sample.stratum, mapped, ref, members, mapped_px,
                                   confidence)  # fmt: skip
            levels.append(SampleEstimate(level, est, on_map is None))
        found[d] = levels
    return found, skipped


def domain_estimates(
    strata_px: np.ndarray, stratum: np.ndarray, mapped: np.ndarray, reference: np.ndarray,
    inside: np.ndarray, mapped_px: np.ndarray, confidence: float | None = None,
) -> AreaEstimates:  # fmt: skip
    """A domain's estimates from a stratified sample whose strata ignore it (Stehman 2014):
    the area of class k the stratified total of y = [reference = k and the unit inside],
    over every unit of every stratum (those outside with y = 0), given as a share of the
    domain's mapped pixels (``mapped_px``, (K,) its pixels per map class: ``total_px``),
    so that proportion x total_px is the domain's estimated area in pixels; user's and
    producer's accuracies and the overall accuracy the ratios of such totals. ``inside``:
    (n,) bool per unit. A unit outside is given a class past the map's, K, in both its map
    and reference class, which puts y = 0 for it in every figure of a class < K."""
    mapped_px = np.asarray(mapped_px, np.int64)
    domain_px = int(mapped_px.sum())
    if domain_px == 0:
        raise ValueError("mapped_px: the domain has no mapped pixel: nothing to estimate")
    outside = len(mapped_px)
    est = stehman(strata_px, stratum, np.where(inside, mapped, outside),
                  np.where(inside, reference, outside), np.append(mapped_px, 0),
                  confidence=confidence)  # fmt: skip
    scale = float(np.sum(strata_px)) / domain_px  # a share of the whole -> of the domain
    classes = tuple(replace(c, proportion=_scaled(c.proportion, scale))
                    for c in est.classes if c.cls < outside)  # fmt: skip
    # overall accuracy: [map = reference, inside] / [inside], as a producer's accuracy of
    # class 0 where class 0 is "inside" in the reference and "inside and right" on the map
    agree = inside & (np.asarray(mapped) == np.asarray(reference))
    both = stehman(strata_px, stratum, np.where(agree, 0, 1), np.where(inside, 0, 1),
                   np.array([1, 1]), confidence=confidence)  # fmt: skip
    overall = next(c.producers for c in both.classes if c.cls == 0)
    if overall is None:
        raise ValueError("inside: no unit of the sample lies in the domain")
    return AreaEstimates(domain_px, classes, overall)


def _scaled(e: Estimate, scale: float) -> Estimate:
    """An estimate (value, SE, interval) times ``scale``."""
    return Estimate(
        e.value * scale, None if e.se is None else e.se * scale, e.why,
        None if e.lo is None else e.lo * scale, None if e.hi is None else e.hi * scale,
    )  # fmt: skip


def point_districts(points: Points, districts: Districts) -> np.ndarray:
    """(m,) int64 the district holding each point (0: none), the polygons moved into each
    point's CRS (:func:`emb.estimation.districts.on_map`); a point on an edge two districts
    share is the first's in the file, as a pixel centre there is in the design's count."""
    out = np.zeros(len(points.ids), np.int64)
    crs = np.asarray(points.crs, dtype=object)
    for text in dict.fromkeys(crs.tolist()):
        picked = np.flatnonzero(crs == text)
        shapes = districts_on_map(districts, text)
        x, y = np.asarray(points.x)[picked], np.asarray(points.y)[picked]
        found = np.zeros(len(picked), np.int64)
        for i, geometry in enumerate(shapes.geometries, start=1):
            free = found == 0
            found[free] = np.where(shapely.intersects_xy(geometry, x[free], y[free]), i, 0)
        out[picked] = found
    return out
