"""Two checkouts of orchmllm timed in one process, plan by plan, on the micro-batched step.

    python3.11 benchmarks/interleaved_ab.py BASE_CHECKOUT NEW_CHECKOUT [--pairs 10] [--budgets 8192,16384,65536]
    python3.11 benchmarks/interleaved_ab.py BASE_CHECKOUT NEW_CHECKOUT --budgets none   # the plain step (one pass)

Alternating processes cannot show a change of a few percent on a VM whose speed drifts by
±30 % from minute to minute; here both trees are imported side by side (each checkout linked
under its own package name in a temporary directory: the package imports itself relatively),
and every plan of one tree is followed by the same plan of the other (which goes first
alternates), so both see the same minutes.  The step is `Orchestrator(MODELS["84b"].stages(), cluster(2560),
max_tokens_per_microbatch=T).plan(sample_workload("default", 2560, 32, seed=2560))` (T "none": no budget, the
plain step) with its routes and layouts built (`StepPlan.built()`, what a runtime's plan builds), timed in
process time after one warm-up plan; the two plans' digests must agree (else the change is not
a pure speed change, and the script says so).  Prints, per T, each tree's min and median and
the median over pairs of new / base.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _load(name: str) -> dict:
    """The modules the step needs, of the checkout linked as package `name`."""
    registry = importlib.import_module(f"{name}.balancers.registry")
    if hasattr(registry, "_entry_points"):  # the installed distribution's entry points name orchmllm's own peers,
        registry._entry_points = ()  # which the linked copy registers under its own name: no reserved names here
    return {part: importlib.import_module(f"{name}{suffix}") for part, suffix in
            (("root", ""), ("models", ".study.models"), ("workloads", ".study.workloads"),
             ("simulator", ".study.simulator"))}


def built(step):
    """The step with its routes and layouts built: `StepPlan.built()`, or in a checkout without it each read once
    (free before a63fb56, whose `Orchestrator.plan` built them; a build in a63fb56 and 53e573d)."""
    if hasattr(step, "built"):
        return step.built()
    for plan in step.microbatches:
        for part in (plan, *plan.stage_plans):
            getattr(part, "route_row" if part is plan else "rank_offsets")
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="checkout of the baseline (its root is the package)")
    parser.add_argument("new", type=Path, help="checkout of the change")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--budgets", default="8192,16384,65536",
                        help="max_tokens_per_microbatch values ('none': the plain step)")
    parser.add_argument("--ranks", type=int, default=2560)
    parser.add_argument("--samples-per-rank", type=int, default=32)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for name, checkout in (("orchbase", args.base), ("orchnew", args.new)):
            (Path(folder) / name).symlink_to(checkout.resolve(), target_is_directory=True)
        sys.path.insert(0, folder)
        trees = {name: _load(name) for name in ("orchbase", "orchnew")}
        budgets = [None if value == "none" else int(value) for value in args.budgets.split(",")]
        steps = {}
        for name, tree in trees.items():
            batch = tree["workloads"].sample_workload("default", args.ranks, args.samples_per_rank, seed=args.ranks)
            for budget in budgets:
                orchestrator = tree["root"].Orchestrator(tree["models"].MODELS["84b"].stages(),
                                                         tree["simulator"].cluster(args.ranks),
                                                         max_tokens_per_microbatch=budget)
                steps[name, budget] = (orchestrator, batch)
        times = {key: [] for key in steps}
        for budget in budgets:
            digests = {name: steps[name, budget][0].plan(steps[name, budget][1]).digest() for name in trees}
            if digests["orchbase"] != digests["orchnew"]:
                print(f"T {budget}: the trees plan differently ({digests}); timing anyway")
        for pair in range(args.pairs):
            for budget in budgets:
                for name in (list(trees) if pair % 2 == 0 else list(reversed(trees))):  # no fixed order
                    orchestrator, batch = steps[name, budget]
                    start = time.process_time()
                    built(orchestrator.plan(batch))
                    times[name, budget].append(1e3 * (time.process_time() - start))
        for budget in budgets:
            base, new = times["orchbase", budget], times["orchnew", budget]
            ratio = statistics.median(n / b for b, n in zip(base, new))
            print(f"T {budget}: base min {min(base):.1f} ms, median {statistics.median(base):.1f} | new min "
                  f"{min(new):.1f} ms, median {statistics.median(new):.1f} | new / base (median of pairs) {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
