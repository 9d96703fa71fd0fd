"""Where BalancedDistributedSampler plugs into a Hugging Face `Trainer`.

The Trainer builds its training DataLoader in `get_train_dataloader()`; override it to
hand back a DataLoader over the balanced shares, and set the sampler's epoch from a
callback.  Do not pass this DataLoader through `accelerator.prepare`: that would split
every rank's (already balanced) share across the ranks again.

    python3.11 examples/hf_trainer_balanced_sampler.py   # runs without transformers, too

Without transformers installed this prints what the Trainer's DataLoader would yield on
rank 0 of 4 and says that the Trainer itself was skipped.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from orchmllm.runtime.sampler import BalancedDistributedSampler


def balanced_train_dataloader(dataset, lengths, *, world_size, rank, per_device_batch_size, seed, collate_fn):
    """The DataLoader a Trainer should train on: this rank's balanced share of each global batch."""
    sampler = BalancedDistributedSampler(lengths, num_replicas=world_size, rank=rank, seed=seed,
                                         global_batch_size=per_device_batch_size * world_size)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn)


def make_trainer_class():
    """A `Trainer` subclass with the balanced DataLoader (needs transformers)."""
    from transformers import Trainer, TrainerCallback

    class SetSamplerEpoch(TrainerCallback):
        def __init__(self, sampler):
            self.sampler = sampler

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.sampler.set_epoch(int(state.epoch or 0))

    class BalancedTrainer(Trainer):
        """`train_lengths`: the length of every training sample, in dataset order."""

        def __init__(self, *args, train_lengths, **kwargs):
            super().__init__(*args, **kwargs)
            self.train_lengths = np.asarray(train_lengths)

        def get_train_dataloader(self):
            loader = balanced_train_dataloader(
                self.train_dataset, self.train_lengths, world_size=self.args.world_size,
                rank=self.args.process_index, per_device_batch_size=self.args.per_device_train_batch_size,
                seed=self.args.seed, collate_fn=self.data_collator)
            self.add_callback(SetSamplerEpoch(loader.batch_sampler))
            return loader

    return BalancedTrainer


def main() -> None:
    lengths = np.minimum(np.rint(np.random.default_rng(0).lognormal(5.0, 1.0, 256)).astype(np.int64) + 8, 2048)
    dataset = [{"input_ids": torch.ones(int(length), dtype=torch.long)} for length in lengths]
    loader = balanced_train_dataloader(dataset, lengths, world_size=4, rank=0, per_device_batch_size=16, seed=42,
                                       collate_fn=lambda items: [item["input_ids"].numel() for item in items])
    shares = list(loader)
    print(f"rank 0 of 4: {len(shares)} steps, samples per step {[len(share) for share in shares[:4]]}..., "
          f"tokens per step {[sum(share) for share in shares[:4]]}...")
    try:
        trainer_class = make_trainer_class()
    except ImportError:
        print("transformers is not installed: the Trainer subclass was skipped")
        return
    print(f"{trainer_class.__name__} overrides get_train_dataloader")


if __name__ == "__main__":
    main()
