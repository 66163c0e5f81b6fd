"""The measurement behind docs/intervals.md: coverage and width of every candidate interval on
the synthetic population, per figure kind, sample size and class. Run by hand (not a test):
``python tests/estimation/compare_intervals.py [draws]``."""

from __future__ import annotations

import sys

import interval_candidates as ic
from area_population import NAMES, population

METHODS = {
    "wald": ic.wald,
    "floor_wald": ic.floor_wald,
    "korn_graubard": ic.korn_graubard,
}
ONE_STRATUM = {"wilson": ic.wilson, "clopper_pearson": ic.clopper_pearson}


def main(draws: int) -> None:
    pop = population()
    for n, least in ((500, 20), (1000, 50)):
        matrices = pop.draw(n, least, draws, seed=n)
        for kind in ic.KINDS:
            f = ic.figure(kind, matrices)
            true = ic.truth(kind, pop.joint)
            methods = {**METHODS, **(ONE_STRATUM if kind == "users" else {})}
            methods["chosen"] = ic.chosen(kind)
            names = NAMES if kind != "overall" else ("overall",)
            print(f"\nn={n} min={least} {kind}: coverage / mean width vs Wald")
            print("  " + "".join(f"{c:>16}" for c in names))
            wald_w = ic.width(ic.wald(pop.strata_px, f, 0.95))
            for name, method in methods.items():
                b = method(pop.strata_px, f, 0.95)
                cov, w = ic.coverage(b, true), ic.width(b) / wald_w
                cells = "".join(f"{c:8.3f} {r:6.2f} " for c, r in zip(cov, w, strict=True))
                print(f"  {name:16}{cells}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
