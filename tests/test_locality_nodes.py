"""Nodes of ranks by a shift where the node size is a power of two (`partial_plan.node_of`): the same nodes as
`ranks // gpus_per_node`, and the locality passes divide no item array (numpy's integer division costs 5x the
shift: 1.9 ms of `moved`'s 2.6 ms on 360k items at D = 2560)."""

import numpy as np
import pytest

from orchmllm.balancers.locality import balance as locality_balance
from orchmllm.balancers.locality.deal import take_in_node
from orchmllm.balancers.locality.partial_plan import PartialPlan, node_of, on_other_nodes
from orchmllm.balancers.origins import Origins
from orchmllm.balancers.problem import make_problem


@pytest.mark.parametrize("gpus_per_node", [1, 2, 3, 6, 8, 16, 64])
def test_node_of_is_the_floor_division(gpus_per_node):
    ranks = np.random.default_rng(gpus_per_node).integers(0, 4096, 1000)
    assert node_of(ranks, gpus_per_node).tolist() == (ranks // gpus_per_node).tolist()
    others = np.random.default_rng(gpus_per_node + 100).integers(0, 4096, 1000)
    assert on_other_nodes(ranks, others, gpus_per_node).tolist() == (ranks // gpus_per_node
                                                                     != others // gpus_per_node).tolist()


class _Divided(np.ndarray):
    """An int64 item array that records every integer division applied to it (or to arrays taken from it)."""

    divisions: list = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc in (np.floor_divide, np.divmod):
            _Divided.divisions.append(ufunc.__name__)
        plain = [np.asarray(value) if isinstance(value, _Divided) else value for value in inputs]
        return getattr(ufunc, method)(*plain, **kwargs)


def _watched(array: np.ndarray) -> np.ndarray:
    _Divided.divisions = []
    return np.asarray(array, dtype=np.int64).view(_Divided)


def test_regression_moved_and_the_labelling_bound_divided_every_items_rank():
    """`moved` took node = rank // gpus_per_node of every item's source and destination, and
    `_labelling_may_beat` of every source again, each a numpy integer division: shifts now (8 GPUs a node),
    the same bytes."""
    rng = np.random.default_rng(0)
    sources, destinations = rng.integers(0, 64, 5000), rng.integers(0, 64, 5000)
    item_bytes = rng.random(5000)
    expected_node = float(item_bytes[destinations // 8 != sources // 8].sum())
    origins = Origins(_watched(sources), item_bytes, 8)
    node_bytes, rank_bytes = locality_balance.moved(_watched(destinations), origins)
    assert (node_bytes, rank_bytes) == (expected_node, float(item_bytes[destinations != sources].sum()))
    locality_balance._labelling_may_beat(destinations, rng.integers(0, 64, 5000), origins, 64)
    assert _Divided.divisions == []


def test_regression_take_in_node_divided_every_items_source():
    """`take_in_node` grouped the left-over items by source // gpus_per_node: a shift now, the same deal."""
    rng = np.random.default_rng(1)
    lengths, sources = rng.integers(1, 50, 4000), rng.integers(0, 32, 4000)
    problem = make_problem(lengths, 32)
    plans = []
    for given in (sources, _watched(sources)):
        state = PartialPlan(problem, target=float(problem.item_costs.sum()) / 32 * 1.01)
        left = take_in_node(state, given, 8)
        plans.append((state.destinations.tolist(), np.asarray(left).tolist()))
    assert plans[0] == plans[1]
    assert _Divided.divisions == []
