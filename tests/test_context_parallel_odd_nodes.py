"""Context parallelism on nodes whose size a degree does not divide (6 GPUs and degree 4, 3 and degree 2).

Groups are aligned blocks of ranks; on such nodes some blocks straddle two nodes ([4, 8) on nodes of 6),
and the planner leaves those out unless groups may cross nodes, using the ones inside ([0, 4), [8, 12)).
A degree is refused only where no block of it fits in a node (wider than a node).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmllm import ContextParallel, CostModel, Topology, balance, balance_microbatches
from orchmllm.testing.context_parallel import check_split_plan

COST = CostModel.from_transformer(num_layers=32, hidden_size=4096)


def check_split_microbatches(plan, lengths, num_ranks, spec, budget):
    """Every micro-batch's pass is a certified split plan of its items (groups inside nodes, budget held), and
    the step plan puts every item where its pass does."""
    lengths = np.asarray(lengths)
    if plan.passes is None:
        assert not plan.split_items.size
        return
    for m, laid in enumerate(plan.passes):
        items = np.flatnonzero(plan.microbatch == m)
        if laid is None:
            assert not items.size
            continue
        check_split_plan(laid, lengths[items], num_ranks, spec, cost=COST, max_tokens_per_rank=budget)
        assert np.array_equal(laid.assignment, plan.rank[items]) and np.array_equal(laid.degree, plan.degree[items])


PROBE_LENGTHS = np.r_[np.random.default_rng(0).integers(64, 4096, 40), [150000, 90000]]


@pytest.mark.parametrize("num_ranks, gpus_per_node, degrees", [(12, 6, (1, 2, 4)), (12, 3, (1, 2)), (20, 10, (1, 8)),
                                                               (15, 5, (1, 2, 4))])
def test_regression_a_degree_not_dividing_the_node_was_refused_on_two_nodes(num_ranks, gpus_per_node, degrees):
    """Cause (probe20 P20-14): `allowed_degrees` refused a degree where some aligned block of it straddles two
    nodes (degree 4 on 2 nodes of 6 GPUs), though [0, 4) and [8, 12) lie inside nodes, and took it on one node;
    and the two-tier layout (`tiers.py`) packed blocks from rank 0 regardless of nodes, so with the refusal
    lifted it put a group across nodes (RuntimeError).  Now the blocks inside nodes are used, plain and
    micro-batched."""
    spec = ContextParallel(degrees=degrees, gpus_per_node=gpus_per_node)
    plan = balance(PROBE_LENGTHS, num_ranks, cost=COST, context_parallel=spec)
    check_split_plan(plan, PROBE_LENGTHS, num_ranks, spec, cost=COST)
    assert plan.degree.max() > 1
    budget = int(PROBE_LENGTHS.max()) // min(degrees[-1], 2)
    micro = balance_microbatches(PROBE_LENGTHS, num_ranks, cost=COST, max_tokens_per_microbatch=budget,
                                 context_parallel=spec)
    check_split_microbatches(micro, PROBE_LENGTHS, num_ranks, spec, budget)
    assert micro.degree.max() > 1


def test_regression_two_tiers_put_a_group_across_nodes_of_six():
    """Cause (probe20 P20-14, the lead's sweep seed 19): with degree 4 on 2 nodes of 6 GPUs, two tiers laid
    the items alone from rank 0 and their groups of 4 on [4, 8), across the nodes."""
    rng = np.random.default_rng(19)
    lengths = np.r_[rng.integers(64, 4096, 30), [180000, 150000, 120000]]
    spec = ContextParallel(degrees=(1, 4), gpus_per_node=6)
    plan = balance(lengths, 12, cost=COST, context_parallel=spec)
    check_split_plan(plan, lengths, 12, spec, cost=COST)
    assert set(plan.assignment[plan.degree == 4].tolist()) <= {0, 8}


@pytest.mark.parametrize("gpus_per_node", [3, 6])
def test_one_node_and_two_nodes_take_the_same_degrees(gpus_per_node):
    """Two nodes take what one node takes (and the topology's node size alike); only a degree wider than a node
    is refused, naming the node size."""
    lengths = [50000, 40000] + [300] * 40
    spec = ContextParallel(degrees=(1, 2, 4) if gpus_per_node == 6 else (1, 2), gpus_per_node=gpus_per_node)
    for num_ranks in (gpus_per_node, 2 * gpus_per_node):
        check_split_plan(balance(lengths, num_ranks, cost=COST, context_parallel=spec), lengths, num_ranks, spec,
                         cost=COST)
    plan = balance(lengths, 2 * gpus_per_node, cost=COST, context_parallel=ContextParallel(degrees=spec.degrees),
                   topology=Topology(num_nodes=2, gpus_per_node=gpus_per_node))
    check_split_plan(plan, lengths, 2 * gpus_per_node, spec, cost=COST)
    wider = 4 if gpus_per_node == 3 else 8  # wider than a node, within the ranks
    wide = ContextParallel(degrees=(1, wider), gpus_per_node=gpus_per_node)
    with pytest.raises(ValueError, match=rf"holds {wider} > {gpus_per_node} gpus per node; "
                                         r"groups stay inside a node unless "
                                         r"`allow_inter_node=True`; pass degrees=\(1,\) for this job"):
        balance(lengths, 2 * gpus_per_node, cost=COST, context_parallel=wide)


@st.composite
def odd_node_cases(draw):
    """(lengths with a few giants, ranks, spec, a micro-batch budget) on 1 to 3 nodes of 3, 5, 6, 10 or 12 GPUs."""
    gpus_per_node = draw(st.sampled_from([3, 5, 6, 10, 12]))
    num_ranks = gpus_per_node * draw(st.integers(1, 3))
    wider = draw(st.lists(st.sampled_from([c for c in (2, 4, 8) if c <= gpus_per_node]), min_size=1, max_size=2))
    degrees = tuple(sorted({draw(st.sampled_from([1, 1, 2]))} | set(wider)))
    small = draw(st.lists(st.integers(64, 4096), min_size=1, max_size=3 * num_ranks))
    giants = draw(st.lists(st.integers(20000, 200000), min_size=1, max_size=3))
    return np.array(small + giants), num_ranks, ContextParallel(degrees=degrees, gpus_per_node=gpus_per_node)


@pytest.mark.filterwarnings("ignore:`degrees` .* leave out 1")
@given(case=odd_node_cases())
def test_plans_on_odd_nodes_keep_every_group_inside_a_node(case):
    lengths, num_ranks, spec = case
    plan = balance(lengths, num_ranks, cost=COST, context_parallel=spec)
    check_split_plan(plan, lengths, num_ranks, spec, cost=COST)
    budget = int(lengths.max())
    micro = balance_microbatches(lengths, num_ranks, cost=COST, max_tokens_per_microbatch=budget,
                                 context_parallel=spec)
    check_split_microbatches(micro, lengths, num_ranks, spec, budget)
