"""Replay every rank's recorded per-stage work in isolation: busy time without contention.

The demo's concurrent busy times are CPU times of ranks that share the machine's cores
with each other (and, on a shared machine, with everyone else).  So every rank records the
exact tensors each stage ran on (encoder inputs and lengths; the LLM's packed embeddings,
sample lengths and labels), and after the run one process, rank 0, replays all of them, one
at a time, with one intra-op thread, the same kernels forward and backward, while the other
ranks wait.  One process, because every rank's work then runs on the same parameters,
allocator and memory layout.

Thread CPU time alone is not contention-proof on a shared virtual machine: what the
hypervisor's other tenants and the other core run changes how fast the same instructions
retire, in spells of tens of milliseconds to seconds (on the 2-core VM this was written on,
one rank-sized LLM stage took 241-402 ms over forty runs at load ~1, slowed evenly over its
whole length, not by a few preemptions), and glibc returns freed blocks to the kernel, so
every replay of a large stage took ~10 000 page faults again.  Hence:

- the replaying process keeps freed memory (`mallopt`: no trimming, no mmap for large
  blocks) and runs the largest work of every stage once untimed, so first-touch costs are
  paid before any measurement;
- a stage is replayed piece by piece: its forward is a chain of segments of a few
  milliseconds (`TinyMultimodalModel` segments: a block's attention, its MLP, ...), and a
  *round* runs every rank's work of one (key, stage) in lockstep, slot by slot: the forward
  of segment 0 of every rank's work, then segment 1, ..., then the backward of the last
  segment of every work, ..., down to segment 0 (each segment's input is its predecessor's
  output, detached; its backward is given the gradient its successor's backward left
  there: the same kernels on the same tensors as the whole stage).  The pieces a slot
  compares run within a few tens of milliseconds of each other, at the same speed, in an
  order rotated from slot to slot and round to round;
- a piece's time is its share of its slot's mean, averaged over the rounds with the
  highest and lowest fifth of the shares left out, times the slot's median mean; a work's
  time is the sum over its slots;
- the rounds of all (key, stage) groups are interleaved, so each group samples the whole
  replay's spells;
- the noise floor's identical work (D copies of rank 0's work of a key, each copy on
  tensors of its own) is timed in that key's own rounds, D - 1 more columns beside the D
  ranks' works, rank 0's column shared: measured beside the work it qualifies.

>>> work = StageWork("llm", torch.zeros(3, 2), torch.tensor([3]), torch.zeros(3, dtype=torch.int64))
>>> work.stage, work.num_rows
('llm', 3)
>>> estimate_from_rounds([[2.0, 1.0], [4.0, 2.0], [2.0, 1.0], [2.0, 1.0], [2.0, 1.0]])  # one round at half speed
[2.0, 1.0]
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from ...balancers.validation import is_int
from .model import TinyMultimodalModel, compose

# How long the waiting ranks wait for rank 0's replay; the launcher's own timeout ends a
# stuck run before this.
REPLAY_WAIT = datetime.timedelta(hours=2)


@dataclass(frozen=True, eq=False)
class StageWork:
    """The tensors one stage of one step ran on, on one rank."""

    stage: str  # a modality ("image", "audio") or "llm"
    inputs: torch.Tensor  # encoder inputs, or the LLM's packed input embeddings
    lengths: torch.Tensor  # int64: items' lengths (encoder units, or sample lengths)
    labels: torch.Tensor | None = None  # the LLM's packed labels

    @property
    def num_rows(self) -> int:
        return int(self.inputs.shape[0])


class WorkRecorder:
    """Collects the StageWork of one pass: wrap the encoders, then add the LLM's input."""

    def __init__(self):
        self.work: list[StageWork] = []

    def encoders(self, model: TinyMultimodalModel) -> dict[str, Callable]:
        def recorded(modality, module):
            def run(inputs, lengths):
                self.work.append(StageWork(modality, inputs.detach().clone(), lengths.clone()))
                return module(inputs, lengths)
            run.__wrapped__ = module  # the module whose contract `check_encoders` checks
            return run

        return {modality: recorded(modality, module) for modality, module in model.encoders().items()}

    def llm(self, embeddings: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor) -> None:
        self.work.append(StageWork("llm", embeddings.detach().clone(), lengths.clone(), labels.clone()))


def stage_segments(model: TinyMultimodalModel, work: StageWork) -> list[Callable]:
    """The stage's forward as the model's chain of segments, the last one ending in the scalar
    whose backward is the stage's: the LLM's summed loss, or an encoder's output sum (its
    output gradient is ones)."""
    if work.stage == "llm":
        segments = model.llm.segments(work.lengths)
        head = segments[-1]
        return segments[:-1] + [lambda x: model.loss_sum(head(x), work.labels)]
    segments = model.encoders()[work.stage].segments(work.lengths)
    last = segments[-1]
    return segments[:-1] + [lambda x: last(x).sum()]


def _stage_input(work: StageWork) -> torch.Tensor:
    """A fresh copy of what the stage's first segment runs on (the LLM's embeddings need their gradient)."""
    return work.inputs.clone().requires_grad_(work.stage == "llm")


def run_stage(model: TinyMultimodalModel, work: StageWork) -> None:
    """Forward and backward of one recorded stage (the encoder's output gradient is ones)."""
    compose(stage_segments(model, work), _stage_input(work)).backward()


def time_round(model: TinyMultimodalModel, works: list[StageWork], clock: Callable[[], float],
               shift: int = 0) -> np.ndarray:
    """One round of the same stage's `works` in lockstep (module docstring): seconds of every
    (slot, work), slots being the forward of every segment, then the backward of every
    segment in reverse; slot s runs the works in the order rotated by `shift` + s.

    >>> model = TinyMultimodalModel()
    >>> works = [StageWork("llm", torch.zeros(rows, 128), torch.tensor([rows]), torch.zeros(rows, dtype=torch.int64))
    ...          for rows in (4, 8)]
    >>> time_round(model, works, clock=lambda: 0.0).shape  # 5 segments: 2 blocks x (attention, MLP), the head
    (10, 2)
    """
    chains = [stage_segments(model, work) for work in works]
    count, size = len(chains[0]), len(works)
    seconds = np.zeros((2 * count, size))
    # Where a work's tensors lie moves its speed by ~1 % on the VM: every round copies the inputs
    # in its own order behind a spacer of its own size, so no work keeps a lucky address.
    spacer = torch.empty(256 * (1 + shift % 7), dtype=torch.uint8)
    current = [None] * size
    for turn in range(size):
        current[(turn + shift) % size] = _stage_input(works[(turn + shift) % size])
    inputs, outputs = [[None] * count for _ in works], [[None] * count for _ in works]
    for slot in range(count):
        for turn in range(size):
            column = (turn + shift + slot) % size
            x = current[column] if slot == 0 else current[column].detach().requires_grad_(True)
            start = clock()
            y = chains[column][slot](x)
            seconds[slot, column] = clock() - start
            inputs[column][slot], outputs[column][slot], current[column] = x, y, y
    gradients = [None] * size
    for slot in reversed(range(count)):
        for turn in range(size):
            column = (turn + shift + slot) % size
            start = clock()
            outputs[column][slot].backward(gradients[column])
            seconds[2 * count - 1 - slot, column] = clock() - start
            gradients[column] = inputs[column][slot].grad if slot else None
            inputs[column][slot] = outputs[column][slot] = None
    del spacer
    return seconds


def estimate_from_rounds(seconds, trim: float = 0.2) -> list[float]:
    """Per work, its time at the replay's typical speed, from rounds (rows) timing the same works
    (columns) back to back: the work's share of its round's mean, averaged over the rounds
    without the `trim` fraction of highest and of lowest shares, times the median round mean.
    (On the 2-core VM under load the trimmed mean of 5 rounds gave a lower noise floor than
    their median or minimum.)"""
    seconds = np.asarray(seconds, dtype=np.float64)
    means = seconds.mean(axis=1, keepdims=True)
    shares = np.sort(np.divide(seconds, means, out=np.zeros_like(seconds), where=means > 0), axis=0)
    cut = int(trim * shares.shape[0])
    return (shares[cut:shares.shape[0] - cut].mean(axis=0) * float(np.median(means))).tolist()


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory in the process (no trimming, no mmap for large blocks),
    so a replayed stage does not page-fault its buffers in again; False where not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 1 << 30)) and bool(mallopt(m_trim_threshold, (1 << 31) - 1))


def replay_local(model: TinyMultimodalModel, works: dict, clock: Callable[[], float], repetitions: int = 5,
                 copies: dict | None = None) -> dict:
    """Replay {key: [per-rank list of StageWork]} in this process (see the module docstring);
    {key: [busy seconds per rank]}.  Every rank's list of a key holds the same stages in the
    same order (every rank runs every encoder, with empty inputs where it has no items).

    `copies` {key: source key}: `key` is identical work on every rank, rank 0's work of `source
    key`, timed in the source's own rounds (D - 1 more columns beside the source's D; rank 0's
    column is the source's), so the noise floor is measured beside the work it qualifies.
    """
    if not is_int(repetitions) or repetitions < 1:
        raise ValueError(f"`repetitions` must be an int >= 1; got {repetitions!r}")
    copies = dict(copies or {})
    columns = {key: list(works[key]) for key in works}  # per key: the works timed in its rounds
    extra = {}  # copy key -> (source key, first column of its copies)
    for key, source in sorted(copies.items()):
        if source not in works:
            raise ValueError(f"`copies` maps {key!r} to {source!r}, which has no recorded work")
        extra[key] = (source, len(columns[source]))
        columns[source] += [[_own_copy(work) for work in works[source][0]] for _ in range(len(works[source]) - 1)]
    groups = []  # (key, stage index): one round times every column's work of that stage
    for key in sorted(columns):
        stages = {tuple(work.stage for work in column) for column in columns[key]}
        if len(stages) != 1:
            raise ValueError(f"recorded work of {key!r} has different stages on different ranks: {sorted(stages)}")
        groups += [(key, index) for index in range(len(stages.pop()))]
    seconds = {group: [] for group in groups}  # per group, per round: (slot, column) seconds
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        keep_freed_memory()
        largest = {}
        for key, index in groups:
            for column in columns[key]:
                work = column[index]
                if work.num_rows > largest.get(work.stage, (-1, None))[0]:
                    largest[work.stage] = (work.num_rows, work)
        for _, work in largest.values():  # first touch of the heap, lazy initialisation
            time_round(model, [work], clock)
        for repetition in range(repetitions):
            for key, index in groups:
                seconds[key, index].append(time_round(model, [column[index] for column in columns[key]], clock,
                                                      repetition))
    finally:
        torch.set_num_threads(threads)
        model.zero_grad(set_to_none=True)
    busy = {key: np.zeros(len(columns[key])) for key in columns}
    for (key, _), rounds in seconds.items():
        rounds = np.stack(rounds)  # (round, slot, column)
        for slot in range(rounds.shape[1]):
            busy[key] += estimate_from_rounds(rounds[:, slot])
    result = {key: busy[key][:len(works[key])].tolist() for key in works}
    for key, (source, first) in extra.items():
        size = len(works[source])
        result[key] = [float(busy[source][0])] + busy[source][first:first + size - 1].tolist()
    return result


def _own_copy(work: StageWork) -> StageWork:
    """The same work on tensors of its own (a copy must not find rank 0's inputs in cache)."""
    return StageWork(work.stage, work.inputs.clone(), work.lengths.clone(),
                     None if work.labels is None else work.labels.clone())


def on_rank_zero(compute: Callable[[], object], rank: int, world_size: int):
    """`compute()` on rank 0 while the other ranks wait (up to REPLAY_WAIT, on a group of their
    own), its result on every rank (a collective over the world).

    >>> on_rank_zero(lambda: 42, rank=0, world_size=1)
    42
    """
    result = [compute() if rank == 0 else None]
    if world_size > 1:
        wait = dist.new_group(backend="gloo", timeout=REPLAY_WAIT)
        dist.broadcast_object_list(result, src=0, group=wait)
        dist.destroy_process_group(wait)
    return result[0]


def replay_in_isolation(model: TinyMultimodalModel, recorded: dict, clock: Callable[[], float], rank: int,
                        world_size: int, repetitions: int = 5, copies: dict | None = None) -> dict:
    """Every rank's recorded work ({key: [StageWork]}, the same keys on every rank) is sent to
    rank 0, which replays it all (`replay_local`) while the others wait; {key: this rank's busy
    seconds} on every rank (a collective over the world).

    `copies` {key: source key}: `key`'s work on every rank is rank 0's work of `source key`
    (identical work on every rank: the noise floor of the measurement; see `replay_local`).
    """
    if not is_int(repetitions) or repetitions < 1:
        raise ValueError(f"`repetitions` must be an int >= 1; got {repetitions!r}")
    copies = dict(copies or {})
    mine = {key: work for key, work in recorded.items() if key not in copies}
    if world_size > 1:
        gather = dist.new_group(backend="gloo", timeout=REPLAY_WAIT)
        gathered = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0, group=gather)
        dist.destroy_process_group(gather)
    else:
        gathered = [mine]

    def replay():
        return replay_local(model, {key: [part[key] for part in gathered] for key in mine}, clock, repetitions,
                            copies)

    return {key: float(values[rank]) for key, values in on_rank_zero(replay, rank, world_size).items()}
