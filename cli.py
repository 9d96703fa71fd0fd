"""The `orchmllm` command."""

from __future__ import annotations

import argparse

import numpy as np

from .balancers import ALGORITHMS, balance


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="orchmllm", description=__doc__)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--items-per-rank", type=int, default=16)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    lengths = np.rint(rng.lognormal(6.5, 1.0, args.ranks * args.items_per_rank)).astype(np.int64) + 1
    print(f"{'algorithm':<16}{'makespan':>14}{'lower bound':>14}{'gap':>10}")
    for name in ALGORITHMS:
        plan = balance(lengths, args.ranks, algorithm=name)
        print(f"{name:<16}{plan.makespan:>14.0f}{plan.lower_bound:>14.0f}{plan.gap:>10.2%}")
    return 0
