"""A distributed sampler that post-balances every global batch with no communication.

When the length of every sample is known ahead (a dataset index), every rank can draw the
same random global batch from a shared seed, compute the same deterministic plan locally,
and load only its own share: post-balancing with zero exchange and no data movement.

    for each step of the epoch (a permutation seeded by (seed, epoch), cut into global batches):
        plan = balance(lengths[batch], num_replicas, cost=cost)   # bit-identical on every rank
        yield batch[plan.items_of(rank)]                          # this rank's share

Over an epoch every sample is yielded exactly once across the ranks, and the union of the
ranks' shares of a step is its random global batch.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Sampler

from ..balancers import BalancePlan, CostModel, balance
from ..balancers.problem import as_lengths
from ..balancers.validation import as_bool, as_int


class BalancedDistributedSampler(Sampler[list[int]]):
    """Yields, step by step, this rank's share of a balanced random global batch.

    A batch sampler: pass it as `DataLoader(dataset, batch_sampler=sampler)`.  Shares hold
    different numbers of samples with equal work; normalise the loss by the global token
    count (`orchmllm.runtime.normalize_loss`).  Like `DistributedSampler`, call
    `set_epoch(epoch)` before each epoch for a new shuffle.

    Args:
        lengths: length of every dataset sample (tokens), index i for sample i.
        num_replicas: data-parallel ranks D; rank: this rank, in [0, D).
        global_batch_size: samples per step over all ranks, at least D.
        seed: the shuffle seed, the same on every rank.
        drop_last: drop the epoch's last, incomplete global batch; else balance it too
            (then it must hold at least D samples).
        cost: the work of a sample of length l (default: l).
        algorithm: a registered balancer (default "auto", deterministic).

    >>> lengths = [9, 1, 1, 1, 5, 3, 3, 1]
    >>> ranks = [BalancedDistributedSampler(lengths, num_replicas=2, rank=rank, global_batch_size=4)
    ...          for rank in range(2)]
    >>> [[sum(lengths[i] for i in share) for share in step] for step in zip(*ranks)]  # tokens per rank
    [[5, 5], [9, 5]]
    >>> sorted(next(iter(ranks[0])) + next(iter(ranks[1]))) == sorted(ranks[0].global_batches()[0])
    True
    """

    def __init__(self, lengths, *, num_replicas: int, rank: int, global_batch_size: int, seed: int = 0,
                 drop_last: bool = True, cost: CostModel | None = None, algorithm: str = "auto"):
        self.lengths = as_lengths(lengths)
        self.num_replicas = as_int(num_replicas, "num_replicas", minimum=1)
        self.rank = as_int(rank, "rank", minimum=0)
        if self.rank >= self.num_replicas:
            raise ValueError(f"`rank` must be in [0, num_replicas={self.num_replicas}); got {self.rank}")
        self.global_batch_size = as_int(global_batch_size, "global_batch_size", minimum=self.num_replicas)
        if self.global_batch_size > self.lengths.size:
            raise ValueError(f"`global_batch_size` {self.global_batch_size} exceeds the {self.lengths.size} samples")
        self.seed = as_int(seed, "seed", minimum=0)
        self.drop_last = as_bool(drop_last, "drop_last")
        remainder = self.lengths.size % self.global_batch_size
        if not self.drop_last and 0 < remainder < self.num_replicas:
            raise ValueError(f"drop_last=False leaves a last global batch of {remainder} samples "
                             f"({self.lengths.size} % {self.global_batch_size}) for {self.num_replicas} replicas; "
                             f"pass drop_last=True or a global_batch_size that leaves at least one per replica")
        self.cost = cost
        self.algorithm = algorithm
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently in `epoch` (the same on every rank)."""
        self.epoch = as_int(epoch, "epoch", minimum=0)

    def __len__(self) -> int:
        """Steps per epoch."""
        full, remainder = divmod(self.lengths.size, self.global_batch_size)
        return full + (0 if self.drop_last or not remainder else 1)

    def global_batches(self) -> list[np.ndarray]:
        """Dataset indices of this epoch's global batches, as drawn (a permutation seeded by (seed, epoch))."""
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.lengths.size)
        size = self.global_batch_size
        return [order[step * size:(step + 1) * size] for step in range(len(self))]

    def plan(self, batch: np.ndarray) -> BalancePlan:
        """The plan of one global batch, the same on every rank."""
        return balance(self.lengths[batch], self.num_replicas, cost=self.cost, algorithm=self.algorithm)

    def __iter__(self):
        for batch in self.global_batches():
            yield batch[self.plan(batch).items_of(self.rank)].tolist()
