"""The package's entry points to MILP solvers: HiGHS through `scipy.optimize.milp`
(`solve_milp`: `ilp` and `exact`) and PuLP's bundled CBC (`run_cbc`: the node-wise ILP's
PuLP model).

scipy 1.17's HiGHS build writes a debug line (`HighsMipSolverData::transformNewIntegerFeasibleSolution
tmpSolver.run();`) straight to the process's standard output on some models, which a library
must not do.  `solve_milp` therefore runs HiGHS with file descriptor 1 pointed at a private
temporary file; afterwards every line written there that is not one of HiGHS's own is written
back to the real standard output, so another thread's output is delayed, never lost.  Calls
are serialised (one lock): the redirection is process-wide.  HiGHS runs in this process with
its default, fixed random seed, so a solve that is not cut by its time limit is reproducible.

The backends are imported by the call that uses them, so that importing a solver module costs
neither scipy.optimize nor PuLP.  Bounds and constraints are given as scipy's tuples:
`bounds=(lower, upper)`, `constraints=(A, lower, upper)` or a list of such.

>>> result = solve_milp([-1.0, -1.0], integrality=[1, 1], bounds=(0, 3), constraints=([[2.0, 1.0]], -np.inf, 4.0))
>>> result.status, float(result.fun)
(0, -3.0)
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import threading

import numpy as np

_SEED = 1
_MIN_SECONDS = 0.01
_LOCK = threading.Lock()
_LIBC = ctypes.CDLL(None)
_HIGHS_PREFIXES = (b"Highs", b"HiGHS")
"""Lines HiGHS prints by itself (its log is off: `disp` is False)."""


def solve_milp(c, *, integrality, bounds, constraints, time_limit: float | None = None,
               node_limit: int | None = None, presolve: bool = True):
    """`scipy.optimize.milp(...)` with gap 0, HiGHS's output kept off the process's stdout."""
    from scipy.optimize import milp

    options = {"mip_rel_gap": 0, "presolve": presolve, "disp": False}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    if node_limit is not None:
        options["node_limit"] = int(node_limit)
    with _LOCK, _quiet_stdout():
        return milp(c, integrality=integrality, bounds=bounds, constraints=constraints, options=options)


class _quiet_stdout:
    """Point fd 1 at a temporary file; on exit restore it and pass on the lines that are not HiGHS's."""

    def __enter__(self):
        self.saved = None
        try:
            sys.stdout.flush()
            self.saved = os.dup(1)
        except (OSError, ValueError, AttributeError):  # no fd 1 (closed, or stdout replaced): nothing to guard
            return self
        self.capture = tempfile.TemporaryFile()
        os.dup2(self.capture.fileno(), 1)
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            return False
        _LIBC.fflush(None)  # HiGHS writes through C stdio, buffered while fd 1 is a file
        os.dup2(self.saved, 1)
        os.close(self.saved)
        self.capture.seek(0)
        kept = b"".join(line for line in self.capture.read().splitlines(keepends=True)
                        if not line.startswith(_HIGHS_PREFIXES))
        self.capture.close()
        while kept:
            kept = kept[os.write(1, kept):]
        return False


def run_cbc(lp, time_limit: float, warm_start: bool) -> None:
    """Solve `lp` with PuLP's bundled CBC: one thread, fixed seeds, no gap, at least 0.01 s,
    files in a private temporary directory that is removed afterwards; the outcome is in
    `lp.sol_status` (`lp`: a `pulp.LpProblem`).  Raises pulp.PulpSolverError when CBC dies without
    writing a solution."""
    import pulp

    with tempfile.TemporaryDirectory(prefix="orchmllm_cbc_") as workdir:
        solver = pulp.COIN_CMD(path=pulp.PULP_CBC_CMD.pulp_cbc_path, msg=False,
                               timeLimit=max(time_limit, _MIN_SECONDS), threads=1, gapRel=0, warmStart=warm_start,
                               options=[f"randomSeed {_SEED}", f"randomCbcSeed {_SEED}"])
        solver.tmpDir = workdir
        lp.solve(solver)
