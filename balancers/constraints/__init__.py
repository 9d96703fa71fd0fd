"""Side constraints on a plan: keep-together groups and equal item counts."""
