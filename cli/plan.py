"""`orchmllm plan`: balance one lengths file and print or save the assignment."""

from __future__ import annotations

from ..balancers.validation import SizeLimitError
from ..study.compare import LOCALITY_SUFFIX, file_stages, plan_for, plugin_failure
from .arguments import (DEFAULT_BYTES_PER_TOKEN, DEFAULT_GPUS_PER_NODE, algorithms as algorithm_names,
                        check_time_limit, file_cost, rank_count, topology as checked_topology)
from .errors import PluginFailure, UsageError, naming_flag, one_line, usage_errors
from .files import check_not_input, check_plan_path, load_lengths, save_plan
from .render import print_json, print_plan, print_written, progress, to_json_text


def _flags(args) -> dict[str, str]:
    """The options of `plan` by the name of the balancers' argument they give (see `naming_flag`)."""
    return {"max_tokens_per_rank": f"--max-tokens {args.max_tokens}", "num_ranks": f"--ranks {args.ranks}"}


def _cap_error(error, args) -> UsageError:
    return UsageError(f"{naming_flag(error, _flags(args))} (smallest cap known to be needed: --max-tokens "
                      f"{error.min_cap})")


def _check_applies(option_value: str, name: str, padded: bool) -> None:
    """UsageError when algorithm `name` balances only the other cost (padded or unpadded) than --padded says."""
    from ..balancers import algorithms, get_algorithm

    if get_algorithm(name.removesuffix(LOCALITY_SUFFIX)).solves(padded):
        return
    kind, fix = ("unpadded", "drop --padded") if padded else ("padded", "add --padded")
    able = ", ".join(record.name for record in algorithms(padded=padded))
    raise UsageError(f"--algorithm {option_value}: algorithm {name.removesuffix(LOCALITY_SUFFIX)!r} balances "
                     f"{kind} batches only; {fix}, or choose one of {able}")


def run(args) -> int:
    """`orchmllm plan`: balance one lengths file and print or save the assignment."""
    from ..balancers import InfeasibleError, get_algorithm
    from ..balancers.problem import make_problem

    check_time_limit(args.time_limit)
    rank_count(args.ranks, "--ranks")
    lengths = load_lengths(args.lengths, args.column)
    name = algorithm_names(args.algorithm, "--algorithm")
    if len(name) != 1:
        raise UsageError(f"--algorithm takes one name; got {args.algorithm!r}")
    _check_applies(args.algorithm, name[0], args.padded)
    if args.output is not None:
        check_plan_path(args.output)
        check_not_input("--output", args.output, [args.lengths])
    cost = file_cost(args.cost, lengths, args.padded)
    bytes_per_token = DEFAULT_BYTES_PER_TOKEN if args.bytes_per_token is None else args.bytes_per_token
    with usage_errors("--bytes-per-token"):
        stage = file_stages(lengths, args.ranks, cost, args.padded, bytes_per_token)[0]
    topology = None
    if name[0].endswith(LOCALITY_SUFFIX):
        topology = checked_topology(args.ranks, DEFAULT_GPUS_PER_NODE if args.gpus_per_node is None
                                    else args.gpus_per_node)
    for option, value in (("--gpus-per-node", args.gpus_per_node), ("--bytes-per-token", args.bytes_per_token)):
        if value is not None and topology is None:
            raise UsageError(f"{option} applies only with a +locality algorithm (--algorithm NAME{LOCALITY_SUFFIX}); "
                             f"--algorithm {args.algorithm} does not look at where items come from")
    try:
        make_problem(stage.lengths, args.ranks, cost=stage.cost, padded=stage.padded,
                     max_tokens_per_rank=args.max_tokens)  # the balancers' own input checks, before any work
    except InfeasibleError as error:
        raise _cap_error(error, args) from None
    except (ValueError, TypeError) as error:
        raise UsageError(naming_flag(error, _flags(args))) from None
    try:
        with progress(not args.json, 1, f"balancing {lengths.size} items on {args.ranks} ranks") as advance:
            plan = plan_for(name[0], stage, args.ranks, args.time_limit, topology, args.max_tokens)
            advance()
    except InfeasibleError as error:  # a cap only the solve itself finds too small
        raise _cap_error(error, args) from None
    except SizeLimitError as error:  # an exact model too large for these items
        raise UsageError(f"--algorithm {args.algorithm}: {one_line(error)}") from None
    except RuntimeError as error:  # a plugin's kernel raised or returned a broken plan (orchmllm's own: a bug)
        raise PluginFailure(plugin_failure(name[0], error)) from None
    payload = plan.to_json()
    if args.output is not None:
        save_plan(plan, to_json_text(payload), args.output)
    if args.json:
        print_json(payload)
        return 0
    print_plan(plan, args.lengths, args.quiet, str(get_algorithm(name[0].removesuffix(LOCALITY_SUFFIX)).kind))
    if args.output is not None:
        print_written([args.output])
    return 0
