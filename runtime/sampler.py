"""A distributed sampler that post-balances every global batch with no communication.

When the length of every sample is known ahead (a dataset index), every rank can draw the
same random global batch from a shared seed, compute the same deterministic plan locally,
and load only its own share: post-balancing with zero exchange and no data movement.

    for each step of the epoch (a permutation seeded by (seed, epoch), cut into global batches):
        plan = balance(lengths[batch], num_replicas, cost=cost)   # bit-identical on every rank
        yield batch[plan.items_of(rank)]                          # this rank's share

Over an epoch every sample is yielded exactly once across the ranks, and the union of the
ranks' shares of a step is its random global batch.

With a token budget T per micro-batch (gradient accumulation), the step is planned as
cells instead, `balance_microbatches(lengths[batch], num_replicas, max_tokens_per_microbatch=T)`,
and the sampler yields the rank's M micro-batches of every step one after another, each a
list of indices within T; M is the same on every rank (FSDP synchronises every micro-batch).

Every rank must draw from the same dataset with the same settings: a rank whose lengths,
seed, epoch or cost model differ plans other batches, and the shares then duplicate, drop
or invent samples without any error.  So, when a process group is initialised, every
`iter(sampler)` (once per epoch) all-gathers a fingerprint of each setting and every rank
raises `ConfigMismatchError` naming the settings and the ranks that differ: one small
collective per epoch, none per step.  A digest of every step's plan rides with the settings (the
epoch is planned ahead at `iter`, each plan once), so ranks whose algorithm plans apart on any step
(another version, a plugin that is not deterministic across processes) are named too.

With a budget, the model must compute its output through every trainable parameter on an empty micro-batch too
(DDP and FSDP2 reduce every parameter's gradient in the step's last backward on every rank): `microbatches(loader)`
wraps the loaded micro-batches as `MicroBatch`es, so that `accumulate(model, micro)` holds the gradient sync and
checks that contract as the dispatcher's loop does (`runtime.microbatch`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from ..balancers import BalancePlan, CostModel, MicroBatchPlan, balance, balance_microbatches
from ..balancers.problem import as_lengths, integer_sum
from ..balancers.registry import get_algorithm, get_microbatch_algorithm
from ..balancers.validation import as_bool, as_int, tensor_values
from .agreement import ConfigMismatchError, call_header, disagreement, fingerprint, options_that_differ, words_of
from .comm import checked_group, collective, group_rank, group_size, is_distributed
from .microbatch import MicroBatch, Sampling, iterate, new_step
from .steps import StepToken, contract_of

_END = object()  # what `next` returns from a loader that yielded every micro-batch
AGREEMENT = ("BalancedDistributedSampler's epoch agreement all-gather (every process of `group` iterates the "
             "sampler, or passes check_agreement=False)")  # what a dead or stalled peer's error names
PLANS, FAILED = "plans of the epoch", "planning failed: "  # the plans' digest, or why they are missing
FAILED_ON = "BalancedDistributedSampler's planning of the epoch failed"  # on some ranks, the others planned it
SAME_OPTIONS = ("every rank must pass the same dataset and options (and call set_epoch alike), else the shares "
                "duplicate or drop samples")
FAILURE_CHARS = 300  # of a failure's message, carried in the gather to every rank


def _sampler_algorithm(name, max_tokens_per_microbatch):
    """`name` checked when the sampler is built: a micro-batch algorithm with a budget, else a balancer of
    unpadded samples (the sampler plans sums of lengths; it has no padded mode)."""
    if max_tokens_per_microbatch is not None:
        return get_microbatch_algorithm(name).name
    record = get_algorithm(name)
    if not record.solves(padded=False):
        raise ValueError(f"`algorithm` {name!r} balances padded batches only; the sampler balances sums of "
                         f"lengths: choose an unpadded one, e.g. 'auto' or 'lpt'")
    if record.exact:
        raise ValueError(f"`algorithm` {name!r} is an exact solver, which stops at a wall-clock time limit: ranks "
                         f"that plan alone (the sampler exchanges nothing per step) could stop at different plans "
                         f"and duplicate or drop samples; choose a deterministic one, e.g. 'auto' or 'lpt'")
    return record.name


class BalancedDistributedSampler(Sampler[list[int]]):
    """Yields, step by step, this rank's share of a balanced random global batch.

    A batch sampler: pass it as `DataLoader(dataset, batch_sampler=sampler)`.  Shares hold
    different numbers of samples with equal work; normalise the loss by the global token
    count (`orchmllm.runtime.normalize_loss`: this rank's count, summed over the ranks, or the
    step's, `normalize_loss(loss_sum, total_loss_tokens=sampler.step_tokens()[step])`, which
    every rank knows).  Like `DistributedSampler`, call `set_epoch(epoch)` before each epoch.

    With `max_tokens_per_microbatch` T, every yielded list is one micro-batch: the step's M
    micro-batches follow each other (every rank yields the same M, some lists possibly
    empty, so the `collate_fn` must accept an empty list), and `microbatches_per_step()`
    tells the gradient-accumulation loop where each step ends.  On an empty micro-batch
    the model must still compute its output through every trainable parameter (run the
    layers on the empty tensors, never return early or a constant) and the loss from that
    output: the last micro-batch's backward reduces every parameter's gradient (DDP,
    FSDP2) on every rank, and a rank whose loss leaves some out hangs its peers or trains
    wrong.  `microbatches(loader)` wraps what the loader yields as `MicroBatch`es, whose
    `accumulate(model, micro)` checks it (`ModelContractError` on every rank); a loop of one's own
    (`no_sync()` by hand) gets no check: the sampler sees index lists, not the model.  The epoch
    is then planned ahead on first use (`len` counts micro-batches).
    Every micro-batch's loss is divided by its step's tokens (`step_tokens()`); a count of one
    micro-batch weights tokens by the micro-batch they sit in, and `normalize_loss` refuses it
    (for a loss that requires grad) while the sampler yields steps of several micro-batches.
    The sampler knows lengths, not loss tokens: for a loss over some tokens only (prompts masked),
    scale it inside `accumulate` by the step's tokens over its loss tokens (the sum over
    `global_batches()[step]` of your dataset's loss-token counts), `normalize_loss(loss_sum * tokens /
    loss_tokens, micro)`: `normalize_loss(loss_sum, total_loss_tokens=...)` is refused there, since
    the model check sees only `normalize_loss(loss, micro)` (the dispatcher takes loss tokens itself,
    `plan(lengths, loss_tokens=)`).

    Args:
        lengths: length of every dataset sample (tokens), index i for sample i.
        num_replicas: data-parallel ranks D; rank: this rank, in [0, D).
        global_batch_size: samples per step over all ranks, at least D.
        seed: the shuffle seed, the same on every rank.
        drop_last: drop the epoch's last, incomplete global batch; else balance it too
            (then it must hold at least D samples).
        max_tokens_per_microbatch: token budget T of one micro-batch on one rank (every
            sample must fit); None yields the whole share of a step at once.
        cost: the work of a sample of length l (default: l).
        algorithm: a registered balancer, or with T a micro-batch algorithm (default
            "auto", deterministic); not an exact balancer, whose time limit could stop ranks
            planning alone at different plans.
        check_agreement: when a process group is initialised, every `iter(sampler)` checks
            that the ranks of `group` share the dataset's lengths, the seed, the epoch and
            every option, and that they hold the ranks [0, num_replicas) equally often, else
            raises `ConfigMismatchError` on every rank naming what differs and where.  It is
            a collective: every process of `group` must iterate the sampler as often as the
            others (once per epoch, as a training loop does).  A digest of every step's plan of
            the epoch rides with the settings, so a solver that differs under one `algorithm`
            name on any step (another orchmllm version on some nodes, a plugin whose plans
            depend on the process) is named too, and a rank whose planning fails names itself
            and the error on every rank.  The check therefore plans the epoch at `iter`, once,
            and keeps its shares: the first batch waits for the whole epoch's planning (~25 ms
            a step at 1024 samples on 64 ranks: ~5 s for 200 steps); unchecked (False, or no
            process group), steps are planned one by one as they are taken.  False skips it (a
            rank that iterates alone, e.g. to log shares); every rank must pass the same value:
            a rank that skips it while the others check leaves them waiting in its all-gather
            until the group's timeout (gloo: 30 min by default, NCCL: 10), no error before.
        group: the processes that iterate this sampler (default: the world); with tensor
            or pipeline parallelism, those that load data, each of its DP rank.  Iterated on a
            loader thread beside the training thread's collectives: a group of its own
            (`dist.new_group()`, made at the same point on every rank).

    >>> lengths = [9, 1, 1, 1, 5, 3, 3, 1]
    >>> ranks = [BalancedDistributedSampler(lengths, num_replicas=2, rank=rank, global_batch_size=4)
    ...          for rank in range(2)]
    >>> [[sum(lengths[i] for i in share) for share in step] for step in zip(*ranks)]  # tokens per rank
    [[5, 5], [9, 5]]
    >>> sorted(next(iter(ranks[0])) + next(iter(ranks[1]))) == sorted(ranks[0].global_batches()[0])
    True
    >>> micro = [BalancedDistributedSampler(lengths, num_replicas=2, rank=rank, global_batch_size=8,
    ...                                     max_tokens_per_microbatch=9) for rank in range(2)]
    >>> [(sampler.microbatches_per_step(), [[lengths[i] for i in m] for m in sampler]) for sampler in micro]
    [([2], [[9], [3]]), ([2], [[5, 3, 1], [1, 1, 1]])]
    """

    def __init__(self, lengths, *, num_replicas: int, rank: int, global_batch_size: int, seed: int = 0,
                 drop_last: bool = True, max_tokens_per_microbatch: int | None = None,
                 cost: CostModel | None = None, algorithm: str = "auto", check_agreement: bool = True,
                 group=None):
        self.lengths, self.num_replicas, self.rank = lengths, num_replicas, rank
        self.global_batch_size = global_batch_size
        self.seed, self.drop_last, self.max_tokens_per_microbatch = seed, drop_last, max_tokens_per_microbatch
        self.cost, self.algorithm, self.epoch = cost, algorithm, 0
        self.check_agreement = as_bool(check_agreement, "check_agreement")
        self.group = group
        self._kept: dict[str, tuple] = {}  # name -> (lengths, other settings, what `_kept_for` built from them)
        self._mark: Sampling | None = None  # while it lives, per-micro-batch counts are refused (`Sampling`)
        self._trained = [False]  # whether a loop of `microbatches` trained (`StepToken.trained`, `contract_of`)
        self._check_settings()

    def _check_settings(self) -> None:
        """Check and canonicalise every setting, naming it: they are public attributes, which may be set after
        first use (a new seed, a lower budget), and each must pass what the constructor checks."""
        checked = getattr(self, "_checked_lengths", None)  # None: lengths never checked (lengths=None too)
        if checked is None or self.lengths is not checked or self.lengths.flags.writeable:
            lengths = tensor_values(self.lengths, "lengths") if isinstance(self.lengths, torch.Tensor) else self.lengths
            # a private copy over immutable bytes: kept plans know it by identity (a copy or an unpickled sampler
            # gets a writable array back, taken as new lengths)
            self.lengths = np.frombuffer(as_lengths(lengths).tobytes(), dtype=np.int64)
            self._checked_lengths = self.lengths
        self.num_replicas = as_int(self.num_replicas, "num_replicas", minimum=1)
        self.rank = as_int(self.rank, "rank", minimum=0)
        if self.rank >= self.num_replicas:
            raise ValueError(f"`rank` must be in [0, num_replicas={self.num_replicas}); got {self.rank}")
        self.global_batch_size = as_int(self.global_batch_size, "global_batch_size", minimum=self.num_replicas)
        if self.global_batch_size > self.lengths.size:
            raise ValueError(f"`global_batch_size` {self.global_batch_size} exceeds the {self.lengths.size} samples")
        self.seed, self.epoch = as_int(self.seed, "seed", minimum=0), as_int(self.epoch, "epoch", minimum=0)
        self.drop_last = as_bool(self.drop_last, "drop_last")
        remainder = self.lengths.size % self.global_batch_size
        if not self.drop_last and 0 < remainder < self.num_replicas:
            raise ValueError(f"drop_last=False leaves a last global batch of {remainder} samples "
                             f"({self.lengths.size} % {self.global_batch_size}) for {self.num_replicas} replicas; "
                             f"pass drop_last=True or a global_batch_size that leaves at least one per replica")
        self.group = checked_group(self.group)
        self.max_tokens_per_microbatch = as_int(self.max_tokens_per_microbatch, "max_tokens_per_microbatch",
                                                minimum=1, optional=True)
        longest = int(np.argmax(self.lengths))
        if self.max_tokens_per_microbatch is not None and self.lengths[longest] > self.max_tokens_per_microbatch:
            raise ValueError(f"`max_tokens_per_microbatch`={self.max_tokens_per_microbatch} is below the "
                             f"{int(self.lengths[longest])} tokens of sample {longest}; every sample must fit "
                             f"one micro-batch")
        self.algorithm = _sampler_algorithm(self.algorithm, self.max_tokens_per_microbatch)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently in `epoch` (the same on every rank)."""
        self.epoch = as_int(epoch, "epoch", minimum=0)

    @property
    def steps(self) -> int:
        """Steps (global batches) per epoch."""
        self._check_settings()
        full, remainder = divmod(self.lengths.size, self.global_batch_size)
        return full + (0 if self.drop_last or not remainder else 1)

    def __len__(self) -> int:
        """Batches yielded per epoch: steps, or with a token budget the micro-batches of all steps."""
        if self.max_tokens_per_microbatch is None:
            return self.steps
        return sum(self.microbatches_per_step())

    def global_batches(self) -> list[np.ndarray]:
        """Dataset indices of this epoch's global batches, as drawn (a permutation seeded by (seed, epoch))."""
        self._check_settings()
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.lengths.size)
        size = self.global_batch_size
        return [order[step * size:(step + 1) * size] for step in range(self.steps)]

    def plan(self, batch: np.ndarray) -> BalancePlan | MicroBatchPlan:
        """The plan of one global batch, the same on every rank (cells with a token budget)."""
        if self.max_tokens_per_microbatch is None:
            return balance(self.lengths[batch], self.num_replicas, cost=self.cost, algorithm=self.algorithm)
        return balance_microbatches(self.lengths[batch], self.num_replicas, cost=self.cost, algorithm=self.algorithm,
                                    max_tokens_per_microbatch=self.max_tokens_per_microbatch)

    def _kept_for(self, name: str, build):
        """`build()`, kept under `name` while every setting stays (public attributes, which may be set after
        first use: a new seed, a lower budget; `lengths` by identity, its array over immutable bytes)."""
        kept = self._kept.get(name)
        if kept is None or kept[0] is not self.lengths or self.lengths.flags.writeable or \
                kept[1] != self._other_settings():  # lengths first
            self._check_settings()
            kept = self._kept[name] = (self.lengths, self._other_settings(), build())
        return kept[2]

    def _other_settings(self) -> list:
        """The settings but `lengths` (which the kept values know by identity)."""
        return [(key, value) for key, value in self._settings().items() if key != "lengths"]

    def _epoch_plans(self) -> list[MicroBatchPlan]:
        return self._kept_for("plans", lambda: [self.plan(batch) for batch in self.global_batches()])

    def step_tokens(self) -> list[int]:
        """Tokens of every step's global batch this epoch (all ranks, all micro-batches; the same on every
        rank): the divisor of each micro-batch's loss (`normalize_loss(loss, micro)`), right where every token
        counts in the loss; for a masked loss see the class docstring (outside `accumulate`, a loop of one's
        own: `normalize_loss(..., total_loss_tokens=)` with the loss tokens of `global_batches()[step]`)."""
        return list(self._kept_for("step tokens", lambda: [integer_sum(self.lengths[batch])
                                                           for batch in self.global_batches()]))

    def microbatches_per_step(self) -> list[int]:
        """M of every step of this epoch (the same on every rank); needs `max_tokens_per_microbatch`."""
        if self.max_tokens_per_microbatch is None:
            raise ValueError("`microbatches_per_step` needs `max_tokens_per_microbatch`: without a token budget "
                             "every step is one batch")
        return [plan.num_microbatches for plan in self._epoch_plans()]

    def microbatches(self, loaded, group=None):
        """Yield the micro-batches of the epoch as `runtime.microbatch.MicroBatch`es for `accumulate`: `loaded` is
        what iterates this sampler (a `DataLoader(dataset, batch_sampler=sampler, collate_fn=...)`, not built with
        in_order=False), one collated batch per yielded list, in order; `micro.data` is that batch, `micro.items`
        its dataset indices as yielded, `micro.lengths` their lengths, and every micro-batch's loss is divided by
        its step's tokens (`normalize_loss(loss_sum, micro)`).  `group`: the processes whose gradients the model
        reduces (DDP's process group, default the world), on which the model check runs until the first step
        trained and on every step whose last micro-batch is empty on some rank (the plan says which: every rank
        decides alike):

            for micro in sampler.microbatches(loader):
                with accumulate(model, micro):                # no gradient sync but on the step's last
                    normalize_loss(loss_fn(model(micro.data)), micro).backward()
                if micro.is_last:
                    optimizer.step(); optimizer.zero_grad()
        """
        checked_group(group)
        if self.max_tokens_per_microbatch is None:
            raise ValueError("`microbatches` needs `max_tokens_per_microbatch`: without a token budget every step is "
                             "one batch (normalise its loss with `normalize_loss`)")
        source = getattr(loaded, "batch_sampler", self)
        if source is not self:
            raise ValueError(f"`loaded` iterates another batch sampler ({type(source).__name__}), not this sampler: "
                             f"pass the DataLoader built with `batch_sampler=` this sampler")
        if getattr(loaded, "in_order", True) is False and getattr(loaded, "num_workers", 0):
            raise ValueError("`loaded` may yield its batches out of order (a DataLoader with workers and "
                             "in_order=False), but `microbatches` pairs them with the plan's micro-batches in order: "
                             "build the DataLoader with in_order=True (the default)")
        return self._loaded_microbatches(iter(loaded), group)  # iter first: it iterates the sampler (its epoch check)

    def _loaded_microbatches(self, loaded, group):
        plans, batches, tokens, step = self._epoch_plans(), self.global_batches(), self.step_tokens(), None
        for number, (batch, plan) in enumerate(zip(batches, plans)):
            new_step()  # raises where this thread left the previous step's loop with its gradient sync held
            step = StepToken(self._trained) if step is None else step.next()
            count = plan.num_microbatches
            cells = [batch[plan.items_of(self.rank, index)] for index in range(count)]
            last = np.bincount(plan.rank[plan.microbatch == count - 1], minlength=self.num_replicas)
            contract = contract_of(step, last, group)
            step.empty = frozenset(index for index, cell in enumerate(cells) if not cell.size)
            yield from iterate(MicroBatch(index, count, cells[index], self._next_loaded(loaded, number, index),
                                          tokens[number], self.num_replicas,
                                          lengths=torch.tensor(self.lengths[cells[index]]), step=step,
                                          contract=contract) for index in range(count))
        if next(loaded, _END) is not _END:
            raise ValueError(f"`loaded` yielded more than the epoch's {len(self)} micro-batches: it must yield one "
                             f"collated batch per list this sampler yields (`batch_sampler=` this sampler)")

    def _next_loaded(self, loaded, step: int, index: int):
        """The next collated batch, or a ValueError naming the micro-batch it lacks."""
        try:
            return next(loaded)
        except StopIteration:
            raise ValueError(f"`loaded` ended before micro-batch {index} of step {step}: it must yield one collated "
                             f"batch per list this sampler yields (`batch_sampler=` this sampler)") from None

    def _settings(self) -> dict[str, object]:
        """What every rank must share to draw the same batches, by argument name."""
        return {"len(lengths)": self.lengths.size, "lengths": self.lengths, "seed": self.seed, "epoch": self.epoch,
                "num_replicas": self.num_replicas, "global_batch_size": self.global_batch_size,
                "drop_last": self.drop_last, "max_tokens_per_microbatch": self.max_tokens_per_microbatch,
                "cost": CostModel() if self.cost is None else self.cost, "algorithm": self.algorithm}

    def check_ranks_agree(self) -> None:
        """All-gather a fingerprint of the settings, the epoch's plans and the rank (a `call_header`: a rank in
        another orchmllm call is named); raise `ConfigMismatchError` on every rank naming the settings that
        differ, or the ranks whose planning failed and why (a collective of `group`; no-op alone).  A rank whose
        settings or planning fail joins the gather all the same: every rank names it and its error (the failing
        rank's as `__cause__`); when every rank failed alike, each raises its own error after the gather."""
        if not is_distributed(self.group):
            return
        failure = None
        try:  # a rank whose settings or planning fail still joins the gather, and re-raises after it
            self._check_settings()
            plans = self._plans_digest()
        except Exception as error:  # noqa: BLE001
            failure, plans = error, FAILED + _shortened(f"{type(error).__name__}: {error}")
        settings = {**self._settings(), PLANS: plans}
        digest = fingerprint(*(part for setting in settings.items() for part in setting))
        rows = call_header("sampler", [*words_of(digest), self.rank], self.group, AGREEMENT)
        problems = [self._rank_problem(rows[:, 4].tolist())]
        differ = disagreement([row[:4].tobytes() for row in rows], "BalancedDistributedSampler configuration",
                              group_rank(self.group), show=lambda value: value.hex()[:12])
        options_blamed = problems[0] is not None
        if differ:  # the same rows on every rank: all of them gather the settings here
            what, blamed = self._what_differs(differ, settings)
            problems.append(what)
            options_blamed = options_blamed or blamed
        problems = [problem for problem in problems if problem]
        if problems:
            raise ConfigMismatchError("; ".join(problems) + (f"; {SAME_OPTIONS}" if options_blamed else "")) \
                from failure
        if failure is not None:
            raise failure

    def _what_differs(self, differ: str, settings: dict) -> tuple[str, bool]:
        """`differ` with the settings that differ (gathered from every rank), or the ranks whose planning failed;
        and whether options are to blame (not where only a plan failed)."""
        gathered = [None] * group_size(self.group)
        with collective(AGREEMENT, self.group):
            dist.all_gather_object(gathered, ({name: _describe(value) for name, value in settings.items()
                                               if name != PLANS}, settings[PLANS]), group=self.group)
        shown, plans = [row for row, _ in gathered], [plan for _, plan in gathered]
        settings_differ = any(row != shown[0] for row in shown)
        failed: dict[str, list[int]] = {}
        for rank, text in enumerate(plans):
            if text.startswith(FAILED):
                failed.setdefault(text[len(FAILED):], []).append(rank)
        if failed:
            planned = [rank for rank, text in enumerate(plans) if not text.startswith(FAILED)]
            return (f"{FAILED_ON} (seen from rank {group_rank(self.group)}): "
                    + "; ".join(f"ranks {ranks}: {text}" for text, ranks in failed.items())
                    + (f" (ranks {planned} planned it)" if planned else "")
                    + (f"; settings that differ: {options_that_differ(shown)}" if settings_differ else ""),
                    settings_differ)
        if settings_differ:  # the plans differ with the settings: name those
            return f"{differ}; settings that differ: {options_that_differ(shown)}", True
        plans_shown = [{PLANS: repr(plan)} for plan in plans]
        return (f"{differ}; settings that differ: {options_that_differ(plans_shown)} (only the plans differ: another "
                f"orchmllm version or algorithm implementation on some ranks, or an algorithm whose plans depend on "
                f"the process: a plugin should pass `orchmllm.testing.check_conformance`)", True)

    def _plans_digest(self) -> str:
        """A digest of every step's plan this epoch, which every rank computes alone: ranks whose solvers differ
        under one `algorithm` name (another orchmllm version, a plugin of another version or whose plans depend on
        the process) plan apart, on any step.  The epoch is planned ahead (kept: the shares come from the same
        plans); a step's digest costs ~0.04-0.3 % of its planning (fix58: 1024 items on 64 ranks, 9 us of 25 ms)."""
        if self.max_tokens_per_microbatch is not None:
            return fingerprint(*(part for plan in self._epoch_plans() for part in (plan.rank, plan.microbatch))
                               ).hex()[:16]
        return self._epoch_shares()[0]

    def _epoch_shares(self) -> tuple[str, list[np.ndarray]]:
        """Without a budget: the digest of the epoch's plans and this rank's share of every step, planned once."""
        def build():
            digests, shares = [], []
            for batch in self.global_batches():
                plan = self.plan(batch)
                digests.append(fingerprint(plan.assignment))  # 32 bytes a step: the epoch's assignments are not kept
                shares.append(batch[plan.items_of(self.rank)])
            return fingerprint(*digests).hex()[:16], shares

        return self._kept_for("shares", build)

    def _rank_problem(self, ranks: list[int]) -> str | None:
        """None when the gathered `rank`s hold [0, num_replicas) equally often; else what is wrong."""
        size, replicas = len(ranks), self.num_replicas
        holders = {rank: [process for process, held in enumerate(ranks) if held == rank] for rank in range(replicas)}
        if size % replicas == 0 and all(len(processes) == size // replicas for processes in holders.values()):
            return None
        detail = ", ".join(f"rank {rank}: processes {processes}" for rank, processes in holders.items()
                           if len(processes) != size // replicas)
        return (f"BalancedDistributedSampler's `rank`: the {size} processes of the group must hold every rank in "
                f"[0, num_replicas={replicas}) equally often (seen from rank {group_rank(self.group)}: {detail})")

    def __iter__(self):
        """This rank's shares of the epoch's steps, after `check_ranks_agree` (see `check_agreement`), which checks
        the settings where its gather runs (a rank whose settings fail joins it: every rank names them)."""
        checked = self.check_agreement and is_distributed(checked_group(self.group))  # a list of ranks: checked first
        if checked:
            self.check_ranks_agree()
        else:
            self._check_settings()
        return self._shares(checked)

    def _shares(self, checked: bool):
        """Without a budget: the shares the check planned ahead (`checked`), else step by step as they are taken."""
        if self.max_tokens_per_microbatch is None:
            for share in self._epoch_shares()[1] if checked else \
                    (batch[self.plan(batch).items_of(self.rank)] for batch in self.global_batches()):
                yield share.tolist()
            return
        self._mark = Sampling(max(self.microbatches_per_step(), default=1))  # registered while the sampler lives
        for batch, plan in zip(self.global_batches(), self._epoch_plans()):
            for microbatch in range(plan.num_microbatches):
                yield batch[plan.items_of(self.rank, microbatch)].tolist()


def _shortened(text: str) -> str:
    """`text` on one line, at most FAILURE_CHARS characters."""
    text = " ".join(text.split())
    return text if len(text) <= FAILURE_CHARS else text[:FAILURE_CHARS - 3] + "..."


def _describe(value) -> str:
    """A setting as a mismatch message shows it (lengths by count, sum and fingerprint)."""
    if isinstance(value, np.ndarray):
        return f"{value.size} lengths summing to {integer_sum(value)}, sha256 {fingerprint(value).hex()[:12]}"
    return repr(value)
