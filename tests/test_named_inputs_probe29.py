"""Inputs that got raw Python or torch errors, a false verdict or a silent misreading, now named (probe29 P29-01 to
P29-06).

Each case failed on the tree before its fix."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from orchmllm import CostModel, balance
from orchmllm.balancers.microbatch.plan import MicroBatchResult
from orchmllm.runtime import PostBalancingDispatcher
from orchmllm.runtime.launch import run_processes
from orchmllm.testing import MicroBatchConformanceReport, check_conformance

DEVICE_RULE = "every tensor of one exchange must be on one device"


def _meta_on_rank_1(rank, size):
    dispatcher = PostBalancingDispatcher()
    lengths = [[5, 3], [4, 4]][rank]
    batch = {"ids": torch.arange(8), "mask": torch.empty(8, device="meta") if rank == 1 else torch.zeros(8)}
    dispatcher.dispatch(batch, dispatcher.plan(lengths))


def test_a_tensor_on_another_device_is_named_on_every_rank():
    """P29-01: torch.cat's "Tensor on device meta is not on the expected device cpu!" on the rank that passed it,
    PeerFailureError on its peer; now the key and the devices, on every rank, through the exchange's header."""
    with pytest.raises(ValueError, match=f"piece 1 \\(mask\\): tensor is on meta, piece 0 \\(ids\\) on cpu: "
                                         f"{DEVICE_RULE}"):
        dispatcher = PostBalancingDispatcher()
        dispatcher.dispatch({"ids": torch.arange(5), "mask": torch.empty(5, device="meta")}, dispatcher.plan([3, 2]))
    for outcome in run_processes(_meta_on_rank_1, 2, timeout_s=60, collective_timeout_s=5):
        assert outcome.error is not None and "ranks [1] disagree with ranks [0]" in outcome.error \
            and DEVICE_RULE in outcome.error, (outcome.rank, outcome.error)


@pytest.mark.parametrize("world_size, error", [("4", TypeError), (None, TypeError), (4.5, TypeError),
                                               (0, ValueError)])
def test_a_duck_typed_topology_s_world_size_is_named(world_size, error):
    """P29-02: Python's "not all arguments converted during string formatting" ("4" % 2) and NoneType errors."""
    topology = SimpleNamespace(gpus_per_node=2, world_size=world_size)
    with pytest.raises(error, match=f"`topology.world_size` must be a positive int; got {world_size!r}"):
        balance([5, 4, 3, 3, 2, 2], 4, sources=[0, 1, 2, 3, 0, 1], topology=topology)


def _one_per_cell(problem, num_microbatches):
    if problem.num_items > num_microbatches * problem.num_ranks:
        return None
    cell = np.arange(problem.num_items, dtype=np.int64)
    return MicroBatchResult(cell % problem.num_ranks, cell // problem.num_ranks)


def test_a_bare_micro_batch_kernel_runs_the_micro_batch_suite():
    """P29-03: check_conformance called it with the problem alone and raised ConformanceError ("returned a broken
    plan ... missing 1 required positional argument"), saying a correct kernel was wrong."""
    report = check_conformance(_one_per_cell, examples=3, processes=False)
    assert isinstance(report, MicroBatchConformanceReport) and report.algorithm == "_one_per_cell"


def test_an_all_zero_stage_reads_one_times_its_mean():
    """P29-04: the legend of loads of 0 read "max 0.00x mean" (0 / 0) where the tables read 1.00x."""
    pytest.importorskip("matplotlib")
    from orchmllm.cli import plots

    figure = plots.rank_load_grid_figure({"D=2": {"llm": (np.zeros(2), np.zeros(2), "auto")}})
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == [
        "before (max 1.00x mean)", "after by auto (max 1.00x mean)"]


def _str_keys_job(rank, size):
    """Items of one token each, so a per-item output has the rows of a per-token one: the str's letters were the
    keys and "score" went home as per-token rows, to other items where the plan moves some."""
    dispatcher = PostBalancingDispatcher()
    lengths = [1] * (3 if rank == 0 else 1)
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"x": torch.arange(len(lengths), dtype=torch.float32) + 10 * rank}, plan)
    try:
        dispatcher.combine({"score": moved["x"]}, plan, per_item_keys="score", differentiable=False)
    except TypeError as error:
        return str(error)
    return "no error"


def test_combine_s_per_item_keys_given_as_a_str_are_refused_on_every_rank():
    """P29-06: `combine(per_item_keys="score")` took the letters for keys (the constructor refused a str)."""
    for message in run_processes(_str_keys_job, 2, timeout_s=60, collective_timeout_s=5):
        assert message.value is not None and "`per_item_keys` must be a collection of keys, not a str" \
            in message.value, (message.rank, message.value, message.error)
    with pytest.raises(TypeError, match="`per_item_keys` must be a collection of str keys; got NoneType"):
        PostBalancingDispatcher(per_item_keys=None)


def _cost_spelling_job(rank, size):
    dispatcher = PostBalancingDispatcher(cost=None if rank == 0 else CostModel())
    return dispatcher.plan([[5, 3], [4, 4]][rank]).balance.makespan


def test_the_default_cost_spelled_none_or_costmodel_is_one_configuration():
    """P29-05: `cost=None` on one rank and `cost=CostModel()` (the same f(l) = l) on another: ConfigMismatchError."""
    assert [o.value for o in run_processes(_cost_spelling_job, 2, timeout_s=60, collective_timeout_s=5)] == [8.0, 8.0]
