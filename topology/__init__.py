"""orchmllm.topology (see DESIGN.md)."""
