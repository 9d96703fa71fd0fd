"""check_encoders=False (which the contract error recommends beside DDP's find_unused_parameters): an encoder that
returns early on its rank's empty input gives an output that needs no grad there; the embedding exchange must still
record its backward on that rank, or the rank that encoded the image waits in its backward until the collective
timeout (rev56 R5: every rank timed out)."""

import numpy as np
import torch
import torch.distributed as dist

from orchmllm.runtime import MultiStageRuntime, normalize_loss
from orchmllm.runtime.launch import run_processes
from .test_runtime_encoder_contract import STAGES, Model, samples_of, tensors_of, train_step

RANKS = 2


def _unchecked_job(rank, size):
    torch.manual_seed(0)
    model = Model(early_return=True).double()  # plain model: gradients summed below, as DDP would
    runtime = MultiStageRuntime(STAGES, check_encoders=False)
    train_step(model, runtime, rank)
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    for grad in grads:
        dist.all_reduce(grad)
    return [(grad / size).numpy().copy() for grad in grads]  # normalize_loss's "mean" scaling undone


def _reference():
    """One step of both ranks' batch in this process (the one-rank path)."""
    torch.manual_seed(0)
    model = Model(early_return=False).double()
    runtime = MultiStageRuntime(STAGES)
    tensors = [tensors_of(rank) for rank in range(RANKS)]
    text = {key: torch.cat([t[key] for t, _ in tensors]) for key in ("input_ids", "labels")}
    inputs = {"image": torch.cat([i["image"] for _, i in tensors])}
    routes = runtime.plan([sample for rank in range(RANKS) for sample in samples_of(rank)])
    [micro] = runtime.microbatches(routes, runtime.dispatch(routes, text=text, inputs=inputs))
    normalize_loss(model(runtime, micro.routes, micro.data), int(text["labels"].numel())).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


def test_regression_unchecked_early_return_encoder_trains_without_a_hang():
    outcomes = run_processes(_unchecked_job, RANKS, timeout_s=60, collective_timeout_s=8)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for got, expected in zip(outcomes[0].value, _reference()):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
