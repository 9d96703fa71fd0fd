"""The budgeted sampler's loop with `accumulate`: its micro-batches (`sampler.microbatches(loader)`) carry the model
check, so a DDP model that returns early on an empty micro-batch is refused on every rank, never a hang (probe15
P15-17), and a correct model trains exactly as one process over the global batches."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from orchmllm.runtime import normalize_loss
from orchmllm.runtime.launch import run_processes
from orchmllm.runtime.microbatch import accumulate
from orchmllm.runtime.sampler import BalancedDistributedSampler

V = 30
LENGTHS = np.random.default_rng(29).integers(1, 9, 40)  # step 3 of epoch 0: rank 1's last micro-batch is empty
OPTIONS = dict(num_replicas=2, global_batch_size=8, seed=29, max_tokens_per_microbatch=12)
_G = torch.Generator().manual_seed(0)
TOKENS = [torch.randint(0, V, (int(length),), generator=_G) for length in LENGTHS]
LABELS = [torch.randint(0, V, (int(length),), generator=_G) for length in LENGTHS]


class TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.hidden, self.head = nn.Embedding(V, 6), nn.Linear(6, 6), nn.Linear(6, V)

    def forward(self, tokens):
        return self.head(torch.tanh(self.hidden(self.embed(tokens))))


class EarlyModel(TokenModel):
    def forward(self, tokens):
        if tokens.numel() == 0:  # never reaches embed, hidden, head.weight
            return self.head.bias.expand(0, V)
        return super().forward(tokens)


def model_of(early: bool) -> nn.Module:
    torch.manual_seed(0)
    return (EarlyModel() if early else TokenModel()).double()


def collate(indices):
    empty = [torch.zeros(0, dtype=torch.int64)]  # an empty micro-batch: empty tensors
    return torch.cat([TOKENS[i] for i in indices] + empty), torch.cat([LABELS[i] for i in indices] + empty)


def train_job(rank, size, early, epochs):
    model = model_of(early)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = BalancedDistributedSampler(LENGTHS, rank=rank, **OPTIONS)
    loader = DataLoader(range(len(LENGTHS)), batch_sampler=sampler, collate_fn=collate)
    try:
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for micro in sampler.microbatches(loader):
                tokens, labels = micro.data
                with accumulate(ddp, micro):
                    loss_sum = F.cross_entropy(ddp(tokens), labels, reduction="sum")
                    normalize_loss(loss_sum, micro).backward()
                if micro.is_last:
                    optimizer.step()
                    optimizer.zero_grad()
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    return [parameter.detach().clone() for parameter in model.parameters()]


def reference(epochs):
    """One process, float64: every step's whole global batch, its summed loss over its tokens."""
    model = model_of(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = BalancedDistributedSampler(LENGTHS, rank=0, **OPTIONS)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in sampler.global_batches():
            tokens, labels = collate(batch.tolist())
            (F.cross_entropy(model(tokens), labels, reduction="sum") / labels.numel()).backward()
            optimizer.step()
            optimizer.zero_grad()
    return [parameter.detach() for parameter in model.parameters()]


def test_the_epoch_has_an_empty_last_micro_batch_on_a_rank():
    sampler = BalancedDistributedSampler(LENGTHS, rank=1, **OPTIONS)
    cells, ends = list(sampler), np.cumsum(sampler.microbatches_per_step())
    assert any(not cells[end - 1] for end in ends)


def test_regression_an_early_returning_ddp_model_on_an_empty_sampler_micro_batch_is_refused_on_every_rank():
    """Before: the sampler yielded bare index lists (no `microbatches`, no check): with the hand loop of its docs rank 0
    waited in DDP's all-reduce (probe15 P15-17: 'Connection closed by peer'); now every rank raises ModelContractError
    naming the parameters left out."""
    outcomes = run_processes(train_job, 2, args=(True, 1), timeout_s=90, collective_timeout_s=10)
    values = [outcome.value if outcome.ok else outcome.error for outcome in outcomes]
    for value in values:
        assert isinstance(value, str) and value.startswith("ModelContractError"), values
        assert "empty" in value and "return" in value, value
    assert any("embed.weight" in value for value in values), values


def test_a_correct_ddp_model_trains_exactly_as_one_process_over_the_global_batches():
    outcomes = run_processes(train_job, 2, args=(False, 2), timeout_s=90, collective_timeout_s=10)
    values = [outcome.value if outcome.ok else outcome.error for outcome in outcomes]
    assert all(isinstance(value, list) for value in values), values
    expected = reference(2)
    for value in values:
        assert max(float((got - want).abs().max()) for got, want in zip(value, expected)) < 1e-12


def test_microbatches_needs_a_budget_and_this_sampler_s_loader():
    plain = BalancedDistributedSampler(LENGTHS, num_replicas=2, rank=0, global_batch_size=8)
    with pytest.raises(ValueError, match="needs `max_tokens_per_microbatch`"):
        plain.microbatches([])
    sampler = BalancedDistributedSampler(LENGTHS, rank=0, **OPTIONS)
    other = DataLoader(range(len(LENGTHS)), batch_sampler=plain, collate_fn=collate)
    with pytest.raises(ValueError, match="another batch sampler"):
        sampler.microbatches(other)
    with pytest.raises(ValueError, match="ended before micro-batch 1 of step 0"):
        list(sampler.microbatches([collate([])]))
    with pytest.raises(ValueError, match="more than the epoch's"):
        list(sampler.microbatches([collate([])] * (len(sampler) + 1)))


def test_microbatches_carry_the_sampler_s_cells_and_step_tokens():
    sampler = BalancedDistributedSampler(LENGTHS, rank=1, **OPTIONS)
    loader = DataLoader(range(len(LENGTHS)), batch_sampler=sampler, collate_fn=collate)
    micros, cells = list(sampler.microbatches(loader)), list(sampler)
    assert [micro.items.tolist() for micro in micros] == cells
    counts = np.repeat(sampler.microbatches_per_step(), sampler.microbatches_per_step())
    assert [micro.num_microbatches for micro in micros] == counts.tolist()
    assert [int(micro.lengths.sum()) for micro in micros] == [int(LENGTHS[cell].sum()) for cell in cells]
    tokens = np.repeat(sampler.step_tokens(), sampler.microbatches_per_step())
    assert [micro.num_loss_tokens for micro in micros] == tokens.tolist()
    assert [micro.data[0].numel() for micro in micros] == [int(LENGTHS[cell].sum()) for cell in cells]


def skipping_job(rank, size):
    model = model_of(False)
    ddp = nn.parallel.DistributedDataParallel(model)
    sampler = BalancedDistributedSampler(LENGTHS, rank=rank, **OPTIONS)
    loader = DataLoader(range(len(LENGTHS)), batch_sampler=sampler, collate_fn=collate)
    try:
        for micro in sampler.microbatches(loader):
            if not micro.items.size:  # a guard skipping the empty micro-batch: its peers wait in the model check
                continue
            tokens, labels = micro.data
            with accumulate(ddp, micro):
                normalize_loss(F.cross_entropy(ddp(tokens), labels, reduction="sum"), micro).backward()
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    return "completed"


def test_a_rank_that_skips_its_empty_last_micro_batch_raises_at_once():
    outcomes = run_processes(skipping_job, 2, timeout_s=90, collective_timeout_s=10)
    values = [outcome.value if outcome.ok else outcome.error for outcome in outcomes]
    assert values[1].startswith("ModelContractError") and "skip" in values[1], values
    assert values[0] != "completed", values


PROMPTS = LENGTHS // 2  # the first half of each sample is prompt: no loss there


def masked_job(rank, size):
    """Step 0 under DDP with a loss over the non-prompt tokens, scaled as the class docstring says: the gradient of
    the head and the step's global batch."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(TokenModel().double())
    sampler = BalancedDistributedSampler(LENGTHS, rank=rank, **OPTIONS)
    loss_tokens = int(sum(LENGTHS[i] - PROMPTS[i] for i in sampler.global_batches()[0]))
    loader = DataLoader(range(len(LENGTHS)), batch_sampler=sampler, collate_fn=lambda indices: list(indices))
    for micro in sampler.microbatches(loader):
        with accumulate(model, micro):
            tokens = torch.cat([TOKENS[i] for i in micro.data] or [torch.zeros(0, dtype=torch.long)])
            labels = torch.cat([LABELS[i] for i in micro.data] or [torch.zeros(0, dtype=torch.long)])
            mask = torch.cat([torch.arange(int(LENGTHS[i])) >= PROMPTS[i] for i in micro.data]
                             or [torch.zeros(0, dtype=torch.bool)]).double()
            loss_sum = (F.cross_entropy(model(tokens), labels, reduction="none") * mask).sum()
            normalize_loss(loss_sum * sampler.step_tokens()[0] / loss_tokens, micro).backward()
        if micro.is_last:
            return model.module.head.weight.grad.clone(), sampler.global_batches()[0].tolist()


def test_a_masked_loss_scaled_by_the_steps_tokens_over_its_loss_tokens_trains_exactly():
    """probe17 P17-14: the sampler knows lengths, not loss tokens, and `normalize_loss(..., total_loss_tokens=)` is
    refused inside `accumulate`; the documented form (scale by the step's tokens over its loss tokens) is the
    gradient of the summed masked loss over the global batch's loss tokens."""
    outcomes = run_processes(masked_job, 2, timeout_s=60)
    assert all(outcome.ok for outcome in outcomes), [outcome.error for outcome in outcomes]
    torch.manual_seed(0)
    reference = TokenModel().double()
    batch = outcomes[0].value[1]
    loss = sum((F.cross_entropy(reference(TOKENS[i]), LABELS[i], reduction="none")
                * (torch.arange(int(LENGTHS[i])) >= PROMPTS[i]).double()).sum() for i in batch)
    (loss / int(sum(LENGTHS[i] - PROMPTS[i] for i in batch))).backward()
    for outcome in outcomes:
        torch.testing.assert_close(outcome.value[0], reference.head.weight.grad, rtol=0, atol=1e-12)
