"""Calibrate a stage's CostModel on a GPU: time one transformer block's forward+backward at
several sequence lengths, fit f(l) = per_item + linear·l + quadratic·l² (`CostModel.fit`),
and print the coefficients, the fit error and the throughput the FLOP model implies.

    python3.11 benchmarks/calibrate_gpu.py                       # CUDA, 4096 hidden, bf16
    python3.11 benchmarks/calibrate_gpu.py --hidden 2048 --heads 16 --json
    python3.11 benchmarks/calibrate_gpu.py --device cpu --hidden 64 --heads 4 --lengths 16,32,64,128

Without a CUDA device (and without --device cpu) it prints a message and exits 0.
Timings use CUDA events after warm-up; the block is `orchmllm.runtime.demo.model.Block`
(pre-norm attention + 4h MLP, causal attention per packed sequence via SDPA).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from orchmllm.balancers import CostModel
from orchmllm.runtime.demo.model import Block

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def time_block(block: Block, length: int, hidden: int, dtype: torch.dtype, device: torch.device,
               repeats: int) -> float:
    """Median seconds of forward+backward of `block` on one sequence of `length` tokens."""
    x = torch.randn(length, hidden, dtype=dtype, device=device, requires_grad=True)

    def step():
        block(x, [length]).float().sum().backward()

    for _ in range(2):
        step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            stop.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(stop) / 1e3)
        else:
            begin = time.perf_counter()
            step()
            times.append(time.perf_counter() - begin)
    return float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192,16384")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("calibrate_gpu: no CUDA device here, nothing to calibrate "
              "(run it on a GPU node, or pass --device cpu to try the procedure on the CPU)")
        return 0
    lengths = [int(value) for value in args.lengths.split(",")]
    if len(lengths) < 3 or min(lengths) < 1:
        parser.error("--lengths needs at least 3 positive lengths (3 coefficients are fitted)")
    if args.hidden % args.heads:
        parser.error(f"--heads {args.heads} must divide --hidden {args.hidden}")
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    block = Block(args.hidden, args.heads, causal=True).to(device=device, dtype=dtype)
    seconds = [time_block(block, length, args.hidden, dtype, device, args.repeats) for length in lengths]
    fitted = CostModel.fit(lengths, seconds)
    predicted = fitted.item_costs(np.asarray(lengths))
    relative_errors = (predicted - np.asarray(seconds)) / np.asarray(seconds)
    flops = CostModel.from_transformer(num_layers=1, hidden_size=args.hidden, num_heads=args.heads, causal=True)
    achieved = [float(flops(length) / s) for length, s in zip(lengths, seconds)]
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": args.dtype, "hidden": args.hidden, "heads": args.heads,
        "lengths": lengths, "seconds": seconds,
        "cost_model": {"per_item": fitted.per_item, "linear": fitted.linear, "quadratic": fitted.quadratic},
        "fit_max_abs_relative_error": float(np.abs(relative_errors).max()),
        "fit_rms_relative_error": float(np.sqrt(np.mean(relative_errors ** 2))),
        "achieved_flops_per_second": achieved,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"device {report['device']}, {args.dtype}, hidden {args.hidden}, heads {args.heads}")
        for length, s, rate in zip(lengths, seconds, achieved):
            print(f"  l = {length:>6}: {s * 1e3:9.3f} ms fwd+bwd, {rate / 1e9:9.1f} GFLOP/s")
        print(f"CostModel(per_item={fitted.per_item:.4g}, linear={fitted.linear:.4g}, quadratic={fitted.quadratic:.4g})")
        print(f"fit error: max {report['fit_max_abs_relative_error']:.2%}, rms {report['fit_rms_relative_error']:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
