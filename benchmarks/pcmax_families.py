"""Seeded generators of the classical P||Cmax benchmark families (generated on demand, never stored).

minimise max(loads) where loads[r] = sum(times[i] for i on r), over m machines.

Families, after the descriptions in the literature (França et al. 1994; Dell'Amico & Martello
1995; Frangioni, Necciari & Scutellà 2004; Dell'Amico, Iori, Martello & Monaci 2008;
Haouari & Jemmali 2008); our own generators, so the draws are not the published files:

- ``uniform_100``, ``uniform_1000``, ``uniform_10000``: integer times U[1, high].
- ``nonuniform`` (Frangioni et al.): 98 % of the items large, U[0.9 · high, high], and 2 %
  (at least one) small, U[1, 0.02 · high], with high = 1000.
- ``few_large`` (the issue's wording of "non-uniform"): 98 % small, U[1, high / 50], and 2 %
  (at least one) very large, U[0.9 · high, high]; usually the largest item is the optimum.
- ``near_mean``: every item close to the mean, U[0.45 · high, 0.55 · high] with high = 1000
  (no item can fill the slack another leaves: the hardest case for greedy rules).

The grid crosses each family with n/m in {2, 2.25, 2.5, 3} and m in 5..50, so n <= 150 (few
items per machine, where heuristics leave a gap).

Import from a benchmark or test (the source tree is on PYTHONPATH):
``from orchmllm.benchmarks.pcmax_families import instances``.

>>> first = instances()[0]
>>> first.family, first.num_machines, first.num_items, first.times[:4].tolist()
('uniform_100', 5, 10, [26, 85, 79, 83])
>>> len(instances()), max(instance.num_items for instance in instances())
(144, 150)
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

RATIOS = (2.0, 2.25, 2.5, 3.0)
"""Items per machine n/m of the classical grid."""

MACHINES = (5, 10, 20, 30, 40, 50)
"""Machine counts m of the classical grid."""


def _uniform(high: int):
    def draw(rng: np.random.Generator, num_items: int) -> np.ndarray:
        return rng.integers(1, high + 1, num_items)
    return draw


def _mixed(rng: np.random.Generator, num_items: int, few: tuple[int, int], many: tuple[int, int]) -> np.ndarray:
    """2 % (at least one) of the items U[few], the rest U[many], in random order."""
    count = max(1, round(0.02 * num_items))
    times = np.concatenate((rng.integers(few[0], few[1] + 1, count),
                            rng.integers(many[0], many[1] + 1, num_items - count)))
    return rng.permutation(times)


def _nonuniform(rng: np.random.Generator, num_items: int, high: int = 1000) -> np.ndarray:
    return _mixed(rng, num_items, few=(1, high // 50), many=(int(0.9 * high), high))


def _few_large(rng: np.random.Generator, num_items: int, high: int = 1000) -> np.ndarray:
    return _mixed(rng, num_items, few=(int(0.9 * high), high), many=(1, high // 50))


def _near_mean(rng: np.random.Generator, num_items: int, high: int = 1000) -> np.ndarray:
    return rng.integers(int(0.45 * high), int(0.55 * high) + 1, num_items)


FAMILIES = {
    "uniform_100": _uniform(100),
    "uniform_1000": _uniform(1000),
    "uniform_10000": _uniform(10000),
    "nonuniform": _nonuniform,
    "few_large": _few_large,
    "near_mean": _near_mean,
}
"""Family name -> draw(rng, num_items) of int64 processing times."""


@dataclass(frozen=True, eq=False)
class Instance:
    """One seeded P||Cmax instance: `times` (int64, read-only) on `num_machines` machines."""

    family: str
    num_machines: int
    ratio: float
    seed: int
    times: np.ndarray

    @property
    def num_items(self) -> int:
        return int(self.times.size)

    @property
    def key(self) -> tuple[str, int, float, int]:
        """(family, m, n/m, seed): what the instance is regenerated from."""
        return self.family, self.num_machines, self.ratio, self.seed

    @property
    def name(self) -> str:
        return f"{self.family}-m{self.num_machines}-r{self.ratio:g}-s{self.seed}"


def make_instance(family: str, num_machines: int, ratio: float, seed: int = 0) -> Instance:
    """The instance of `family` with round(ratio · m) items, drawn from a seed of its own key.

    >>> make_instance("near_mean", 5, 2.0).times.tolist()
    [497, 487, 470, 527, 467, 528, 508, 465, 500, 454]
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown `family` {family!r}; choose one of {sorted(FAMILIES)}")
    num_items = int(round(ratio * num_machines))
    code = sorted(FAMILIES).index(family)
    rng = np.random.default_rng([code, num_machines, int(round(ratio * 100)), seed])
    times = np.ascontiguousarray(FAMILIES[family](rng, num_items), dtype=np.int64)
    times.setflags(write=False)
    return Instance(family, num_machines, float(ratio), int(seed), times)


def instances(families=tuple(FAMILIES), ratios=RATIOS, machines=MACHINES, seeds=(0,)) -> list[Instance]:
    """The grid family × n/m × m × seed, in that nesting order."""
    return [make_instance(family, m, ratio, seed)
            for family in families for ratio in ratios for m in machines for seed in seeds]
