"""Embed the solver in your own sampler: post-balance every global batch before it is split.

Each step, the sampler draws a global batch at random (exactly what D data-parallel ranks
would sample independently), then asks `orchmllm.balance` which rank should hold which
sample so that every rank carries the same work, and yields one index list per rank.
Only lengths are needed: this is pure numpy, no torch.  In a real job every rank runs
the same sampler with the same seed, so every rank computes the same plan locally.

    python3.11 examples/custom_sampler.py
"""

from __future__ import annotations

import numpy as np

from orchmllm import CostModel, balance


class PostBalancedSampler:
    """Yields, per step, `num_ranks` lists of dataset indices with balanced work.

    Args:
        lengths: tokens of every sample of the dataset.
        num_ranks: data-parallel size D.
        samples_per_rank: mini-batch size per rank (the global batch is D times that).
        cost: work of one sample of length l (default: a 7B transformer's FLOPs, which
            grow quadratically with l through attention).
        seed: sampling seed, identical on every rank.
    """

    def __init__(self, lengths, num_ranks: int, samples_per_rank: int, cost: CostModel | None = None,
                 seed: int = 0):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.num_ranks, self.samples_per_rank = num_ranks, samples_per_rank
        self.cost = cost or CostModel.from_transformer(num_layers=32, hidden_size=4096)
        self.rng = np.random.default_rng(seed)

    def step(self):
        """One global batch: (drawn indices, rank by rank as sampled; per-rank indices after balancing; plan)."""
        batch = self.rng.choice(self.lengths.size, self.num_ranks * self.samples_per_rank, replace=False)
        plan = balance(self.lengths[batch], self.num_ranks, cost=self.cost, algorithm="lpt")
        return batch, [batch[plan.items_of(rank)] for rank in range(self.num_ranks)], plan

    def __iter__(self):
        while True:
            yield self.step()[1]


def main() -> None:
    rng = np.random.default_rng(0)
    # A long-tailed dataset: mostly short chat turns, some long documents.
    dataset = np.rint(rng.lognormal(6.3, 1.0, 100_000)).astype(np.int64) + 16
    sampler = PostBalancedSampler(dataset, num_ranks=16, samples_per_rank=8, seed=1)
    for step in range(3):
        drawn, per_rank, plan = sampler.step()
        assert sorted(np.concatenate(per_rank).tolist()) == sorted(drawn.tolist())  # every sample once
        as_sampled = plan.cost.item_costs(dataset[drawn]).reshape(16, 8).sum(axis=1)
        print(f"step {step}: slowest rank / mean work  as sampled {as_sampled.max() / as_sampled.mean():.3f}"
              f"  post-balanced {plan.imbalance:.3f}  (makespan / lower bound {plan.makespan / plan.lower_bound:.3f}, "
              f"{plan.status})")
        if plan.status == "optimal" and plan.imbalance > 1.01:
            longest = int(dataset[drawn].max())
            print(f"  optimal above 1: one sample of {longest} tokens alone outweighs a rank's fair share")
    print("rank 0 of the last step holds samples", per_rank[0].tolist())


if __name__ == "__main__":
    main()
