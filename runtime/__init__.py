"""orchmllm.runtime (see DESIGN.md)."""
