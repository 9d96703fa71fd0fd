"""The OrchMLLM paper's node-wise rearrangement: min-max inter-node volume, as an ILP.

Groups g of a balanced plan go to nodes k, gpus_per_node groups per node (x[g, k] = 1);
W[g, k] is the bytes of group g that start on node k, S_k the bytes that start on node k,
T_g the bytes of group g.  Node k then sends S_k - sum_g W[g, k] x[g, k] bytes to other
nodes and receives sum_g (T_g - W[g, k]) x[g, k]:

    minimise  max_k max(send_k, recv_k), then sum_k send_k (total inter-node bytes)

Plain code: phase 1 minimises z subject to z >= send_k, z >= recv_k; phase 2 fixes
z <= z* and minimises the total.  Solved with PuLP/CBC (`balancers.exact.milp.run_cbc`: one thread,
fixed seed) within `time_limit` (`ilp.DEFAULT_TIME_LIMIT` when None), warm-started from
`lap_node` (exact minimum total); the result is never worse than that start in (busiest
node, total) order, and its status says `optimal` only when CBC proved both phases optimal,
`time_limit` when the time ran out,
`feasible` otherwise (e.g. phase 2 rejected by CBC's tolerances: phase 1's answer stands).
Groups then take ranks within their node keeping the most bytes on their rank (exact per
node).  A search cut by the time limit depends on the machine's speed, so ranks may
disagree on it: solve on one rank and broadcast, or use the deterministic "lap_node".
The model has D · N binaries, meant for D up to a few hundred ranks: above MAX_BINARIES it is refused
(SizeLimitError naming "lap_node"), and a model whose build used up the time limit is not solved (the start stands).
"""

from __future__ import annotations

import time

import numpy as np

from ..balancers.exact.ilp import DEFAULT_TIME_LIMIT
from ..balancers.exact.milp import run_cbc
from ..balancers.locality.lap import assign_groups, ranks_within_nodes
from ..balancers.problem import Status
from ..balancers.validation import SizeLimitError
from .cluster import Topology
from .traffic import traffic_of


MAX_BINARIES = 65_536  # D · N: 512 ranks on 64 nodes build in ~2 CPU s; 2560 on 320 took 84 s past a 10 s limit


def _node_volumes(node_of_group: np.ndarray, group_of_item: np.ndarray, sources: np.ndarray,
                  item_bytes: np.ndarray, topology: Topology) -> tuple[float, float]:
    """(busiest node's inter-node volume, total inter-node bytes) of a node assignment."""
    gpus = topology.gpus_per_node
    destinations = node_of_group[group_of_item] * gpus
    move = traffic_of(sources, destinations, item_bytes, topology)
    return move.busiest_node_inter_bytes, move.bytes_inter_node


def _run(lp, time_limit: float) -> str:
    """Solve `lp` (a pulp.LpProblem) with CBC: "optimal" (proven), "stopped" (time limit) or "failed"
    (e.g. infeasible)."""
    import pulp

    run_cbc(lp, time_limit, warm_start=True)
    if lp.sol_status == pulp.LpSolutionOptimal:
        return "optimal"
    if lp.sol_status in (pulp.LpSolutionIntegerFeasible, pulp.LpSolutionNoSolutionFound):
        return "stopped"
    return "failed"


def solve(group_of_item: np.ndarray, sources: np.ndarray, item_bytes: np.ndarray, topology: Topology,
          time_limit: float | None) -> tuple[np.ndarray, Status]:
    """rank_of_group minimising the busiest node's inter-node volume, then the total."""
    import pulp  # the model's stack, loaded by the first solve rather than by `import orchmllm.topology`

    deadline = time.perf_counter() + (DEFAULT_TIME_LIMIT if time_limit is None else time_limit)
    gpus, nodes, ranks = topology.gpus_per_node, topology.num_nodes, topology.world_size
    if nodes > 1 and ranks * nodes > MAX_BINARIES:
        raise SizeLimitError(f"placement 'ilp' needs {ranks * nodes} binaries for {ranks} ranks × {nodes} nodes, over "
                             f"MAX_BINARIES={MAX_BINARIES}; use 'lap_node' (the exact least inter-node bytes in total, "
                             f"the ILP's start) or 'locality'")
    start = assign_groups(group_of_item, sources, item_bytes, ranks, gpus)
    start_nodes = start // gpus
    if nodes == 1:
        return start, Status.OPTIMAL
    scale = float(item_bytes.max(initial=0.0)) or 1.0
    weights = np.zeros((ranks, nodes))
    np.add.at(weights, (group_of_item, sources // gpus), item_bytes / scale)
    starting = weights.sum(axis=0)
    group_total = weights.sum(axis=1)
    lp = pulp.LpProblem("orchmllm_nodewise", pulp.LpMinimize)
    busiest = lp.add_variable("busiest", lowBound=0)
    x = {(g, k): lp.add_variable(f"x_{g}_{k}", cat=pulp.LpBinary) for g in range(ranks) for k in range(nodes)}
    for g in range(ranks):
        lp += pulp.lpSum(x[g, k] for k in range(nodes)) == 1
    sends = []
    for k in range(nodes):
        lp += pulp.lpSum(x[g, k] for g in range(ranks)) == gpus
        kept = [(g, float(weights[g, k])) for g in np.flatnonzero(weights[:, k]).tolist()]
        send = float(starting[k]) - pulp.lpSum(w * x[g, k] for g, w in kept)
        recv = pulp.lpSum(float(group_total[g] - weights[g, k]) * x[g, k] for g in range(ranks))
        lp += send <= busiest
        lp += recv <= busiest
        sends.append(send)
    for (g, k), var in x.items():
        var.setInitialValue(1 if start_nodes[g] == k else 0)
    busiest.setInitialValue(_node_volumes(start_nodes, group_of_item, sources, item_bytes, topology)[0] / scale)

    def solution() -> np.ndarray | None:
        if lp.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return None
        chosen = np.array([max(range(nodes), key=lambda k: x[g, k].value() or 0.0) for g in range(ranks)],
                          dtype=np.int64)
        return chosen if np.all(np.bincount(chosen, minlength=nodes) == gpus) else None

    lp.setObjective(busiest)
    if time.perf_counter() >= deadline:  # building took the time: the start, not a search past the limit
        return start, Status.TIME_LIMIT
    outcomes = [_run(lp, deadline - time.perf_counter())]
    candidates = [start_nodes]
    first = solution()
    if first is not None:
        candidates.append(first)
        # CBC meets constraints only within its tolerances: leave it a little room.
        lp += busiest <= float(busiest.value()) * (1 + 1e-6) + 1e-6
        lp.setObjective(pulp.lpSum(sends))
        outcomes.append(_run(lp, deadline - time.perf_counter()))
        second = solution()
        if second is not None:
            candidates.append(second)
    volumes = [_node_volumes(c, group_of_item, sources, item_bytes, topology) for c in candidates]
    best = min(range(len(candidates)), key=lambda index: (volumes[index], -index))
    if outcomes == ["optimal", "optimal"] and volumes[best] == volumes[-1]:
        status = Status.OPTIMAL
    elif "stopped" in outcomes:
        status = Status.TIME_LIMIT
    else:
        status = Status.FEASIBLE
    if best == 0:
        return start, status
    return ranks_within_nodes(candidates[best], group_of_item, sources, item_bytes, gpus), status
