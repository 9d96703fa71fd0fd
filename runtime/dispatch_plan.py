"""The plan of one step as a `PostBalancingDispatcher` made it on every rank (`DispatchPlan`), and which dispatcher
exchanges it (`exchanged_by`)."""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..balancers import BalancePlan, MicroBatchPlan
from .exchange import ExchangeMeta
from .metadata import GatheredMetadata
from .sharding import StepSharding
from .steps import plan_runner


_MAKERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # token -> this process's dispatcher of it


def maker_token(dispatcher) -> bytes:
    """A token naming `dispatcher` in this process alone (random: a copy of its plans in another process finds no
    maker), by which a pickled or deep-copied plan finds its maker again (`DispatchPlan.__setstate__`)."""
    token = os.urandom(16)
    _MAKERS[token] = dispatcher
    return token


@dataclass(frozen=True, eq=False)
class DispatchPlan:
    """One step's plan as every rank holds it: gathered lengths and loss tokens, balance, route.

    `balance` is a `BalancePlan`, or with a micro-batch budget the `MicroBatchPlan` of the
    step's cells; None when the global batch has no items.  `item_microbatch[i]` is the
    micro-batch of item i (all 0 without a budget) and `num_microbatches` the step's M (1
    without a budget; a step with no items runs `num_microbatches` when fixed, else 1, under an interleaved
    `pipeline` rounded up to a whole group of its stages).
    `sharding` says where every item's tokens go (whole, or in zigzag chunks over a group) and
    `route` moves them (one unit per item when none is split).  `config_fingerprint` and
    `config_options` are those of the dispatcher that made it: another one refuses it.
    """

    metadata: GatheredMetadata
    balance: BalancePlan | MicroBatchPlan | None
    route: ExchangeMeta
    planning_seconds: float  # `plan`'s wall time: the metadata all-gather, the balance plan and the route
    item_microbatch: np.ndarray
    num_microbatches: int
    sharding: StepSharding
    config_fingerprint: bytes
    config_options: Mapping
    maker: object = field(default=None, repr=False)  # the dispatcher whose `plan()` made it (`exchanged_by`)

    def __getstate__(self) -> dict:  # pickled or deep-copied: the maker by its token, found again in this process
        return {**self.__dict__, "maker": None if self.maker is None else self.maker._token}

    def __setstate__(self, state: dict) -> None:  # (probe30 P30-02: a copy on one rank ran another instance's sites)
        self.__dict__.update(state, maker=None if state["maker"] is None else _MAKERS.get(state["maker"]))

    @property
    def lengths(self) -> np.ndarray:
        """Length of every item of the global batch, rank by rank."""
        return self.metadata.column(0)

    @property
    def num_loss_tokens(self) -> int:
        """Loss tokens of the whole step on every rank (the global loss denominator)."""
        return int(self.metadata.column(1).sum())

    @property
    def local_items(self) -> np.ndarray:
        """Global indices of the items this rank holds after `dispatch` (whole or a shard), ascending."""
        return self.sharding.local_items

    @property
    def local_lengths(self) -> np.ndarray:
        """Tokens this rank holds of each of `local_items` (a split item's: its shard's)."""
        return self.sharding.local_tokens


def exchanged_by(dispatcher, plan: DispatchPlan, call: str):
    """The dispatcher that exchanges `plan` given to `dispatcher`'s `call` (`dispatch`, `microbatches`, `combine`):
    its maker or `dispatcher` (`steps.plan_runner`).  A maker of other options than `dispatcher`'s carries
    `dispatcher`'s refusal of the plan into its next exchange, where every rank raises it (probe27 P27-10b: refused
    through `dispatcher`'s own sites, a fresh one waited until the timeout and a warm one aborted gloo)."""
    maker = plan_runner(dispatcher, plan.maker)
    if maker is not dispatcher and plan.config_fingerprint != dispatcher.config_fingerprint:
        maker._carry(dispatcher._foreign_problem(plan, call))
    return maker
