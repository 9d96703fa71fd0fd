"""Probes of the split micro-batch planner answered without the split planner (P22-15): the certificate that no
layout exists (`dual_feasible`) starts each spill's search and rules out a fill's grouping before its other
micro-batches are planned; the pass bound settles a refill's probe above the micro-batch's cost.  Counted on
long-context batches (every item over T / 2, or 5 % giants among short items), and the spill's result checked
against its search without certificates."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel, Topology, balance_microbatches
from orchmllm.balancers.context_parallel import microbatch, repair
from orchmllm.balancers.context_parallel.dual_feasible import cannot_lay_out
from orchmllm.study.models import MODELS
from orchmllm.tests.test_context_parallel_repair import over_items

COST = MODELS["84b"].stages()[-1].cost
BUDGET = 32768


def allbig(num_ranks: int, seed: int) -> np.ndarray:
    """32 items a rank of 32-64k tokens: every one splits, and each rank holds one shard of most of them."""
    return np.random.default_rng(seed).integers(32768, 65536, 32 * num_ranks)


def giants_ties(num_ranks: int, seed: int) -> np.ndarray:
    """32 items a rank: 5 % giants of ~100k tokens among items of ~2k, lengths tied within 3 tokens."""
    rng = np.random.default_rng(seed)
    n = 32 * num_ranks
    return np.where(rng.random(n) < 0.05, 100000 + rng.integers(0, 3, n), 2000 + rng.integers(0, 3, n))


def planned(lengths: np.ndarray, num_ranks: int):
    return balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=BUDGET, cost=COST,
                                context_parallel=ContextParallel(),
                                topology=Topology(num_nodes=num_ranks // 8, gpus_per_node=8))


def count_layouts(monkeypatch) -> list:
    """A list the split planner's runs append to from now on: 1 for a layout, 0 for none found."""
    runs, split = [], microbatch.balance_split

    def counted(*args, **kwargs):
        try:
            plan = split(*args, **kwargs)
        except microbatch.InfeasibleError:
            runs.append(0)
            raise
        runs.append(1)
        return plan

    monkeypatch.setattr(microbatch, "balance_split", counted)
    return runs


def test_regression_the_spill_planned_every_bisection_probe_above_the_certified_count(monkeypatch):
    """allbig, 64 x 8, T = 32k, seed 3: 42 spills planned 141 layouts (the doubling from one item, then the
    bisection, planned every count it tried above the fewest the certificate leaves; 765 probes, 1.4 s at
    D = 512).  That count is tried first now: where the planner lays it out (40 spills of 42), it is the fewest,
    found with one layout."""
    runs, spilled = count_layouts(monkeypatch), []
    spill = repair._spill

    def counted(*args):
        before = len(runs)
        plan = spill(*args)
        spilled.append((sum(runs[before:]), runs[before:].count(0)))  # (layouts, plans without one)
        return plan

    monkeypatch.setattr(repair, "_spill", counted)
    plan = planned(allbig(64, 3), 64)
    first_laid = [layouts for layouts, failed in spilled if not failed]
    assert len(first_laid) >= 30 and first_laid == [1] * len(first_laid)
    assert plan.cell_tokens.max() <= BUDGET


def test_regression_a_grouping_certified_without_layout_was_planned_up_to_that_micro_batch(monkeypatch):
    """allbig, 64 x 8, T = 32k, seed 3: the fills of 90 % and 85 % planned 35 micro-batches before reaching one
    that the certificate rules out.  Such a grouping is now refused before any of its micro-batches is planned."""
    runs, refused = count_layouts(monkeypatch), []
    planned_grouping = microbatch._planned

    def counted(lengths, grouping, num_microbatches, num_ranks, spec, budget, overhead, plan_pass):
        before = len(runs)
        plan = planned_grouping(lengths, grouping, num_microbatches, num_ranks, spec, budget, overhead, plan_pass)
        degrees = np.array(spec.degrees, dtype=np.int64)
        if any(cannot_lay_out(lengths[grouping == m], num_ranks, degrees, budget) for m in range(num_microbatches)):
            refused.append(len(runs) - before)
        return plan

    monkeypatch.setattr(microbatch, "_planned", counted)
    planned(allbig(64, 3), 64)
    assert refused and refused == [0] * len(refused)


def test_regression_a_later_fill_certified_without_layout_was_planned_until_its_deferral_failed(monkeypatch):
    """allbig, 64 x 8, T = 32k, seed 3: with no fill laid out yet (only the repaired plan), a later fill's deferral
    planned its micro-batches until one failed (the fills of 90 % and 85 %), though the certificate rules one out
    and the fills go on alike whether it is deferred or refused then.  Such a fill is refused unplanned now."""
    runs, groupings, planned_fills = count_layouts(monkeypatch), [], []
    split_cells, grouped = microbatch._split_cells, microbatch.group_microbatches
    monkeypatch.setattr(microbatch, "group_microbatches", lambda *args: groupings.append(grouped(*args)) or
                        groupings[-1])

    def counted(lengths, num_ranks, spec, budget, *args, **kwargs):
        before = len(runs)
        found = split_cells(lengths, num_ranks, spec, budget, *args, **kwargs)
        grouping = np.unique(groupings[-1], return_inverse=True)[1]
        degrees = np.array(spec.degrees, dtype=np.int64)
        if not kwargs.get("repair") and any(cannot_lay_out(lengths[grouping == m], num_ranks, degrees, budget)
                                            for m in range(int(grouping.max()) + 1)):
            planned_fills.append(len(runs) - before)
        return found

    monkeypatch.setattr(microbatch, "_split_cells", counted)
    planned(allbig(64, 3), 64)
    assert len(planned_fills) >= 2 and planned_fills == [0] * len(planned_fills)


def test_regression_the_refill_planned_probes_whose_bound_is_above_the_cost_it_must_keep(monkeypatch):
    """giants_ties, 64 x 8, T = 32k, seed 5: the refill's bisection planned prefixes whose pass bound is above the
    spilled micro-batch's cost (their plans cannot keep it; at D = 512, 14 of 30 probes, 20-100 ms each).  Those
    are answered by the bound now: every prefix planned has its bound within the cost."""
    above, refill = [], repair._refill

    def checked(grouping, m, rest, plan, later, room, lengths, times, budget, plan_pass, *certificates):
        cost = float(plan.loads.max())

        def recorded(items):
            above.append(plan_pass.bound(items) * (1 - microbatch.FLOOR_SLACK) > cost)
            return plan_pass(items)

        return refill(grouping, m, rest, plan, later, room, lengths, times, budget, recorded, *certificates)

    monkeypatch.setattr(repair, "_refill", checked)
    planned(giants_ties(64, 5), 64)
    assert above and not any(above)


def fake_spill(num_over: int, needed: int, certified: int | None, seed: int):
    """Micro-batch 0 of `num_over` + 1 items over T = 100; it lays out once `needed` of them (least time first,
    never the longest) move out, and a certificate (None: no certificate) rules out fewer than `certified`.
    (the items moved to micro-batch 1, the plan, the item sets planned)."""
    lengths, times, keep = over_items(num_over, seed)
    calls = []

    def moved_out(items):
        return num_over - np.count_nonzero((lengths[items] > 100) & (items != keep))

    def plan_pass(items):
        calls.append(items)
        return SimpleNamespace(loads=np.array([1.0]), size=items.size) if moved_out(items) >= needed else None

    certificates = None if certified is None else SimpleNamespace(
        certified_none=lambda items: bool(moved_out(items) < certified))
    grouping = np.zeros(num_over + 1, dtype=np.int64)
    plan = repair._spill(grouping, 0, lengths, times, 100, plan_pass, certificates)
    return np.flatnonzero(grouping == 1), plan, calls


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 60), st.data(), st.integers(0, 10**6))
def test_property_the_certified_start_moves_the_items_the_search_from_one_moves(num_over, data, seed):
    """Where laying out needs a count moved out and the certificate rules out fewer than some count at most that,
    the search moves the same items and returns the same plan as without the certificate; where the certificate's
    count lays out, with that one probe, and else with the probes of the search without it and one more."""
    needed = data.draw(st.integers(1, num_over + 1))  # num_over + 1: never lays out
    certified = data.draw(st.integers(1, min(needed, num_over)))
    moved, plan, uncertified_calls = fake_spill(num_over, needed, None, seed)
    moved_certified, plan_certified, calls = fake_spill(num_over, needed, certified, seed)
    assert moved.tolist() == moved_certified.tolist()
    assert (plan is None) == (plan_certified is None) and (plan is None or plan.size == plan_certified.size)
    assert len(calls) == (1 if certified == needed else len({call.size for call in uncertified_calls} | {
        num_over + 1 - certified}))
