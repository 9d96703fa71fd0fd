"""One module per balancing algorithm, all with the kernel signature `kernel(problem) -> KernelResult`."""
