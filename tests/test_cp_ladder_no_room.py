"""The split layout's ladder stops after NO_ROOM_RUN targets in a row without token room (`planner.layout`)."""

from orchmllm import balance_microbatches


def _longest_roomless_run(found: list[bool]) -> int:
    """The most targets in a row without token room after one that had it."""
    longest, run, laid = 0, 0, False
    for has_room in found:
        laid, run = laid or has_room, 0 if has_room else run + laid
        longest = max(longest, run)
    return longest


def test_regression_the_ladder_went_on_to_its_end_without_token_room(monkeypatch):
    """The issue 24 probe's zeros_giants family (90 % empty items, the rest 10-100k tokens) at D = 16 x 16, seed 19,
    T = 32k: a layout whose first target laid out went on through 7 wider targets without token room, to the
    ladder's end (bimodal at D = 512, seed 11: 39 of them, 0.12 s of 0.5 s); now NO_ROOM_RUN, the same plans."""
    from orchmllm.balancers.context_parallel import planner
    from orchmllm.benchmarks.bench_context_parallel import COST, SPEC, issue24_families

    passes = {}  # one layout pass per array of laid-out items: whether each target found token room
    place_groups = planner.place_groups

    def counted(*args):
        placed = place_groups(*args)
        passes.setdefault(id(args[5]), (args[5], []))[1].append(placed is not None)
        return placed

    monkeypatch.setattr(planner, "place_groups", counted)
    lengths = issue24_families(16, 16, 19)["zeros_giants"]
    plan = balance_microbatches(lengths, 16, max_tokens_per_microbatch=32768, cost=COST, context_parallel=SPEC)
    runs = [_longest_roomless_run(found) for _, found in passes.values()]
    assert plan.step_cost <= 1.1 * plan.lower_bound
    assert max(runs) == planner.NO_ROOM_RUN
