"""The guard of `normalize_loss` against a per-micro-batch count: dividing each micro-batch's loss by
its own loss tokens weights tokens by the micro-batch they sit in.  A count raises inside a micro-batch
loop, and for a loss that requires grad until the next `plan()` or `microbatches()` (a loop over the
micro-batches collected in a list); a loss of another batch under `torch.no_grad()` takes its count."""

import re

import pytest
import torch
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.orchestrator.samples import Sample
from orchmllm.orchestrator.stages import Stage
from orchmllm.runtime import MultiStageRuntime, PostBalancingDispatcher, normalize_loss
from orchmllm.runtime.launch import spawn
from orchmllm.runtime.microbatch import accumulate

LENGTHS = ([6, 1, 5, 2], [3, 4, 6, 1])  # 28 tokens on 2 ranks under a budget of 8: two micro-batches


def _collected_step(rank):
    """(the plan, the micro-batches collected in a list, the weight each loss is computed with) of a
    micro-batched step, every token a loss token."""
    lengths = LENGTHS[rank]
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=8)
    plan = dispatcher.plan(lengths)
    micros = list(dispatcher.microbatches(plan, dispatcher.dispatch({"tokens": torch.arange(sum(lengths))}, plan)))
    return plan, micros, torch.ones((), dtype=torch.float64, requires_grad=True)


def per_micro_batch_count_job(rank, size):
    plan, micros, weight = _collected_step(rank)
    messages = []
    for micro in micros:
        try:
            normalize_loss(weight * micro.data["tokens"].numel(), micro.data["tokens"].numel()).backward()
        except ValueError as error:
            messages.append(str(error))
    return messages, plan.num_microbatches


def test_regression_a_per_micro_batch_count_over_micro_batches_collected_in_a_list_passed_silently():
    """The guard lived as long as the generator: over `list(microbatches(...))`, without `accumulate`,
    every micro-batch's loss was divided by its own count and tokens weighted by their micro-batch."""
    for messages, count in spawn(per_micro_batch_count_job, 2, timeout_s=60):
        assert count == 2 and len(messages) == count
        assert all(message.startswith("normalize_loss with a count for a loss that requires grad in a step of 2 "
                                      "micro-batches") for message in messages)
        assert all("`normalize_loss(loss_sum, micro)`" in message for message in messages)


def evaluation_after_a_step_job(rank, size):
    plan, micros, weight = _collected_step(rank)
    for micro in micros:
        normalize_loss(weight * micro.data["tokens"].numel(), micro).backward()
    with torch.no_grad():  # a held-out batch of 3 + rank loss tokens on this rank, summed loss 6
        evaluated = float(normalize_loss(weight * 6.0, 3 + rank, gradient_reduction="sum"))
    logged = float(normalize_loss((weight * 6.0).detach(), 3 + rank, gradient_reduction="sum"))
    return plan.num_microbatches, evaluated, logged, float(weight.grad)


def test_regression_an_evaluation_after_a_micro_batched_step_was_refused_its_count():
    """Cause: 30ea487 (the fix above) refused every plain count after a micro-batched step until the next
    `plan()`, an evaluation batch's or a logged loss's too, correct programs; a loss that cannot reach a
    gradient now takes its count (and the global count is all-reduced as before)."""
    results = spawn(evaluation_after_a_step_job, 2, timeout_s=60)
    assert all(count == 2 and evaluated == logged == 6.0 / (3 + 4) for count, evaluated, logged, _ in results)
    assert sum(gradient for *_, gradient in results) == pytest.approx(2.0)  # the step's mean times the world size



def test_regression_a_step_let_go_of_still_refused_a_later_steps_count():
    """Cause: d590b5e kept a step's count of micro-batches on the thread until the next `plan()`, so a later
    plain step's count was refused (a reference step in ranks forked from this thread, in another test).
    The window lasts while the step's micro-batches are held."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=10)
    plan = dispatcher.plan([4, 6, 3, 7, 2])
    micros = list(dispatcher.microbatches(plan, dispatcher.dispatch({"x": torch.arange(22)}, plan)))
    loss = torch.ones((), requires_grad=True)
    with pytest.raises(ValueError, match=f"for a loss that requires grad in a step of {len(micros)} micro-batches"):
        normalize_loss(loss, 2)
    del micros
    assert normalize_loss(loss, 2).item() == 0.5


def kept_multi_stage_micro_batch_job(rank, size):
    """Two multi-stage steps of text-only samples (2 micro-batches each, other loss tokens in the second);
    the first step's first micro-batch, kept, given to `normalize_loss` inside the second step's loop."""
    stages = (Stage("vision", "image", CostModel(linear=1)), Stage("llm", "llm", CostModel(linear=1)))
    runtime = MultiStageRuntime(stages, max_tokens_per_microbatch=8)
    samples = [Sample(text=length, source=rank, id=10 * rank + k) for k, length in enumerate(LENGTHS[rank])]
    text = {"input_ids": torch.zeros(sum(LENGTHS[rank]), dtype=torch.int64)}
    routes = runtime.plan(samples)
    kept = next(iter(runtime.microbatches(routes, runtime.dispatch(routes, text=text))))
    routes = runtime.plan(samples, loss_tokens=[1] * len(samples))
    for micro in runtime.microbatches(routes, runtime.dispatch(routes, text=text)):
        try:
            normalize_loss(torch.ones(()), kept)
        except ValueError as error:
            return micro.num_microbatches, str(error)
    return micro.num_microbatches, "no error"


def test_regression_a_multi_stage_micro_batch_kept_from_the_previous_step_divided_by_its_loss_tokens():
    """Cause (probe6 P6-19, the multi-stage side): a micro-batch kept in a loop variable from the step before
    gave `normalize_loss` that step's loss tokens (28 here, this step's 8), silently."""
    for count, message in spawn(kept_multi_stage_micro_batch_job, 2, timeout_s=60):
        assert count == 2 and message.startswith("normalize_loss with micro-batch 0 of an earlier step (its runtime "
                                                 "has run another since): it would divide by that step's 28 loss "
                                                 "tokens"), message

def test_per_micro_batch_normalisation_raises_in_accumulate_whatever_the_loop():
    """Collected first (`list(...)`), the micro-batches ran after the generator had finished and a
    per-micro-batch count passed silently; inside `accumulate` it raises.  A loop left by `break`
    no longer leaks into the next step: `plan()` starts afresh."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=10)
    lengths = [4, 6, 3, 7, 2]
    plan = dispatcher.plan(lengths)
    micros = list(dispatcher.microbatches(plan, dispatcher.dispatch({"x": torch.arange(sum(lengths))}, plan)))
    assert len(micros) >= 3
    model = nn.Linear(1, 1)
    for micro in micros:
        with accumulate(model, micro), pytest.raises(ValueError, match="normalize_loss with a count inside micro"):
            normalize_loss(torch.zeros(()), 6)
    normalize_loss(torch.zeros(()), 6)  # outside any micro-batch, no gradient: a plain count is right
    with pytest.raises(ValueError, match=f"for a loss that requires grad in a step of {len(micros)} micro-batches"):
        normalize_loss(torch.zeros((), requires_grad=True), 6)  # the step's micro-batches were handed out
    loop = dispatcher.microbatches(plan, dispatcher.dispatch({"x": torch.arange(sum(lengths))}, plan))
    for _ in loop:
        break
    with pytest.raises(ValueError, match="normalize_loss with a count inside micro-batch 0"):
        normalize_loss(torch.zeros(()), 6)  # the loop is still open: its micro-batch still counts
    PostBalancingDispatcher().plan([3, 2])  # the next step
    assert normalize_loss(torch.ones((), requires_grad=True), 2).item() == 0.5
    with pytest.raises(TypeError, match="`micro` must be a MicroBatch"):
        with accumulate(model, 3):
            pass


def test_a_new_micro_batch_loop_forgets_one_left_by_break():
    """The planning may run on a prefetcher's thread: `microbatches()` on the training thread starts
    the step afresh too."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=10)
    lengths = [4, 6, 3, 7, 2]
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"x": torch.arange(sum(lengths))}, plan)
    loop = dispatcher.microbatches(plan, moved)
    next(loop)  # then left, as by `break`
    with pytest.raises(ValueError, match="normalize_loss with a count inside micro-batch 0"):
        normalize_loss(torch.zeros(()), 6)
    again = dispatcher.microbatches(plan, moved)  # the next step's loop, planned elsewhere
    assert float(normalize_loss(torch.ones(()), 2)) == 0.5
    assert len(list(again)) == plan.num_microbatches


@pytest.mark.parametrize("where, rules", [
    ("accumulate", (".detach()", "inside the block")),
    ("normalize_loss", (".detach()", "`micro.loss_scale()` or `total_loss_tokens=`")),
    ("loss_scale", ("does not see a loss scaled by hand", "`normalize_loss(loss, micro)`"))])
def test_regression_the_model_checks_rules_were_only_in_the_readme(where, rules):
    """Cause (probe10 P10-10): that a metric normalised with the micro-batch for a log line must be detached, and
    that the check sees only `normalize_loss(loss, micro)` (not `loss_scale` by hand), was said in README only;
    the docstrings a user reads where the API is defined say it now."""
    from orchmllm.runtime.microbatch import MicroBatch

    documented = {"accumulate": accumulate, "normalize_loss": normalize_loss, "loss_scale": MicroBatch.loss_scale}
    text = " ".join(documented[where].__doc__.split())
    assert all(rule in text for rule in rules), text


@pytest.mark.parametrize("model, check, error, message", [
    (None, True, TypeError, "`model` must be the nn.Module whose gradients the micro-batches accumulate"),
    (torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), True, TypeError, "`model` must be the nn.Module"),
    (nn.Linear(2, 2), "no", TypeError, "`check` must be a bool; got str")])
def test_regression_accumulate_took_any_model_and_check_by_truth(model, check, error, message):
    """Cause (probe10 P10-16): `accumulate(None, micro)` or an optimizer ran with no gradient-sync control and no
    model check, silently, and `check='no'` turned the check on."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=10)
    plan = dispatcher.plan([3, 4])
    micro = next(iter(dispatcher.microbatches(plan, dispatcher.dispatch({"x": torch.zeros(7, 2)}, plan))))
    with pytest.raises(error, match=message):
        with accumulate(model, micro, check=check):
            pass


@pytest.mark.parametrize("reduction", ["avg", "MEAN", None])
def test_regression_loss_scale_took_any_reduction_for_sum(reduction):
    """Cause (probe10 P10-19): `MicroBatch.loss_scale` gave the "sum" factor for anything but "mean" (a typo),
    gradients off by the world size; it checks its argument as `normalize_loss` does."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=10)
    plan = dispatcher.plan([3, 4])
    micro = next(iter(dispatcher.microbatches(plan, dispatcher.dispatch({"x": torch.zeros(7, 2)}, plan))))
    with pytest.raises(ValueError, match=re.escape(f"`gradient_reduction` must be one of ('mean', 'sum'); got "
                                                   f"{reduction!r}")):
        micro.loss_scale(reduction)



def test_regression_the_readmes_multi_stage_loop_left_ddp_micro_batches_unchecked_without_a_word():
    """Cause (probe10 P10-21): README's multi-stage loop (FSDP2, one pass) has no `accumulate`, and the text after it
    said the same calls work under DDP: a micro-batched DDP loop built from it had no model check.  Its loop body
    now runs in `accumulate` with `normalize_loss(loss_sum, micro)`, and the text says so for FSDP2 and DDP alike,
    with a token budget or without."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "fully_shard(model)" in block)
    body = block[block.index("for micro in runtime.microbatches(routes, moved):"):]
    assert "with accumulate(model, micro):" in body and "normalize_loss(loss_sum, micro).backward()" in body, body
    text = " ".join(readme.split())
    assert ("The loop body runs in `with accumulate(model, micro):` and normalises with `normalize_loss(loss_sum, "
            "micro)` (the loss tokens given to `plan`) under FSDP2 and DDP alike, with a token budget or without") \
        in text


@pytest.mark.parametrize("loss_sum", [0, 0.0])
def test_regression_a_python_zero_from_an_empty_micro_batch_was_refused_without_the_cause(loss_sum):
    """Cause (probe13 P13-12): a per-sample loss summed in Python over an empty micro-batch (`sum([])`, 0) reached
    `normalize_loss(0, micro)`, refused only as "got int": the message now names the empty micro-batch and the fix."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=10, num_microbatches=3)
    plan = dispatcher.plan([4, 6])
    micros = list(dispatcher.microbatches(plan, dispatcher.dispatch({"x": torch.arange(10)}, plan)))
    empty = next(micro for micro in micros if not micro.items.size)
    with pytest.raises(TypeError, match=rf"`loss_sum` must be a torch.Tensor; got {type(loss_sum).__name__} "
                                        rf"\(micro-batch "
                                        rf"{empty.index} of 3 holds no item on this rank: every rank runs every "
                                        rf"micro-batch, so compute its loss from the model's output on the empty "
                                        rf"tensors, e.g. `output.sum\(\) \* 0`\)"):
        normalize_loss(loss_sum, empty)
