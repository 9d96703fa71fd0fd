"""probe53 F5, F6: `ContextParallel.time` names its arguments for shapes that do not broadcast and non-bool
`within_node`."""

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel

COST = CostModel(linear=1.0)
SPEC = ContextParallel(seconds_per_cost=1.0)


def test_regression_time_shapes_that_do_not_broadcast_gave_numpy_message():
    """Cause (probe53 F5): `time(cost, [10, 20], [1, 2, 4])` raised numpy's "shape mismatch ... arg 0 ... arg 1"."""
    with pytest.raises(ValueError, match=r"`lengths` \(shape \(2,\)\), `degree` \(shape \(3,\)\) and `within_node` "
                                         r"\(shape \(\)\) must broadcast to one shape"):
        SPEC.time(COST, [10, 20], [1, 2, 4])


@pytest.mark.parametrize("within_node", ["False", "no", 0.5, None, [1, 0]])
def test_regression_time_took_any_truthy_within_node(within_node):
    """Cause (probe53 F6): `within_node="False"` (any truthy value) was priced as inside a node, None as across."""
    with pytest.raises(TypeError, match=r"`within_node` must be a bool or an array of bools"):
        SPEC.time(COST, [100000, 100000], 8, within_node=within_node)


def test_time_takes_python_and_numpy_bools():
    inside, across = (SPEC.time(COST, [100000], 8, within_node=value)[0] for value in (True, False))
    assert across > inside
    assert SPEC.time(COST, [100000], 8, within_node=np.bool_(False))[0] == across
    assert SPEC.time(COST, [100000] * 2, 8, within_node=np.array([True, False])).tolist() == [inside, across]
