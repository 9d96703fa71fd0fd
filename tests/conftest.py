"""Shared test configuration: the toolkit's deterministic Hypothesis profile by default."""

from orchmllm.testing import load_profile

load_profile()
