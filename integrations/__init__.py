"""Drop-in replacements for peers' balancing entry points, backed by orchmllm's balancers.

Numpy only; never imported by the core.  `orchmllm.integrations.verl` mirrors verl's
`verl.utils.seqlen_balancing.get_seqlen_balanced_partitions`.
"""
