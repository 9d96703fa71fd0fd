"""Calibrate a stage's CostModel on a GPU: time one transformer block's forward+backward at
several sequence lengths, fit f(l) = per_item + linear·l + quadratic·l² (`CostModel.fit`),
and print the coefficients, the fit error and the throughput the FLOP model implies.

    python3.11 benchmarks/calibrate_gpu.py                       # CUDA, 4096 hidden, bf16
    python3.11 benchmarks/calibrate_gpu.py --hidden 2048 --heads 16 --json
    python3.11 benchmarks/calibrate_gpu.py --device cpu --hidden 64 --heads 4 --lengths 16,32,64,128

Without a CUDA device (and without --device cpu) it prints a message and exits 0.
Timings use CUDA events after warm-up; the block is `orchmllm.runtime.demo.model.Block`
(pre-norm attention + 4h MLP, causal attention per packed sequence via SDPA).

Split items (`ContextParallel`'s fields): the causal attention of one item of --split-length tokens
split at each of --split-degrees (1, 2, 4, 8), forward+backward through
`runtime.context_parallel_attention`.  On one process (one GPU) each degree's group-rank-0 shard
runs alone with the K/V exchange skipped: the per-shard compute f(l) / (c · η(s)), from which
`half_efficiency_tokens` is fitted.  Under torchrun with W GPUs, degrees up to W also run on real
groups (ranks 0 .. c − 1, K/V by point-to-point sends): the time above the shard's compute is the
exposed communication κ, from which `overlap` (ρ) and `latency_s` (λ) are fitted, with the K/V
volume `kv_bytes_per_token` = 2 · kv_heads · head_dim · bytes and the intra-node bandwidth given.

    torchrun --nproc-per-node 8 benchmarks/calibrate_gpu.py --kv-heads 8 --split-length 65536 --json
    python3.11 benchmarks/calibrate_gpu.py --dry                           # seconds on a CPU: the procedure
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from orchmllm.balancers import CostModel
from orchmllm.balancers.context_parallel import ContextParallel
from orchmllm.runtime.comm import init_distributed
from orchmllm.runtime.context_parallel import ContextParallelLayout, SplitItem, context_parallel_attention
from orchmllm.runtime.demo.calibration import fit_split_efficiency
from orchmllm.runtime.demo.giants import isolated_attention
from orchmllm.runtime.demo.model import Block

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def time_block(block: Block, length: int, hidden: int, dtype: torch.dtype, device: torch.device,
               repeats: int) -> float:
    """Median seconds of forward+backward of `block` on one sequence of `length` tokens."""
    x = torch.randn(length, hidden, dtype=dtype, device=device, requires_grad=True)
    return time_call(lambda: block(x, [length]).float().sum().backward(), device, repeats)


def time_call(step, device: torch.device, repeats: int) -> float:
    """Median seconds of `step()` over `repeats` runs after two warm-up runs."""
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


def split_attention_step(length: int, degree: int, rank: int, heads: int, kv_heads: int, head_dim: int,
                         dtype: torch.dtype, device: torch.device):
    """forward+backward of group rank `rank`'s shard of one causal item split at `degree` (ranks 0 .. degree − 1)."""
    split = SplitItem(0, length, tuple(range(degree)))
    if degree == 1:
        layout = ContextParallelLayout.planned(rank, rank + 1, [length] if rank == 0 else [], [])
    else:
        layout = ContextParallelLayout.planned(rank, max(degree, rank + 1), [split] if rank < degree else [], [split])
    tokens = layout.num_tokens
    q = torch.randn(tokens, heads, head_dim, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(tokens, kv_heads, head_dim, dtype=dtype, device=device, requires_grad=True) for _ in "kv")
    return tokens, lambda: context_parallel_attention(q, k, v, layout).float().sum().backward()


def fit_exposed(exposed: dict, compute: dict, length: int, kv_bytes_per_token: float, bandwidth: float
                ) -> tuple[float, float]:
    """(overlap ρ, latency_s λ) of ContextParallel's κ = max(0, transfer − ρ · attention) + λ · (c − 1) · passes
    fitted to the measured exposed seconds per degree: ρ on a grid of 101 values, λ ≥ 0 by least squares."""
    passes = 2.0  # the runtime moves K/V forward and dK/dV backward
    degrees = sorted(exposed)
    measured = np.array([exposed[c] for c in degrees])
    transfer = np.array([kv_bytes_per_token * passes * length * (c - 1) / c / bandwidth for c in degrees])
    attention = np.array([compute[c] for c in degrees])
    rounds = np.array([passes * (c - 1) for c in degrees])
    best = (float("inf"), 0.0, 0.0)
    for overlap in np.linspace(0.0, 1.0, 101):
        rest = measured - np.maximum(transfer - overlap * attention, 0.0)
        latency = max(float(rounds @ rest / (rounds @ rounds)), 0.0) if rounds.any() else 0.0
        error = float(np.sum((rest - latency * rounds) ** 2))
        best = min(best, (error, float(overlap), latency))
    return best[1], best[2]


def split_report(args, device: torch.device, dtype: torch.dtype) -> dict:
    """Time a split item's attention at every degree (shard compute alone; real groups under torchrun) and fit
    ContextParallel's half_efficiency_tokens (and, with several ranks, overlap and latency_s)."""
    world, rank = (torch.distributed.get_world_size(), torch.distributed.get_rank()) \
        if torch.distributed.is_initialized() else (1, 0)
    degrees = [int(value) for value in args.split_degrees.split(",")]
    head_dim = args.hidden // args.heads
    compute, shards, exposed = {}, {}, {}
    for degree in degrees:
        shards[degree], step = split_attention_step(args.split_length, degree, 0, args.heads, args.kv_heads, head_dim,
                                                    dtype, device)
        with isolated_attention():
            compute[degree] = time_call(step, device, args.repeats)
    for degree in (d for d in degrees if 1 < d <= world):
        _, step = split_attention_step(args.split_length, degree, rank, args.heads, args.kv_heads, head_dim, dtype,
                                       device)
        timings = torch.tensor([time_call(step, device, args.repeats) if rank < degree else 0.0], device=device)
        torch.distributed.all_reduce(timings, op=torch.distributed.ReduceOp.MAX)
        exposed[degree] = max(float(timings[0]) - compute[degree], 0.0)
    split = [d for d in degrees if d > 1]
    half, error = fit_split_efficiency([shards[d] for d in split], split, [compute[1]] * len(split),
                                       [compute[d] for d in split]) if split and 1 in compute else (None, None)
    kv_bytes = 2 * args.kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
    fields = {"half_efficiency_tokens": half, "kv_bytes_per_token": float(kv_bytes)}
    if exposed:
        fields["overlap"], fields["latency_s"] = fit_exposed(exposed, compute, args.split_length, kv_bytes,
                                                             args.intra_node_bandwidth)
        fields["intra_node_bw_bytes_per_s"] = args.intra_node_bandwidth
    if half is not None:
        ContextParallel(**{k: v for k, v in fields.items() if v is not None})  # the fit is a valid spec
    return {"length": args.split_length, "degrees": degrees, "ranks": world, "shard_tokens": shards,
            "shard_compute_seconds": compute, "exposed_seconds": exposed, "fit_rms_relative_error": error,
            "context_parallel": fields}


DRY = ["--device", "cpu", "--hidden", "16", "--heads", "2", "--kv-heads", "1", "--lengths", "8,16,32,64",
       "--repeats", "1", "--dtype", "float32", "--split-length", "256", "--split-degrees", "1,2,4,8"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=None, help="K/V heads of the split item's attention "
                                                                      "(default: --heads)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192,16384")
    parser.add_argument("--split-length", type=int, default=None,
                        help="tokens of the split item (default: the longest of --lengths)")
    parser.add_argument("--split-degrees", default="1,2,4,8")
    parser.add_argument("--intra-node-bandwidth", type=float, default=450e9, help="bytes/s per GPU and direction")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dry", action="store_true", help="tiny sizes on the CPU, one repeat: the procedure only")
    parser.add_argument("--json", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(DRY + argv if "--dry" in argv else argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("calibrate_gpu: no CUDA device here, nothing to calibrate "
              "(run it on a GPU node, or pass --device cpu to try the procedure on the CPU)")
        return 0
    lengths = [int(value) for value in args.lengths.split(",")]
    if len(lengths) < 3 or min(lengths) < 1:
        parser.error("--lengths needs at least 3 positive lengths (3 coefficients are fitted)")
    args.kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    args.split_length = max(lengths) if args.split_length is None else args.split_length
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error(f"--heads {args.heads} must divide --hidden {args.hidden}, --kv-heads {args.kv_heads} --heads")
    if "RANK" in os.environ:
        init_distributed("nccl" if args.device == "cuda" else "gloo")
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    report = block_report(args, lengths, device, dtype)
    report["split"] = split_report(args, device, dtype)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() > 0:
        return 0
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report, args)
    return 0


def block_report(args, lengths, device: torch.device, dtype: torch.dtype) -> dict:
    """Time one block at each length and fit its CostModel."""
    block = Block(args.hidden, args.heads, causal=True).to(device=device, dtype=dtype)
    seconds = [time_block(block, length, args.hidden, dtype, device, args.repeats) for length in lengths]
    fitted = CostModel.fit(lengths, seconds)
    predicted = fitted.item_costs(np.asarray(lengths))
    relative_errors = (predicted - np.asarray(seconds)) / np.asarray(seconds)
    flops = CostModel.from_transformer(num_layers=1, hidden_size=args.hidden, num_heads=args.heads, causal=True)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": args.dtype, "hidden": args.hidden, "heads": args.heads,
        "lengths": lengths, "seconds": seconds,
        "cost_model": {"per_item": fitted.per_item, "linear": fitted.linear, "quadratic": fitted.quadratic},
        "fit_max_abs_relative_error": float(np.abs(relative_errors).max()),
        "fit_rms_relative_error": float(np.sqrt(np.mean(relative_errors ** 2))),
        "achieved_flops_per_second": [float(flops(length) / s) for length, s in zip(lengths, seconds)],
    }


def print_report(report: dict, args) -> None:
    print(f"device {report['device']}, {args.dtype}, hidden {args.hidden}, heads {args.heads}")
    for length, s, rate in zip(report["lengths"], report["seconds"], report["achieved_flops_per_second"]):
        print(f"  l = {length:>6}: {s * 1e3:9.3f} ms fwd+bwd, {rate / 1e9:9.1f} GFLOP/s")
    fitted = report["cost_model"]
    print(f"CostModel(per_item={fitted['per_item']:.4g}, linear={fitted['linear']:.4g}, "
          f"quadratic={fitted['quadratic']:.4g})")
    print(f"fit error: max {report['fit_max_abs_relative_error']:.2%}, rms {report['fit_rms_relative_error']:.2%}")
    split = report["split"]
    print(f"split item of {split['length']} tokens, attention fwd+bwd per group rank ({split['ranks']} ranks):")
    for degree in split["degrees"]:
        exposed = split["exposed_seconds"].get(degree)
        print(f"  c = {degree}: shard {split['shard_tokens'][degree]} tokens, compute "
              f"{split['shard_compute_seconds'][degree] * 1e3:.3f} ms"
              + ("" if exposed is None else f", exposed communication {exposed * 1e3:.3f} ms"))
    print(f"ContextParallel fields: {split['context_parallel']}")


if __name__ == "__main__":
    sys.exit(main())
