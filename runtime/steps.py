"""Which step a micro-batch belongs to: the token a step's micro-batches carry (`StepToken`), the clock a runtime
keeps of its steps (`StepClock`), told apart by the dispatches between its micro-batch loops, and which runtime runs
a step's plan given to another (`plan_runner`)."""

from __future__ import annotations

import numpy as np


def plan_runner(instance, maker):
    """The runtime (a dispatcher, a multi-stage runtime) that runs a plan given to `instance`, made by `maker`: the
    one whose exchanges its peers run now, as far as this rank can tell from what its own program did (never from
    the order of two instances' plans, which a planning thread races: probe30 P30-03).  That is `maker`, in
    `instance`'s group, where `maker` has exchanged before (an evaluation instance given the training plan on one
    rank, probe27 P27-10, review R19-08, probe30 P30-01) or `instance` has made no plan (one built to run another's
    plans, or built again on one rank between a plan and its exchange, P27-08): the peers run `maker`'s sites,
    whose headers may ride in the payload all-to-all while another instance's go in an all-reduce, which they would
    wait for until the group's timeout, or whose sizes gloo would abort on, and another instance's loop may owe the
    model check.  Else `instance`: a plan of an instance that only planned (kept from one planning ahead, P27-10b's
    twin, or another's plan given where the peers run `instance`): the peers run `instance`'s exchanges, whose
    header names the plan that differs."""
    if maker is None or maker is instance or maker.group is not instance.group:
        return instance
    return maker if maker._exchanged or not instance._planned else instance


class StepToken:
    """One step: its micro-batches carry it, and it ends when the dispatcher dispatches the next step (the
    multi-stage runtime: yields the next step's micro-batches), so that a micro-batch kept from it (a loop
    variable of an earlier step) is refused.  `trained` (shared by a runtime's steps) says whether a loop of one
    of them ran its last `accumulate` block with grad; `looping` counts the loops over its micro-batches whose
    generator is open (`microbatch.iterate`: the loop may still run); `carried` the record of a differentiable
    dispatch's tensors, whose backward runs in the step's last micro-batch's (`runtime.carry`), or None."""

    __slots__ = ("ended", "blocked", "empty", "versions", "trained", "graded", "looping", "carried")

    def __init__(self, trained: list | None = None):
        self.ended, self.trained, self.looping = False, [False] if trained is None else trained, 0
        self.carried = None
        self.blocked: dict[int, set] = {}  # id(model) -> its micro-batches whose `accumulate` blocks ran (`_in_order`)
        self.empty: frozenset = frozenset()  # the micro-batches holding no row on this rank (nothing to synchronise)
        self.versions: dict[int, tuple] = {}  # id(model) -> the step's first held block's, `versions.unstepped`'s
        self.graded: dict[int, tuple] = {}  # id(model) -> (micro-batch, a parameter its held block gave a gradient)

    def unsent(self) -> ValueError | None:
        """Why the step's last micro-batch's block may not end: its backward did not reach the rows of the step's
        differentiable dispatch, whose gradient every rank's last backward sends home in one reverse exchange (its
        peers wait there); else None."""
        if self.carried is None or self.carried.sent:
            return None
        return ValueError(
            "the backward of the step's last micro-batch on this rank did not reach its rows of a differentiable "
            "dispatch (`dispatch(..., differentiable=True)`), whose gradients go home in one reverse exchange that "
            "every rank's last backward runs: its peers wait there; compute that micro-batch's loss from its rows on "
            "every rank, an empty one's too (e.g. `model(micro.data[key]).sum() * 0`, not parameters times 0), or, "
            "where the rows take no gradient on purpose (an encoder frozen), dispatch them without "
            "`differentiable=True` (`.detach()` them first)")

    def next(self) -> StepToken:
        """End this step; the token of the next."""
        self.ended = True
        return StepToken(self.trained)


def contract_of(step: StepToken, rows_per_rank: np.ndarray, group) -> tuple | None:
    """`MicroBatch.contract` of a step's micro-batches: `(group,)` until a loop of its runtime trained (`step.trained`:
    a no-grad pass, or steps dispatched before, do not count) or where a rank holds none of the items of its last
    micro-batch (`rows_per_rank`: its items or shards on each rank of `group`, which every rank knows from the plan,
    and training is every rank's loop alike, so all decide alike), else None."""
    return (group,) if not step.trained[0] or not np.all(rows_per_rank) else None


class StepClock:
    """The step of a runtime's micro-batch loops (`step`, the token their micro-batches carry).

    A step ends at a dispatch of other routes: at once (`end`, the dispatcher), or at the next loop (`dispatched`
    with `other`, the multi-stage runtime, whose loop may still run while the next step's inputs move).  Routes made
    once and dispatched every step (the same metadata each step) end it at the first loop after a dispatch that
    followed a loop on EVERY rank: each rank's fact (`handed`: a loop since its latest dispatch) rides in the
    dispatch's header (`tell`), and every rank decides from all of them (`SchemaGuard.every_rank`), so a rank that
    listed the micro-batches for logging stays in the step with its peers.  Loops with no dispatch between them (a
    no-grad pass, then training) and a second batch dict of the step dispatched stay in it.  `begun`: whether the
    first token is the first step's (else the first loop begins one)."""

    __slots__ = ("step", "handed", "again")

    def __init__(self, begun: bool = True):
        self.step, self.handed, self.again = StepToken(), False, not begun

    def tell(self, guard, records: bool = False) -> None:
        """Before a dispatch's exchange: send `handed` with `guard`'s header (and whether this rank `records` the
        exchange's backward: `SchemaGuard.tell`)."""
        guard.tell(self.handed, records)

    def end(self) -> None:
        """After a dispatch of other routes, on a runtime that ends the step at once: the next step begins."""
        self.step, self.again, self.handed = self.step.next(), False, False

    def dispatched(self, guard, group, other: bool = False) -> None:
        """After a dispatch's exchange through `guard` (`other`: of other routes than the latest loop's): the next
        loop begins the next step where `other`, or where every rank of `group` ran a loop since its latest dispatch."""
        self.again = self.again or other or guard.every_rank(group)
        self.handed = False

    def loop(self) -> StepToken:
        """As a micro-batch loop begins: its step (the next one where a dispatch said so)."""
        if self.again:
            self.step, self.again = self.step.next(), False
        self.handed = True
        return self.step
