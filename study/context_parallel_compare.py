"""`orchmllm compare --context-parallel`: the split algorithms on the last stage of every configuration.

For each configuration the last stage (the LLM, or a lengths file's only stage) is planned by

    no_split             today's best plan (`balance`, "auto"), every item whole
    static_cp            every item at one degree, the best of the allowed degrees above 1
    megatron_dynamic_cp  Megatron-LM's dynamic CP at the best of the capacities from the least that
                         fits the longest item in the widest group to the longest item itself
    ours                 `balance(..., context_parallel=spec)`

and judged by one `ContextParallel` spec (its defaults: H100 links, 8 GPUs per node unless
`gpus_per_node` says otherwise; groups may cross nodes only when a degree is wider than a node):
step cost (the makespan; Megatron's waves summed) over the canonical-allotment bound, items
split, widest group, and the planner's time (the peers' from our reimplementations).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..balancers import ContextParallel, balance
from ..balancers.context_parallel.spec import as_degrees
from .compare import PEER_TIMING, CompareConfig, compare_topology, ratio
from .context_parallel_peers import best_megatron_dynamic_cp, best_static_cp, megatron_capacities, no_split
from .records import FieldsAsJson

SPLIT_ALGORITHMS = ("no_split", "static_cp", "megatron_dynamic_cp", "ours")


@dataclass(frozen=True)
class SplitRow(FieldsAsJson):
    """One split algorithm on one configuration's last stage."""

    ranks: int
    items_per_rank: int | None
    stage: str
    algorithm: str
    kind: str  # "orchmllm" or "peer"
    setting: str  # the degree or capacity a peer ran at ("" for ours and no_split)
    step_cost: float
    lower_bound: float
    step_cost_over_bound: float
    items_split: int
    widest_degree: int
    waves: int
    solve_seconds: float
    timed: str = "orchmllm"


def compare_spec(degrees, num_ranks: int, gpus_per_node: int) -> ContextParallel:
    """The spec every algorithm is judged by on `num_ranks` ranks (degree 1 added: the peers run short
    items whole; ours plans with the degrees as given)."""
    degrees = as_degrees(degrees)
    gpus = compare_topology(num_ranks, gpus_per_node).gpus_per_node
    return ContextParallel(degrees=degrees, gpus_per_node=gpus, allow_inter_node=degrees[-1] > gpus)


def _runs(lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost) -> dict[str, tuple]:
    """Per algorithm: (its plan, or Megatron's waves; the setting a peer ran at; planning seconds)."""
    judge = replace(spec, degrees=tuple(sorted({1, *spec.degrees})))
    runs = {}
    start = time.perf_counter()
    plan = no_split(lengths, num_ranks, judge, cost=cost)
    runs["no_split"] = (plan, "", time.perf_counter() - start)
    start = time.perf_counter()
    plan, degree = best_static_cp(lengths, num_ranks, judge, spec.degrees, cost=cost)
    runs["static_cp"] = (plan, f"degree {degree}", (time.perf_counter() - start) / max(len(spec.degrees) - 1, 1))
    capacities = megatron_capacities(lengths, spec.degrees[-1], int(lengths.max(initial=1)))
    start = time.perf_counter()
    waves, capacity = best_megatron_dynamic_cp(lengths, num_ranks, judge, capacities, cost=cost)
    runs["megatron_dynamic_cp"] = (waves, f"capacity {capacity}", (time.perf_counter() - start) / len(capacities))
    plan = balance(lengths, num_ranks, cost=cost, context_parallel=spec)
    runs["ours"] = (plan, "", plan.solve_seconds)
    return runs


def compare_context_parallel(configs: Sequence[CompareConfig], degrees, gpus_per_node: int
                             ) -> tuple[tuple[SplitRow, ...], dict]:
    """Every split algorithm on the last stage of every configuration (a padded stage cannot split:
    ValueError): the rows, in `SPLIT_ALGORITHMS` order, and the plans by (ranks, items_per_rank,
    algorithm) for plots (Megatron's a `WavePlan`).  The bound is the canonical-allotment bound
    over the degrees and 1, below every row's plan."""
    rows, plans = [], {}
    for config in configs:
        stage = config.stages[-1]
        if stage.padded:
            raise ValueError(f"stage {stage.name!r} is padded; `context_parallel` splits unpadded stages only")
        spec = compare_spec(degrees, config.num_ranks, gpus_per_node)
        runs = _runs(stage.lengths, config.num_ranks, spec, stage.cost)
        bound = runs["no_split"][0].lower_bound
        for name in SPLIT_ALGORITHMS:
            plan, setting, seconds = runs[name]
            plans[(config.num_ranks, config.items_per_rank, name)] = plan
            waves = getattr(plan, "waves", (plan,))
            step = plan.step_cost if name == "megatron_dynamic_cp" else plan.makespan
            kind = "peer" if name in ("static_cp", "megatron_dynamic_cp") else "orchmllm"
            rows.append(SplitRow(
                ranks=config.num_ranks, items_per_rank=config.items_per_rank, stage=stage.name, algorithm=name,
                kind=kind, setting=setting, step_cost=step, lower_bound=bound,
                step_cost_over_bound=ratio(step, bound), items_split=sum(int(w.split_items.size) for w in waves),
                widest_degree=max(int(w.degree.max(initial=1)) for w in waves), waves=len(waves),
                solve_seconds=seconds, timed=PEER_TIMING if kind == "peer" else "orchmllm"))
    return tuple(rows), plans
