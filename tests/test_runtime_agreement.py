"""Cross-rank mismatches end in one clear error on every rank, within the collective timeout.

Each job runs a few steps on a real gloo group; from some step on, rank 1 (or every
rank) passes something the others do not.  Every rank catches what it raised and returns
it, so the tests see each rank's outcome; a rank that hung or crashed fails them.
"""

import time

import numpy as np
import pytest
import torch

from orchmllm.balancers import CostModel
from orchmllm.runtime import (ConfigMismatchError, ExchangeMeta, FlatAllToAll, HierarchicalAllToAll,
                              MultiStageRuntime, Piece, PlanMismatchError, PostBalancingDispatcher, SchemaGuard,
                              SchemaMismatchError,
                              exchange)
from orchmllm.runtime.demo.data import SyntheticMultimodal
from orchmllm.runtime.demo import demo_stages
from orchmllm.runtime.launch import run_processes
from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel

LENGTHS = [[3, 1, 2], [2, 2], [4], [1, 1, 1]]
COLLECTIVE_TIMEOUT_S = 20


def _batch(rank):
    rows = sum(LENGTHS[rank])
    return {"x": torch.arange(2 * rows, dtype=torch.float32).reshape(rows, 2) + 100 * rank,
            "id": torch.arange(len(LENGTHS[rank])) + 10 * rank}


ODD_BATCHES = {  # what rank 1 passes instead, from the deviating step on
    "float32 vs int32": lambda b: {**b, "x": b["x"].to(torch.int32)},
    "float32 vs float64": lambda b: {**b, "x": b["x"].to(torch.float64)},
    "trailing shape": lambda b: {**b, "x": b["x"].reshape(-1, 2, 1)},
    "extra key": lambda b: {**b, "mask": torch.ones(b["x"].shape[0], dtype=torch.bool)},
    "missing key": lambda b: {"x": b["x"]},
    "renamed key": lambda b: {"x": b["x"], "ids": b["id"]},
    "one row short": lambda b: {**b, "x": b["x"][:-1]},  # rank 1 raised alone, its peers waited for it
}


def outcome(run):
    try:
        return ("ok", run())
    except (SchemaMismatchError, PlanMismatchError, ValueError) as error:
        return (type(error).__name__, str(error))


def dispatch_job(rank, size, case, first_odd_step, odd_ranks):
    dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(linear=1), per_item_keys={"id"})

    def steps():
        received = []
        for step in range(3):
            plan = dispatcher.plan(LENGTHS[rank])
            batch = _batch(rank)
            if step >= first_odd_step and rank in odd_ranks:
                batch = ODD_BATCHES[case](batch)
            moved = dispatcher.dispatch(batch, plan)
            received.append((moved["x"].dtype, moved["x"].double().sum().item(), sorted(moved["id"].tolist())))
        return received

    return outcome(steps)


def assert_every_rank_names_rank_1(outcomes, error_type, started):
    elapsed = time.monotonic() - started
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == error_type, (o.rank, o.value)
        assert "ranks [1] disagree with ranks [0, 2, 3]" in message, message
    assert elapsed < COLLECTIVE_TIMEOUT_S, elapsed


@pytest.mark.parametrize("first_odd_step", [0, 2], ids=["first-dispatch", "after-two-agreed-steps"])
@pytest.mark.parametrize("case", sorted(ODD_BATCHES))
def test_a_rank_dispatching_another_schema_is_named_on_every_rank(case, first_odd_step):
    started = time.monotonic()
    outcomes = run_processes(dispatch_job, 4, args=(case, first_odd_step, {1}), timeout_s=60,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "SchemaMismatchError", started)
    assert "dispatch: the schema of the pieces differs" in outcomes[0].value[1]


def test_every_rank_switching_dtype_together_is_not_an_error():
    """All ranks change x to float64 at step 1: the guarded exchange redoes the step under
    the new schema and delivers the same values."""
    results = [o.value for o in run_processes(dispatch_job, 4, args=("float32 vs float64", 1, {0, 1, 2, 3}),
                                               timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)]
    for kind, steps in results:
        assert kind == "ok"
        assert [dtype for dtype, *_ in steps] == [torch.float32, torch.float64, torch.float64]
        assert steps[0][1:] == steps[1][1:] == steps[2][1:]
    assert sorted(i for _, steps in results for i in steps[0][2]) == sorted(i for r in range(4) for i in
                                                                          (np.arange(len(LENGTHS[r])) + 10 * r))


def test_regression_float64_on_one_rank_was_returned_as_reinterpreted_float32_bits():
    """Cause: splits were sized by each rank's own dtype, so a float64 rank's bytes reached
    float32 ranks as garbage (or aborted gloo).  Now nobody returns a tensor."""
    outcomes = run_processes(dispatch_job, 4, args=("float32 vs float64", 0, {1}), timeout_s=60,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert [o.value[0] for o in outcomes] == ["SchemaMismatchError"] * 4
    assert "x: float64[2] (per token)" in outcomes[0].value[1] and "x: float32[2] (per token)" in outcomes[0].value[1]


CONFIGS = {  # what rank 1 plans with instead (check_plan stays at its default, off)
    "algorithm": {"algorithm": "identity"},
    "cost model": {"cost": CostModel(linear=1, quadratic=1)},
    "cap": {"max_tokens_per_rank": 10**6},
    "per-item keys": {"per_item_keys": set()},
    "check_plan": {"check_plan": True},  # rank 1 alone ran the digest all-gather: gloo aborted the others
}
DIFFERING_OPTION = {  # how the error names it (it showed two hashes only)
    "algorithm": "`algorithm` (ranks [0, 2, 3]: 'lpt'; ranks [1]: 'identity')",
    "cost model": "`cost.quadratic` (ranks [0, 2, 3]: 0; ranks [1]: 1)",  # the field (probe59 M4: two reprs)
    "cap": "`max_tokens_per_rank` (ranks [0, 2, 3]: None; ranks [1]: 1000000)",
    "per-item keys": "`per_item_keys` (ranks [0, 2, 3]: ['id']; ranks [1]: [])",
    "check_plan": "`check_plan` (ranks [0, 2, 3]: False; ranks [1]: True)",
}


def config_job(rank, size, case):
    options = {"algorithm": "lpt", "cost": CostModel(linear=1), "per_item_keys": {"id"}}
    if rank == 1:
        options.update(CONFIGS[case])
    dispatcher = PostBalancingDispatcher(**options)
    return outcome(lambda: dispatcher.dispatch(_batch(rank), dispatcher.plan(LENGTHS[rank])))


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_regression_a_rank_with_another_config_returned_garbage_ids_without_check_plan(case):
    """Cause: with check_plan=False nothing compared configurations, so a rank planning
    with another algorithm or cost model routed items its peers did not expect."""
    started = time.monotonic()
    outcomes = run_processes(config_job, 4, args=(case,), timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "ConfigMismatchError", started)
    assert outcomes[2].value[1].startswith("dispatcher configuration differs across ranks (seen from rank 2)")
    for o in outcomes:  # the options that differ, named on every rank
        assert f"options that differ: {DIFFERING_OPTION[case]};" in o.value[1], o.value[1]


def stage_config_job(rank, size):
    config = ModelConfig()
    costs = {m: CostModel(per_item=1, linear=2 if rank == 1 and m == "audio" else 1) for m in ("image", "audio", "llm")}
    runtime = MultiStageRuntime(demo_stages(costs, config, algorithm="lpt"))
    return outcome(lambda: runtime.plan(SyntheticMultimodal(config, samples_per_rank=3).samples(0, rank)))


def test_a_rank_declaring_another_stage_cost_model_is_named_on_every_rank():
    started = time.monotonic()
    outcomes = run_processes(stage_config_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "ConfigMismatchError", started)
    for o in outcomes:  # the stage and the field that differ (the message showed two hashes only)
        assert ("options that differ: `stages[1].cost` (ranks [0, 2, 3]: CostModel(per_item=1.0, linear=1.0, "
                "quadratic=0.0); ranks [1]: CostModel(per_item=1.0, linear=2.0, quadratic=0.0));") in o.value[1]


ODD_ENCODER_OUTPUTS = {"float64": lambda out: out.double(),
                       "one row more": lambda out: torch.cat([out, out.new_zeros(1, out.shape[1])])}


def encoder_dtype_job(rank, size, odd="float64"):
    """Rank 1's vision encoder returns float64 embeddings (or one row more) at the second step."""
    config = ModelConfig(llm_hidden=16, encoder_hidden=16, vocab=32)
    torch.manual_seed(0)
    model = TinyMultimodalModel(config)
    data = SyntheticMultimodal(config, samples_per_rank=3)
    runtime = MultiStageRuntime(demo_stages({m: CostModel(per_item=1, linear=1) for m in ("image", "audio", "llm")},
                                            config, algorithm="lpt"))

    def steps():
        for step in range(2):
            batch = data.local_batch(step, rank)
            routes = runtime.plan(batch.samples)
            moved = runtime.dispatch(routes, text=batch.text, per_sample=batch.per_sample, inputs=batch.inputs)
            encoders = dict(model.encoders())
            if rank == 1 and step == 1:
                def odd_vision(inputs, lengths):
                    return ODD_ENCODER_OUTPUTS[odd](model.vision(inputs, lengths))
                odd_vision.__wrapped__ = model.vision  # the module whose contract `check_encoders` checks
                encoders["image"] = odd_vision
            [micro] = runtime.microbatches(routes, moved)
            packed = runtime.forward(micro.routes, micro.data, encoders=encoders, text_embedding=model.llm.embed)
            packed.embeddings.sum().backward()
        return "trained"

    return outcome(steps)


def test_a_rank_whose_encoder_returns_another_dtype_is_named_on_every_rank():
    started = time.monotonic()
    outcomes = run_processes(encoder_dtype_job, 4, timeout_s=90, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "SchemaMismatchError", started)
    assert "encoder outputs: the schema of the pieces differs" in outcomes[3].value[1]


def test_regression_an_encoder_returning_a_row_too_many_on_one_rank_raised_there_alone():
    """Cause: `forward` checked the encoder's output shape before the embedding exchange and raised on
    that rank alone; its peers waited in the exchange until the collective timeout."""
    started = time.monotonic()
    outcomes = run_processes(encoder_dtype_job, 4, args=("one row more",), timeout_s=90,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "SchemaMismatchError", started)
    assert "ranks [1]: invalid input: encoder 'image' returned shape" in outcomes[0].value[1]


NODEWISE_ASSIGNMENT = np.array([3, 2, 1, 0, 0, 1, 2, 3])  # item i holds the value 10 * (i // 2) + i % 2


def hierarchical_schema_job(rank, size):
    """The schema check guards the node-wise transport's three phases too."""
    transport = HierarchicalAllToAll(2)
    guard = SchemaGuard("node-wise exchange")
    meta = ExchangeMeta.from_assignment(NODEWISE_ASSIGNMENT, [2, 2, 2, 2], rank)
    results = []

    def steps():
        for step in range(3):
            dtype = torch.float64 if step == 2 and rank == 1 else torch.float32
            tensor = torch.arange(2, dtype=dtype) + 10 * rank
            (out,) = exchange([Piece(meta, tensor.reshape(2, 1), 1, "x")], transport, guard=guard)
            results.append(out.reshape(-1).tolist())
        return results

    kind, value = outcome(steps)
    return kind, value, results


def test_schema_mismatch_through_the_nodewise_transport_is_named_on_every_rank():
    started = time.monotonic()
    outcomes = run_processes(hierarchical_schema_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    for o in outcomes:
        kind, message, delivered = o.value
        assert kind == "SchemaMismatchError" and "ranks [1] disagree" in message
        assert len(delivered) == 2 and delivered[0] == delivered[1]  # the agreed steps arrived intact
    for o in outcomes:
        items = np.flatnonzero(NODEWISE_ASSIGNMENT == o.rank)
        assert o.value[2][0] == (10 * (items // 2) + items % 2).tolist()
    assert time.monotonic() - started < COLLECTIVE_TIMEOUT_S


def layout_job(rank, size):
    return outcome(lambda: HierarchicalAllToAll(4 if rank == 1 else 2).num_nodes)


def test_regression_nodewise_transport_with_other_gpus_per_node_blocked_every_rank_forever():
    """Cause: each rank created the subgroups of its own layout, and `new_group` waited for
    members that never came (the collective timeout does not bound it)."""
    started = time.monotonic()
    outcomes = run_processes(layout_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "ValueError", started)
    assert "HierarchicalAllToAll's `gpus_per_node` differs across ranks" in outcomes[0].value[1]
    assert "ranks [0, 2, 3]: 2; ranks [1]: 4" in outcomes[0].value[1]


def mixed_transport_job(rank, size):
    def run():
        transport = HierarchicalAllToAll(2) if rank else None  # rank 0: the flat default
        return PostBalancingDispatcher(transport=transport).plan(np.array([5, 3, 2 + rank])).digest
    return outcome(run)


def test_regression_a_flat_rank_beside_nodewise_ones_aborted_in_gloo():
    """probe20 P20-10: rank 0's dispatcher on the flat transport, ranks 1-3 building HierarchicalAllToAll(2): the
    layout all-gather (one word) paired with rank 0's metadata all-gather (six) and gloo aborted a rank (SIGABRT,
    a C++ trace), the others a PeerFailureError.  The layout gather is now a call header (the metadata header's
    shape, a tag word): every rank names the mismatch."""
    started = time.monotonic()
    outcomes = run_processes(mixed_transport_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok and o.value[0] == "ConfigMismatchError" for o in outcomes), [(o.error, o.value) for o in outcomes]
    for o in outcomes:  # the two calls, named alike on every rank (tests/test_runtime_collective_tags.py: others)
        assert o.value[1] == (f"orchmllm calls paired across ranks (seen from rank {o.rank}): rank 0 is in a plan's "
                              f"metadata all-gather (PostBalancingDispatcher.plan, MultiStageRuntime.plan) while "
                              f"ranks [1, 2, 3] are in a HierarchicalAllToAll's construction (its layout all-gather): "
                              f"ranks that plan on the flat transport beside ranks that build a HierarchicalAllToAll: "
                              f"every rank of the group must pass the same `transport`"), o.value[1]
    assert time.monotonic() - started < COLLECTIVE_TIMEOUT_S


def invalid_layout_job(rank, size):
    return outcome(lambda: HierarchicalAllToAll(3 if rank == 1 else 2).num_nodes)


def test_a_layout_only_one_rank_finds_invalid_is_named_on_every_rank_not_raised_alone():
    outcomes = run_processes(invalid_layout_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok and o.value[0] == "ValueError" and "ranks [1] disagree" in o.value[1] for o in outcomes)


def test_world_size_one_guard_and_fingerprint_need_no_process_group():
    meta = ExchangeMeta.from_assignment([0, 0], [2], 0)
    guard = SchemaGuard()
    (out,) = exchange([Piece(meta, torch.ones(2, 3), 1, "x")], FlatAllToAll(), guard=guard)
    assert torch.equal(out, torch.ones(2, 3))  # alone: nothing to agree with, no process group needed


def fused_job(rank, size):
    """Rank 1 exchanges each micro-batch's inputs on its own, the others fused for the step."""
    config = ModelConfig()
    runtime = MultiStageRuntime(demo_stages({m: CostModel(per_item=1, linear=1) for m in ("image", "audio", "llm")},
                                            config, algorithm="lpt"), max_tokens_per_microbatch=4096,
                                fused_input_exchange=rank != 1)
    return outcome(lambda: runtime.plan(SyntheticMultimodal(config, samples_per_rank=3).samples(0, rank)))


def test_regression_a_rank_exchanging_inputs_unfused_aborted_its_peers():
    """Cause: `fused_input_exchange` was not in the fingerprint, so the ranks' exchanges differed
    and gloo aborted ("Connection reset by peer")."""
    started = time.monotonic()
    outcomes = run_processes(fused_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "ConfigMismatchError", started)


def bad_input_job(rank, size, runtime_kind):
    """Rank 1's loss tokens have one count too few: it raises why, the others stop with it."""
    if runtime_kind == "dispatcher":
        dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(linear=1))
        losses = LENGTHS[rank][:-1] if rank == 1 else LENGTHS[rank]
        return outcome(lambda: dispatcher.plan(LENGTHS[rank], loss_tokens=losses))
    config = ModelConfig()
    runtime = MultiStageRuntime(demo_stages({m: CostModel(per_item=1, linear=1) for m in ("image", "audio", "llm")},
                                            config, algorithm="lpt"), max_tokens_per_microbatch=4096)
    samples = SyntheticMultimodal(config, samples_per_rank=3).samples(0, rank)
    losses = [1] * (len(samples) - (rank == 1))
    return outcome(lambda: runtime.plan(samples, loss_tokens=losses))


@pytest.mark.parametrize("runtime_kind", ["dispatcher", "multistage"])
def test_regression_a_rank_whose_own_input_fails_its_checks_left_the_others_waiting(runtime_kind):
    """Cause: the rank raised before the metadata all-gather and its peers waited for it until the
    process group's timeout (30 min by default); now it joins the gather as failed."""
    started = time.monotonic()
    outcomes = run_processes(bad_input_job, 4, args=(runtime_kind,), timeout_s=60,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    kinds = [o.value[0] for o in outcomes]
    assert kinds == ["PeerInputError", "ValueError", "PeerInputError", "PeerInputError"], outcomes
    assert "`loss_tokens` must have one count per" in outcomes[1].value[1]
    assert "ranks [1] failed their own input checks" in outcomes[0].value[1]
    assert time.monotonic() - started < COLLECTIVE_TIMEOUT_S


def equal_options_job(rank, size):
    """The same micro-batch options spelt differently on rank 1 (np.int64, an int overhead)."""
    budget, overhead = (np.int64(16), 0) if rank == 1 else (16, 0.0)
    dispatcher = PostBalancingDispatcher(cost=CostModel(linear=1), max_tokens_per_microbatch=budget,
                                         microbatch_overhead=overhead)
    return outcome(lambda: dispatcher.plan(LENGTHS[rank]).balance.digest())


def test_regression_equal_options_spelt_differently_were_a_config_mismatch():
    outcomes = run_processes(equal_options_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert [o.value[0] for o in outcomes] == ["ok"] * 4 and len({o.value[1] for o in outcomes}) == 1


def all_invalid_job(rank, size):
    """After one good step every rank passes x one row short, and rank 0 also switches it to float64."""
    dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(linear=1), per_item_keys={"id"})

    def steps():
        for step in range(2):
            plan = dispatcher.plan(LENGTHS[rank])
            batch = _batch(rank)
            if step == 1:
                batch = {**batch, "x": batch["x"][:-1].double() if rank == 0 else batch["x"][:-1]}
            dispatcher.dispatch(batch, plan)
        return "dispatched"

    return outcome(steps)


def test_regression_every_rank_invalid_and_one_also_changing_schema_left_that_one_waiting():
    """Cause: every rank sent the invalid-input header, so the check passed; rank 0, whose schema
    also changed, then entered the exchange again while the others raised."""
    started = time.monotonic()
    outcomes = run_processes(all_invalid_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert [o.value[0] for o in outcomes] == ["ValueError"] * 4
    assert all("tensor has" in o.value[1] and "rows but this rank's" in o.value[1] for o in outcomes)
    assert time.monotonic() - started < COLLECTIVE_TIMEOUT_S


def test_fingerprints_keep_distinct_integers_apart_and_take_any_int():
    """Options were fingerprinted as floats: 2**53 and 2**53 + 1 collided, 10**400 overflowed."""
    caps = [PostBalancingDispatcher(max_tokens_per_rank=cap).config_fingerprint for cap in (2**53, 2**53 + 1)]
    assert caps[0] != caps[1]
    assert PostBalancingDispatcher(max_tokens_per_rank=10**400).config_fingerprint
    spelt = [PostBalancingDispatcher(max_tokens_per_microbatch=16, microbatch_overhead=overhead).config_fingerprint
             for overhead in (0, 0.0, np.float64(0))]
    assert len(set(spelt)) == 1


def test_regression_a_multi_stage_option_spelt_otherwise_or_left_at_its_default_agrees():
    """The runtime fingerprinted the orchestrator options as given: a rank passing a default
    explicitly, or 16 as np.int64(16), raised ConfigMismatchError against the others."""
    stages = demo_stages({m: CostModel() for m in ("image", "audio", "llm")}, ModelConfig())
    spelt = [MultiStageRuntime(stages, **options).config_fingerprint for options in (
        {"max_tokens_per_microbatch": 16}, {"max_tokens_per_microbatch": np.int64(16), "microbatch_overhead": 0},
        {"max_tokens_per_microbatch": 16, "makespan_slack": 0.002, "placement": "locality"})]
    assert len(set(spelt)) == 1
    assert MultiStageRuntime(stages, max_tokens_per_microbatch=17).config_fingerprint != spelt[0]


STALE_STEPS = {  # every rank's lengths at steps 0 and 1; rank 1 dispatches step 1 along step 0's plan
    # its two items swap lengths: the plans swap their destinations, every row count matches (moved wrong rows)
    "same row counts": ([[9, 1, 7], [5, 3], [2, 15], [4, 4, 8]], [[9, 1, 7], [3, 5], [2, 15], [4, 4, 8]]),
    # its items grow: the row counts differ (gloo aborted every rank with SIGABRT)
    "other row counts": ([[9, 1, 7], [5, 3], [2, 15], [4, 4, 8]], [[9, 1, 7], [5, 12], [2, 15], [4, 4, 8]]),
}


def stale_plan_job(rank, size, case):
    dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(linear=1), per_item_keys={"id"})

    def steps():
        plans = []
        for step, lengths in enumerate(STALE_STEPS[case]):
            plans.append(dispatcher.plan(lengths[rank]))
            plan = plans[0] if rank == 1 else plans[-1]
            batch = {"id": torch.arange(len(lengths[rank])) + 10 * rank + 100 * step,
                     "x": torch.ones(sum(lengths[rank]), 2)}
            moved = dispatcher.dispatch(batch, plan)
        return sorted(moved["id"].tolist())

    return outcome(steps)


@pytest.mark.parametrize("case", sorted(STALE_STEPS))
def test_regression_a_rank_dispatching_along_last_step_s_plan_is_named_on_every_rank(case):
    """Cause: nothing in the exchange said which plan a rank followed: with matching row counts the
    stale rank's rows landed where the current plan puts other items, with no error; with other
    counts gloo aborted every process (SIGABRT).  The plan's identity, agreed at the metadata
    gather, is now checked before any payload moves."""
    started = time.monotonic()
    outcomes = run_processes(stale_plan_job, 4, args=(case,), timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "PlanMismatchError", started)
    assert "dispatch: the plan differs across ranks" in outcomes[0].value[1]
    assert "pass every exchange the plan of this step" in outcomes[0].value[1]


def kept_plan_job(rank, size):
    """Every rank dispatches step 0 and step 1 along step 0's plan (a user caching it), giving each
    step's lengths: rank 1's two items swap lengths at step 1, every row total matches."""
    dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(linear=1), per_item_keys={"id"})

    def steps():
        plan = None
        for step, lengths in enumerate(STALE_STEPS["same row counts"]):
            plan = plan or dispatcher.plan(lengths[rank])
            batch = {"id": torch.arange(len(lengths[rank])) + 10 * rank + 100 * step,
                     "x": torch.ones(sum(lengths[rank]), 2)}
            moved = dispatcher.dispatch(batch, plan, lengths=lengths[rank])
        return sorted(moved["id"].tolist())

    return outcome(steps)


def test_regression_every_rank_dispatching_along_a_kept_plan_cut_rows_by_its_lengths():
    """Cause: when every rank kept step 0's plan, the plan identities agreed and every row total
    matched, so step 1's rows were cut by step 0's lengths (item 110 received 2 rows of item 111),
    no error.  A packed batch has no item boundaries: `dispatch(..., lengths=)` now checks this
    rank's lengths against the plan's before any payload moves, and every rank names rank 1."""
    started = time.monotonic()
    outcomes = run_processes(kept_plan_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "PlanMismatchError", started)
    assert ("rank 1's item 0 has length 3 but the plan was made with 5: the plan is another step's"
            in outcomes[0].value[1])


def test_dispatch_lengths_are_checked_on_one_rank_too():
    dispatcher = PostBalancingDispatcher(algorithm="lpt", per_item_keys={"id"})
    plan = dispatcher.plan([5, 3])
    batch = {"id": torch.arange(2), "x": torch.ones(8, 2)}
    assert dispatcher.dispatch(batch, plan, lengths=[5, 3])["id"].tolist() == [0, 1]
    with pytest.raises(PlanMismatchError, match=r"rank 0's item 1 has length 4 but the plan was made with 3"):
        dispatcher.dispatch(batch, plan, lengths=[5, 4])
    with pytest.raises(PlanMismatchError, match=r"rank 0 dispatches 3 items but the plan was made from 2 items"):
        dispatcher.dispatch(batch, plan, lengths=[5, 3, 0])
    with pytest.raises(ValueError, match=r"`lengths` must be 1-D"):
        dispatcher.dispatch(batch, plan, lengths=[[5, 3]])


def stale_routes_job(rank, size, where):
    """Rank 1 dispatches step 1 along step 0's routes, or runs micro-batch 1 along micro-batch 0's routes."""
    config = ModelConfig(llm_hidden=16, encoder_hidden=16, vocab=32)
    torch.manual_seed(0)
    model = TinyMultimodalModel(config)
    data = SyntheticMultimodal(config, samples_per_rank=3)
    budget = None if where == "step" else max(s.llm_length for r in range(size) for s in data.samples(0, r))
    runtime = MultiStageRuntime(demo_stages({m: CostModel(per_item=1, linear=1) for m in ("image", "audio", "llm")},
                                            config, algorithm="lpt"), max_tokens_per_microbatch=budget)

    def steps():
        first = None
        for step in range(2):
            batch = data.local_batch(step, rank)
            routes = runtime.plan(batch.samples)
            first = first or routes
            stale = rank == 1 and where == "step" and step == 1
            moved = runtime.dispatch(first if stale else routes, text=batch.text, per_sample=batch.per_sample,
                                     inputs=batch.inputs)
            micros = [(micro.routes, micro.data) for micro in runtime.microbatches(first if stale else routes, moved)]
            for index, (micro_routes, part) in enumerate(micros):
                if rank == 1 and where == "micro-batch" and index == 1:
                    micro_routes = micros[0][0]
                packed = runtime.forward(micro_routes, part, encoders=model.encoders(),
                                         text_embedding=model.llm.embed)
                packed.embeddings.sum().backward()
        return "trained"

    return outcome(steps)


@pytest.mark.parametrize("where", ["step", "micro-batch"])
def test_a_rank_running_another_step_s_or_micro_batch_s_routes_is_named_on_every_rank(where):
    started = time.monotonic()
    outcomes = run_processes(stale_routes_job, 4, args=(where,), timeout_s=90,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "PlanMismatchError", started)


def missing_input_job(rank, size):
    config = ModelConfig(llm_hidden=16, encoder_hidden=16, vocab=32)
    data = SyntheticMultimodal(config, samples_per_rank=3)
    runtime = MultiStageRuntime(demo_stages({m: CostModel(per_item=1, linear=1) for m in ("image", "audio", "llm")},
                                            config, algorithm="lpt"))
    batch = data.local_batch(0, rank)
    inputs = {m: t for m, t in batch.inputs.items() if not (rank == 1 and m == "audio")}
    return outcome(lambda: runtime.dispatch(runtime.plan(batch.samples), text=batch.text, inputs=inputs))


def test_regression_a_rank_dispatching_without_a_modality_s_inputs_raised_there_alone():
    """Cause: the missing key was refused before the exchange on that rank alone; its peers waited in
    the all-to-all until the collective timeout."""
    started = time.monotonic()
    outcomes = run_processes(missing_input_job, 4, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert_every_rank_names_rank_1(outcomes, "SchemaMismatchError", started)
    assert "ranks [1]: invalid input: `inputs` lacks modality 'audio'" in outcomes[0].value[1]


def kept_plan_after_dispatch_job(rank, size, call):
    """Every rank dispatches step 1 along its own plan, then runs `call` along step 0's (kept) plan: rank 1's
    two items swap lengths at step 1, every row total matches."""
    dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(linear=1), per_item_keys={"id"})
    kept, fresh = (dispatcher.plan(lengths[rank]) for lengths in STALE_STEPS["same row counts"])
    lengths = STALE_STEPS["same row counts"][1][rank]
    moved = dispatcher.dispatch({"id": torch.arange(len(lengths)) + 10 * rank, "x": torch.ones(sum(lengths), 2)},
                                fresh, lengths=lengths)
    if call == "combine":
        return outcome(lambda: dispatcher.combine(moved, kept, differentiable=False)["id"].tolist())

    def microbatches_then_combine():  # the micro-batches of the step dispatched; the refusal at the next exchange
        micros = list(dispatcher.microbatches(kept, moved))
        assert [micro.lengths.tolist() for micro in micros] == [fresh.local_lengths.tolist()]
        return dispatcher.combine(moved, fresh, differentiable=False)["id"].tolist()

    return outcome(microbatches_then_combine)


@pytest.mark.parametrize("call", ["combine", "microbatches"])
def test_regression_combine_and_microbatches_along_a_kept_plan_returned_rows_to_the_wrong_items(call):
    """Cause: combine and microbatches took any plan: along step 0's, kept by every rank after step 1's
    dispatch, rank 1's per-item outputs came home swapped ([111, 110]) and its micro-batch lengths were
    step 0's, no error.  They now take the latest dispatch's plan only: every rank raises (after `microbatches`,
    which runs no collective and yields the latest dispatch's micro-batches, at the next exchange)."""
    started = time.monotonic()
    outcomes = run_processes(kept_plan_after_dispatch_job, 4, args=(call,), timeout_s=60,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert time.monotonic() - started < COLLECTIVE_TIMEOUT_S + 30
    for o in outcomes:
        assert o.ok and o.value[0] == "PlanMismatchError", (o.rank, o.value if o.ok else o.error)
        assert f"{call} on rank {o.rank}: the plan is not the one the latest dispatch followed" in o.value[1]


KEPT_AT_MICROBATCHES = ([[9, 1, 7], [5, 3, 6], [2, 11]], [[9, 1, 7], [6, 3, 5], [2, 11]])  # steps 0, 1, 2, ...


def kept_plan_at_microbatches_job(rank, size):
    """Every rank dispatches step 1 along its own plan; rank 1 alone then passes `microbatches` step 0's (kept)
    plan, every rank runs a collective of its own (the model's gradient all-reduce stands for it), then the
    next step's `plan` and `dispatch`.  Rank 1 first iterates the micro-batches of its own plan, to compare."""
    from torch import distributed as dist
    dispatcher = PostBalancingDispatcher(per_item_keys={"id"}, max_tokens_per_microbatch=12)
    kept, fresh = (dispatcher.plan(lengths[rank]) for lengths in KEPT_AT_MICROBATCHES)
    lengths = KEPT_AT_MICROBATCHES[1][rank]
    moved = dispatcher.dispatch({"id": torch.arange(len(lengths)) + 10 * rank, "x": torch.ones(sum(lengths), 2)},
                                fresh)
    own = [micro.lengths.tolist() for micro in dispatcher.microbatches(fresh, moved)]
    seen = [micro.lengths.tolist() for micro in dispatcher.microbatches(kept if rank == 1 else fresh, moved)]
    total = torch.tensor([float(sum(map(sum, seen)))])
    dist.all_reduce(total)

    def next_step():
        plan = dispatcher.plan(lengths)
        dispatcher.dispatch({"id": torch.arange(len(lengths)), "x": torch.ones(sum(lengths), 2)}, plan)

    return own, seen, total.item(), outcome(next_step)


def test_regression_a_kept_plan_at_microbatches_was_refused_on_its_rank_alone():
    """Cause: `microbatches` raised its refusal of a plan kept from the previous step on that rank alone (it
    runs no collective); its peers, past `microbatches`, got gloo's raw "Connection closed by peer" at their
    next collective (probe12 P12-13).  The rank now runs the micro-batches of the step it dispatched, which
    its peers run too, and the refusal rides in the dispatcher's next exchange header: every rank raises it."""
    outcomes = run_processes(kept_plan_at_microbatches_job, 3, timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        own, seen, total, (kind, message) = o.value
        assert seen == own and total == sum(map(sum, KEPT_AT_MICROBATCHES[1])), (o.rank, own, seen, total)
        assert kind == "PlanMismatchError", (o.rank, kind, message)
        assert "ranks [1] disagree with ranks [0, 2]" in message and "microbatches on rank 1: the plan is not the " \
            "one the latest dispatch followed" in message, (o.rank, message)


def test_a_kept_plan_at_microbatches_is_refused_at_once_on_one_rank():
    """Without peers nothing waits: `microbatches` raises the refusal itself (so it does over several ranks for a
    `moved` other than what the latest dispatch returned: its micro-batches cannot be taken for that dispatch's)."""
    dispatcher = PostBalancingDispatcher(per_item_keys={"id"})
    kept, fresh = dispatcher.plan([5, 3]), dispatcher.plan([3, 5])
    moved = dispatcher.dispatch({"id": torch.arange(2), "x": torch.ones(8, 2)}, fresh)
    with pytest.raises(PlanMismatchError, match=r"microbatches on rank 0: the plan is not the one the latest dispatch "
                                                r"followed \([0-9a-f]{16} vs [0-9a-f]{16}\); pass microbatches"):
        dispatcher.microbatches(kept, moved)
    assert [micro.lengths.tolist() for micro in dispatcher.microbatches(fresh, moved)] == [[3, 5]]


def test_regression_a_kept_plan_of_the_same_lengths_but_other_loss_tokens_scaled_the_loss():
    """Cause: `dispatch(..., lengths=)` compared lengths only, so a plan made with other loss tokens went on
    and normalised the loss by its count (10 instead of 58 in the probe: 5.8x).  `loss_tokens=` is checked too."""
    dispatcher = PostBalancingDispatcher(algorithm="lpt", per_item_keys={"id"})
    kept = dispatcher.plan([5, 3], loss_tokens=[1, 1])
    dispatcher.plan([5, 3], loss_tokens=[5, 3])
    batch = {"id": torch.arange(2), "x": torch.ones(8, 2)}
    with pytest.raises(PlanMismatchError, match=r"rank 0's item 0 has loss tokens 5 but the plan was made with 1: "
                                                r"the plan is another step's"):
        dispatcher.dispatch(batch, kept, lengths=[5, 3], loss_tokens=[5, 3])
    with pytest.raises(ValueError, match=r"`loss_tokens` must be 1-D"):
        dispatcher.dispatch(batch, kept, loss_tokens=[[5, 3]])
    assert dispatcher.dispatch(batch, kept, lengths=[5, 3], loss_tokens=[1, 1])["id"].tolist() == [0, 1]


TEXT_ONLY = {0: [4, 4, 2, 6], 1: [4, 4, 6, 2]}  # two micro-batches of 8 tokens a rank: equal row counts


class PackedLinear(torch.nn.Linear):
    """An encoder of packed inputs and their lengths (the runtime's contract)."""

    def __init__(self):
        super().__init__(1, 1)

    def forward(self, inputs, lengths):
        return super().forward(inputs)


def swapped_pass_job(rank, size, slip):
    """Text-only samples in two micro-batches of equal token counts; `slip` says what every rank passes `forward`:
    "swapped" micro-batch k's data with micro-batch k + 1's routes (a rank alone doing so runs another plan
    word than its peers: `test_a_rank_running_another_step_s_or_micro_batch_s_routes_is_named_on_every_rank`),
    "step routes" the routes `plan` returned, "step inputs" what `dispatch` returned."""
    from orchmllm.orchestrator import Sample, Stage
    stages = (Stage("vision", "image", CostModel(per_item=1, linear=1)), Stage("llm", "llm", CostModel(linear=1)))
    runtime = MultiStageRuntime(stages, max_tokens_per_microbatch=8)
    samples = [Sample(text=text, source=rank, id=10 * rank + k) for k, text in enumerate(TEXT_ONLY[rank])]
    routes = runtime.plan(samples)
    ids = torch.cat([torch.full((text,), 10 * rank + k) for k, text in enumerate(TEXT_ONLY[rank])])
    moved = runtime.dispatch(routes, text={"input_ids": ids}, inputs={"image": torch.zeros(0, 1)}, samples=samples)
    micros = list(runtime.microbatches(routes, moved))
    encoder, embedding = PackedLinear(), torch.nn.Embedding(32, 1)

    def run():
        lengths = []
        for k, micro in enumerate(micros):
            passed = {"step routes": (routes, micro.data), "step inputs": (micro.routes, moved),
                      "swapped": (micros[(k + 1) % len(micros)].routes, micro.data)}[slip]
            packed = runtime.forward(*passed, encoders={"image": encoder}, text_embedding=embedding)
            lengths.append(packed.sample_lengths.tolist())
        return lengths

    try:
        return outcome(run)
    except TypeError as error:
        return ("TypeError", str(error))


def test_regression_forward_packed_another_micro_batch_s_data_at_these_routes_boundaries():
    """`forward(micros[1].routes, micros[0].data)` on every rank agreed on the routes' plan word, so the
    8 rows of samples of 2 and 6 tokens were packed as two sequences of 4, with no error."""
    outcomes = run_processes(swapped_pass_job, 2, args=("swapped",), timeout_s=60,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert [o.value for o in outcomes] == [
        ("PlanMismatchError", f"forward on rank {rank}: `moved` was dispatched for other routes than `routes` (another "
                              f"micro-batch's or another step's); pass forward one micro-batch's `micro.routes` and "
                              f"`micro.data`") for rank in range(2)], [o.error or o.value for o in outcomes]


@pytest.mark.parametrize("slip, name, source, got", [("step routes", "routes", "micro.routes", "StepRoutes"),
                                                     ("step inputs", "moved", "micro.data", "StepInputs")])
def test_regression_forward_given_the_step_s_routes_or_inputs_raised_an_attribute_error(slip, name, source, got):
    outcomes = run_processes(swapped_pass_job, 2, args=(slip,), timeout_s=60, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    for o in outcomes:
        assert o.value == ("TypeError", f"`{name}` must be a micro-batch's `{source}`, a "
                                        f"{'PassRoutes' if name == 'routes' else 'Dispatched'}; got {got} (the whole "
                                        f"step's: pass a micro-batch's, from `runtime.microbatches`)"), o.value


def test_regression_assemble_took_another_micro_batch_s_embeddings_as_raw_tensors():
    """Cause: `MultiStageRuntime.assemble(routes, text_embedded, arrived)` was public and its `arrived`
    tensors carry no pass, so another micro-batch's embeddings of equal row counts were packed at these
    routes' boundaries, no error (probe5 P5-03).  Only `forward`, which checks `moved` against `routes`,
    assembles now."""
    assert not hasattr(MultiStageRuntime, "assemble") and callable(MultiStageRuntime._assemble)


STEP_LENGTHS = {0: [5, 3, 4, 2], 1: [6, 1, 1, 2]}


def _features(rank):
    return torch.randn(sum(STEP_LENGTHS[rank]), 3, generator=torch.Generator().manual_seed(rank),
                       dtype=torch.float64)


def rank0_lists_job(rank, size):
    """A plan made once, two steps along it: each, rank 0 alone lists the micro-batches (logging), every rank
    dispatches a second batch dict of the step along the plan (the labels), then the DDP training loop."""
    from torch import nn
    from orchmllm.runtime import normalize_loss
    from orchmllm.runtime.microbatch import accumulate
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    plan = dispatcher.plan(STEP_LENGTHS[rank])
    steps, known = [], []  # the step tokens the loops met, in order (a listing's included)

    def number(step):
        known.extend([step] if all(step is not token for token in known) else [])
        return next(index for index, token in enumerate(known, 1) if token is step)

    for _ in range(2):
        moved = dispatcher.dispatch({"x": _features(rank)}, plan, lengths=STEP_LENGTHS[rank])
        if rank == 0:
            for micro in dispatcher.microbatches(plan, moved):  # logging
                number(micro.step)
        dispatcher.dispatch({"y": _features(rank)}, plan, lengths=STEP_LENGTHS[rank])
        seen = []
        for micro in dispatcher.microbatches(plan, moved):
            seen.append((number(micro.step), micro.contract is not None))
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
        steps.append((seen, torch.cat([net.weight.grad.flatten(), net.bias.grad]).tolist()))
        net.zero_grad(set_to_none=True)
    return steps


def test_regression_a_step_ended_by_how_often_one_rank_listed_its_micro_batches():
    """Cause (review9 R9-07): whether a step ended, and so whether it was due the model check, whose collective
    then runs, came from rank-local facts (did THIS rank run `microbatches` since the dispatch): rank 0, which
    listed the micro-batches for logging, took the labels' dispatch for the next step's, started step 2 (not due)
    while rank 1 stayed in step 1 (due): rank 0's gradients were off by 0.5, no error, rank 1 raised a misleading
    ModelContractError.  Each rank's fact now rides in the dispatch header and every rank decides from all of
    them: a dispatch of the step's plan is the next step's where every rank ran a loop since the latest one."""
    torch.manual_seed(0)
    from torch import nn
    net = nn.Linear(3, 1).double()
    features = torch.cat([_features(rank) for rank in STEP_LENGTHS])
    (net(features).sum() / features.shape[0]).backward()
    want = torch.cat([net.weight.grad.flatten(), net.bias.grad])
    outcomes = run_processes(rank0_lists_job, 2, timeout_s=90, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        (first, got_first), (second, got_second) = o.value
        assert first == [(1, True), (1, True)] and second == [(2, False), (2, False)], (o.rank, first, second)
        for got in (got_first, got_second):
            assert torch.allclose(torch.tensor(got, dtype=torch.float64), want, rtol=1e-12, atol=1e-14), (o.rank, got)


def test_regression_a_negative_zero_cost_coefficient_fingerprints_as_zero():
    """probe59 M4: a rank configured with `CostModel(per_item=-0.0)` was refused beside one with 0.0 (the
    fingerprint reads reprs), though both plan alike; real options now keep -0.0 as 0.0."""
    assert repr(CostModel(per_item=-0.0, linear=-0.0, quadratic=1.0)) == repr(CostModel(quadratic=1.0, linear=0.0))
    prints = [PostBalancingDispatcher(cost=cost).config_fingerprint for cost in (CostModel(per_item=-0.0), CostModel())]
    assert prints[0] == prints[1]
