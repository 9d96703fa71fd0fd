"""The best shape of a replica's cells for a schedule, and the bound it certifies.

A replica's pipeline time is the longest path through its schedule's operation graph
(`schedules`), and with uniform stages each operation lasts α·x_k or β·x_k (divided by v),
x_k the cost of slot k, so every path is linear in x and the time T(x) = max over paths
of a_path · x is convex, piecewise linear and homogeneous.  Its least value τ over cells
x >= 0 with Σ x = 1 is one sparse linear program over the cells and every operation's end
time e (a longest path is the least e that satisfies its precedences):

    minimise t  s.t.  e_op >= e_p + d_op(x) for every input or stage predecessor p of op,
                      e_op >= d_op(x),  t >= e_op,  Σ x = 1,  x >= 0

(O(ops) rows: 2·P·v·M operations; one HiGHS solve, where cutting planes over paths took
hundreds at M = 66).  Every replica whose cells sum to X runs at least τ·X (T(x) >= τ·Σ x),
so τ·X̄ bounds every plan's step.  The bound is certified by weak duality, not by the
solver's tolerance: the program's duals are a unit flow through the graph; split into real
paths with weights y >= 0, Σ y = 1, max_path a·x >= Σ y·a·x >= min_k (yᵀA)_k · Σ x.

1F1B's optimum is not flat: light micro-batches first and last shorten the fill and
drain more than they cost the steady state (P = 8, M = 16: 0.927 × the flat time).
GPipe's is flat (its closed form), and so, on the sizes tried, is the interleaved one's
(flat cells are kept wherever they are as fast as the program's answer).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .schedules import programs, replica_times
from .spec import Pipeline

ROUNDING = 1e-12  # the certified bound's float products are rounded: it drops by this fraction
PINNING_ROWS = 33  # costs of the top cell timed once per schedule and M (`pinned_scales`)


def flat_profile(pipeline: Pipeline, num_microbatches: int) -> bool:
    """Whether the best cells (`best_profile`) are all equal (GPipe; 1F1B at M 1, interleaved at M = P):
    the planner's shaped start is then LPT from zero loads, the plain planner's own where its levels are flat."""
    shape = best_profile(pipeline, num_microbatches)[1]
    return bool(np.all(shape == shape[0]))


@lru_cache(maxsize=128)
def best_profile(pipeline: Pipeline, num_microbatches: int) -> tuple[float, np.ndarray]:
    """(τ, x): a certified lower bound τ on T(x) over cells x >= 0 summing to 1, and the best cells
    found (sum 1, slot order, read-only); see the module."""
    m = num_microbatches
    flat = np.full(m, 1.0 / m)
    flat.setflags(write=False)
    if pipeline.schedule == "gpipe":  # its closed form: flat cells are optimal
        return (1 + (pipeline.stages - 1) / m) / pipeline.stages * (1 - ROUNDING), flat
    graph = _Graph(pipeline, m)
    x, flows = graph.solve()
    flat_time, time = replica_times(pipeline, *pipeline.stage_times(np.vstack([flat, x])))  # the longest paths
    best = flat if flat_time <= time else x
    split, weights = graph.paths(flows)
    bound = float(((weights / weights.sum()) @ split).min()) if weights.sum() > 0 else 0.0
    best = best.copy()
    best.setflags(write=False)
    return max(bound, 0.0) * (1 - ROUNDING), best


class _Graph:
    """The schedule's operations as the linear program of the module: its rows are the edges
    (input or stage predecessor -> operation), the starts (operations with neither) and the ends."""

    def __init__(self, pipeline: Pipeline, m: int):
        _, self.slot, is_backward, previous, needed = programs(pipeline, m)
        share = pipeline.forward_share / pipeline.virtual_stages
        self.weight = np.where(is_backward.astype(bool), share * pipeline.backward_factor, share)
        self.m, n = m, self.slot.size
        ops = np.arange(n)
        self.before = np.stack([previous, needed])  # (2, n): the predecessors, -1 where none
        has = self.before >= 0
        self.edge = np.full((2, n), -1)  # the row of each (predecessor, op) edge
        self.edge[has] = np.arange(int(has.sum()))
        self.start = np.flatnonzero(~has.any(axis=0))  # operations with no predecessor
        self.tail, self.head = self.before[has], np.broadcast_to(ops, (2, n))[has]

    def solve(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, flows): the program's cells (normalised) and its duals per row (>= 0: edges, starts, ends)."""
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix

        m, n, edges, starts = self.m, self.slot.size, self.tail.size, self.start.size
        rows = np.r_[np.repeat(np.arange(edges), 3), np.repeat(edges + np.arange(starts), 2),
                     np.repeat(edges + starts + np.arange(n), 2)]
        columns = np.c_[m + self.tail, m + self.head, self.slot[self.head]].ravel()
        columns = np.r_[columns, np.c_[m + self.start, self.slot[self.start]].ravel(),
                        np.c_[m + np.arange(n), np.full(n, m + n)].ravel()]
        values = np.r_[np.c_[np.ones(edges), -np.ones(edges), self.weight[self.head]].ravel(),
                       np.c_[-np.ones(starts), self.weight[self.start]].ravel(), np.tile([1.0, -1.0], n)]
        a_ub = coo_matrix((values, (rows, columns)), shape=(edges + starts + n, m + n + 1)).tocsr()
        result = linprog(np.r_[np.zeros(m + n), 1.0], A_ub=a_ub, b_ub=np.zeros(a_ub.shape[0]),
                         A_eq=np.r_[np.ones(m), np.zeros(n + 1)][None, :], b_eq=[1.0],
                         bounds=[(0, None)] * (m + n) + [(None, None)], method="highs")
        if result.status != 0:
            raise RuntimeError(f"the schedule's shape program failed: {result.message}")
        x = np.maximum(result.x[:m], 0.0)
        return x / x.sum(), np.maximum(-result.ineqlin.marginals, 0.0)

    def _back(self) -> list[tuple[int, int, int, int]]:
        """Per operation, its incoming rows and the operation each comes from (-1: its start row), the later row
        first: (row, from, other row or -1, from).  An operation has its start row alone, or one or two edges."""
        edges, starts = self.tail.size, self.start.size
        start_row = np.full(self.slot.size, -1)
        start_row[self.start] = edges + np.arange(starts)
        back = []
        for edge, before, other_edge, other_before, start in zip(*(array.tolist() for array in (
                self.edge[0], self.before[0], self.edge[1], self.before[1], start_row))):
            rows = sorted([(row, earlier) for row, earlier in ((start, -1), (edge, before), (other_edge, other_before))
                           if row >= 0], reverse=True) + [(-1, -1)]
            back.append((*rows[0], *rows[1]))
        return back

    def paths(self, flows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The dual flow split into real paths, heaviest end first, following each operation's
        heaviest incoming row (ties: the later row): (coefficients per slot (paths, M), weights).  Each path is
        walked over Python lists (the flows read and a path's sums as Python floats: the same float64 operations in
        the same order as over arrays; interleaved 2x2, M 256: 1.18 -> 0.23 s, 1F1B 4, M 256: 0.36 -> 0.08 s), an
        operation's at most two incoming rows read from one tuple (`_back`)."""
        edges, starts = self.tail.size, self.start.size
        flow = flows.copy()
        end_rows = edges + starts + np.arange(self.slot.size)
        back, slots, weight, flow_list = self._back(), self.slot.tolist(), self.weight.tolist(), flow.tolist()
        coefficients, weights = [], []
        for _ in range(max(4 * self.m, 64)):
            op = int(np.argmax(flow[end_rows]))
            amount, used, path = flow_list[end_rows[op]], [int(end_rows[op])], [0.0] * self.m
            if amount <= 1e-12:
                break
            first = used[0]
            while op >= 0:
                path[slots[op]] += weight[op]
                row, earlier, other, other_earlier = back[op]
                got = flow_list[row]
                if other >= 0 and flow_list[other] > got:  # equal flows: the later row, `row`
                    row, earlier, got = other, other_earlier, flow_list[other]
                if got < amount:
                    amount = got
                used.append(row)
                op = earlier
            if amount <= 1e-12:  # a broken flow (the solver's rounding): this end carries none
                flow[first] = flow_list[first] = 0.0
                continue
            flow[used] -= amount
            for row in used:
                flow_list[row] -= amount
            coefficients.append(path)
            weights.append(max(amount, 0.0))
        return np.array(coefficients).reshape(-1, self.m), np.array(weights)


@lru_cache(maxsize=64)
def pinned_scales(pipeline: Pipeline, num_microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """(r, λ(r)) on PINNING_ROWS points, M >= 2: the best cells x (`best_profile`, sum 1, the largest x_top) with
    the top cell at r ∈ [x_top, T(x) / T(e_top)] instead, the others scaled by λ(r), make the time T(x) again by
    the secant between λ = 0 (r·T(e_top): homogeneous) and 1; T is convex in λ, so at most T(x).  λ = 1 where
    the others at x already make at most T(x), 0 from r·T(e_top) >= T(x) on; between the points interpolated."""
    x = best_profile(pipeline, num_microbatches)[1]
    top = int(np.argmax(x))
    rows = np.vstack([x, np.eye(x.size)[top], np.repeat(x[None, :], PINNING_ROWS, axis=0)])
    goal, alone = replica_times(pipeline, *pipeline.stage_times(rows[:2]))
    ratios = np.linspace(float(x[top]), max(goal / alone, float(x[top])), PINNING_ROWS)
    rows[2:, top] = ratios
    full = replica_times(pipeline, *pipeline.stage_times(rows[2:]))
    scales = np.where(full > goal, np.clip((goal - ratios * alone) / np.maximum(full - ratios * alone, 1e-300), 0, 1),
                      1.0)
    for array in (ratios, scales):
        array.setflags(write=False)
    return ratios, scales
