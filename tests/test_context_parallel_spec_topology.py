"""A `ContextParallel` spec against the topology it plans on and the cost it prices (probe17 P17-07, P17-13)."""

import re
import warnings

import pytest

from orchmllm import balance, balance_microbatches
from orchmllm.balancers import CostModel
from orchmllm.balancers.context_parallel import ContextParallel
from orchmllm.orchestrator import Orchestrator
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload
from orchmllm.topology import Topology

LENGTHS = [5000, 300, 200, 100, 90, 80, 70, 60]
UNIT_COST = "`context_parallel` with the default cost (1 per token)"


def test_regression_a_split_priced_in_unit_costs_at_an_h100s_flop_rate_planned_without_a_word():
    """Cause (P17-07): with the default cost (1 per token) a split item's communication seconds, at an H100's FLOP rate,
    made a step of 5900 tokens cost 4.3e12, no warning (the CLI refuses it).  Both APIs now warn once."""
    spec = ContextParallel(degrees=(1, 2))
    with pytest.warns(UserWarning, match=re.escape(UNIT_COST)) as caught:
        balance_microbatches(LENGTHS, 8, max_tokens_per_microbatch=3000, context_parallel=spec)
    assert sum(UNIT_COST in str(warning.message) for warning in caught) == 1
    with pytest.warns(UserWarning, match=re.escape(UNIT_COST)):
        balance(LENGTHS, 8, max_tokens_per_rank=3000, context_parallel=spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        balance(LENGTHS, 8, max_tokens_per_rank=3000, context_parallel=spec, cost=CostModel(linear=6e9))
        balance(LENGTHS, 8, max_tokens_per_rank=3000, context_parallel=ContextParallel(degrees=(1, 2),
                                                                                       seconds_per_cost=1e-6))


def test_regression_the_orchestrator_replaced_a_specs_latency_and_node_size_with_the_topologys_unseen():
    """Cause (P17-13): `spec.on(topology)` took the topology's node size, bandwidths and latency over the spec's own,
    so a calibrated `latency_s` never reached the Orchestrator's plan and gpus_per_node=3 planned as 8, no word.
    A node size the topology gives otherwise is now refused; a bandwidth or latency warns, naming both."""
    batch = sample_workload("long", 8, 2, seed=1)
    stages = MODELS["10b"].stages()
    with pytest.raises(ValueError, match=r"`context_parallel` sets gpus_per_node=3 \(the topology's: 8\)"):
        Orchestrator(stages, Topology(1, 8), context_parallel=ContextParallel(degrees=(1, 2, 4), gpus_per_node=3))
    with pytest.warns(UserWarning, match=r"sets latency_s=0.005 \(the topology's: 1e-05\), which the topology gives"):
        Orchestrator(stages, Topology(1, 8), context_parallel=ContextParallel(degrees=(1, 2, 4), latency_s=5e-3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Orchestrator(stages, Topology(1, 8, latency_s=5e-3), context_parallel=ContextParallel(degrees=(1, 2, 4))
                     ).plan(batch)
        ContextParallel(degrees=(1, 2), latency_s=5e-3).on(Topology(1, 8, latency_s=5e-3))


def test_regression_a_topology_s_inverted_bandwidths_were_blamed_on_the_spec():
    """probe20 P20-22: a Topology with inter-node bandwidth above intra-node (a typo'd figure) planned plainly,
    then Orchestrator(context_parallel=ContextParallel()) refused it as the spec's own fields, which the user
    left at their defaults; the error now says the values are the topology's."""
    topology = Topology(2, 8, intra_node_bw_bytes_per_s=1e9, inter_node_bw_bytes_per_s=1e12)
    with pytest.raises(ValueError, match=r"^the topology's links, which `context_parallel` takes: "
                                         r"`inter_node_bw_bytes_per_s` \(1e\+12\) must not exceed"):
        ContextParallel().on(topology)
