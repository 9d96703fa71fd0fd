"""Improvers of a plan in hand: local search on loads and exact re-solves of small groups of ranks."""
