"""Name → kernel.  Every kernel takes a validated `Problem` and returns a `KernelResult`."""

from __future__ import annotations

from . import identity, lpt
from . import padded
from . import ilp
from . import karmarkar_karp
from . import auto
from . import multifit
from .problem import Kernel

ALGORITHMS: dict[str, Kernel] = {
    "identity": identity.solve,
    "lpt": lpt.solve,
    "padded": padded.solve,
    "ilp": ilp.solve,
    "karmarkar_karp": karmarkar_karp.solve,
    "auto": auto.solve,
    "multifit": multifit.solve,
}
