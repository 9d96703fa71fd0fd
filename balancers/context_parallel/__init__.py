"""Giant items: splitting an item over a context-parallel group of ranks (zigzag layout, planner)."""
