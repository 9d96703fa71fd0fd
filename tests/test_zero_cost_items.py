"""Items of cost 0 (zero-length items under a cost without a per-item term) change no load: LPT and the
differencing place them in one step (probe22 P22-01: 2.9 s for `karmarkar_karp` and 83 ms for `lpt` at 2560 × 32
mostly-zero items, against 11 and 5 ms on the default mix: one item per round)."""

import numpy as np
import pytest

from orchmllm import CostModel, InfeasibleError, balance, balance_microbatches
from orchmllm.balancers.kernels import karmarkar_karp, lpt
from orchmllm.balancers.kernels.reference import dense_kk, heap_lpt
from orchmllm.balancers.problem import make_problem


def mostly_zero(seed: int, num_ranks: int, share: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.where(rng.random(num_ranks * 32) < share, 0, rng.integers(1, 5000, num_ranks * 32))


def counting(monkeypatch, module, name: str) -> list:
    calls, step = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(1) or step(*args, **kwargs))
    return calls


@pytest.mark.parametrize("share", [1.0, 0.97, 0.5])
@pytest.mark.parametrize("integer", [True, False])
def test_regression_lpt_places_the_zero_cost_items_at_once_with_the_same_plan(monkeypatch, share, integer):
    lengths = mostly_zero(1, 64, share)
    problem = make_problem(lengths, 64, costs=lengths * (1.0 if integer else 0.37))
    pops = counting(monkeypatch, lpt.heapq, "heappop")
    assignment = lpt.solve(problem).assignment
    assert len(pops) <= np.count_nonzero(lengths)  # the zero-cost items went through heap rounds, one pop each
    np.testing.assert_array_equal(assignment, heap_lpt(problem.item_costs, 64))


@pytest.mark.parametrize("share", [1.0, 0.97, 0.5])
def test_regression_differencing_deals_the_zero_cost_items_apart(monkeypatch, share):
    costs = mostly_zero(2, 64, share).astype(float)
    rounds = counting(monkeypatch, lpt, "round_length")
    assignment = karmarkar_karp.differencing(costs, 64)
    assert len(rounds) <= 40 + np.count_nonzero(costs)  # one a zero item before
    np.testing.assert_array_equal(np.sort(np.bincount(assignment, weights=costs, minlength=64)), dense_kk(costs, 64))
    counts = np.bincount(assignment[costs == 0], minlength=64)
    assert counts.max() - counts.min() <= 1 + np.count_nonzero(costs)  # dealt round-robin, fewest items first


@pytest.mark.parametrize("algorithm", ["lpt", "karmarkar_karp", "auto", "multifit"])
def test_zero_cost_plans_keep_every_item(algorithm):
    lengths = mostly_zero(3, 16, 0.9)
    plan = balance(lengths, 16, algorithm=algorithm)
    assert np.bincount(plan.assignment, minlength=16).sum() == lengths.size and plan.makespan >= lengths.max()


@pytest.mark.parametrize("num_ranks, seed", [(512, 3), (2560, 4)])
@pytest.mark.parametrize("explicit", [False, True])
def test_regression_auto_plans_the_costly_items_as_if_the_free_ones_were_absent(num_ranks, seed, explicit):
    """probe23 P23-07: with 90 % of the items free (empty samples, or `costs=` 0), auto's size rules counted them
    and skipped the searches the costly items alone get: 6.3 % (512) and 7.6 % (2560) above those items' plan."""
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(num_ranks * 32) < 0.9, 0, rng.integers(1, 8000, num_ranks * 32))
    if explicit:  # positive lengths, costs 0 for the masked ones
        kept = lengths > 0
        lengths = rng.integers(1, 8000, lengths.size)
        costs = np.where(kept, lengths.astype(float) ** 1.2, 0.0)
        whole, alone = balance(lengths, num_ranks, costs=costs), balance(lengths[kept], num_ranks, costs=costs[kept])
        assert whole.tokens.max() <= 1.05 * lengths.sum() / num_ranks  # rev16 R16-02: dealt by count, +24-30 %
    else:
        cost = CostModel(linear=1.0, quadratic=1e-4)
        whole, alone = balance(lengths, num_ranks, cost=cost), balance(lengths[lengths > 0], num_ranks, cost=cost)
    assert whole.makespan == alone.makespan and whole.lower_bound == pytest.approx(alone.lower_bound, rel=1e-9)
    counts = np.bincount(whole.assignment, minlength=num_ranks)
    assert counts.sum() == lengths.size and counts.max() - counts.min() <= np.bincount(
        alone.assignment, minlength=num_ranks).max() - np.bincount(alone.assignment, minlength=num_ranks).min() + 1


def part_free(rng, most_items: int):
    """A tiny instance with sources: (ranks, lengths, costs with about 40 % zeros, sources)."""
    num_ranks = int(rng.integers(2, 5))
    lengths = rng.integers(1, 50, int(rng.integers(4, most_items)))
    costs = np.where(rng.random(lengths.size) < 0.4, 0.0, lengths.astype(float))
    return num_ranks, lengths, costs, rng.integers(0, num_ranks, lengths.size)


def test_regression_with_sources_items_of_cost_0_stay_home():
    """probe24 P24-03: the communication-aware pass moved items of cost 0 off their source ranks (42 % of the moved
    bytes on half-free instances) where they change no load."""
    rng = np.random.default_rng(41)
    for _ in range(100):
        num_ranks, lengths, costs, sources = part_free(rng, 20)
        plan = balance(lengths, num_ranks, costs=costs, sources=sources)
        free = costs == 0
        assert np.array_equal(plan.assignment[free], sources[free])


def test_regression_items_of_cost_0_go_home_within_the_cap_and_never_when_padded():
    """probe24 P24-04: under a cap, items of cost 0 that fit at home still moved; rev16 R16-09: padded, an empty
    item sent home adds a row to its source's padded count (the makespan doubled: 36 -> 72)."""
    assert balance([9, 9, 9, 9, 0, 0, 0, 0], 2, padded=True, sources=[0, 0, 1, 1, 0, 0, 0, 0]).makespan == 36
    rng = np.random.default_rng(16)
    for _ in range(150):
        num_ranks, lengths, costs, sources = part_free(rng, 14)
        cap = int(balance(lengths, num_ranks, costs=costs, sources=sources).tokens.max()) + int(rng.integers(0, 20))
        try:
            plan = balance(lengths, num_ranks, costs=costs, sources=sources, max_tokens_per_rank=cap)
        except InfeasibleError:
            continue
        assert plan.tokens.max() <= cap
    plan = balance([41, 22, 38, 5, 26, 18, 1, 31], 3, costs=[0, 22, 38, 0, 26, 0, 1, 0],
                   sources=[0, 2, 0, 2, 1, 2, 0, 1], max_tokens_per_rank=67)
    assert plan.assignment[[0, 3, 5, 7]].tolist() == [0, 2, 2, 1]  # item 3 (5 tokens) moved 2 -> 1 with room at home


def test_regression_free_items_holding_huge_tokens_are_placed_without_overflow():
    """probe24 P24-05: the placeholders (free items' longest + each rank's tokens) summed past int64 (then on lengths
    of 2**60 and 2**61; lengths are below 2**53 now, so ~2**63 tokens take a thousand of the longest)."""
    lengths = np.array([2**53 - 1] * 1020 + [5, 3], dtype=np.int64)
    costs = np.zeros(lengths.size)
    costs[[0, 1, -1]] = [1.0, 2.0, 3.0]
    plan = balance(lengths, 2, costs=costs)
    assert plan.makespan == 3.0 and int(plan.tokens.sum()) == int(lengths.sum())


def test_regression_micro_batches_send_items_of_cost_0_home_where_their_cells_have_room():
    """probe24 P24-09: `balance_microbatches(..., sources=)` moved items of cost 0 that fit on their source rank (61 %
    of the moved bytes on tiny instances); they go home, into their own micro-batch or the source's roomiest cell,
    within every cell's budget, and no cell's cost changes."""
    lengths = [26, 14, 16, 3, 4, 1, 9, 40, 32, 45, 25, 30, 48, 36, 31, 27]
    costs = [26, 14, 0, 3, 0, 1, 0, 40, 32, 0, 0, 0, 0, 36, 31, 27]
    sources = [3, 1, 1, 3, 3, 3, 1, 2, 3, 2, 3, 2, 2, 1, 3, 0]
    plan = balance_microbatches(lengths, 4, max_tokens_per_microbatch=96, costs=costs, sources=sources)
    assert plan.rank[[4, 10, 11, 12]].tolist() == [3, 3, 2, 2] and plan.step_cost == 58
    rng = np.random.default_rng(9)
    for _ in range(100):
        num_ranks, lengths, costs, sources = part_free(rng, 24)
        budget = int(lengths.max()) * 3
        plan = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, costs=costs, sources=sources)
        alone = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, costs=costs)
        assert plan.cell_tokens.max() <= budget and np.isfinite(plan.step_cost) and alone.num_microbatches > 0
        assert np.bincount(plan.microbatch, minlength=plan.num_microbatches).all()  # none emptied
