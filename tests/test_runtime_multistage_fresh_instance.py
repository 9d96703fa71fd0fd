"""A multi-stage runtime rebuilt on one rank (same options) meets its peers' warm ones (probe27 P27-08's twin).

A runtime owes the model check (`check_model_contract`, an all-gather as the backward of a step's last micro-batch
starts) until one of its loops trained; a runtime built since on one rank owed it while its warm peers did not, so
under DDP that rank waited in the check's all-gather while its peers ran the next collective, until the group's
timeout.  The metadata all-gather of `plan` now carries a word of each rank's exchange sites and of whether its
runtime trained: where they differ, every rank starts afresh (the check runs on every rank, as at the first step).

Real gloo groups of 3 ranks; each rank counts its own orchmllm collectives (`runtime.counting`)."""

import pytest
import torch
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.orchestrator.samples import Sample, Segment
from orchmllm.orchestrator.stages import Stage
from orchmllm.runtime import MultiStageRuntime, accumulate, normalize_loss
from orchmllm.runtime.counting import CollectiveCounter
from orchmllm.runtime.launch import spawn

STAGES = (Stage("vision", "image", CostModel(per_item=1, linear=1)), Stage("llm", "llm", CostModel(linear=1)))
REBUILT_RANK, REBUILT_STEP = 2, 1


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.vision, self.embed = nn.Linear(4, 8), nn.Embedding(16, 8)

    def encode(self, patches, lengths):
        return self.vision(patches)

    def forward(self, runtime, micro):
        packed = runtime.forward(micro.routes, micro.data, encoders={"image": self.encode}, text_embedding=self.embed)
        return packed.embeddings.sum()


def _samples(rank, step):
    return [Sample(text=3 + (rank + step + k) % 4, segments=(Segment("image", 2 + k, 2 + k),) if k != 1 else (),
                   source=rank, id=10 * rank + k) for k in range(3)]


def _step(runtime, model, rank, step, rebuilt=False, through=None, train=True, between=None):
    """Plan, dispatch and train one step (`rebuilt`: through a new runtime built after the plan; `through`: through
    that runtime; not `train`: under no_grad; `between()` run after the plan, uncounted); (its loss, the orchmllm
    collectives it ran)."""
    samples, generator = _samples(rank, step), torch.Generator().manual_seed(rank + 10 * step)
    counter, uncounted = CollectiveCounter(), 0
    try:
        routes = runtime.plan(samples)
        if between is not None:
            uncounted = -sum(counter.calls.values())
            between()
            uncounted += sum(counter.calls.values())
        runtime = MultiStageRuntime(STAGES) if rebuilt else through or runtime
        text = {"input_ids": torch.randint(0, 16, (sum(sample.text for sample in samples),), generator=generator)}
        image = torch.randn(sum(s.length for sample in samples for s in sample.segments), 4, generator=generator)
        total = 0.0
        for micro in runtime.microbatches(routes, runtime.dispatch(routes, text=text, inputs={"image": image})):
            if not train:
                with torch.no_grad():
                    total += float(model(runtime, micro))
                continue
            with accumulate(model, micro):
                loss = model(runtime, micro)
                normalize_loss(loss, micro).backward()
            total += float(loss.detach())
    finally:
        counter.close()
    return round(total, 4), sum(counter.calls.values()) - uncounted


def _job(rank, size):
    """Three DDP training steps with one runtime; three with another where rank 2 alone builds a new runtime at its
    step 1; three more where rank 2 runs step 1's routes through a runtime built after the plan (and drops it):
    per run, each step's (loss, collectives)."""
    torch.manual_seed(0)
    model, runs = nn.parallel.DistributedDataParallel(Model()), []
    for case in ("warm", "rebuilt", "after_plan"):
        runtime, steps = MultiStageRuntime(STAGES), []
        for step in range(3):
            rebuilt = case != "warm" and rank == REBUILT_RANK and step == REBUILT_STEP
            if rebuilt and case == "rebuilt":
                runtime = MultiStageRuntime(STAGES)
            steps.append(_step(runtime, model, rank, step, rebuilt and case == "after_plan"))
        runs.append(steps)
    return runs


def test_regression_a_runtime_rebuilt_on_one_rank_waited_in_the_model_check_until_the_timeout():
    """Cause: rank 2's new runtime owed the model check at step 1 and its warm peers did not: rank 2 raised
    PeerFailureError in the check's all-gather, ranks 0-1 in the next payload all-to-all, after the collective
    timeout.  Now every rank runs the check at the rebuild's step (ten collectives, as at the first step), the
    next step nine, with the losses of the run without the rebuild.  A runtime built after the plan (on rank 2
    alone) runs it through the runtime that made it (nine), and its own first plan starts every rank afresh (ten)."""
    for warm, rebuilt, after_plan in spawn(_job, 3, timeout_s=60, collective_timeout_s=5):
        assert [count for _, count in warm] == [10, 9, 9], warm
        assert [count for _, count in rebuilt] == [10, 10, 9], rebuilt
        assert [count for _, count in after_plan] == [10, 9, 9], after_plan
        assert [loss for loss, _ in rebuilt] == [loss for loss, _ in after_plan] == [loss for loss, _ in warm]


def _evaluation_job(rank, size, options, after=False):
    """A training and an evaluation runtime (of `options`), the evaluation one planning and running no-grad loops
    only (it never trains), before the training step or, `after`, between its plan and its loop; at step 1 rank 2
    trains the training runtime's routes through the evaluation one.  Per step: the training step's (loss,
    collectives)."""
    torch.manual_seed(0)
    model, steps = nn.parallel.DistributedDataParallel(Model()), []
    train, evaluation = MultiStageRuntime(STAGES), MultiStageRuntime(STAGES, **options)
    for step in range(3):
        evaluate = (lambda: _step(evaluation, model, rank, step + 5, train=False)) if after else None
        if not after:
            _step(evaluation, model, rank, step + 5, train=False)
        through = evaluation if rank == REBUILT_RANK and step == REBUILT_STEP else None
        steps.append(_step(train, model, rank, step, through=through, between=evaluate))
    return steps


@pytest.mark.parametrize("options, after", [({}, False), ({"check_encoders": False}, False),
                                            ({"check_encoders": False}, True)],
                         ids=["same_options", "no_encoder_check", "planned_since"])
def test_regression_an_evaluation_runtime_given_the_training_routes_on_one_rank_owed_the_model_check(options, after):
    """Cause (review R19-08): only a runtime that had made no routes ran another's through their maker; an
    evaluation runtime (routes made, never trained) owed the model check on rank 2 alone, and every rank waited
    until the timeout; one without `check_encoders` still did after that fix (probe27 P27-10b's twin: routes went
    through their maker only where it had the same options), and where the evaluation runtime planned since the
    training routes (probe30 P30-01).  Now they run through the runtime that made them (`steps.plan_runner`): the
    training steps' collectives and losses as without it."""
    runs = spawn(_evaluation_job, 3, args=(options, after), timeout_s=60, collective_timeout_s=5)
    alone = spawn(_job, 3, timeout_s=60, collective_timeout_s=5) if options else None
    for rank, steps in enumerate(runs):
        assert [count for _, count in steps] == [10, 9, 9], steps
        assert alone is None or steps == alone[rank][0], (steps, alone[rank][0])
