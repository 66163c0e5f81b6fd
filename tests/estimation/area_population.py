"""A synthetic map and its reference, and stratified samples of it drawn as the design draws them.

Why synthetic: the intervals of issue 57 must hold where the check of the test split showed them
failing (a rare class, a class mapped almost without error, samples with no disagreement), and
coverage needs a truth known exactly and thousands of samples. The population is built the way
a crop map errs: fields (parcels) with one crop each, lakes, and three kinds of map error,
whole parcels given another class, blobs (a haze, a flooded field) given one class whatever lies
under them, and salt (single pixels). The classes:

====  ========  ===========================================================================
id    name      role
====  ========  ===========================================================================
0     corn      big class
1     soy       big class
2     grass     big class, also what the blobs are mapped as
3     forest    middle class
4     water     lakes; mapped almost without error (user's accuracy about 0.965, from the
                lakes' mixed shore pixels and two flooded fields)
5     rare      a rare crop, 1.4% of the area, in small parcels; about a quarter of its area
                is mapped as soy or grass, so its omission hides in the big strata
====  ========  ===========================================================================

Everything a stratified random sample yields is the error matrix of its units (strata = map
classes: row = stratum), so a sample is drawn per stratum as a multivariate hypergeometric
from the stratum's reference-class pixel counts (``Generator.multivariate_hypergeometric``):
the same distribution as ``StratifiedSampler.draw`` followed by counting, for thousands of draws
at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from emb.estimation.design import allocate

NAMES = ("corn", "soy", "grass", "forest", "water", "rare")
CORN, SOY, GRASS, FOREST, WATER, RARE = range(6)
K = len(NAMES)
SIDE = 1000  # pixels per side


@dataclass(frozen=True)
class Population:
    """The map's and the reference's pixel counts: ``joint[i, j]`` pixels mapped i, truly j."""

    joint: np.ndarray  # (K, K) int64

    @property
    def strata_px(self) -> np.ndarray:
        """N_i.: the map's pixels per class (the strata)."""
        return self.joint.sum(1)

    @property
    def area(self) -> np.ndarray:
        """The true share of the area of every class."""
        return self.joint.sum(0) / self.joint.sum()

    @property
    def users(self) -> np.ndarray:
        return np.diagonal(self.joint) / self.joint.sum(1)

    @property
    def producers(self) -> np.ndarray:
        return np.diagonal(self.joint) / self.joint.sum(0)

    @property
    def overall(self) -> float:
        return float(np.trace(self.joint) / self.joint.sum())

    def draw(self, n: int, min_per_class: int, draws: int, seed: int) -> np.ndarray:
        """(draws, K, K) error matrices of stratified random samples (rows: strata = map
        classes), allocated as the design allocates (``allocate``: min per class, the rest in
        proportion to the area), without replacement within each stratum."""
        rng = np.random.default_rng(seed)
        allocation = allocate(self.strata_px, n, min_per_class)
        out = np.zeros((draws, K, K), np.int64)
        for i, units in enumerate(allocation):
            out[:, i] = rng.multivariate_hypergeometric(self.joint[i], int(units), size=draws)
        return out


def _parcels(rng: np.random.Generator) -> np.ndarray:
    """(SIDE, SIDE) parcel ids: strips 12-40 px high, each cut into fields 15-70 px wide."""
    ids = np.zeros((SIDE, SIDE), np.int64)
    top, next_id = 0, 0
    while top < SIDE:
        height = int(rng.integers(12, 41))
        cuts = np.cumsum(rng.integers(15, 71, size=SIDE // 15 + 1))
        cuts = cuts[cuts < SIDE]
        field = np.searchsorted(cuts, np.arange(SIDE), side="right")
        ids[top : top + height] = next_id + field
        next_id += len(cuts) + 1
        top += height
    return ids


def _disks(rng: np.random.Generator, count: int, radii: tuple[int, int]) -> np.ndarray:
    """(SIDE, SIDE) bool: the union of ``count`` random disks."""
    out = np.zeros((SIDE, SIDE), bool)
    for _ in range(count):
        r0, c0 = (int(v) for v in rng.integers(0, SIDE, size=2))
        radius = int(rng.integers(*radii))
        top, left = max(r0 - radius, 0), max(c0 - radius, 0)
        bottom, right = min(r0 + radius + 1, SIDE), min(c0 + radius + 1, SIDE)
        rows, cols = np.ogrid[top:bottom, left:right]
        window = out[top:bottom, left:right]
        window |= (rows - r0) ** 2 + (cols - c0) ** 2 <= radius**2
    return out


@cache
def population(seed: int = 57) -> Population:
    """The population of the module docstring (seeded; about 1 s, then cached)."""
    mapped, reference = scene(seed)
    joint = np.bincount(mapped.ravel() * K + reference.ravel(), minlength=K * K)
    return Population(joint.reshape(K, K).astype(np.int64))


@cache
def scene(seed: int = 57) -> tuple[np.ndarray, np.ndarray]:
    """(mapped, reference) (SIDE, SIDE) int64 class ids of the module docstring's scene: a
    test that splits it (districts) needs the pixels, not only their counts."""
    rng = np.random.default_rng(seed)
    ids = _parcels(rng)
    n_parcels = int(ids.max()) + 1
    size = np.bincount(ids.ravel(), minlength=n_parcels)
    crop = rng.choice([CORN, SOY, GRASS, FOREST], size=n_parcels, p=[0.37, 0.32, 0.24, 0.07])
    rare_target, rare_px = 0.014 * SIDE * SIDE, 0
    for p in rng.permutation(np.flatnonzero(size < np.median(size))):  # small parcels
        if rare_px >= rare_target:
            break
        crop[p], rare_px = RARE, rare_px + size[p]
    reference = crop[ids]
    lakes = _disks(rng, 4, (45, 70))
    reference[lakes] = WATER

    # whole parcels: 5% of the crops' parcels confused among the crops, a quarter of the rare
    # crop's parcels mapped as soy or grass, a few crop parcels mapped as the rare crop
    swap = crop.copy()
    confused = (rng.random(n_parcels) < 0.05) & (crop != RARE)
    swap[confused] = rng.choice([CORN, SOY, GRASS, FOREST], size=int(confused.sum()))
    rare = np.flatnonzero(crop == RARE)
    missed = rng.choice(rare, size=len(rare) // 4, replace=False)
    swap[missed] = rng.choice([SOY, GRASS], size=len(missed))
    small_crops = np.flatnonzero((crop != RARE) & (size < np.percentile(size, 20)))
    swap[rng.choice(small_crops, size=3, replace=False)] = RARE
    mapped = swap[ids]
    mapped[lakes] = WATER
    # blobs: haze mapped as grass over whatever lies under it, two flooded fields as water
    mapped[_disks(rng, 25, (8, 25)) & ~lakes] = GRASS
    mapped[_disks(rng, 2, (6, 9))] = WATER
    # the lakes' shore: a 1 px ring of mixed pixels mapped as water
    shore = np.zeros_like(lakes)
    shore[1:] |= lakes[:-1]
    shore[:-1] |= lakes[1:]
    shore[:, 1:] |= lakes[:, :-1]
    shore[:, :-1] |= lakes[:, 1:]
    mapped[shore & ~lakes] = WATER
    # salt: 1.5% of the pixels given a random crop
    salt = rng.random((SIDE, SIDE)) < 0.015
    mapped[salt] = rng.choice([CORN, SOY, GRASS, FOREST, RARE], size=int(salt.sum()),
                              p=[0.3, 0.3, 0.3, 0.08, 0.02])  # fmt: skip
    mapped.flags.writeable = reference.flags.writeable = False  # cached: shared by callers
    return mapped, reference
