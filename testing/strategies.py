"""Hypothesis strategies that build balancing inputs by construction (never by filtering).

    problems()            lengths with ties, heavy tails and zeros; rank counts; cost
                          models; caps from roomy to tight to infeasible; padded or not
    hard_cases()          Graham's instances, where list scheduling is furthest from optimal
    multimodal_batches()  orchestrator `Batch`es of text + image / audio samples
    topologies()          `Topology`s of a few nodes
    located_items()       lengths on a topology, each item's source rank and bytes (the
                          locality-aware balancers' input)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ..balancers import CostModel
from ..balancers.origins import Origins
from ..balancers.validation import as_bool, as_int
from ..orchestrator import Batch, Sample, Segment
from ..topology import Topology

COST_MODELS = {
    "tokens": CostModel(),
    "affine": CostModel(per_item=3, linear=2),
    "quadratic": CostModel(linear=1, quadratic=0.37),  # non-integer costs
    "per_item_only": CostModel(per_item=1, linear=0),  # every item costs the same
}
"""The cost models `problems()` draws from, by name."""


CONSTRAINTS = ("costs", "equal_counts", "groups")
"""The constraints of `balance` that `problems(constraints=...)` can draw."""


@dataclass(frozen=True)
class BalanceCase:
    """One input of `balance`: `balance(case.lengths, case.num_ranks, **case.options)`.

    At most one constraint is set: explicit `costs` (then `cost` is None), `equal_counts`,
    or keep-together `groups`; `options` names only the constraint that is set.
    """

    lengths: tuple[int, ...]
    num_ranks: int
    cost: CostModel | None
    padded: bool
    max_tokens_per_rank: int | None
    costs: tuple[int, ...] | None = None
    equal_counts: bool = False
    groups: tuple[int, ...] | None = None

    @property
    def constraint(self) -> str | None:
        """The constraint that is set ("costs", "equal_counts", "groups"), or None."""
        return next((name for name in CONSTRAINTS if getattr(self, name) not in (None, False)), None)

    @property
    def options(self) -> dict:
        options = {"cost": self.cost, "padded": self.padded, "max_tokens_per_rank": self.max_tokens_per_rank}
        if self.constraint is not None:
            options[self.constraint] = getattr(self, self.constraint)
        return options


def _lengths(size: int) -> st.SearchStrategy[list[int]]:
    sized = {"min_size": size, "max_size": size}
    tied = st.integers(1, 4).flatmap(lambda top: st.lists(st.integers(0, top), **sized))
    heavy_tailed = st.lists(st.integers(0, 20).map(lambda half_octaves: int(2 ** (half_octaves / 2))), **sized)
    spread = st.lists(st.integers(0, 1000), **sized)
    return st.one_of(tied, heavy_tailed, spread)


@st.composite
def _problems(draw, max_items, min_items, max_ranks, min_ranks, padded, caps, costs, constraints):
    # The size is drawn first and uniformly: Hypothesis's own list sizes favour tiny lists.
    size = draw(st.sampled_from(range(min_items, max_items + 1)))
    lengths = draw(_lengths(size))
    num_ranks = draw(st.sampled_from(range(min_ranks, max_ranks + 1)))
    cap = None
    if caps and draw(st.booleans()):
        # Around the necessary bound max(largest, ceil(total / D)): below it (rejected up
        # front), at it (tight: feasible or not), and above it by up to two items.
        necessary = max(max(lengths), -(-sum(lengths) // num_ranks), 1)
        cap = max(1, necessary + draw(st.integers(-2, 2 * max(lengths) + 2)))
    constraint = draw(st.sampled_from(constraints)) if constraints else None
    if constraint in ("costs", "groups"):  # balanced unpadded only
        padded = False
    case = BalanceCase(tuple(lengths), num_ranks, draw(st.sampled_from(costs)),
                       draw(st.booleans()) if padded is None else padded, cap)
    if constraint == "costs":  # integers: sums are exact, so optima compare with ==
        return replace(case, cost=None, costs=tuple(draw(st.lists(st.integers(0, 30), min_size=size, max_size=size))))
    if constraint == "groups":  # a few ids, so groups of several items are common
        return replace(case, groups=tuple(draw(st.lists(st.integers(0, 3), min_size=size, max_size=size))))
    return replace(case, equal_counts=constraint == "equal_counts")


def as_constraints(constraints) -> tuple[str, ...]:
    """`constraints` (names in `CONSTRAINTS`, one name as a str, or None for all) as a tuple of names;
    TypeError / ValueError naming the argument.

    >>> as_constraints("costs"), as_constraints(None)
    (('costs',), ('costs', 'equal_counts', 'groups'))
    """
    names = (CONSTRAINTS if constraints is None else [constraints] if isinstance(constraints, str)
             else list(constraints) if isinstance(constraints, Iterable) else constraints)  # a str is one name
    odd = [names] if not isinstance(names, (list, tuple)) else [name for name in names if not isinstance(name, str)]
    if odd:
        got = type(names).__name__ if odd[0] is names else f"a {type(names).__name__} holding {type(odd[0]).__name__}"
        raise TypeError(f"`constraints` must be a name in {CONSTRAINTS} or a sequence of them; got {got}")
    unknown = sorted(set(names) - set(CONSTRAINTS))
    if unknown:
        raise ValueError(f"`constraints` must be names in {CONSTRAINTS}; got {unknown}")
    return tuple(names)


def as_kinds(padded) -> tuple[bool, ...]:
    """`padded` as the non-empty tuple of kinds to draw (False: unpadded, True: padded); ValueError naming it."""
    kinds = tuple(padded) if isinstance(padded, (list, tuple)) else None
    if not kinds or any(not isinstance(kind, bool) for kind in kinds):
        raise ValueError(f"`padded` must list the kinds to draw, False and/or True; got {padded!r}")
    return kinds


def _names(values, name: str, what: str) -> tuple:
    """`values` as a non-empty tuple (a sequence, not a str): what `sampled_from` draws from."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values:
        raise TypeError(f"`{name}` must be a non-empty list or tuple of {what}; got {values!r}")
    return tuple(values)


def hard_cases(max_items: int = 8, max_ranks: int = 4, padded=(False,)) -> list[BalanceCase]:
    """Graham's instances for D = 2 .. max_ranks with 2D + 1 <= max_items items: two items of
    each length 2D - 1 down to D + 1, three of D, on D ranks, no cap, of each kind in `padded`.
    LPT's makespan is 4D - 1, the optimum 3D (his 4/3 - 1/(3D) bound, reached): properties
    run them first rather than wait for chance to draw them.

    >>> [(case.lengths, case.num_ranks) for case in hard_cases(7, 3)]
    [((3, 3, 2, 2, 2), 2), ((5, 5, 4, 4, 3, 3, 3), 3)]
    """
    max_items, max_ranks = size_range(1, max_items, "items")[1], size_range(1, max_ranks, "ranks")[1]
    kinds = as_kinds(padded)
    return [BalanceCase(tuple(length for length in range(2 * d - 1, d, -1) for _ in range(2)) + (d, d, d), d,
                        COST_MODELS["tokens"], kind, None)
            for d in range(2, max_ranks + 1) if 2 * d + 1 <= max_items for kind in kinds]


def problems(*, max_items: int = 8, min_items: int = 1, max_ranks: int = 4, min_ranks: int = 1,
             padded: bool | None = None, caps: bool = True, costs=None,
             constraints=()) -> st.SearchStrategy[BalanceCase]:
    """`BalanceCase`s small enough for `brute_force` at the defaults (4**8 plans).

    `padded` None draws both kinds; `caps` False never sets `max_tokens_per_rank`;
    `costs` is a list of `CostModel`s (default: `COST_MODELS`).  `constraints`, names from
    `CONSTRAINTS`, gives every case one of them: explicit integer `costs`, `equal_counts`,
    or `groups` of up to four ids (costs and groups cases are unpadded).

    >>> from hypothesis import find
    >>> find(problems(constraints=["groups"]), lambda case: len(set(case.groups)) < len(case.groups)).options
    {'cost': CostModel(per_item=0.0, linear=1.0, quadratic=0.0), 'padded': False, 'max_tokens_per_rank': None, \
'groups': (0, 0)}

    >>> from hypothesis import given, settings
    >>> from orchmllm import balance
    >>> from orchmllm.testing import check_plan
    >>> @settings(max_examples=20, derandomize=True, database=None)
    ... @given(problems(padded=True, caps=False))
    ... def test_padded_plans_are_certified(case):
    ...     check_plan(balance(case.lengths, case.num_ranks, algorithm="padded", **case.options),
    ...                case.lengths, case.num_ranks, **case.options)
    >>> test_padded_plans_are_certified()
    """
    min_items, max_items = size_range(min_items, max_items, "items", MAX_DRAWN_ITEMS)
    min_ranks, max_ranks = size_range(min_ranks, max_ranks, "ranks")
    models = list(COST_MODELS.values()) if costs is None else list(_names(costs, "costs", "CostModels"))
    if any(not isinstance(model, CostModel) for model in models):
        raise TypeError(f"`costs` must hold CostModels; got {[type(model).__name__ for model in models]}")
    padded, caps = None if padded is None else as_bool(padded, "padded"), as_bool(caps, "caps")
    constraints = as_constraints(constraints)
    if padded and set(constraints) - {"equal_counts"}:
        raise ValueError("`costs` and `groups` constraints are unpadded: pass padded=None or False with them")
    return _problems(max_items, min_items, max_ranks, min_ranks, padded, caps, models, constraints)


MAX_DRAWN_ITEMS = 8192  # Hypothesis draws no longer list (its BUFFER_SIZE): a larger size fails at the first draw


def size_range(low, high, what: str, most: int | None = None) -> tuple[int, int]:
    """(min_`what`, max_`what`) checked at the call, where Hypothesis would fail only at the first draw:
    ints with 1 <= min <= max (<= `most` when given: `MAX_DRAWN_ITEMS` for a drawn list's size).

    >>> size_range(5, 2, "items")
    Traceback (most recent call last):
    ...
    ValueError: `min_items` must be at most `max_items`; got min_items=5 > max_items=2
    """
    low, high = as_int(low, f"min_{what}", minimum=1), as_int(high, f"max_{what}", minimum=1)
    if low > high:
        raise ValueError(f"`min_{what}` must be at most `max_{what}`; got min_{what}={low} > max_{what}={high}")
    if most is not None and high > most:
        raise ValueError(f"`max_{what}` must be at most MAX_DRAWN_ITEMS = {most} (Hypothesis draws no longer list); "
                         f"got {high}")
    return low, high


@st.composite
def _samples(draw, num_ranks, modalities, max_segments):
    segment = st.builds(lambda modality, length, ratio: Segment(modality, length, max(1, length // ratio)),
                        st.sampled_from(modalities), st.integers(1, 4096), st.sampled_from([1, 4, 16]))
    return Sample(text=draw(st.integers(0, 2048)),
                  segments=tuple(draw(st.lists(segment, max_size=max_segments))),
                  source=draw(st.integers(0, num_ranks - 1)))


@st.composite
def _batches(draw, max_samples, max_ranks, modalities, max_segments):
    num_ranks = draw(st.integers(1, max_ranks))
    samples = draw(st.lists(_samples(num_ranks, modalities, max_segments), min_size=1, max_size=max_samples))
    samples = [Sample(s.text, s.segments, s.source, index) for index, s in enumerate(samples)]
    return Batch.from_samples(samples, num_ranks)


def multimodal_batches(*, max_samples: int = 16, max_ranks: int = 4, modalities=("image", "audio"),
                       max_segments: int = 3) -> st.SearchStrategy[Batch]:
    """`Batch`es of samples with text and up to `max_segments` modality segments each.

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=10, derandomize=True, database=None)
    ... @given(multimodal_batches(max_ranks=2))
    ... def test_every_sample_comes_from_a_rank(batch):
    ...     assert batch.num_samples >= 1 and batch.sample_source.max() < batch.num_ranks
    >>> test_every_sample_comes_from_a_rank()
    """
    max_samples, max_ranks = size_range(1, max_samples, "samples")[1], size_range(1, max_ranks, "ranks")[1]
    modalities = _names(modalities, "modalities", "modality names")
    for modality in modalities:
        Segment(modality, 1, 1)  # a name a Segment takes (a non-empty str, not 'llm'), or its error
    return _batches(max_samples, max_ranks, modalities, as_int(max_segments, "max_segments", minimum=0))


def topologies(*, max_nodes: int = 4, gpus_per_node=(1, 2, 4, 8)) -> st.SearchStrategy[Topology]:
    """`Topology(num_nodes, gpus_per_node)` with 1..max_nodes nodes.

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=10, derandomize=True, database=None)
    ... @given(topologies(max_nodes=2))
    ... def test_world_size(topology):
    ...     assert topology.world_size == topology.num_nodes * topology.gpus_per_node <= 16
    >>> test_world_size()
    """
    max_nodes = size_range(1, max_nodes, "nodes")[1]
    gpus = tuple(as_int(gpus, "gpus_per_node", minimum=1) for gpus in _names(gpus_per_node, "gpus_per_node", "ints"))
    return st.builds(Topology, num_nodes=st.integers(1, max_nodes), gpus_per_node=st.sampled_from(gpus))


@dataclass(frozen=True, eq=False)
class LocatedItems:
    """Items on a cluster: their lengths, the rank each starts on and the bytes it moves, as
    `balance(lengths, topology.world_size, sources=, item_bytes=, topology=)` takes them."""

    topology: Topology
    lengths: np.ndarray
    sources: np.ndarray
    item_bytes: np.ndarray

    @property
    def origins(self) -> Origins:
        """The sources, bytes and node size as the locality kernels take them."""
        return Origins(self.sources, self.item_bytes, self.topology.gpus_per_node)


@st.composite
def _located_items(draw, topologies, lengths, max_bytes):
    topology, drawn = draw(topologies), np.array(draw(lengths))
    per_item = {"min_size": len(drawn), "max_size": len(drawn)}
    sources = draw(st.lists(st.integers(0, topology.world_size - 1), **per_item))
    item_bytes = draw(st.lists(st.integers(0, max_bytes), **per_item))
    return LocatedItems(topology, drawn, np.array(sources), np.array(item_bytes, dtype=float))


def located_items(topologies: st.SearchStrategy[Topology], lengths: st.SearchStrategy[list[int]], *,
                  max_bytes: int = 49) -> st.SearchStrategy[LocatedItems]:
    """`LocatedItems` of `lengths` on a topology of `topologies`, each item from any rank, moving
    0..max_bytes bytes (whole numbers, so byte sums are exact).

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=10, derandomize=True, database=None)
    ... @given(located_items(topologies(max_nodes=2), st.lists(st.integers(0, 9), min_size=1, max_size=5)))
    ... def test_every_item_has_a_rank(items):
    ...     assert len(items.sources) == len(items.lengths) and items.sources.max() < items.topology.world_size
    >>> test_every_item_has_a_rank()
    """
    return _located_items(topologies, lengths, as_int(max_bytes, "max_bytes", minimum=0))


def load_profile(name: str | None = None) -> None:
    """Register the deterministic "ci" and exploratory "dev" profiles; load `name`.

    `name` defaults to $HYPOTHESIS_PROFILE, else "ci": derandomized, no deadline, 60
    examples, the failing example's blob printed.  "dev" runs 300 random examples.  Call
    it from a `conftest.py` (orchmllm's own tests do).

    >>> load_profile()
    >>> settings.get_profile("ci").max_examples, settings.get_profile("ci").derandomize
    (60, True)
    """
    settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("dev", deadline=None, max_examples=300)
    settings.load_profile(name or os.environ.get("HYPOTHESIS_PROFILE", "ci"))
