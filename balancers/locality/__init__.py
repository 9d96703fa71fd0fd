"""Communication-aware balancing: the plain makespan while moving only what must move."""
