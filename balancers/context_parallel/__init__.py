"""Giant items: split an item over a context-parallel group of ranks only when it pays, certified.

The problem (one plain step; `balance(..., context_parallel=spec)`).  Items i with lengths
l_i and stage cost f(l); D ranks on nodes of g GPUs; allowed degrees C (powers of two, at most
g unless inter-node groups are allowed).  Choose for every item a group G_i of c_i = |G_i| ∈ C
ranks, an aligned block [s, s + c_i) with s a multiple of c_i (inside a node), no rank in two
groups of different blocks, and

    minimise max_r L(r),   L(r) = Σ_{i : r ∈ G_i} t_i(c_i, G_i)
    subject to tokens(r) = Σ_{i : r ∈ G_i} shard_r(l_i, c_i) <= max_tokens_per_rank

where t_i(c, G) = f(l_i) / (c · η(l_i / c)) + κ(l_i, c, G) is the time each rank of the group
spends on its zigzag shard (`spec.py`; t_i(1) = f(l_i)) and shard_r its tokens (`layout.py`).
As plain code:

    loads = [0.0] * D
    for i in items:
        block = range(start[i], start[i] + degree[i])
        inside = block[0] // g == block[-1] // g
        for r in block:
            loads[r] += spec.time(cost, [l[i]], degree[i], within_node=inside)[0]
    makespan = max(loads)

Rooms: `spec` (the degrees and split-cost parameters), `layout` (the zigzag shards), `bound`
(the canonical-allotment lower bound), `blocks` (aligned groups), `planner`, `search` and
`exact` (the algorithm: layout and deal, local search, exact search on tiny instances), `plan`
(the certified `ContextParallelPlan`), `split` (the entry point behind `balance`, and
`certify_split` for any given split plan).  The micro-batched step and the orchestrator build on this one plan shape.
"""

from .bound import Allotment
from .plan import ContextParallelPlan
from .spec import ContextParallel
from .split import certify_split

__all__ = ["Allotment", "ContextParallel", "ContextParallelPlan", "certify_split"]
