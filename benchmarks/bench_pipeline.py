"""Pipeline-parallel steps: the PP-aware cells against the PP-unaware plan, DynaPipe-style
micro-batching and the certified bound; planning time at D = 2560 × 32.

Run: python3.11 -m pytest benchmarks/bench_pipeline.py -q -s   (--heavy: D = 512 too)

Instances: the LLM-stage lengths of `sample_workload`, 8·M samples per replica (about 8 per
cell), budget T = max(16k, the longest item); realistic mixes (default, vision, speech) and
giant-heavy ones (long: 5 % long videos and 5 % 8k-128k documents; long_tail: Pareto);
cost: the 84B model's LLM FLOPs.  P ∈ {4, 8}, M ∈ {8, 16, 32}, D ∈ {8, 64} (and 512), the
three schedules.  The planner's constants (search budget, light replicas, swaps) were set
on the default and long mixes at seeds 1 and 2, the search's stop gap (which also ends the starts)
on this grid at seeds 1 and 2, its stall window on the planning-time instance (default, seed 7,
D = 2560), its rounds (`search.CellSearch.rounds`) on this grid at seeds 1 and 2 and on the
planning-time instance with a fixed M (held out: seeds 61, 67 and 71, D 8/64 and 61 at D = 512), its
raised starts (`planner._starts`) on that instance at seeds 7 and 11 (held out: 83, 89, 97 at D 8/64, 83 at 512);
the figures are on seeds 7, 23 and 31 (23 and 31 never looked at before issue 28's audit),
and issue 28's targets are asserted per seed on each family of mixes: ours / PP-unaware at most
0.97 at the median and never above 1, ours / bound at most 1.02 at the median.  GPipe's rows sit
at ~1.000 (its step is order-free, flat cells are its optimum and the plain plan already has them,
within 0.2 % of the bound) and the interleaved ones at ~0.973: on 53 of 90 GPipe and 34 of 90
interleaved rows (seed 23, D up to 512) 0.97 x the PP-unaware step is below the certified bound, so
the 0.97 holds over the three schedules, not per schedule.  Seed 7's realistic median is 0.959
(0.969 before pp32's raised starts, `planner._starts`).
Every plan's step is `pipeline_step` of its cells (same model, same bound), micro-batch m
run m-th on every replica: ours (`pipeline=`), the PP-unaware plan in its own order, and
DynaPipe-style per-replica contiguous micro-batches (`study.pipeline_peers`).
"""

import os
import time

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers import Pipeline
from orchmllm.balancers.pipeline.planner import pipeline_step
from orchmllm.study.models import MODELS
from orchmllm.study.pipeline_peers import pipeline_peers
from orchmllm.study.workloads import sample_workload

COST = MODELS["84b"].llm.cost(causal=True)
REALISTIC, GIANT = ("default", "vision", "speech"), ("long", "long_tail")
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2))
HELD_OUT_SEED = 7  # the planning-time instance's
QUALITY_SEEDS = (7, 23, 31)
TARGET_VS_UNAWARE, TARGET_VS_BOUND = 0.97, 1.02  # issue 28, at the median
PAIRS = 11  # alternated pairs of the planning-time ratio


def _instance(workload, ranks, microbatches, seed):
    batch = sample_workload(workload, ranks, 8 * microbatches, seed)
    lengths = batch.sample_llm_length
    return lengths, batch.sample_source, max(16384, int(lengths.max()))


def _row(workload, ranks, microbatches, stages, schedule, virtual, seed):
    lengths, sources, budget = _instance(workload, ranks, microbatches, seed)
    pipeline = Pipeline(stages=stages, schedule=schedule, virtual_stages=virtual)
    ours = balance_microbatches(lengths, ranks, max_tokens_per_microbatch=budget, cost=COST,
                                num_microbatches=microbatches, pipeline=pipeline)
    assert ours.pipeline.lower_bound <= ours.pipeline.step_time
    problem, peers = pipeline_peers(lengths, ranks, sources=sources, cost=COST, max_tokens_per_microbatch=budget,
                                    num_microbatches=microbatches)
    steps = {name: pipeline_step(problem, plan.rank, plan.microbatch, pipeline.runnable(plan.num_microbatches),
                                 pipeline, 0.0).step_time for name, plan in peers.items()}
    assert ours.pipeline.step_time <= steps["unaware"]  # never worse than the PP-unaware plan
    return dict(workload=workload, D=ranks, M=microbatches, P=stages, schedule=schedule,
                vs_unaware=ours.pipeline.step_time / steps["unaware"], vs_bound=1 + ours.pipeline.gap,
                dynapipe_vs_ours=steps["dynapipe_style"] / ours.pipeline.step_time,
                bubble=ours.pipeline.bubble_fraction, seconds=ours.solve_seconds)


def _summary(rows, key):
    return f"median {np.median([r[key] for r in rows]):.3f}, max {max(r[key] for r in rows):.3f}"


@pytest.mark.timeout(7200)
@pytest.mark.parametrize("seed", QUALITY_SEEDS)
def test_pipeline_aware_against_unaware_dynapipe_and_bound(request, seed):
    heavy = request.config.getoption("--heavy", default=False)
    rows = [_row(w, d, m, p, s, v, seed) for w in REALISTIC + GIANT for d in ((8, 64, 512) if heavy
            else (8, 64)) for m in (8, 16, 32) for p in (4, 8) for s, v in SCHEDULES]
    print(f"\n{'workload':<10} {'D':>4} {'M':>3} {'P':>2} {'schedule':<11} {'ours/unaware':>12} {'ours/bound':>10} "
          f"{'dynapipe/ours':>13} {'bubble':>6} {'plan s':>7}")
    for r in rows:
        print(f"{r['workload']:<10} {r['D']:>4} {r['M']:>3} {r['P']:>2} {r['schedule']:<11} {r['vs_unaware']:>12.3f} "
              f"{r['vs_bound']:>10.3f} {r['dynapipe_vs_ours']:>13.3f} {r['bubble']:>6.3f} {r['seconds']:>7.3f}")
    for label, chosen in [("all", rows)] + [(s, [r for r in rows if r["schedule"] == s]) for s, _ in SCHEDULES] + \
            [(name, [r for r in rows if r["workload"] in mix]) for name, mix in (("realistic", REALISTIC),
                                                                                  ("giant-heavy", GIANT))]:
        print(f"{label:<12} ours/unaware {_summary(chosen, 'vs_unaware')}; ours/bound {_summary(chosen, 'vs_bound')}; "
              f"dynapipe/ours {_summary(chosen, 'dynapipe_vs_ours')}")
    for name, mix in (("realistic", REALISTIC), ("giant-heavy", GIANT)):
        chosen = [r for r in rows if r["workload"] in mix]
        assert np.median([r["vs_unaware"] for r in chosen]) <= TARGET_VS_UNAWARE, (seed, name)
        assert np.median([r["vs_bound"] for r in chosen]) <= TARGET_VS_BOUND, (seed, name)


def _ratios(piped, plain, pairs, best_of):
    """Per pair, the best of 3 CPU seconds (`time.process_time`) of `piped` over that of `plain`, which one first
    alternating: `pairs` ratios."""
    ratios = []
    for pair in range(pairs):
        order = (plain, piped) if pair % 2 == 0 else (piped, plain)
        seconds = {call: best_of(call, 3, time.process_time) for call in order}
        ratios.append(seconds[piped] / seconds[plain])
    return ratios


def _report(step):
    """What a user reads of a `PipelineStep`."""
    return (step.replica_times, step.step_time, step.unaware_step_time, step.lower_bound, step.gap, step.status,
            step.bubble_fraction)


@pytest.mark.timeout(1800)
def test_planning_time_at_2560_ranks(best_of):
    """D = 2560 × 32 samples, T = 16k, M free, P = 8 (1F1B): planning with the pipeline, its whole report read
    (`PipelineStep`'s fields: every replica's time, the step of the plain cells it started from, the bound, the
    bubble), over planning without, same run; issue 28 asks at most 1.5x.

    Per pair the best of 3 calls each in CPU seconds (`time.process_time`: a shared machine's other processes
    take the wall clock, one call's 10 ms swung 0.6-4.4x in wall time at load 10), which one first alternating;
    the median of PAIRS pairs."""
    lengths = sample_workload("default", 2560, 32, HELD_OUT_SEED).sample_llm_length
    pipeline = Pipeline(stages=8)
    plain = lambda: balance_microbatches(lengths, 2560, max_tokens_per_microbatch=16384, cost=COST)  # noqa: E731
    piped = lambda: _report(balance_microbatches(lengths, 2560, max_tokens_per_microbatch=16384,  # noqa: E731
                                                 cost=COST, pipeline=pipeline).pipeline)
    first = best_of(piped, 1)  # the best shape of (P, M) is computed once per process
    ratios = _ratios(piped, plain, PAIRS, best_of)
    plan = balance_microbatches(lengths, 2560, max_tokens_per_microbatch=16384, cost=COST, pipeline=pipeline)
    print(f"\nD = 2560 x 32, M = {plan.num_microbatches}: first call {first:.3f} s; later calls with the report read / "
          f"plain median {np.median(ratios):.2f} (all {', '.join(f'{r:.2f}' for r in ratios)}); ours/start "
          f"{plan.pipeline.step_time / plan.pipeline.unaware_step_time:.3f}; load {os.getloadavg()[0]:.1f}")
    assert np.median(ratios) <= 1.5, ratios


FIXED_PAIRS = 5  # alternated pairs per case of the fixed-M ratios


@pytest.mark.timeout(1800)
def test_planning_time_at_2560_ranks_with_a_fixed_microbatch_count(best_of):
    """D = 2560 × 32 samples, T = 16k, P = 8, M FIXED at 8, 16 and 32 (as trainers run: num_microbatches=8/16/32),
    the three schedules (interleaved with v = 2): planning with the pipeline over planning the same M without,
    same run, measured like `test_planning_time_at_2560_ranks` (best of 3 CPU seconds per call, alternated
    pairs, the median of FIXED_PAIRS).  Issue 28's 1.5x is NOT met here and not asserted.  The shaped start (one
    LPT over all M·D cells, ~0.25 of a plain plan) and one walk of every replica's schedule (0.06-0.25 of one) are
    needed for the quality the grid asks (pp29: plain + shaped start timed, no search, 1.45-1.70x); since the
    replicas that take the items overflowing a cell alone start their other cells higher (`planner._starts`, where
    at most D items overflow: M = 8 here) the shaped start alone is within 1.02-1.05x of the bound.  pp32
    (2026-12-06, load 7, seed 7), before -> after, piped / plain (step / bound): M = 8 GPipe 3.18 -> 1.72x (1.177
    -> 1.046), 1F1B 3.19 -> 2.10x (1.114 -> 1.017), interleaved 4.02 -> 3.31x (1.095 -> 1.000); M = 16, where
    9000-12000 items overflow a cell and a second shaped start takes the D largest so (the faster searched; GPipe
    searches both, c2f5fc8): GPipe 2.91 -> 6.7x (1.321, same plan on this seed; up to 10 % faster steps held out),
    1F1B 3.22 -> 3.71x (1.171 -> 1.055), interleaved 6.54 -> 3.67x (1.098 -> 1.019).  pp33 (2026-12-06, load 5.5,
    same plans): M = 8 interleaved 3.7 -> 1.72x (its shaped start meets the certified bound, the largest item's
    chain: no search since 1fb51b6), M 16 1F1B and interleaved 3-7 % less planner time (a round's moves made at
    once); M 16 GPipe ~6.8x: the second shaped start's search (budget-bound, ~60 % of the planner's time here) ends
    up to 15 % faster than the first's on most long-mix rows at D 8-512 (and speech at D 2560, P 8), and no rule on
    the overflow count separates those rows from this one.  pp34 (2026-12-06, load ~7, two alternated runs, the
    same plain planner): M = 8 GPipe 1.70 -> 1.57x, 1F1B 2.02 -> 1.99x, interleaved ~1.56x (unchanged); M = 16
    GPipe 6.4 -> 3.3x, 1F1B 3.7 -> 3.3x, interleaved 3.8 -> 3.5x, by doing less for the same plans (held out): a
    search behind the step found before it stops where its rate cannot reach it (the second GPipe start's
    66 120 rows -> 3 480), GPipe searches its plain cells as planned (order-free: no reordered start to walk),
    losing searches are not summed, the winner's accounts and its moved rows' times are kept where exact, a round
    times one offer of an item that lands below its replica anyway (2048 of 3040 rows a round), the shaped start
    not searched is walked on 17 replicas that show it slower, and GPipe's closed form takes row maxima over
    columns.  pp35 (2026-12-06, load 5.6-6.0, three alternated runs, HEAD 7c13634 against the same HEAD with the
    pipeline files before a7c585d; same plans held out): M = 8 GPipe ~1.51 -> ~1.47x, 1F1B 1.84 -> 1.77x, interleaved
    ~1.53x (no search there: unchanged); M = 16 GPipe 3.06 -> 2.87x, 1F1B 3.07 -> 2.81x, interleaved 3.24 -> 3.02x: a
    round times only the items that may be offered (their time without them lies in [time - cost, time]: 960 -> ~450
    rows, 1F1B), times the replicas several items leave with the offers where their moves are known, a search copies
    the cells only when it changes them, and the moved replicas' cells are summed alone.  pp36 (2026-12-06, load ~10,
two alternated runs of 21 rounds in one process, HEAD 9e3ef4f against 12f5d31, same plans; over the plain step of
2b223d0's parent, today's in brackets): M = 8 GPipe ~1.5x (unchanged), 1F1B 1.74-1.88 -> 1.59-1.72x (1.10-1.17x),
interleaved 1.54-1.61 -> 1.41-1.49x (0.95-0.98x); M = 16 GPipe ~2.9x (unchanged), 1F1B 2.71-2.91 -> 2.39-2.57x
(1.70-1.74x), interleaved 3.03-3.20 -> 2.47-2.70x (1.74-1.92x): a replica's time never falls where a cell's cost
rises, so the plain cells (1F1B, interleaved: only their step is read) are timed on the replica holding every
micro-batch's largest cell, and their reordering on 64 replicas that hold its step and show its search stalling
above the step found (then skipped, `search.stalls_at_once`).  pp38 (2026-12-06, load 5.2-5.6, this test in git
archive trees of HEAD a3d8c95 with the planner, schedules and lpt.py of a3fadf2 and as is, alternated twice; plans
bit-identical on held-out digests): M = 16 1F1B 1.88-1.92 -> 1.49-1.61x, interleaved 1.87 -> 1.54-1.55x, GPipe 2.22-2.24
-> 2.16-2.18x, M = 8 1F1B 1.18 -> 1.13-1.16x, M free ~1.37x (unchanged): the walks read contiguous duration rows
whatever the layout given (gathered rows came in C order and concatenate laid them out in F order, every duration row
strided: 1.6-2x a walk's time); where two shaped starts are made and only the faster searched, the first's LPT's first
M·D choices bound its cells from below and show it the slower (`shaped.first_from_below`: one LPT over all items
fewer); the reordered plain cells are made and timed on their 64 step rows alone, in the starts' walk, unless
searched; the raised start's keys sort by introsort (many runs).  pp39 (2026-12-06, load 3.4-3.7, this test in git
archive trees of f6c16a5 and of it with 11cba0b's schedules.py, alternated twice; same plans held out): M = 16 GPipe
2.16-2.25 -> 2.12-2.14x (min of 11 in one process 38.7 -> 37.9 ms, plain 18.2): GPipe's replica times take the closed
form where every sum is exact (`schedules._exact_times`: durations of whole units, as this cost model gives), the
walk's floats (the starts' 7680 rows 2.7 -> 1.5 ms).  pp40 (2026-12-06, load 2.9-3.2, this test in git archive
trees of d19f349 and 630d46a, alternated twice; a GPipe plan change, same plans on 306 held-out and tuning rows):
M = 16 GPipe 2.09-2.10 -> 1.59x (one noisy run 1.71; min of 9 in one process 39.4 -> 30.0 ms, plain 18.9): GPipe's
second shaped start (the D largest pinned) is bounded from below by its LPT's first 4·D choices and not made where
that bound runs longer than the first's step and the D largest hold < 0.16 of the work (`shaped.pinned_heavy`).
pp41 (2026-12-06, load 6.5-9, this test with M = 32 added, in git archive trees of 79fca74 and of it with pp41's
pipeline files, alternated twice): M = 16 1F1B 1.59-1.61 -> 1.54-1.55x, interleaved 1.51-1.57 -> 1.44-1.46x, M = 32
interleaved 1.70-1.71 -> 1.43-1.46x, GPipe 1.20-1.22 -> 1.13-1.14x; M = 16 GPipe (~1.6x) and M = 32 1F1B
(1.52-1.55x) not met, M = 8 unchanged: a search behind its rival stops its steps where the steps its budget left buys
cannot bring it level (`search.CellSearch._out_of_reach`, exact: at M = 32 the dropped search from the slower start
walked ~13 000 rows), and 1F1B and interleaved make the second shaped start alone where the D largest items are
light and spread (`shaped.second_alone`, a heuristic: the first's bound was ~0.12 of the planning; same plans held
out).
    What is left is walks (`replica_times`, numpy-bound: ~1.6 ns per operation and replica, ~0.2 ms a walk
    however few rows at M = 16;
    batching operations by level with gathers was 2-5x slower; the 1F1B walk has no O(M) form, its critical paths
    zig-zag over the stages), the shaped LPTs (`lpt.greedy_from`, ~2 ms each) and the rounds.  Asserted: that no case
    exceeds 12x, a guard (1F1B M = 8 read 11.4-12.9x before pp29's rounds) and that every plan is at most the
    step of the plain cells it started from."""
    lengths = sample_workload("default", 2560, 32, HELD_OUT_SEED).sample_llm_length
    medians = {}
    for microbatches in (8, 16, 32):
        for schedule, virtual in SCHEDULES:
            pipeline = Pipeline(stages=8, schedule=schedule, virtual_stages=virtual)
            plain = lambda: balance_microbatches(lengths, 2560, max_tokens_per_microbatch=16384,  # noqa: E731
                                                 cost=COST, num_microbatches=microbatches)
            piped = lambda: _report(balance_microbatches(  # noqa: E731
                lengths, 2560, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=microbatches,
                pipeline=pipeline).pipeline)
            best_of(piped, 1)  # the best shape of (P, M) is computed once per process
            ratios = _ratios(piped, plain, FIXED_PAIRS, best_of)
            step = piped()[1:3]
            assert step[0] <= step[1]  # ours <= the step of the plain cells it started from
            medians[microbatches, schedule] = float(np.median(ratios))
            print(f"\nD = 2560 x 32, M = {microbatches}, {schedule}: piped / plain median "
                  f"{medians[microbatches, schedule]:.2f} (all {', '.join(f'{r:.2f}' for r in ratios)}); "
                  f"ours/start {step[0] / step[1]:.3f}; load {os.getloadavg()[0]:.1f}", end="")
    print()
    assert max(medians.values()) <= 12, medians
