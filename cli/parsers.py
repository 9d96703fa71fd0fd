"""The `orchmllm` command's subcommand parsers, built without the solvers behind them.

`build_parser` (`command`) needs no numpy, scipy, balancer or torch: a help's lists that would need them (the
algorithms, models, workloads, strategies, schedules) are `%(name)s` fields that `HelpFormatter` fills only
when a help is printed, and `--schedule`'s choices load on first use (`_Names`).  So a refusal that the options
alone show (`prechecks`) comes before the subcommand's module imports them (issue 24: `demo --ranks -1` took
4.3 s of CPU, most of it importing torch).
"""

from __future__ import annotations

import argparse
from importlib import import_module

from .arguments import DEFAULT_BYTES_PER_TOKEN, DEFAULT_GPUS_PER_NODE, ascii_number

DEFAULT_MODEL, DEFAULT_ITEMS_PER_RANK = "84b", "16"  # workloads only: None when not given, refused with --lengths
INT, FLOAT = ascii_number(int), ascii_number(float)  # argparse types: `-D ٢` is no 2 (lengths files refuse it)
MIXED_ONLY = {"algorithm": "auto", "transport": "flat", "costs": "calibrated", "repeats": 3}  # giants: defaults only


def _algorithms() -> str:
    from ..balancers import ALGORITHMS

    return ", ".join(ALGORITHMS)


def _models() -> str:
    from ..study.models import list_models

    return ", ".join(list_models())


def _workloads() -> str:
    from ..study.workloads import list_workloads

    return ", ".join(list_workloads())


def _strategies() -> str:
    from ..study.strategies import STRATEGIES

    return "\n".join(f"  {name:<17} {strategy.description}" for name, strategy in STRATEGIES.items())


def _schedules() -> str:
    return ", ".join(_Names("..balancers.pipeline", "SCHEDULES"))


HELP_FIELDS = {"algorithms": _algorithms, "models": _models, "workloads": _workloads, "strategies": _strategies,
               "schedules": _schedules}  # `%(name)s` in a help or description: filled when a help is printed


def _filled(text: str, escape: bool) -> str:
    """`text` with its HELP_FIELDS filled (their `%` doubled where argparse then formats it: `escape`)."""
    for name, make in HELP_FIELDS.items():
        field = f"%({name})s"
        if field in text:
            value = make()
            text = text.replace(field, value.replace("%", "%%") if escape else value)
    return text


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter of the subcommands (descriptions and examples kept as written) that fills HELP_FIELDS."""

    def _get_help_string(self, action) -> str:
        return _filled(super()._get_help_string(action), escape=True)

    def _format_text(self, text: str) -> str:
        return super()._format_text(_filled(text, escape=False))


class _Names:
    """argparse `choices` read from a module's sequence of names on first use (a `metavar` must name the
    option: argparse would list the choices when the option is added)."""

    def __init__(self, module: str, name: str):
        self._module, self._name = module, name

    def _names(self):
        return getattr(import_module(self._module, __package__), self._name)

    def __contains__(self, value) -> bool:
        return value in self._names()

    def __iter__(self):
        return iter(self._names())


def items_per_rank(args) -> str:
    """compare's --items-per-rank as given, else its default."""
    return DEFAULT_ITEMS_PER_RANK if args.items_per_rank is None else args.items_per_rank


def add_parsers(commands) -> None:
    """The subcommands `compare`, `simulate`, `demo` and `plan` (each run by its module's `run`)."""
    for add in (_add_compare, _add_simulate, _add_demo, _add_plan):
        add(commands)


def _subcommand(commands, name: str, summary: str, description: str, examples: str) -> argparse.ArgumentParser:
    """Add subcommand `name` with its one-line `summary`, `description` and `examples` epilog."""
    return commands.add_parser(name, help=summary, description=description, epilog=examples,
                               formatter_class=HelpFormatter)


COMPARE_EXAMPLES = """examples:
  orchmllm compare                                   # default tri-modal workload, D=64 and 512
  orchmllm compare --ranks 8,64,2560 --items-per-rank 4,16
  orchmllm compare --lengths lengths.csv --ranks 32 --cost 0,1,0.0005
  orchmllm compare --lengths trace.csv --column ContextTokens --ranks 64 --json
  orchmllm compare --algorithms lpt,karmarkar_karp,verl_kk --plot out/ --csv out/compare.csv
  orchmllm compare --max-tokens-per-microbatch 16384 --plot out/   # + micro-batched planning, cells.png
  orchmllm compare --workload long --context-parallel 1,2,4,8      # + the split algorithms on the LLM stage
"""


def _add_compare(commands) -> None:
    compare = _subcommand(
        commands, "compare", "compare every balancer and peers' heuristics on a workload or lengths file",
        "Balance every stage of a workload (or a file of lengths) with every registered "
        "algorithm and the peers' heuristics; report makespan against the lower bound, "
        "solve time and bytes moved within and across nodes.",
        COMPARE_EXAMPLES)
    source = compare.add_mutually_exclusive_group()
    source.add_argument("--workload", default="default", help="built-in workload: %(workloads)s "
                                                              "(default: %(default)s)")
    source.add_argument("--workload-file", metavar="FILE",
                        help="JSON lines of multimodal samples, e.g. {\"text\": 212, \"segments\": "
                             "[{\"modality\": \"image\", \"length\": 1024, \"tokens\": 256}]}")
    source.add_argument("--lengths", metavar="FILE", help="lengths file: .csv, .jsonl or .npy (one stage)")
    compare.add_argument("--model", help=f"model whose stage costs and bytes a workload uses: "
                                         f"%(models)s (default: {DEFAULT_MODEL})")
    compare.add_argument("--column", help="CSV column or JSON key holding the lengths (default: the only "
                                          "column / 'length')")
    compare.add_argument("-D", "--ranks", default="64,512", help="comma-separated data-parallel sizes D "
                                                                 "(default: %(default)s)")
    compare.add_argument("--items-per-rank", help=f"comma-separated samples per rank, workloads only "
                                                  f"(default: {DEFAULT_ITEMS_PER_RANK})")
    compare.add_argument("--algorithms", help="comma-separated algorithms, NAME+locality variants and peers "
                                              "(default: those registered as default, plus auto+locality); "
                                              "algorithms: %(algorithms)s")
    compare.add_argument("--cost", metavar="A,B,C", help="lengths files: cost f(l) = A + B*l + C*l^2 "
                                                         "(default: 0,1,0)")
    compare.add_argument("--padded", action="store_true", help="lengths files: padded rank cost count*f(max l)")
    compare.add_argument("--time-limit", type=FLOAT,
                         help="seconds an exact solver may spend per stage; also lets auto finish small "
                              "stages with the ILP (default: none, so auto is deterministic; ilp then uses "
                              "its own default)")
    compare.add_argument("--gpus-per-node", type=INT, default=DEFAULT_GPUS_PER_NODE,
                         help="GPUs per node (default: %(default)s)")
    compare.add_argument("--bytes-per-token", type=FLOAT,
                         help=f"bytes moved per length unit, for --lengths files (default: "
                              f"{DEFAULT_BYTES_PER_TOKEN:g}, hidden 4096 in bf16)")
    compare.add_argument("--max-tokens-per-microbatch", type=INT, metavar="T",
                         help="also plan the last stage (the LLM) as gradient-accumulation micro-batches of at most "
                              "T tokens per rank: ours and the reimplemented peers' micro-batching, "
                              "with Σ_m max_r cost / bound and M (and cells.png with --plot)")
    compare.add_argument("--context-parallel", metavar="DEGREES",
                         help="also plan the last stage (the LLM) with giant items splittable over context-parallel "
                              "groups of these degrees (powers of two, e.g. 1,2,4,8): no_split, static_cp, "
                              "megatron_dynamic_cp and ours, with step / bound (and cp_work.png with --plot); a degree "
                              "wider than --gpus-per-node lets every degree's groups cross nodes; split "
                              "times take the stage's cost in FLOPs on an H100 (workloads' costs are; give --cost in "
                              "FLOPs with --lengths)")
    compare.add_argument("--seed", type=INT, default=0, help="workload sampling seed (default: %(default)s)")
    compare.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    compare.add_argument("--csv", metavar="FILE", help="also write one row per run to this CSV file")
    compare.add_argument("--plot", metavar="DIR", help="write loads.png, traffic.png (and traffic_locality.png "
                                                       "with a +locality algorithm) to DIR (needs matplotlib)")

SIMULATE_EXAMPLES = """examples:
  orchmllm simulate                                  # 84b model, 2560 GPUs, default workload, batch sized by memory
  orchmllm simulate --model 18b --gpus 64,256,1024 --plot out/
  orchmllm simulate --strategies none,llm_only,ours --samples-per-rank 8 --json
  orchmllm simulate --workload-file samples.jsonl --gpus 64
  orchmllm simulate --max-tokens-per-microbatch 16384 --gpus 256,2560   # gradient accumulation under T
  orchmllm simulate --workload long --context-parallel 1,2,4,8 --plot out/  # giant items split over groups
"""


def _add_simulate(commands) -> None:
    simulate = _subcommand(
        commands, "simulate", "simulate one training step on a cluster under each balancing strategy",
        "Model one training step of a multimodal model on H100 nodes for each strategy of the "
        "OrchMLLM ablations: step time, speed-up, MFU, overhead and memory.\n\nstrategies:\n%(strategies)s",
        SIMULATE_EXAMPLES)
    simulate.add_argument("--model", default="84b", help="%(models)s (default: %(default)s)")
    simulate.add_argument("--gpus", default="2560", help="comma-separated GPU counts, nodes of 8 "
                                                         "(default: %(default)s)")
    source = simulate.add_mutually_exclusive_group()
    source.add_argument("--workload", default="default", help="built-in workload: %(workloads)s "
                                                              "(default: %(default)s)")
    source.add_argument("--workload-file", metavar="FILE", help="JSON lines of multimodal samples")
    simulate.add_argument("--samples-per-rank", type=INT, default=None,
                          help="samples per rank (default: sized by memory like a training run: the largest of "
                               "1, 2, then multiples of 4 up to 64, at which ours fits in 90%% of GPU memory; every "
                               "strategy then runs that same batch; 32 with --max-tokens-per-microbatch, 4 with "
                               "--context-parallel, 128 per replica with --pipeline-stages)")
    simulate.add_argument("--strategies", help="comma-separated strategies (default: all; none is always "
                                               "simulated as the reference)")
    simulate.add_argument("--max-tokens-per-microbatch", type=INT, metavar="T",
                          help="simulate the step as gradient-accumulation micro-batches of at most T LLM tokens "
                               "per rank, under the strategies none, verl_dynamic_bsz, megatron_hybrid, sorted_grid "
                               "and ours (default --samples-per-rank then 32)")
    simulate.add_argument("--context-parallel", metavar="DEGREES",
                          help="simulate the step with the LLM's giant items splittable over context-parallel "
                               "groups of these degrees (powers of two, e.g. 1,2,4,8; a degree wider than a node lets "
                               "every degree's groups cross nodes), under the strategies none, no_split, static_cp, "
                               "megatron_dynamic_cp and ours (default --samples-per-rank then 4)")
    _add_pipeline_arguments(simulate)
    simulate.add_argument("--seed", type=INT, default=0, help="workload sampling seed (default: %(default)s)")
    simulate.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    simulate.add_argument("--plot", metavar="DIR", help="write timeline_*.png (and scaling.png for several "
                                                        "--gpus) to DIR (needs matplotlib)")

def _add_pipeline_arguments(simulate) -> None:
    """The pipeline options of `simulate`."""
    simulate.add_argument("--pipeline-stages", type=INT, metavar="P",
                          help="simulate a pipeline-parallel step: P stages over the model's layers (encoders on "
                               "the first), gpus / P data-parallel replicas, micro-batches of at most "
                               "--max-tokens-per-microbatch tokens (default 16384), strategies ours (PP-aware), "
                               "ours_unaware, verl_dynamic_bsz, sorted_grid, dynapipe_style")
    simulate.add_argument("--schedule", choices=_Names("..balancers.pipeline", "SCHEDULES"), metavar="SCHEDULE",
                          help="pipeline schedule with --pipeline-stages: %(schedules)s (default: 1f1b)")
    simulate.add_argument("--virtual-stages", type=INT, metavar="V",
                          help="model chunks per stage with --schedule interleaved (default: 2)")

DEMO_EXAMPLES = """examples:
  orchmllm demo                                      # 4 CPU gloo ranks, 3 steps
  orchmllm demo --ranks 2 --steps 2 --dtype float64 --json
  orchmllm demo --costs flops --repeats 1            # FLOP cost models, one concurrent pass: quicker
  orchmllm demo --max-tokens-per-microbatch 2048     # gradient accumulation: micro-batches of <= 2048 tokens
  orchmllm demo --workload giants --context-parallel 1,2,4 --json   # a giant item split over rank groups
on a GPU cluster, the same training step under torchrun and NCCL:
  torchrun --nproc-per-node 8 -m orchmllm demo --json
exit code 1 when a check fails: gradients differ beyond rounding, a sample lost or duplicated,
or the isolated busy max/mean of the balanced step above 1.05 or not below the unbalanced one
(micro-batched: sum over micro-batches of the slowest rank's busy time / sum of the means);
with --workload giants: tokens or samples lost, gradients beyond rounding of the unsplit reference,
the unsplit plan's isolated busy max/mean below 1.5 (no giant) or the split plan's above the best the
degrees allow (its certified bound's max/mean) + 0.10
"""


def _add_demo(commands) -> None:
    demo = _subcommand(
        commands, "demo", "train a tiny vision+audio+text model on local gloo ranks, balanced and not",
        "Spawn CPU processes in a gloo group (or join the ranks torchrun started) and train the "
        "tiny multimodal model on the same batches with and without post-balancing: compare "
        "gradients, lost samples, exchange and planning time, and per-rank busy time, measured "
        "while every rank runs (concurrent) and replayed one rank at a time (isolated).",
        DEMO_EXAMPLES)
    demo.add_argument("--ranks", type=INT, default=4, help="processes, unless under torchrun (default: %(default)s)")
    demo.add_argument("--steps", type=INT, default=3, help="training steps (default: %(default)s)")
    demo.add_argument("--samples-per-rank", type=INT, default=16, help="samples per rank (default: %(default)s)")
    demo.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                      help="parameter dtype (default: %(default)s)")
    demo.add_argument("--seed", type=INT, default=0, help="data seed (default: %(default)s)")
    demo.add_argument("--algorithm", default=MIXED_ONLY["algorithm"],
                      help="balancer of every stage (default: %(default)s)")
    demo.add_argument("--transport", choices=("flat", "hierarchical"), default=MIXED_ONLY["transport"],
                      help="all-to-all: flat or node-wise (default: %(default)s)")
    demo.add_argument("--gpus-per-node", type=INT, default=None,
                      help="ranks per node of the node-wise transport (default: torchrun's LOCAL_WORLD_SIZE)")
    demo.add_argument("--costs", choices=("calibrated", "flops"), default=MIXED_ONLY["costs"],
                      help="stage cost models: timed on every rank, or FLOP formulas (default: %(default)s)")
    demo.add_argument("--repeats", type=INT, default=MIXED_ONLY["repeats"],
                      help="concurrent busy time = min over this many passes (default: %(default)s)")
    demo.add_argument("--replay-repeats", type=INT, default=5,
                      help="rounds of the isolated replay, every rank's work timed once in each "
                           "(default: %(default)s)")
    demo.add_argument("--max-tokens-per-microbatch", type=INT, default=None, metavar="T",
                      help="run the balanced step as gradient-accumulation micro-batches of at most T LLM tokens "
                           "per rank, compared with the unbalanced un-micro-batched step (default: one pass)")
    demo.add_argument("--workload", choices=("mixed", "giants"), default="mixed",
                      help="mixed: the vision+audio+text mix; giants: one item a step longer than a rank's share, "
                           "split over context-parallel groups (default: %(default)s)")
    demo.add_argument("--context-parallel", metavar="DEGREES", default=None,
                      help="with --workload giants: the degrees an item may be split at (default: 1,2,4 up to "
                           "--ranks)")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")


PLAN_EXAMPLES = """examples:
  orchmllm plan lengths.csv --ranks 8
  orchmllm plan lengths.npy --ranks 64 --algorithm lpt --output plan.json --quiet
  orchmllm plan lengths.jsonl --ranks 16 --padded --max-tokens 65536 --json
  orchmllm plan lengths.csv --ranks 64 --algorithm auto+locality --gpus-per-node 8
"""


def _add_plan(commands) -> None:
    plan = _subcommand(
        commands, "plan", "balance a lengths file and print or save the assignment",
        "Balance the items of a lengths file over D ranks and print the per-rank loads, "
        "or save the assignment (item -> rank) for another tool.",
        PLAN_EXAMPLES)
    plan.add_argument("lengths", metavar="FILE", help="lengths file: .csv, .jsonl or .npy")
    plan.add_argument("-D", "--ranks", type=INT, required=True, help="number of data-parallel ranks")
    plan.add_argument("--algorithm", default="auto",
                      help="algorithm or peer name; NAME+locality keeps items near the rank that listed "
                           "them, the file's items being listed rank by rank (default: %(default)s)")
    plan.add_argument("--column", help="CSV column or JSON key holding the lengths")
    plan.add_argument("--cost", metavar="A,B,C", help="cost f(l) = A + B*l + C*l^2 (default: 0,1,0)")
    plan.add_argument("--padded", action="store_true", help="padded rank cost count*f(max l)")
    plan.add_argument("--max-tokens", type=INT, help="memory cap: tokens per rank")
    plan.add_argument("--time-limit", type=FLOAT, help="seconds an exact solver may spend")
    plan.add_argument("--gpus-per-node", type=INT,
                      help=f"with a +locality algorithm: GPUs per node (default: {DEFAULT_GPUS_PER_NODE})")
    plan.add_argument("--bytes-per-token", type=FLOAT,
                      help=f"with a +locality algorithm: bytes moved per length unit (default: "
                           f"{DEFAULT_BYTES_PER_TOKEN:g})")
    plan.add_argument("--output", "-o", metavar="FILE", help="save the plan: .json (full), .csv (item,rank) "
                                                             "or .npy (assignment)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--quiet", "-q", action="store_true", help="print only the summary line")
