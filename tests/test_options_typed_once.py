"""Options typed once (issue 25): every argument checked at one place with one message, whatever the layer."""

import re

import numpy as np
import pytest

from orchmllm import ALGORITHMS, MICROBATCH_ALGORITHMS, CostModel, Orchestrator
from orchmllm import balance, balance_microbatches
from orchmllm.balancers.api import balance_request, solve
from orchmllm.balancers.microbatch import options as microbatch_module
from orchmllm.balancers.microbatch.api import plan_microbatches
from orchmllm.balancers.microbatch.options import MicroBatchOptions, microbatch_options
from orchmllm.orchestrator import Stage
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload
from orchmllm.testing import check_conformance, check_microbatch_conformance
from orchmllm.topology import Topology


def _unknown(argument: str, names) -> str:
    return re.escape(f"unknown `{argument}` 'magic'; choose one of {sorted(names)}")


@pytest.mark.parametrize("call, argument, names", [
    (lambda: Orchestrator([Stage("llm", "llm", CostModel())], Topology(1, 2), uniform_algorithm="magic"),
     "uniform_algorithm", ALGORITHMS),
    (lambda: microbatch_options(16, algorithm="magic", algorithm_name="microbatch_algorithm"),
     "microbatch_algorithm", MICROBATCH_ALGORITHMS),
    (lambda: check_conformance("magic", examples=1, processes=False), "algorithm_or_kernel", ALGORITHMS),
    (lambda: check_microbatch_conformance("magic", examples=1, processes=False), "algorithm_or_kernel",
     MICROBATCH_ALGORITHMS),
], ids=["orchestrator", "microbatch_options", "conformance", "microbatch_conformance"])
def test_regression_algorithm_names_were_checked_in_five_places_with_five_messages(call, argument, names):
    with pytest.raises(ValueError, match=_unknown(argument, names)):  # the registry's lookup, one message
        call()


def test_regression_a_padded_only_uniform_algorithm_was_refused_at_the_first_plan_with_advice_that_does_not_apply():
    """probe20 P20-11: uniform_algorithm='padded' passed the options check; plan() then advised `padded=True`,
    which the Orchestrator does not take.  It is refused at construction, naming the argument."""
    with pytest.raises(ValueError, match=r"^`uniform_algorithm` 'padded' solves the padded cost only, and "
                                         r"`uniform_algorithm` balances every stage as if unpadded; choose one of "
                                         r"\['identity', 'lpt', 'ilp'"):
        Orchestrator([Stage("llm", "llm", CostModel())], Topology(1, 2), uniform_algorithm="padded")


def test_a_stage_names_itself_before_the_registrys_message():
    with pytest.raises(ValueError, match="stage 'vision': " + _unknown("algorithm", ALGORITHMS)):
        Stage("vision", "image", CostModel(), algorithm="magic")
    with pytest.raises(TypeError, match="stage 'vision': `algorithm` must be a str; got int"):
        Stage("vision", "image", CostModel(), algorithm=3)


def test_regression_the_microbatch_budget_was_checked_again_in_every_step(monkeypatch):
    calls, check = [], microbatch_module.as_budget
    monkeypatch.setattr(microbatch_module, "as_budget", lambda value: calls.append(value) or check(value))
    orchestrator = Orchestrator(MODELS["10b"].stages(), Topology(1, 4), max_tokens_per_microbatch=np.int64(16384))
    assert calls == [16384] and orchestrator.options.microbatching == MicroBatchOptions(16384)
    batch = sample_workload("default", 4, 8, seed=0)
    for _ in range(2):
        assert orchestrator.plan(batch).cells.max_tokens_per_microbatch == 16384
    assert calls == [16384]  # at construction only: every step reads the checked options


def test_checked_options_plan_as_the_arguments_do():
    lengths, options = [6, 5, 4, 3, 2, 2, 9, 1], microbatch_options(np.int64(9), microbatch_overhead=1)
    assert options == MicroBatchOptions(9, None, 1.0, "auto", None)
    assert options.with_budget(8).max_tokens_per_microbatch == 8
    with pytest.raises(ValueError, match=r"a cell budget must be in \[1, 9\]; got 10"):
        options.with_budget(10)
    planned = plan_microbatches(lengths, 2, options)
    given = balance_microbatches(lengths, 2, **options.arguments())
    assert planned.digest() == given.digest() and planned.to_json().keys() == given.to_json().keys()


def test_balance_builds_one_checked_request_with_the_items_origins():
    lengths, sources = [5, 4, 3, 3, 3, 7, 1, 2], [0, 0, 1.0, 1, 2, 2, 3, 3]
    request = balance_request(lengths, 4, sources=sources, topology=Topology(2, 2), makespan_slack=np.float32(0.5))
    origins = request.origins
    assert origins.sources.dtype == np.int64 and origins.item_bytes.tolist() == [float(x) for x in lengths]
    assert (origins.gpus_per_node, request.makespan_slack, request.groups) == (2, 0.5, None)
    assert origins.take(np.array([2, 5])).sources.tolist() == [1, 2]
    assert solve(request).digest() == balance(lengths, 4, sources=sources, topology=Topology(2, 2),
                                              makespan_slack=0.5).digest()
    assert balance_request(lengths, 4).origins is None and balance_request(lengths, 4).makespan_slack is None
    with pytest.raises(ValueError, match=r"`topology` has 1 nodes × 2 gpus = 2 != num_ranks 4"):
        balance_request(lengths, 4, sources=sources, topology=Topology(1, 2))



def test_regression_kernels_ran_the_ilp_through_its_checked_entry(monkeypatch):
    """`auto` and `exact` handed their own clean plans to `ilp.improve`, which checked them again (shape,
    ranks, cap); they call its search directly, and `improve` stays the checked entry for a user's start."""
    from orchmllm.balancers.exact import ilp
    from orchmllm.balancers.kernels import auto, exact

    searched = []
    monkeypatch.setattr(ilp, "improve", lambda *args, **kwargs: pytest.fail("a kernel called ilp.improve"))
    for module in (auto, exact):
        monkeypatch.setattr(module, "search", lambda *args, search=ilp.search: searched.append(1) or search(*args))
    lengths = [26, 15, 28, 29, 29, 3, 14, 18]  # the heuristics stop at 57, above the bound 54: the ILP runs
    plan = balance(lengths, 3, algorithm="auto", time_limit=5)
    assert searched == [1] and plan.lower_bound <= plan.makespan <= 57.0
    assert balance(lengths, 3, algorithm="exact", time_limit=5).makespan == plan.makespan  # never via `improve`


@pytest.mark.parametrize("values, error, message", [
    ([4, -1], ValueError, "must be non-negative integers; got -1 at index "),
    ([True, False], TypeError, "must hold integers, not booleans"),
    ([1.5, 2.0], TypeError, "must hold integers; got dtype float64"),
    (np.array([1, 2**63 + 1], dtype=np.uint64), ValueError, "must fit int64 \\(below 2\\*\\*63\\)"),
], ids=["negative", "booleans", "floats", "uint64"])
def test_regression_three_integer_checks_said_three_things(values, error, message):
    """A batch's columns and a rank's metadata are checked by the lengths' helper
    (`validation.as_non_negative_integers`): one message (the batch and the metadata said 'must be
    non-negative; got -1', 'must hold integers; got dtype bool')."""
    from orchmllm.orchestrator import Batch
    from orchmllm.runtime.metadata import as_table

    with pytest.raises(error, match="`segment_length` " + message):
        Batch.from_arrays(num_ranks=1, modalities=("image",), sample_text=[9], sample_source=[0],
                          segment_sample=[0, 0], segment_modality=[0, 0], segment_length=values,
                          segment_tokens=[1, 1])
    with pytest.raises(error, match="`lengths` " + message):
        as_table(values)
    if np.asarray(values).dtype.kind != "f":  # whole floats are lengths (the float case: not whole)
        with pytest.raises(error, match="`lengths` " + message):
            balance(values, 2)


def test_regression_the_dispatcher_checked_its_options_only_when_a_step_planned():
    """Its balance options travelled as a dict to every step's `balance`: an unknown algorithm or a
    bad cap surfaced at the first `plan()`, after the metadata all-gather. They are one frozen
    `DispatchOptions` now, checked at construction with the registry's and make_problem's messages,
    and ranks that spell an option differently fingerprint the same configuration."""
    from orchmllm.runtime import PostBalancingDispatcher
    from orchmllm.runtime.options import DispatchOptions

    with pytest.raises(ValueError, match=_unknown("algorithm", ALGORITHMS)):
        PostBalancingDispatcher(algorithm="magic")
    with pytest.raises(ValueError, match="max_tokens_per_rank"):
        PostBalancingDispatcher(max_tokens_per_rank=0)
    with pytest.raises(ValueError, match="time_limit"):
        PostBalancingDispatcher(time_limit=-1.0)
    spelled = PostBalancingDispatcher(max_tokens_per_microbatch=np.int64(4096), microbatch_overhead=0)
    plain = PostBalancingDispatcher(max_tokens_per_microbatch=4096, per_item_keys=(), check_plan=False)
    assert spelled.config_fingerprint == plain.config_fingerprint
    assert isinstance(plain.options, DispatchOptions) and plain.options.microbatching.max_tokens_per_microbatch == 4096
    with pytest.raises(AttributeError):
        plain.options.algorithm = "lpt"  # frozen
