"""Wrap a PyTorch training loop with the post-balancing dispatcher.

Every rank samples its own variable-length sequences, as a plain data-parallel loader
does.  Three lines make the step balanced:

    plan = dispatcher.plan(local_lengths)                 # all-gather lengths, same plan everywhere
    batch = dispatcher.dispatch(batch, plan)              # one all-to-all of every tensor
    loss = normalize_loss(loss_sum, num_loss_tokens)      # divide by the *global* token count

The model, optimizer and gradient all-reduce are untouched.  The first step is also run
without balancing (algorithm "identity": every sequence stays home) to show that the
all-reduced gradients agree up to rounding: sums commute, only their order changes.

    python3.11 examples/train_with_dispatcher.py            # 4 CPU processes, gloo
    torchrun --nproc-per-node 8 examples/train_with_dispatcher.py   # NCCL on GPUs (gloo on CPUs)
"""

from __future__ import annotations

import numpy as np
import torch
import torch._dynamo  # noqa: F401  the first optimizer step imports it; do it once, before forking ranks
import torch.nn.functional as F
from torch import nn

from orchmllm import CostModel
from orchmllm.runtime.comm import comm_device, is_distributed
from orchmllm.runtime.dispatcher import PostBalancingDispatcher
from orchmllm.runtime.launch import run_script
from orchmllm.runtime.reduction import all_reduce_gradients, normalize_loss

VOCAB, HIDDEN, SEQUENCES_PER_RANK, STEPS = 97, 32, 16, 3


class TinyCausalLM(nn.Module):
    """Embedding, one causal self-attention layer per sequence, an MLP and the LM head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        x = self.embed(tokens)
        mixed = []
        for part in torch.split(x, lengths):  # packed sequences: attention within each one
            q, k, v = self.qkv(part).unsqueeze(0).chunk(3, dim=-1)
            mixed.append(F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(0))
        x = x + torch.cat(mixed) if mixed else x
        return self.head(x + self.mlp(x))


def local_batch(rank: int, step: int, device) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
    """This rank's random sequences: long-tailed lengths, next-token labels, packed along dim 0."""
    rng = np.random.default_rng([step, rank])
    lengths = np.minimum(np.rint(rng.lognormal(4.0, 1.0, SEQUENCES_PER_RANK)).astype(np.int64) + 2, 1024)
    tokens = torch.as_tensor(rng.integers(0, VOCAB, int(lengths.sum())), device=device)
    labels = torch.roll(tokens, -1)
    return lengths, {"tokens": tokens, "labels": labels}


def gradients_of(model, dispatcher, rank, step, device) -> tuple[list[torch.Tensor], dict]:
    """One forward/backward of this step through `dispatcher`; all-reduced gradients and figures."""
    model.zero_grad(set_to_none=True)
    lengths, batch = local_batch(rank, step, device)
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch(batch, plan)
    logits = model(moved["tokens"], plan.local_lengths.tolist())
    loss_sum = F.cross_entropy(logits, moved["labels"], reduction="sum")
    loss = normalize_loss(loss_sum, moved["labels"].numel(), gradient_reduction="sum")
    loss.backward()
    all_reduce_gradients(model.parameters(), op="sum")
    total = loss.detach().clone()
    if is_distributed():
        torch.distributed.all_reduce(total)  # the mean token loss of the global batch
    work = dispatcher.options.cost.item_costs(plan.lengths)
    home_work = np.bincount(plan.metadata.source_ranks, weights=work, minlength=plan.metadata.counts.size)
    figures = {"loss": float(total), "work_before": home_work.tolist(), "work_after": plan.balance.loads.tolist(),
               "status": str(plan.balance.status), "planning_seconds": plan.planning_seconds}
    return [p.grad.detach().clone() for p in model.parameters()], figures


def train(rank: int, world_size: int) -> dict:
    """The training loop of one rank; returns what rank 0 prints."""
    torch.manual_seed(0)  # same initial parameters on every rank
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    device = comm_device()
    model = TinyCausalLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cost = CostModel(linear=1.0, quadratic=1.0 / HIDDEN)  # MLP per token + causal attention per pair
    balanced = PostBalancingDispatcher(algorithm="lpt", cost=cost, check_plan=True)
    unbalanced = PostBalancingDispatcher(algorithm="identity", cost=cost)
    reference, _ = gradients_of(model, unbalanced, rank, 0, device)
    report = {"steps": []}
    for step in range(STEPS):
        grads, figures = gradients_of(model, balanced, rank, step, device)
        if step == 0:
            report["grad_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(grads, reference))
            report["grad_max_abs"] = max(float(g.abs().max()) for g in reference)
        optimizer.step()
        report["steps"].append(figures)
    return report


def show(report: dict, world_size: int) -> None:
    for step, figures in enumerate(report["steps"]):
        before, after = np.asarray(figures["work_before"]), np.asarray(figures["work_after"])
        print(f"step {step}: loss {figures['loss']:.4f}  work per rank as sampled "
              f"{before.round().astype(int).tolist()} "
              f"-> balanced {after.round().astype(int).tolist()}  (max/mean {before.max() / before.mean():.2f} -> "
              f"{after.max() / after.mean():.2f} {figures['status']}, "
              f"planned in {1e3 * figures['planning_seconds']:.1f} ms)")
    print(f"step 0 gradients, balanced vs unbalanced: max |diff| {report['grad_max_abs_diff']:.3g} "
          f"(largest gradient {report['grad_max_abs']:.3g}) on {world_size} ranks")


if __name__ == "__main__":
    run_script(train, 4, show)  # under torchrun this process is one rank; alone, 4 local gloo ranks
