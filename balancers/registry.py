"""Name → kernel.  Every kernel takes a validated `Problem` and returns a `KernelResult`."""

from __future__ import annotations

from . import auto, identity, ilp, karmarkar_karp, lpt, multifit, padded
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
