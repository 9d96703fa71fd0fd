"""An encoder whose output needs no grad on a call with items, on some ranks only, after its checked first call (fix60,
rev56 R5's rest): with `check_encoders=True` the embedding exchange records its backward only where an output needs
grad, so the ranks whose outputs did waited in their backward's reverse exchange until the collective timeout.  Every
rank now learns, in the exchange's own header, whether every rank records it, and all raise, naming the ranks and
the encoder."""

import torch

from orchmllm.balancers import CostModel
from orchmllm.orchestrator.samples import Sample, Segment
from orchmllm.orchestrator.stages import Stage
from orchmllm.runtime import EncoderContractError, MultiStageRuntime, normalize_loss
from orchmllm.runtime.launch import run_processes
from .test_runtime_encoder_contract import Model

STAGES = (Stage("vision", "image", CostModel(per_item=1, linear=1)), Stage("llm", "llm", CostModel(linear=1)))
RANKS = 2


def _samples(rank):
    return [Sample(text=4 + rank, segments=(Segment("image", 3, 3),), source=rank, id=rank)]


def _step(model, runtime, rank):
    routes = runtime.plan(_samples(rank))
    generator = torch.Generator().manual_seed(rank)
    text = {key: torch.randint(0, 16, (4 + rank,), generator=generator) for key in ("input_ids", "labels")}
    inputs = {"image": torch.randn(3, 4, generator=generator, dtype=torch.float64)}
    [micro] = runtime.microbatches(routes, runtime.dispatch(routes, text=text, inputs=inputs))
    normalize_loss(model(runtime, micro.routes, micro.data), int(text["labels"].numel())).backward()


def _job(rank, size):
    torch.manual_seed(0)
    model = Model(early_return=False).double()
    runtime = MultiStageRuntime(STAGES)
    _step(model, runtime, rank)  # the checked first call: every rank's output reaches every parameter
    said, forward = [], model.vision.forward
    for detached in (True, False):  # rank 1's output detached; then rank 1 alone runs the pass without grad
        if rank == 1:
            detach = lambda patches, lengths: forward(patches, lengths).detach()  # noqa: E731
            model.vision.forward = detach if detached else forward
        try:
            with torch.set_grad_enabled(rank == 0 or detached):
                _step(model, runtime, rank)
        except EncoderContractError as error:
            said.append(str(error))
    _step(model, runtime, rank)  # then trains again
    model.vision.requires_grad_(False)
    _step(model, runtime, rank)  # and a frozen encoder's outputs need grad on no rank: none records
    return said


def test_regression_a_detached_output_on_some_ranks_is_named_on_every_rank_not_a_hang():
    outcomes = run_processes(_job, RANKS, timeout_s=60, collective_timeout_s=8)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for outcome in outcomes:
        assert len(outcome.value) == 2, outcome.value
        for text, why in zip(outcome.value, ("rank 1: encoder 'image''s output needs no grad",
                                             "rank 1: grad mode is off")):
            assert f"ranks [0] record the embedding exchange's backward and ranks [1] do not ({why}" in text, text
