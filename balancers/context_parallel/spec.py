"""`ContextParallel`: which degrees an item may be split at, and what a split item costs.

An item of l tokens split over a group of c ranks (zigzag layout, `layout.py`) costs each of
them, in the stage's cost units,

    t(c) = f(l) / (c · η(s)) + κ(l, c) / seconds_per_cost,   s = ⌈l / c⌉,  t(1) = f(l)
    η(s) = s / (s + half_efficiency_tokens)                   kernel efficiency of a short shard
    κ(l, c) = max(0, comm − ρ · attention) + λ · (c − 1) · layers · passes      (seconds)
    comm = kv_bytes_per_token · layers · passes · l · (c − 1) / c / bandwidth
    attention = seconds_per_cost · quadratic · l² / (c · η(s))   (the cost model's l² term)

The bandwidth is the intra-node one when the group sits inside a node, the inter-node one
otherwise.  Work c · t(c) never falls as c grows: c · t(c) = max(f / η, (f − ρ·q·l²) / η + c·comm)
+ λ'·c·(c − 1) with 1 / η(⌈l / c⌉) and c · comm non-decreasing in c, f ≥ q·l² and ρ ≤ 1 (which
is enforced).  So splitting buys wall time, never work, and only items long relative to the
step are worth splitting.

Defaults, from public figures (every one overridable, to be calibrated on GPUs):
- seconds_per_cost 1 / (989e12 · 0.55): an H100/H200 SXM's dense bf16 peak at the 55 % that
  large training runs reach (the simulator's `study.models` GPU), i.e. cost models in FLOPs
  (`CostModel.from_transformer`); set it for other units.
- intra 450e9 B/s (NVLink 4, per GPU and direction), inter 50e9 B/s (one 400 Gb/s NDR NIC per
  GPU), latency 10 µs per message: the `topology` h100 preset.
- kv_bytes_per_token 4096 = 8 K/V heads · 128 dims · (K, V) · 2 bytes bf16, num_layers 80
  (a Llama-3-70B / Qwen2-72B-sized LLM with grouped-query attention), kv_passes 3 (the forward
  moves K/V once, the backward K/V again plus dK/dV).
- overlap ρ 0.8: ring attention hides its K/V transfers behind attention compute, less what
  the first step and synchronisation leave exposed.
- half_efficiency_tokens 256: attention and GEMM kernels reach half their long-sequence
  throughput around a few hundred tokens (η(4096) = 0.94, η(512) = 0.67).
- min_gain 0.01: a plan that splits replaces today's only when its makespan is below today's
  / (1 + min_gain), since splitting has costs the model leaves out (a harder runtime path,
  exposure to a slow group member).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields, replace

import numpy as np

from ..cost import CostModel
from ..problem import MAX_RANKS, as_lengths
from ..validation import as_bool, as_int, as_real, check_int64, is_int

H100_SECONDS_PER_FLOP = 1.0 / (989e12 * 0.55)
DEFAULT_DEGREES = (1, 2, 4, 8)
"""`ContextParallel`'s default degrees: groups of up to a node of 8 GPUs.  Not capped to a smaller job: a
job of fewer ranks or GPUs per node is refused with the degrees that fit it (an explicit choice is never
changed unseen, and a default equal to it could not be told apart)."""


def as_degrees(degrees) -> tuple[int, ...]:
    """`degrees` as a sorted tuple of distinct powers of two (1 included as 2**0).

    >>> as_degrees([4, 1, 2])
    (1, 2, 4)
    >>> as_degrees((1, 3))
    Traceback (most recent call last):
    ...
    ValueError: `degrees` must be powers of two (1, 2, 4, ...); got 3
    """
    if isinstance(degrees, (str, bytes)) or not hasattr(degrees, "__iter__"):
        raise TypeError(f"`degrees` must be a sequence of ints; got {type(degrees).__name__}")
    values = list(degrees)
    if not values:
        raise ValueError("`degrees` must hold at least one degree")
    for value in values:
        if not is_int(value):
            raise TypeError(f"`degrees` must hold ints; got {value!r}")
        if value < 1 or value & (value - 1):
            raise ValueError(f"`degrees` must be powers of two (1, 2, 4, ...); got {value}")
    if len(set(values)) != len(values):
        raise ValueError(f"`degrees` must be distinct; got {values}")
    return tuple(sorted(int(value) for value in values))


@dataclass(frozen=True)
class ContextParallel:
    """The degrees an item may be split at, the node size, and the split-cost parameters.

    >>> cp = ContextParallel(degrees=(1, 2, 4))
    >>> cp.time(CostModel(linear=1.0), [1000], 1).tolist()
    [1000.0]
    >>> float(cp.time(CostModel(linear=1.0), [1000], 2, within_node=True)[0]) > 500.0   # η and κ cost a little
    True

    `degrees` without 1 split every item, however short (static context parallelism); that is
    rarely meant, so it warns (UserWarning): include 1 to let the planner keep items whole.
    The default degrees (1, 2, 4, 8) fill a node of 8 GPUs; on fewer ranks or smaller nodes pass the degrees that
    fit (e.g. `degrees=(1, 2, 4)`), which the refusal names.
    """

    degrees: tuple[int, ...] = DEFAULT_DEGREES
    gpus_per_node: int = 8
    allow_inter_node: bool = False
    seconds_per_cost: float = H100_SECONDS_PER_FLOP
    intra_node_bw_bytes_per_s: float = 450e9
    inter_node_bw_bytes_per_s: float = 50e9
    latency_s: float = 10e-6
    kv_bytes_per_token: float = 4096.0
    num_layers: int = 80
    kv_passes: float = 3.0
    overlap: float = 0.8
    half_efficiency_tokens: float = 256.0
    min_gain: float = 0.01

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", as_degrees(self.degrees))
        if self.degrees[0] != 1:
            warnings.warn(f"`degrees` {self.degrees} leave out 1: every item will be split, however short (static "
                          f"context parallelism); include 1 to let the planner keep items whole", UserWarning,
                          stacklevel=3)
        object.__setattr__(self, "gpus_per_node", as_int(self.gpus_per_node, "gpus_per_node", minimum=1))
        if self.gpus_per_node > MAX_RANKS:  # numpy's int64 block arithmetic would overflow past 2**63
            raise ValueError(f"`gpus_per_node` must be at most 2**20 = {MAX_RANKS} (a node's ranks, as `num_ranks`); "
                             f"got {self.gpus_per_node}")
        object.__setattr__(self, "num_layers", as_int(self.num_layers, "num_layers", minimum=1))
        object.__setattr__(self, "allow_inter_node", as_bool(self.allow_inter_node, "allow_inter_node"))
        for name in ("seconds_per_cost", "intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s"):
            object.__setattr__(self, name, as_real(getattr(self, name), name, allow_zero=False))
        for name in ("latency_s", "kv_bytes_per_token", "kv_passes", "overlap", "half_efficiency_tokens", "min_gain"):
            object.__setattr__(self, name, as_real(getattr(self, name), name))
        if self.overlap > 1:
            raise ValueError(f"`overlap` must be in [0, 1] (the share of attention time that hides K/V "
                             f"transfers; above 1 a split item's work could fall with its degree); got {self.overlap}")
        if self.inter_node_bw_bytes_per_s > self.intra_node_bw_bytes_per_s:
            raise ValueError(f"`inter_node_bw_bytes_per_s` ({self.inter_node_bw_bytes_per_s:g}) must not exceed "
                             f"`intra_node_bw_bytes_per_s` ({self.intra_node_bw_bytes_per_s:g})")

    @property
    def splits(self) -> bool:
        """Whether any degree above 1 is allowed."""
        return self.degrees[-1] > 1

    def on(self, topology) -> "ContextParallel":
        """This spec with a topology's node size, bandwidths and latency (any object with
        `gpus_per_node` and the `Topology` link attributes it has); `degrees` was warned about already.
        A value set in this spec (not its default) that the topology gives otherwise is not replaced unseen: a node
        size is a ValueError (groups must tile the topology's nodes), a bandwidth or latency a UserWarning naming
        both (the topology's is taken: set a calibrated one on the Topology)."""
        if not hasattr(topology, "gpus_per_node"):  # None or 4 gave this spec back unchanged
            raise TypeError(f"`topology` must have `gpus_per_node` (e.g. orchmllm.topology.Topology); got "
                            f"{type(topology).__name__}")
        names = ("gpus_per_node", "intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s", "latency_s")
        defaults = {field.name: field.default for field in fields(self)}
        clash = {name: f"{name}={getattr(self, name)!r} (the topology's: {getattr(topology, name)!r})"
                 for name in names if hasattr(topology, name)
                 and getattr(self, name) not in (defaults[name], getattr(topology, name))}
        if "gpus_per_node" in clash:
            raise ValueError(f"`context_parallel` sets {clash['gpus_per_node']}: its groups must tile the topology's "
                             f"nodes; leave gpus_per_node at its default with a topology")
        if clash:
            warnings.warn(f"`context_parallel` sets {', '.join(clash.values())}, which the topology gives: the "
                          f"topology's are taken (set a calibrated value on the Topology)", UserWarning, stacklevel=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                return replace(self, **{name: getattr(topology, name) for name in names if hasattr(topology, name)})
            except ValueError as error:  # the topology's values, which this spec's checks refuse (probe20 P20-22)
                raise ValueError(f"the topology's links, which `context_parallel` takes: {error}") from None

    def warn_unit_cost(self, cost: CostModel | None) -> None:
        """A UserWarning where `cost` is None or the default CostModel (1 per token) and `seconds_per_cost` is the
        default (an H100's FLOP rate): a split's communication seconds then dwarf every item's cost, so the plan
        splits nothing that could wait and its costs read as FLOPs (`balance` and `balance_microbatches`)."""
        if (cost is None or cost == CostModel()) and self.seconds_per_cost == H100_SECONDS_PER_FLOP:
            warnings.warn("`context_parallel` with the default cost (1 per token): split times add communication "
                          "seconds at an H100's FLOP rate (`seconds_per_cost`), so every split is all communication; "
                          "pass `cost` in FLOPs (e.g. CostModel(linear=6e9) for a 1B-parameter model) or set "
                          "ContextParallel(seconds_per_cost=...) to the seconds of one unit of your cost", UserWarning,
                          stacklevel=4)

    def time(self, cost: CostModel, lengths, degree, within_node=True) -> np.ndarray:
        """Per-rank time t(c) of items of `lengths` split at `degree` (broadcast), in cost units.

        `within_node` (broadcast too): the group sits inside one node (intra-node bandwidth).
        Degree 1 is the unsplit cost f(l) exactly.  Any power of two is priced, in `degrees` or not (what a
        peer's or a what-if degree would cost); another degree is refused (probe31 P31-05: 3 was priced).  A time
        beyond float64 is refused (ValueError), as the planner refuses it.
        """
        if not isinstance(cost, CostModel):
            raise TypeError(f"`cost` must be a CostModel; got {type(cost).__name__}")
        lengths = as_lengths(lengths)
        degree = np.asarray(degree)
        if degree.dtype == object or degree.dtype.kind not in "iu":
            raise TypeError(f"`degree` must be a positive int or an array of them; got dtype {degree.dtype}")
        check_int64(degree, "degree")  # a uint64 of 2**63 is a power of two, which int64 would wrap negative
        if degree.size and degree.min() < 1:
            raise ValueError(f"`degree` must be at least 1; got {int(degree.min())}")
        if degree.size and np.any(degree & (degree - 1)):
            bad = int(degree.flat[np.flatnonzero(degree & (degree - 1))[0]])
            raise ValueError(f"`degree` must be powers of two (1, 2, 4, ...); got {bad}")
        inside = np.asarray(within_node)
        if inside.dtype != np.bool_ and inside.size:  # "False" or 0.5 would read as True
            raise TypeError(f"`within_node` must be a bool or an array of bools (numpy bools too); got "
                            f"{type(within_node).__name__} {within_node!r:.80}")
        try:
            arrays = np.broadcast_arrays(lengths, degree.astype(np.int64), inside.astype(bool))
        except ValueError:
            raise ValueError(f"`lengths` (shape {lengths.shape}), `degree` (shape {degree.shape}) and `within_node` "
                             f"(shape {inside.shape}) must broadcast to one shape (numpy's rules)") from None
        with np.errstate(over="ignore", invalid="ignore"):  # a time beyond float64 is named below
            times = self.item_times(cost, *arrays)
        if times.size and not np.isfinite(times).all():  # as the planner refuses it (`split.allot`)
            at = np.unravel_index(int(np.flatnonzero(~np.isfinite(times))[0]), times.shape)
            raise ValueError(f"`context_parallel`'s split times overflow float64 (scale the cost model or the "
                             f"`context_parallel` parameters down): length {int(arrays[0][at])} at degree "
                             f"{int(arrays[1][at])} takes {float(times[at])}")
        return times

    def item_times(self, cost: CostModel, lengths: np.ndarray, degree: np.ndarray,
                   within_node: np.ndarray) -> np.ndarray:
        """`time` on clean int64 arrays of one shape (kernels call this; no validation)."""
        unsplit = cost.item_costs(lengths)
        c = degree.astype(np.float64)
        length = lengths.astype(np.float64)
        shard = np.maximum(-(-lengths // degree), 1).astype(np.float64)
        efficiency = shard / (shard + self.half_efficiency_tokens)
        per_rank = c * efficiency
        with np.errstate(over="ignore"):  # costs near float64's top: inf, never chosen (`time` refuses it)
            compute = unsplit / per_rank
        attention = self.seconds_per_cost * (cost.quadratic * length * length) / per_rank
        bandwidth = np.where(within_node, self.intra_node_bw_bytes_per_s, self.inter_node_bw_bytes_per_s)
        messages = self.num_layers * self.kv_passes
        transfer = self.kv_bytes_per_token * messages * length * (c - 1.0) / c / bandwidth
        exposed = np.maximum(transfer - self.overlap * attention, 0.0) + self.latency_s * messages * (c - 1.0)
        return np.where(degree == 1, unsplit, compute + exposed / self.seconds_per_cost)
