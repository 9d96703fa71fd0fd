"""Context-parallel attention on real gloo groups: a split item's loss and every gradient equal the
unsplit single-process reference (float64 within 1e-12; float32 within float32 rounding), with
unsplit sequences and several groups in one call, padding, GQA, inside DDP and FSDP2, and clear
errors (never a hang) when a rank's layout is wrong or a peer dies."""

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from orchmllm.balancers.context_parallel.layout import shard_positions
from orchmllm.runtime.context_parallel import ContextParallelLayout, SplitItem, context_parallel_attention
from orchmllm.runtime.launch import spawn

HIDDEN, HEADS, KV_HEADS, DIM = 4, 2, 1, 3


def item_data(seed, lengths, padded):
    """Per item: inputs (l, HIDDEN), loss weights (l, HEADS, DIM), padding mask (l,); the same on every rank."""
    rng = np.random.default_rng(seed)
    return [(torch.from_numpy(rng.standard_normal((length, HIDDEN))),
             torch.from_numpy(rng.standard_normal((length, HEADS, DIM))),
             torch.from_numpy(rng.random(length) < 0.3) if padded else torch.zeros(length, dtype=torch.bool))
            for length in lengths]


def projections(seed, dtype):
    rng = np.random.default_rng(seed + 1)
    return [torch.tensor(rng.standard_normal((HIDDEN, heads * DIM)), dtype=dtype, requires_grad=True)
            for heads in (HEADS, KV_HEADS, KV_HEADS)]


def naive_attention(q, k, v, padding, causal):
    """Whole-item attention written out (the reference): a query with no key left gets zeros."""
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[2])
    allowed = ~padding[None, :].expand(len(q), -1)
    if causal:
        allowed = allowed & torch.ones(len(q), len(q), dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, 0.0)
    peak = scores.masked_fill(~allowed, -torch.inf).amax(-1, keepdim=True)
    weights = torch.exp(scores - torch.where(torch.isfinite(peak), peak, 0.0)) * allowed
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
    return torch.einsum("hqk,khd->qhd", weights, v)


def project(x, weights):
    q, k, v = (x @ w for w in weights)
    return q.reshape(len(x), HEADS, DIM), k.reshape(len(x), KV_HEADS, DIM), v.reshape(len(x), KV_HEADS, DIM)


def reference(items, data, seed, causal, dtype):
    """Loss and gradients (projections, every item's inputs) of the unsplit items in one process."""
    weights = projections(seed, dtype)
    inputs = [x.to(dtype).requires_grad_() for x, _, _ in data]
    loss = sum((naive_attention(*project(x, weights), padding, causal) * w.to(dtype)).sum()
               for x, (_, w, padding) in zip(inputs, data))
    grads = torch.autograd.grad(loss, weights + inputs)
    return loss.detach(), grads[:3], grads[3:]


def relative_error(got, expected):
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    return float((got - expected).abs().max()) / scale if expected.numel() and scale else 0.0


def rank_layout(items, rank):
    """This rank's sequences for `items` [(length, group)]: a group of one rank is an unsplit sequence."""
    splits = [SplitItem(index, length, group) for index, (length, group) in enumerate(items) if len(group) > 1]
    sequences, held = [], []
    for index, (length, group) in enumerate(items):
        if rank in group:
            split = next((s for s in splits if s.item == index), None)
            sequences.append(length if split is None else split)
            held.append((index, np.arange(length) if split is None else
                         shard_positions(length, len(group), group.index(rank))))
    return ContextParallelLayout.build(sequences, splits), held


def check_plan(rank, items, seed, causal, padded, dtype=torch.float64):
    """Run one plan on this rank; every rank returns (errors vs the reference, the tokens it held)."""
    data = item_data(seed, [length for length, _ in items], padded)
    layout, held = rank_layout(items, rank)
    weights = projections(seed, dtype)
    pick = lambda part: torch.cat([data[i][part][pos] for i, pos in held]) if held else data[0][part][:0]  # noqa: E731
    x = pick(0).to(dtype).requires_grad_()
    out = context_parallel_attention(*project(x, weights), layout, causal=causal,
                                     key_padding_mask=pick(2) if padded else None)
    loss = (out * pick(1).to(dtype)).sum()
    loss.backward()
    for tensor in [loss.detach()] + [w.grad for w in weights]:
        dist.all_reduce(tensor)
    ref_loss, ref_weights, ref_inputs = reference(items, data, seed, causal, torch.float64)
    ref_x = torch.cat([ref_inputs[i][pos] for i, pos in held]) if held else x.grad
    errors = [relative_error(loss.detach().double(), ref_loss)]
    errors += [relative_error(w.grad.double(), r) for w, r in zip(weights, ref_weights)]
    errors.append(relative_error(x.grad.double(), ref_x))
    return max(errors), [(i, pos.tolist()) for i, pos in held]


def assert_every_token_once(results, items):
    held = {}
    for _, tokens in results:
        for item, positions in tokens:
            held.setdefault(item, []).extend(positions)
    assert sorted(held) == list(range(len(items)))
    assert all(sorted(held[i]) == list(range(length)) for i, (length, _) in enumerate(items))


def whole_group_job(rank, size, padded_cases):
    return [check_plan(rank, [(13, tuple(range(size)))], seed, causal, padded)
            for seed, (causal, padded) in enumerate(padded_cases)]


CASES = [(True, False), (True, True), (False, True)]


@pytest.mark.parametrize("degree", [2, 4, 8])
def test_one_item_split_over_the_world_matches_the_unsplit_reference(degree):
    per_rank = spawn(whole_group_job, degree, args=(CASES,), timeout_s=120)
    for case in range(len(CASES)):
        results = [rank_results[case] for rank_results in per_rank]
        assert_every_token_once(results, [(13, tuple(range(degree)))])
        assert max(error for error, _ in results) <= 1e-12
