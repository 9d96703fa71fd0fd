"""Gradient-accumulation steps: the cells (rank, micro-batch) of a global batch planned jointly."""
