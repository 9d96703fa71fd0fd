"""One module per balancing algorithm, each with the kernel signature `solve(problem) -> KernelResult`
(the registry's records name them); `lpt_capped`, `lpt_runs`, `last_units` and `min_slack` are steps the kernels
share, and `reference` holds the plain-code references the tests compare the fast kernels with."""
