"""orchmllm.orchestrator (see DESIGN.md)."""
