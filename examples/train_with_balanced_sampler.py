"""Balanced batches with no communication: BalancedDistributedSampler + DataLoader + DDP.

The dataset's sample lengths are known ahead, so every rank draws the same random global
batch from the shared seed, computes the same plan locally and loads only its own share;
nothing is exchanged but DDP's gradient all-reduce.  Shares differ in size and match in
work, so the loss is normalised by the global token count.

    python3.11 examples/train_with_balanced_sampler.py          # 4 CPU processes, gloo
    torchrun --nproc-per-node 8 examples/train_with_balanced_sampler.py
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from orchmllm.runtime.launch import run_script
from orchmllm.runtime.reduction import normalize_loss
from orchmllm.runtime.sampler import BalancedDistributedSampler

VOCAB, HIDDEN, SAMPLES_PER_RANK, EPOCHS = 97, 16, 16, 2


class Sequences(Dataset):
    """Token sequences of long-tailed lengths; `lengths` is the index the sampler plans with."""

    def __init__(self, size: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.lengths = np.minimum(np.rint(rng.lognormal(4.0, 0.9, size)).astype(np.int64) + 4, 512)
        self.seed = seed

    def __len__(self):
        return self.lengths.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + index)
        return index, torch.randint(0, VOCAB, (int(self.lengths[index]),), generator=generator)


def collate(items):
    """Pack a share into one flat sequence (varlen) with per-sample offsets."""
    indices, sequences = zip(*items)
    return torch.tensor(indices), torch.cat(sequences), torch.tensor([len(s) for s in sequences])


def train(rank: int, world_size: int) -> dict:
    torch.manual_seed(0)
    dataset = Sequences(size=world_size * SAMPLES_PER_RANK * 8)
    sampler = BalancedDistributedSampler(dataset.lengths, num_replicas=world_size, rank=rank,
                                         global_batch_size=world_size * SAMPLES_PER_RANK, seed=1)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    model = DistributedDataParallel(nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    seen, ratios, losses = [], [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for indices, tokens, _ in loader:
            seen.extend(indices.tolist())
            work = torch.tensor([float(tokens.numel())])
            all_work = [torch.zeros(1) for _ in range(world_size)]
            dist.all_gather(all_work, work)  # only to report the balance; the sampler needs no collective
            all_work = torch.cat(all_work)
            ratios.append(float(all_work.max() / all_work.mean()))
            logits = model(tokens[:-1])
            loss_sum = nn.functional.cross_entropy(logits, tokens[1:], reduction="sum")
            loss = normalize_loss(loss_sum, torch.tensor(tokens.numel() - 1))  # global token count
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces (averages) the gradients
            optimizer.step()
            mean_loss = loss.detach().clone()  # loss_sum · world size / global tokens, per rank
            dist.all_reduce(mean_loss)
            losses.append(float(mean_loss) / world_size)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, seen)
    random_split = dataset.lengths[np.random.default_rng(5).permutation(dataset.lengths.size)]
    random_split = random_split[: sampler.global_batch_size * len(sampler)].reshape(-1, world_size, SAMPLES_PER_RANK)
    random_work = random_split.sum(axis=2)
    return {"seen": sorted(index for indices in everyone for index in indices), "ratios": ratios, "losses": losses,
            "random_ratio": float(np.mean(random_work.max(axis=1) / random_work.mean(axis=1)))}


def show(first: dict, world_size: int) -> None:
    every = first["seen"]
    steps = len(first["ratios"])
    print(f"{world_size} ranks, {EPOCHS} epochs, {steps // EPOCHS} steps per epoch")
    print(f"per-rank tokens max/mean: random split {first['random_ratio']:.3f} -> balanced shares "
          f"{np.mean(first['ratios']):.4f} (worst step {max(first['ratios']):.4f})")
    print(f"every sample exactly once per epoch: {every == sorted(list(range(len(every) // EPOCHS)) * EPOCHS)}")
    print(f"loss {first['losses'][0]:.3f} -> {first['losses'][-1]:.3f}")


def main() -> None:
    run_script(train, 4, show, timeout_s=300.0)  # under torchrun this process is one rank; alone, 4 local gloo ranks


if __name__ == "__main__":
    main()
