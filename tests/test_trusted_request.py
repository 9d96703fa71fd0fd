"""`trusted_request`: the request of data its caller checked where it was made (the orchestrator's), the same as
`balance_request`'s of the same data, without scanning the entries again; the checks the caller cannot make
(token and cost sums, the cap's lower bound, the algorithm and options) keep `balance`'s errors."""

import numpy as np
import pytest

from orchmllm import CostModel, InfeasibleError, Orchestrator, Topology
from orchmllm.balancers import api
from orchmllm.balancers.api import balance_request, solve, trusted_request
from orchmllm.orchestrator import Batch, Sample, Segment, Stage


def _instance(seed: int):
    """Lengths, keywords for both entries (a cost model or per-item costs, a cap, sources or none), as arrays the
    orchestrator would hand over: read-only int64 lengths, int64 sources, float64 bytes."""
    rng = np.random.default_rng(seed)
    size, ranks = int(rng.integers(1, 300)), int(rng.choice([1, 4, 8]))
    lengths = rng.integers(0, 5000, size)
    lengths.setflags(write=False)
    options = {"algorithm": str(rng.choice(["auto", "lpt", "karmarkar_karp"]))}
    if seed % 3 == 0:
        options["costs"] = rng.random(size) * 100
    else:
        options["cost"] = CostModel(linear=1.0, quadratic=float(rng.choice([0.0, 1e-3])))
        options["padded"] = bool(seed % 3 == 1 and options["algorithm"] == "auto")
    if seed % 2:
        options["max_tokens_per_rank"] = int(lengths.max() + lengths.sum() // ranks + 1)
    if seed % 4 < 2 and not options.get("padded"):
        options.update(sources=rng.integers(0, ranks, size), item_bytes=rng.random(size) * 1e6 if seed % 5 else None,
                       topology=Topology(ranks // 2, 2) if ranks > 1 else None, makespan_slack=0.01,
                       fill=[None, "on_miss"][seed % 8 < 4])
    return lengths, ranks, options


@pytest.mark.parametrize("seed", range(24))
def test_trusted_request_plans_as_balance_request(seed):
    """Seeded instances of every kind the orchestrator asks (model or per-item costs, padded, capped, with sources,
    bytes, topology and fill): the same problem, origins and options, and the same plan."""
    lengths, ranks, options = _instance(seed)
    checked, trusted = balance_request(lengths, ranks, **options), trusted_request(lengths, ranks, **options)
    for name in ("lengths", "item_costs"):
        assert np.array_equal(getattr(checked.problem, name), getattr(trusted.problem, name))
    assert trusted.problem.lengths.dtype == np.int64 and trusted.problem.item_costs.dtype == np.float64
    for name in ("num_ranks", "cost", "padded", "max_tokens_per_rank", "time_limit", "equal_counts"):
        assert getattr(checked.problem, name) == getattr(trusted.problem, name)
    for name in ("kernel", "algorithm", "groups", "makespan_slack", "fill", "certified", "built_in"):
        assert getattr(checked, name) == getattr(trusted, name)
    assert (checked.origins is None) == (trusted.origins is None)
    if checked.origins is not None:
        assert trusted.origins.item_bytes.dtype == np.float64
        assert checked.origins.gpus_per_node == trusted.origins.gpus_per_node
        for name in ("sources", "item_bytes"):
            assert np.array_equal(getattr(checked.origins, name), getattr(trusted.origins, name))
    first, second = solve(checked), solve(trusted)
    assert np.array_equal(first.assignment, second.assignment) and first.makespan == second.makespan
    assert first.lower_bound == second.lower_bound and first.status == second.status


def test_trusted_request_neither_builds_nor_checks_the_entries_again(monkeypatch):
    """The point of the entry: no `make_problem` (a copy and scans of the lengths) and no `as_origins` (scans and
    copies of sources and bytes)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the trusted entry checked its entries again")

    monkeypatch.setattr(api, "make_problem", refuse)
    monkeypatch.setattr(api, "as_origins", refuse)
    request = trusted_request(np.array([5, 4, 3, 3]), 2, sources=np.array([0, 0, 1, 1]), makespan_slack=0.0)
    assert solve(request).makespan == 8.0


@pytest.mark.parametrize("name, value, message", [
    ("lengths", [5, 4], r"`lengths` must be a non-empty 1-D int64 array .*got list"),
    ("lengths", np.array([5.0, 4.0]), r"`lengths` must be a non-empty 1-D int64 array .*got float64, shape \(2,\)"),
    ("lengths", np.zeros((2, 1), dtype=np.int64), r"`lengths` .* got int64, shape \(2, 1\)"),
    ("lengths", np.zeros(0, dtype=np.int64), r"`lengths` must be a non-empty"),
    ("costs", np.ones(2, dtype=np.float32), r"`costs` must be a non-empty 1-D float64 array of 2 .*got float32"),
    ("sources", np.array([0, 1, 1]), r"`sources` must be a non-empty 1-D int64 array of 2 .*shape \(3,\)"),
    ("item_bytes", np.ones(1), r"`item_bytes` must be a non-empty 1-D array of 2 "),
])
def test_trusted_request_refuses_a_wrong_dtype_or_shape_by_name(name, value, message):
    """The O(1) part of the contract: a TypeError naming the argument, never a silent cast or a numpy error."""
    options = {"lengths": np.array([5, 4]), "sources": np.array([0, 1])}
    options[name] = value
    with pytest.raises(TypeError, match=message):
        trusted_request(options.pop("lengths"), 2, **options)


def test_trusted_request_keeps_balances_errors_on_what_the_caller_cannot_know():
    """Tokens that overflow int64, a cap below the largest item, costs that overflow float64 (a model's item, the
    sum of a model's or of given costs), an algorithm that does not solve the problem, options that do not go
    together, a topology of another world size, a slack that is no number: `balance`'s own errors, word for word."""
    lengths, sources = np.array([7, 3, 2]), np.array([0, 1, 1])
    cases = [(np.full(1025, 2**53 - 1), {}), (lengths, dict(max_tokens_per_rank=5)),
             (lengths, dict(cost=CostModel(quadratic=1e307))), (lengths, dict(cost=CostModel(quadratic=1.5e306))),
             (lengths, dict(costs=np.array([1e308, 1e308, 1.0]))), (lengths, dict(algorithm="padded")),
             (lengths, dict(fill="on_miss")), (lengths, dict(sources=sources, topology=Topology(2, 2))),
             (lengths, dict(sources=sources, makespan_slack="big"))]
    for items, options in cases:
        with pytest.raises((ValueError, TypeError)) as checked:
            balance_request(items, 2, **options)
        with pytest.raises(checked.type) as trusted:
            trusted_request(items, 2, **options)
        assert str(trusted.value) == str(checked.value)
    with pytest.raises(InfeasibleError, match="below the largest item"):
        trusted_request(lengths, 2, max_tokens_per_rank=5)


def test_the_orchestrators_stage_errors_on_bad_user_input_stay_clear():
    """What a user of the orchestrator gets wrong about a stage still reads as a clear error naming it, whichever
    entry the planner balances through: an encoder cost model that overflows float64 on the batch's segments (one
    pass and micro-batched), an encoder cap below a segment."""
    stages = (Stage("vision", "image", CostModel(quadratic=1e300), algorithm="lpt"),
              Stage("llm", "llm", CostModel(linear=1.0), algorithm="lpt"))
    batch = Batch.from_samples([Sample(10, (Segment("image", 10**6, 64),), rank % 4) for rank in range(16)], 4)
    for options in ({}, {"max_tokens_per_microbatch": 4096}):
        with pytest.raises(ValueError, match=r"`cost` CostModel\(.*quadratic=1e\+300\) gives item 0 \(length 1000000\) "
                                             r"the cost inf; costs must be finite float64"):
            Orchestrator(stages, Topology(2, 2), **options).plan(batch)
    capped = (Stage("vision", "image", CostModel(), algorithm="lpt", max_tokens_per_rank=500), stages[1])
    with pytest.raises(InfeasibleError, match="stage 'vision' .*max_tokens_per_rank=500 is below segment 0"):
        Orchestrator(capped, Topology(2, 2)).plan(batch)


def _hand_made(**columns):
    base = dict(num_ranks=4, modalities=("image",), sample_text=np.array([10, 20, 30, 40, 50, 60]),
                sample_source=np.array([0, 0, 1, 2, 3, 3]), sample_id=np.arange(6),
                segment_sample=np.array([0, 1, 2, 4]),
                segment_modality=np.zeros(4, dtype=np.int64), segment_length=np.array([100, 200, 300, 400]),
                segment_tokens=np.array([16, 32, 48, 64]), segment_position=np.zeros(4, dtype=np.int64))
    return Batch(**{**base, **columns})


@pytest.mark.parametrize("columns, message", [
    ({"segment_length": np.array([100, -200, 300, 400])}, r"`segment_length` must be non-negative integers; got -200"),
    ({"sample_text": np.array([10, -90, 30, 40, 50, 60])}, r"`sample_text` must be non-negative integers; got -90"),
    ({"sample_source": np.array([0, 0, 1, 2, 3, 7])}, r"`sample_source` must be ranks in \[0, 4\); got 7 at index 5")])
def test_regression_a_hand_made_batch_reached_the_trusted_stage_plans_unchecked(columns, message, monkeypatch):
    """review R18-03: `Batch(...)` checks nothing, and the stage plans trust the batch's columns: a negative length
    planned silently, a source past the ranks raised numpy's broadcast error.  The planner validates such a batch
    (`planner.checked`) and only such a batch: one `from_arrays` made goes through as it is."""
    from orchmllm.orchestrator import planner

    stages = (Stage("vision", modality="image", cost=CostModel(linear=1.0), padded=False),
              Stage("llm", "llm", cost=CostModel(linear=1.0, quadratic=1e-4)))
    orchestrator = Orchestrator(stages, Topology(1, 4))
    with pytest.raises(ValueError, match=message):
        orchestrator.plan(_hand_made(**columns))
    hand_made, made = _hand_made(), []
    validated = planner.checked(hand_made)
    assert validated.validated and not getattr(hand_made, "validated", False)
    monkeypatch.setattr(Batch, "from_arrays", lambda **kwargs: made.append(kwargs))
    assert planner.checked(validated) is validated and made == []
    assert orchestrator.plan(validated).step_cost == 515.2996
