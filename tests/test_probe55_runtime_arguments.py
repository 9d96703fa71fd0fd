"""probe55: public runtime helpers given arguments a user may get wrong.

`run_processes(3, 2)` (not a function) and `args=5` started every rank, and each reported its own TypeError traceback;
`ContextParallelLayout.planned(rank=3, world_size=2, ...)` and `world_size=0` returned a layout for a rank that does not
exist.  Each is refused at the call now, naming the argument."""

import pytest

from orchmllm.runtime.context_parallel import ContextParallelLayout
from orchmllm.runtime.launch import run_processes


def _rank(rank, size, *args):
    return rank


@pytest.mark.parametrize("fn, args, got", [(3, (), "int and tuple"), (_rank, 5, "function and int")])
def test_regression_a_function_or_args_of_the_wrong_kind_started_every_rank(fn, args, got):
    with pytest.raises(TypeError, match=f"`fn` must be callable and `args` a tuple .*; got {got}"):
        run_processes(fn, 2, args=args)


@pytest.mark.parametrize("rank, world_size, message", [
    (3, 2, r"`rank` must be in \[0, world_size=2\); got 3"), (0, 0, "`world_size` must be >= 1; got 0"),
    (-1, 2, r"`rank` must be in \[0, world_size=2\); got -1")])
def test_regression_planned_took_a_rank_outside_the_world(rank, world_size, message):
    with pytest.raises(ValueError, match=message):
        ContextParallelLayout.planned(rank, world_size, [3], [])


def test_a_list_of_args_and_a_valid_rank_still_work():
    assert [o.value for o in run_processes(_rank, 2, args=[1, 2], timeout_s=30)] == [0, 1]
    assert ContextParallelLayout.planned(1, 2, [3], []).lengths == (3,)
