"""The split plan's local search never "moves" an item onto the block it is on (`search.py`)."""

from orchmllm import balance_microbatches
from orchmllm.balancers.context_parallel import search


def test_regression_the_search_spent_its_moves_putting_a_group_item_back_on_its_own_block(monkeypatch):
    """A split item's moves weigh its own group's block too, from its ranks' loads without it: (L - t) + t rounds
    a hair below L, so putting it back read as a move lowering the makespan rank; it changed nothing, the next
    round found the same one, and the search spent every move left on it (the issue 24 probe's bimodal family at
    D = 64 x 16, seed 1: 63 of 64 moves; allgiant at D = 512, seed 11: all 183).  Its own block is no move now."""
    from orchmllm.benchmarks.bench_context_parallel import COST, SPEC, issue24_families

    moves, apply = [], search._State.apply

    def recorded(self, item, start, degree, rank):
        moves.append(item >= 0 and (int(self.start[item]), int(self.degree[item])) == (start, degree))
        return apply(self, item, start, degree, rank)

    monkeypatch.setattr(search._State, "apply", recorded)
    lengths = issue24_families(64, 16, 1)["bimodal"]
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=32768, cost=COST, context_parallel=SPEC)
    assert moves and not any(moves)
    assert plan.step_cost <= 1.1 * plan.lower_bound
