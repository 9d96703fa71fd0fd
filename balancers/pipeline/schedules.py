"""Pipeline schedules: which operation every stage runs in which order, and the step time they give.

Model.  A data-parallel replica runs its M micro-batches (slot k = the k-th it runs) through
P stages.  Micro-batch k takes F[s, k] forward and B[s, k] backward on stage s; with v
virtual stages (interleaved) the model is G = P·v chunks, chunk j of stage s is model stage
g = j·P + s, and each of its operations takes F[s, k] / v or B[s, k] / v.  An operation
starts once its stage has finished the previous operation of its order and its input is
there (point-to-point transfers are taken as overlapped, their time left out):

    F(k, g) needs F(k, g - 1);   B(k, g) needs B(k, g + 1);   B(k, G - 1) needs F(k, G - 1)
    end(op) = max(end(previous op of its stage), end(its input)) + duration(op)
    replica time = max over ops of end(op);   step time = max over replicas

Plain code (`programs` lists every operation in an order where inputs come first):

    for op in ops:
        end[op] = max(end[op.previous], end[op.input]) + duration[op]
    step = max(end)

Orders of stage s (Megatron-LM's, `schedules.py`):
    gpipe        F(0), ..., F(M-1), then B(0), ..., B(M-1)
    1f1b         w = min(P - 1 - s, M) forwards, then F(w + i), B(i) for i < M - w, then the
                 last w backwards (PipeDream-flush, Megatron's non-interleaved schedule)
    interleaved  virtual operation n -> slot (n // (P·v))·P + n % P, chunk (n % (P·v)) // P
                 (backward: v - 1 - chunk); W = 2·(P - s - 1) + (v - 1)·P warm-up forwards
                 (all M·v when M == P), at most M·v; then F(W + i), B(i); then the rest B.
                 M must be a multiple of P (`Pipeline.check_microbatches`).

GPipe with uniform stages (F[s, k] = f_k, B[s, k] = b_k) has a closed form in any order,
the proportionate flow shop's makespan once per phase (`gpipe_time`):

    step = Σ f + (P - 1)·max f + Σ b + (P - 1)·max b

`replica_times` takes it where every sum is exact (`_exact_times`: durations of whole units, as integer costs
divisible by P·(1 + k) give), there the walk's floats; elsewhere the two may differ in the last bits.

Why replicas are independent: with pipeline parallelism the data-parallel replicas meet
only in the gradient reduction at the end of the step (DeepSpeed refuses ZeRO-2/3 with
pipelines, torchtitan keeps parameters unsharded across micro-batches under PP, Megatron's
distributed optimizer reduces once), so the step is the slowest replica's pipeline, and
each replica runs its cells in its own order.  (Micro-batches in lockstep across replicas,
as the plain micro-batch objective assumes, would give every operation the max over
replicas: never less, as every end time is monotone in every duration.)
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .spec import Pipeline

# rows walked together, about: a block holds up to 1.25 BLOCK_ROWS rows at M <= 16, fewer in proportion above.  Since
# the walk reuses its registers (`_walk`) one block beats two up to ~10 000 rows at M 32 (P 8: 2560 rows 1F1B 1.5 vs
# 2.2 ms, interleaved 3.0 vs 4.2; 5120 rows 3.2 vs 4.6, 5.8 vs 8.7; M 8-16 up to 10 240 rows 0.6-0.9x two), and two
# win from ~10 000-20 000 rows at M 32 (20 480: 16.6 vs 12.4 ms): the starts' walk at D = 2560, M 32 is one block
BLOCK_ROWS = 8192


def stage_order(pipeline: Pipeline, num_microbatches: int, stage: int) -> list[tuple[bool, int, int]]:
    """The operations of `stage` in the order it runs them: (backward?, slot, model stage).

    >>> stage_order(Pipeline(stages=2), 3, 0)
    [(False, 0, 0), (False, 1, 0), (True, 0, 0), (False, 2, 0), (True, 1, 0), (True, 2, 0)]
    """
    p, m, v = pipeline.stages, num_microbatches, pipeline.virtual_stages
    if pipeline.schedule == "gpipe":
        return [(False, k, stage) for k in range(m)] + [(True, k, stage) for k in range(m)]
    total = m * v
    if pipeline.schedule == "1f1b":
        warmup = min(p - 1 - stage, m)
    else:
        warmup = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)

    def op(n: int, backward: bool) -> tuple[bool, int, int]:
        within = n % (p * v)
        chunk = within // p
        if backward:
            chunk = v - 1 - chunk
        return backward, (n // (p * v)) * p + within % p, chunk * p + stage

    order = [op(n, False) for n in range(warmup)]
    for i in range(total - warmup):
        order += [op(warmup + i, False), op(i, True)]
    return order + [op(n, True) for n in range(total - warmup, total)]


@lru_cache(maxsize=64)
def programs(pipeline: Pipeline, num_microbatches: int) -> tuple[np.ndarray, ...]:
    """Every operation once, inputs first: (stage, slot, backward, previous op of its stage, input
    op) as int64 arrays, -1 where there is none.  RuntimeError if the orders deadlock."""
    pipeline.check_microbatches(num_microbatches, "the number of micro-batches")
    p, g_count = pipeline.stages, pipeline.stages * pipeline.virtual_stages
    orders = [stage_order(pipeline, num_microbatches, s) for s in range(p)]
    where = {(backward, slot, g): (s, i) for s, order in enumerate(orders)
             for i, (backward, slot, g) in enumerate(order)}

    def needs(backward: bool, slot: int, g: int):
        if not backward:
            return (False, slot, g - 1) if g > 0 else None
        return (True, slot, g + 1) if g < g_count - 1 else (False, slot, g)

    done, position, rows = {}, [0] * p, []
    while len(rows) < len(where):
        progressed = False
        for s in range(p):
            while position[s] < len(orders[s]):
                key = orders[s][position[s]]
                need = needs(*key)
                if need is not None and need not in done:
                    break
                previous = done[orders[s][position[s] - 1]] if position[s] else -1
                done[key] = len(rows)
                rows.append((s, key[1], int(key[0]), previous, -1 if need is None else done[need]))
                position[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"the {pipeline.schedule} orders of {pipeline} deadlock at M={num_microbatches}")
    table = np.array(rows, dtype=np.int64).reshape(-1, 5)
    columns = tuple(np.ascontiguousarray(table[:, c]) for c in range(5))
    for column in columns:
        column.setflags(write=False)
    return columns


def replica_times(pipeline: Pipeline, forward: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """Each replica's pipeline time: forward / backward seconds (>= 0) of shape (replicas, M) (uniform stages)
    or (replicas, P, M), slot k the k-th micro-batch each replica runs (see the module docstring).

    >>> replica_times(Pipeline(stages=2), np.array([[1.0, 1.0]]), np.array([[2.0, 2.0]])).tolist()
    [9.0]
    """
    forward, backward = np.asarray(forward, dtype=np.float64), np.asarray(backward, dtype=np.float64)
    exact = None if pipeline.schedule != "gpipe" or pipeline.virtual_stages > 1 or forward.ndim != 2 else \
        _exact_times(forward, backward, pipeline.stages)
    if exact is not None:  # every sum exact: the walk's floats, O(M) a row
        return exact
    rows, m = forward.shape[0], forward.shape[-1]
    blocks = -(-rows * max(m, 16) // (20 * BLOCK_ROWS))  # ceil(rows / (1.25 BLOCK_ROWS · min(1, 16 / M)))
    if blocks > 1:  # each row is timed alone: the same floats in blocks
        return np.concatenate([replica_times(pipeline, f, b) for f, b in zip(np.array_split(forward, blocks),
                                                                             np.array_split(backward, blocks))])
    uniform, staged, stage_ends, count = _walk(pipeline, m)
    if not stage_ends:
        return np.zeros(rows)
    durations = _durations(pipeline, forward, backward)
    ends, maximum, add = list(np.empty((count, rows))), np.maximum, np.add  # end times, written in place (`_walk`)
    for left, right, row, out in uniform if forward.ndim == 2 else staged:
        # durations >= 0, so end times are >= +0.0 and an absent operation's 0 changes no max
        end = ends[out]
        if right >= 0:
            maximum(ends[left], ends[right], out=end)
            add(end, durations[row], end)  # `out` given by position: ~0.2 µs less a call (numpy 2)
        else:
            add(ends[left] if left >= 0 else 0.0, durations[row], end)
    # a stage's end times never fall along its order: its last operation ends it
    first, *rest = (ends[register] for register in stage_ends)
    times = np.maximum(first, rest[0]) if rest else first.copy()
    for end in rest[1:]:
        np.maximum(times, end, out=times)
    return times


def _durations(pipeline: Pipeline, forward: np.ndarray, backward: np.ndarray) -> list[np.ndarray]:
    """`replica_times`' duration rows, one per row number of `_walk`: the rows of (2M, replicas) per stage (no
    (operations, replicas) gather), each a contiguous view, whatever the layout given.  Written into C order: for
    rows (replicas, M) in C order (the search's and the probes' rows, gathered) concatenate laid the transposes out
    in F order, every duration row strided, 1.6-2x the walk's time (D = 2560 x 16: 1.50 -> 0.74 ms, 1F1B)."""
    rows, axes = forward.shape[0], (*range(1, forward.ndim), 0)  # the rows last
    shape = forward.transpose(axes).shape
    both = np.empty((*shape[:-2], 2 * shape[-2], rows))
    np.concatenate([forward.transpose(axes), backward.transpose(axes)], axis=-2, out=both)
    if pipeline.virtual_stages > 1:
        both /= pipeline.virtual_stages
    return list(both.reshape(int(np.prod(both.shape[:-1])), rows))  # its rows, each made a view once


@lru_cache(maxsize=64)
def _walk(pipeline: Pipeline, num_microbatches: int) -> tuple[tuple, tuple, tuple[int, ...], int]:
    """`replica_times`' walk of `programs`, per operation (the rows of end times it reads, its previous op's and its
    input op's, each op once and -1 for none: one row where its previous op is its input, as 1F1B's backwards on the
    last stage, M of 2·P·M operations, a max fewer each; its durations' row; the row its end is written to), with the
    rows of uniform stages' durations (2M, rows) and of per-stage ones (P·2M, rows); each stage's last operation's
    row, and the rows of end times in all.  An end no later operation reads frees its row for the next ones (a
    stage's last excepted, read at the end), so a few rows are held, not all, each written in place: no array made per
    operation (D = 2560 x 32, interleaved M 32: 4.2 -> 2.8 ms a walk of 2560 rows, 1.05 -> 0.92 ms of 16; the same
    floats)."""
    stage, slot, is_backward, previous, needed = programs(pipeline, num_microbatches)
    stage_ends = tuple(dict(zip(stage.tolist(), range(stage.size))).values())
    operations = list(zip(previous.tolist(), needed.tolist()))
    last_read = {}
    for op, inputs in enumerate(operations):
        for earlier in inputs:
            if earlier >= 0:
                last_read[earlier] = op
    kept, held, free, reads, count = set(stage_ends), {}, [], [], 0
    for op, inputs in enumerate(operations):
        registers = tuple(held[earlier] for earlier in dict.fromkeys(inputs) if earlier >= 0)
        reads.append(registers + (-1,) * (2 - len(registers)))
        free += [held[earlier] for earlier in set(inputs) if earlier >= 0 and last_read[earlier] == op and
                 earlier not in kept]  # read for the last time here: this operation's end may take its row
        held[op], count = (free.pop(), count) if free else (count, count + 1)
    column = slot + num_microbatches * is_backward  # its row of one stage's durations (2M, rows)
    walk = [tuple((left, right, row, held[op]) for op, ((left, right), row) in enumerate(zip(reads, rows.tolist())))
            for rows in (column, stage * 2 * num_microbatches + column)]
    return walk[0], walk[1], tuple(held[op] for op in stage_ends), count


def step_rows(cell_costs: np.ndarray, count: int) -> np.ndarray:
    """The rows (replicas, ascending) of cells (rows, M) whose times (uniform stages) hold the step: the `count` of
    largest sums and each row above the row of largest sum in some cell.  A replica's time never falls where a
    cell's cost rises, in floats too (the stage times' products, the walk's max and +, all rounded monotonically), so
    no other row runs longer than that one: the max of these rows' times is every row's.

    >>> step_rows(np.array([[1.0, 3.0], [2.0, 2.0], [2.0, 3.0], [0.0, 1.0]]), 1).tolist()
    [2]
    """
    columns = np.ascontiguousarray(cell_costs.T)  # reductions over short rows run a loop per row (`_row_max`)
    sums = np.add.reduce(columns, axis=0)
    if count >= sums.size:
        return np.arange(sums.size)
    top, largest = int(np.argmax(sums)), np.argpartition(sums, sums.size - count)[sums.size - count:]
    above = np.logical_or.reduce(columns > columns[:, top:top + 1], axis=0)
    return np.union1d(np.flatnonzero(above), np.append(largest, top))


def gpipe_time(forward: np.ndarray, backward: np.ndarray, stages: int) -> np.ndarray:
    """GPipe's closed form per replica (uniform stages, rows = replicas): Σ f + (P - 1)·max f + the same of b.

    >>> gpipe_time(np.array([[1.0, 3.0]]), np.array([[2.0, 6.0]]), 4).tolist()
    [39.0]
    """
    return (forward.sum(axis=1) + (stages - 1) * _row_max(forward)
            + backward.sum(axis=1) + (stages - 1) * _row_max(backward))


def _exact_times(forward: np.ndarray, backward: np.ndarray, stages: int) -> np.ndarray | None:
    """GPipe's closed form (`gpipe_time`) where every duration (rows, M) is a whole multiple of one power of two u with
    (M + P - 1)·(max f + max b) < 2**53·u, else None.  Every end time of the walk and every sum and product of the
    closed form is then a whole multiple of u at most that (a replica's time, at most Σ f + (P - 1)·max f + the same
    of b), so each is exact whatever the order of the sums: the two give the same floats (the exact proportionate flow
    shop's makespan), the row sums by a matrix product.  Integer costs divisible by P·(1 + k)
    make such durations (`Pipeline.stage_times`; bench_pipeline's cost model, D = 2560 x 32, M 16: the starts' 7680
    rows walked in 2.4-2.7 ms).  The first row is tried alone first (cheap where not)."""
    if not forward.size:
        return None
    for rows in ((forward[:1], backward[:1]), (forward, backward)):  # the first row's unit divides u: tried first
        top = (forward.shape[1] + stages - 1) * (float(rows[0].max()) + float(rows[1].max()))
        exponent = math.frexp(top)[1]  # top < 2**exponent, so 2**53·u = 2**(exponent + 1) covers it and its rounding
        if rows[0] is not forward and not top > 0:
            continue  # a first row of 0 (or NaN: refused below)
        if not 0 < top < math.inf or not -960 < exponent < 960:
            return None
        scale = math.ldexp(1.0, 52 - exponent)  # 1 / u: exact scaling (the values are below 2**exponent)
        for values in rows:
            scaled = values * scale
            if not np.array_equal(np.floor(scaled), scaled) or (scale < 1 and np.count_nonzero(scaled) !=
                                                                 np.count_nonzero(values)):  # none lost below u
                return None
    times = np.zeros(forward.shape[0])  # +0.0: a row of -0.0 alone ends at +0.0, as the walk's
    ones = np.ones(forward.shape[1])
    for values in (forward, backward):  # row sums by a matrix product (exact in any order), maxima over columns
        times += values @ ones
        times += (stages - 1) * _row_max(values)
    return times


def _row_max(values: np.ndarray) -> np.ndarray:
    """Each row's max (exact in any order): over the columns of a transposed copy, one elementwise max per column,
    where numpy's reduction along short rows runs a loop per row (2048 x 16: 35 µs, not 131)."""
    return np.maximum.reduce(np.ascontiguousarray(values.T), axis=0)

