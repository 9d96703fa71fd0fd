"""Fields of a frozen dataclass built on their first read: what a plan holds for the runtime (a pass's routes), not
for its cost, so that a plan made to be costed (a search, a benchmark) never builds it.

    @dataclass(frozen=True, eq=False)
    class Plan:
        inputs: ...
        route: np.ndarray = Built("_routes")      # Plan(inputs) builds it on the first `plan.route`
        def _routes(self) -> dict: ...            # every Built field of the class, by name

A value given at construction (`Plan(inputs, route=...)`; `dataclasses.replace` reads, so builds, every field and
passes them on) is kept; the builder fills the others, all at once, under one lock (two threads' first reads build
once).  It reads only the instance's own frozen fields (and a stage plan's `_batch`, which the planner sets), so a
field reads the same whenever it is built, and a plan pickles and copies with whatever it has built so far (a
class with `Built` fields derives from `Lazy`, whose state is read under the lock: a copy taken while another thread
builds waits for that build).  `build(plan)` builds them all now (where the plan is made, when another thread or a
later moment reads them).
"""

from __future__ import annotations

import os
import threading

_LOCK = threading.RLock()  # re-entrant: a pass's routes read its stage plans' layouts


def _new_lock() -> None:
    """A forked child's lock, free: the parent's may be held by a building thread the child does not have (its half-
    filled fields are kept: a build fills what is missing and keeps what is there)."""
    global _LOCK
    _LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_lock)


class _Unset:
    """The default of a `Built` field: not given, built on the first read."""

    def __repr__(self) -> str:
        return "<built on first read>"


UNSET = _Unset()


class Built:
    """A dataclass field (a data descriptor: its default is `UNSET`) read from the instance's `__dict__`, filled by
    the method named `builder` (which returns every `Built` field's value by name) where it was not given."""

    def __init__(self, builder: str):
        self.builder = builder
        self.name = ""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return UNSET
        values = instance.__dict__
        if self.name not in values:
            with _LOCK:
                if self.name not in values:  # built by another thread while this one waited
                    for name, value in getattr(instance, self.builder)().items():
                        values.setdefault(name, value)
        return values[self.name]

    def __set__(self, instance, value) -> None:
        if value is not UNSET:
            instance.__dict__[self.name] = value


class Lazy:
    """The base of a class with `Built` fields: pickling and copying read its fields under the builders' lock, never
    while another thread fills them (which would change the dict they iterate)."""

    def __getstate__(self) -> dict:
        with _LOCK:
            return dict(self.__dict__)


def build(instance) -> None:
    """Build every `Built` field of `instance` (its class's and its bases') that is not built yet."""
    for cls in type(instance).__mro__:
        for name, field in vars(cls).items():
            if isinstance(field, Built):
                getattr(instance, name)
