"""Proofs: branch and bound, lower bounds, LP dives and the MILP models; verdicts, never a heuristic's guess."""
