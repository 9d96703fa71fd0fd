"""Proofs: branch and bound, lower bounds, LP dives and the MILP models.  They start from the
caller's plan and return verdicts (a plan with its bound, or `verdict.CapInfeasible`); the kernels
in `kernels/` (`exact`, `ilp`) run the heuristics for a start and raise for the user."""
