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
raised starts (`planner._starts`) on that instance at seeds 7 and 11 (held out: 83, 89, 97 at D 8/64, 83 at 512),
GPipe's start by heights (`pipeline.heights.ROOM_SHARE`) on it at M 16, seed 7, and the long mix at D = 512, M 8,
seed 7 (held out: seeds 11, 23, 41 there; this grid at seeds 7, 23, 31, D 8/64 and 7, 23 at D = 512);
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
from orchmllm.balancers.pipeline.step import pipeline_step
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
FIXED_LIMIT = 1.5  # the median ratio asserted at M 8, 16 and 32 (issue 28)


@pytest.mark.timeout(1800)
def test_planning_time_at_2560_ranks_with_a_fixed_microbatch_count(best_of):
    """D = 2560 × 32 samples, T = 16k, P = 8, M FIXED at 8, 16 and 32 (as trainers run: num_microbatches=8/16/32), the
    three schedules (interleaved with v = 2): planning with the pipeline over planning the same M without, same run,
    measured like `test_planning_time_at_2560_ranks` (best of 3 CPU seconds per call, alternated pairs, the median of
    FIXED_PAIRS). Issue 28 asks 1.5x, asserted at every M. M 32 read ~1.8-2.0x from a209722 (the plain plan ~7x
    faster: 21-31 ms) until fd730f9: there every replica's M-shaped cells held one near the largest item (1F1B 1.274x
    the bound, the largest item's chain); the start on fewer micro-batches (`pipeline.fewer`: the items shaped for
    k < M cells, the rest empty) meets that bound, so the planner returns it as optimal and skips the other starts and
    searches (1.2-1.5x, 1F1B and interleaved).  M 16 1F1B and interleaved ~1.1-1.4x since the rounds' budget follows
    the gap left (`search.ROUND_GAP`), GPipe ~1.2x since its start by heights (`pipeline.heights`: ~0.25 of a plain
    plan, within ~1 % of the bound, searched alone).  What was tried and kept or rejected is in BENCHMARKS.md and the
    git log of this file and of `balancers/pipeline`. Also asserted: every plan is at most the step of the plain
    cells it started from."""
    medians = _fixed_ratios(HELD_OUT_SEED, (8, 16, 32), FIXED_PAIRS, best_of)
    assert all(median <= FIXED_LIMIT for median in medians.values()), medians


def _fixed_ratios(seed, counts, pairs, best_of):
    """{(M, schedule): the median piped / plain ratio} of `test_planning_time_at_2560_ranks_with_a_fixed_microbatch_
    count`'s measure at `seed` for each M of `counts` (printed, with the plain call's CPU ms); each plan at most the
    step of the plain cells it started from (asserted)."""
    lengths = sample_workload("default", 2560, 32, seed).sample_llm_length
    medians = {}
    for microbatches in counts:
        for schedule, virtual in SCHEDULES:
            pipeline = Pipeline(stages=8, schedule=schedule, virtual_stages=virtual)
            plain = lambda: balance_microbatches(lengths, 2560, max_tokens_per_microbatch=16384,  # noqa: E731
                                                 cost=COST, num_microbatches=microbatches)
            piped = lambda: _report(balance_microbatches(  # noqa: E731
                lengths, 2560, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=microbatches,
                pipeline=pipeline).pipeline)
            best_of(piped, 1)  # the best shape of (P, M) is computed once per process
            ratios = _ratios(piped, plain, pairs, best_of)
            step = piped()[1:3]
            assert step[0] <= step[1]  # ours <= the step of the plain cells it started from
            medians[microbatches, schedule] = float(np.median(ratios))
            print(f"\nD = 2560 x 32, seed {seed}, M = {microbatches}, {schedule}: piped / plain median "
                  f"{medians[microbatches, schedule]:.2f} (all {', '.join(f'{r:.2f}' for r in ratios)}; plain "
                  f"{1e3 * best_of(plain, 3, time.process_time):.0f} ms); ours/start {step[0] / step[1]:.3f}; "
                  f"load {os.getloadavg()[0]:.1f}", end="")
    print()
    return medians


HELD_OUT_TIME_SEEDS = (5, 13, 29, 41)


@pytest.mark.timeout(1800)
def test_planning_time_at_2560_ranks_held_out_seeds(best_of):
    """The fixed-M measure at held-out seeds, M 16 and 32, printed, not asserted (a load-sensitive ratio at seeds the
    bench's figures were not chosen on; BENCHMARKS.md records them).  Each plan at most its start's step (asserted)."""
    for seed in HELD_OUT_TIME_SEEDS:
        _fixed_ratios(seed, (16, 32), 3, best_of)
