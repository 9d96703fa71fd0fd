"""Validators of the `orchmllm` command's option values and of the files they name; each raises UsageError naming
the option (or the file).  Solver-backed checks import their module when called: `prechecks` uses the others.

>>> int_list("64, 512", "--ranks")
[64, 512]
>>> int_list("8,x", "--ranks")
Traceback (most recent call last):
...
orchmllm.cli.errors.UsageError: --ranks must be comma-separated integers, e.g. 64,512; got '8,x'
"""

from __future__ import annotations

import argparse
import codecs
from contextlib import contextmanager
from pathlib import Path

from .errors import UsageError, one_line, usage_errors

DEFAULT_GPUS_PER_NODE = 8
DEFAULT_BYTES_PER_TOKEN = 8192.0  # a bf16 hidden state of 4096


ASCII_ONLY = "the digits 0-9 only"  # int() and float() also read other scripts' digits: `-D ٢` as 2


def ascii_number(kind):
    """An argparse `type` reading `kind` (int or float) from ASCII text only, as lengths files are read
    (`files._parse_length`); argparse names it `kind`'s way ("invalid int value: 'x'").

    >>> ascii_number(int)("12")
    12
    >>> ascii_number(int)("\u0662")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: invalid int value: '٢' (the digits 0-9 only)
    """
    def read(text: str):
        if not text.isascii():
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r} ({ASCII_ONLY})")
        return kind(text)

    read.__name__ = kind.__name__
    return read


def int_list(text: str, name: str) -> list[int]:
    """Comma-separated integers >= 1."""
    if not text.isascii():
        raise UsageError(f"{name} must be comma-separated integers of {ASCII_ONLY}, e.g. 64,512; got {text!r}")
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise UsageError(f"{name} must list at least one integer; got {text!r}")
    if not all(parts):  # '1,,2' is a slip, not the degrees 1 and 2
        raise UsageError(f"{name} must be comma-separated integers with none empty, e.g. 64,512; got {text!r}")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise UsageError(f"{name} must be comma-separated integers, e.g. 64,512; got {text!r}") from None
    bad = [value for value in values if value < 1]
    if bad:
        raise UsageError(f"{name} must be >= 1; got {bad[0]}")
    return values


def degree_list(text: str, option: str, ranks: list[int]) -> tuple[int, ...]:
    """Comma-separated context-parallel degrees: distinct powers of two, none above any of `ranks`.

    >>> degree_list("1,2,4,8", "--context-parallel", [64])
    (1, 2, 4, 8)
    >>> degree_list("1,16", "--context-parallel", [64, 8])
    Traceback (most recent call last):
    ...
    orchmllm.cli.errors.UsageError: --context-parallel 1,16: degree 16 > 8 ranks
    (a group cannot be larger than the ranks)
    """
    from ..balancers.context_parallel.spec import as_degrees

    values = int_list(text, option)
    with usage_errors(f"{option} {text}"):
        degrees = as_degrees(values)
    if degrees[-1] > min(ranks):
        raise UsageError(f"{option} {text}: degree {degrees[-1]} > {min(ranks)} ranks (a group cannot be larger "
                         f"than the ranks)")
    return degrees


def rank_count(value: int, option: str) -> int:
    """A rank (or GPU) count: >= 1 and at most the balancers' 2**20 (`problem.MAX_RANKS`)."""
    from ..balancers.problem import as_num_ranks

    positive_int(value, option)
    with usage_errors(f"{option} {value}"):
        return as_num_ranks(value)


def rank_list(text: str, option: str) -> list[int]:
    """Comma-separated rank (or GPU) counts, each as `rank_count` checks it."""
    return [rank_count(value, option) for value in int_list(text, option)]


def batch_size(num_ranks: int, samples_per_rank: int, option: str) -> None:
    """UsageError naming `option` when a step of `num_ranks` × `samples_per_rank` samples is too large to draw."""
    from ..study.compare import check_batch_size

    with usage_errors(f"{option} {samples_per_rank}"):
        check_batch_size(num_ranks, samples_per_rank)


def positive_int(value: int | None, name: str) -> None:
    """UsageError unless `value` (when given) is >= 1."""
    if value is not None and value < 1:
        raise UsageError(f"{name} must be >= 1; got {value}")


def check_seed(seed: int) -> None:
    """UsageError unless --seed is one numpy's generators take (an integer >= 0)."""
    if seed < 0:
        raise UsageError(f"--seed must be >= 0; got {seed}")


def name_list(text: str | None, option: str) -> list[str] | None:
    """The comma-separated names of `text` (None when not given); UsageError when it lists none."""
    if text is None:
        return None
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise UsageError(f"{option} must list at least one name; got {text!r}")
    return names


def strategy_names(text: str | None, known, kind: str):
    """The strategies --strategies names (default: all of `known`); UsageError naming the first unknown one."""
    strategies = name_list(text, "--strategies") or known
    unknown = [name for name in strategies if name not in known]
    if unknown:
        raise UsageError(f"unknown {kind} strategy {unknown[0]!r} in --strategies; choose from {', '.join(known)}")
    return strategies


def check_time_limit(seconds: float | None) -> None:
    """--time-limit checked as the solvers check `time_limit` (`as_time_limit`), named by the flag."""
    from ..balancers.problem import as_time_limit

    with usage_errors("--time-limit"):
        as_time_limit(seconds)


def cost_model(text: str | None):
    """--cost PER_ITEM,LINEAR,QUADRATIC (default: f(l) = l), a CostModel."""
    from ..balancers import CostModel

    if text is None:
        return CostModel()
    try:
        if not text.isascii():
            raise ValueError(ASCII_ONLY)
        per_item, linear, quadratic = (float(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"--cost must be three numbers PER_ITEM,LINEAR,QUADRATIC ({ASCII_ONLY}), e.g. 0,1,0.001; "
                         f"got {text!r}") from None
    with usage_errors(f"--cost {text!r}"):
        return CostModel(per_item=per_item, linear=linear, quadratic=quadratic)


def file_cost(text: str | None, lengths, padded: bool):
    """--cost as a model (`cost_model`) whose costs of a lengths file's items stay finite, checked as
    balance() checks them but named by the flag (a model overflowing float64 was a traceback in compare)."""
    from ..balancers.problem import item_costs_of

    cost = cost_model(text)
    with usage_errors(f"--cost {text!r}"):
        item_costs_of(lengths, cost, None, padded)
    return cost


def algorithms(text: str | None, option: str = "--algorithms") -> list[str]:
    """The algorithm, +locality and peer names of `text`, or compare's default set."""
    from ..study.compare import algorithm_names

    with usage_errors(option):
        return algorithm_names(text)


def topology(num_ranks: int, gpus_per_node: int):
    """The whole-node cluster of `num_ranks` GPUs that compare and plan use."""
    from ..study.compare import compare_topology

    positive_int(gpus_per_node, "--gpus-per-node")
    try:
        return compare_topology(num_ranks, gpus_per_node)
    except ValueError as error:
        raise UsageError(f"--ranks {num_ranks}: {one_line(error)}; choose D in whole nodes or set "
                         f"--gpus-per-node") from None


def model_stages(model: str):
    """The stages of a named model; UsageError for an unknown name."""
    from ..study.models import default_stages

    with usage_errors(f"--model {model}"):
        return default_stages(model)


def check_workload_source(args, stages) -> int | None:
    """UsageError for an unknown workload, or a workload file with a bad line anywhere in it.

    Returns the number of samples in the workload file (None for a built-in workload).
    """
    from ..study.workloads import check_workload_file, list_workloads

    if args.workload_file is not None:
        require_file(args.workload_file, "workload file")
        with usage_errors(str(args.workload_file)), utf8_text(args.workload_file):
            return check_workload_file(args.workload_file, modalities=[s.modality for s in stages if not s.is_llm])
    if args.workload not in list_workloads():
        raise UsageError(f"--workload {args.workload}: unknown workload {args.workload!r}; choose one of "
                         f"{', '.join(list_workloads())} "
                         f"or pass --lengths FILE / --workload-file FILE")
    return None


def check_file_holds(args, num_ranks: int, samples_per_rank: int, available: int | None, option: str) -> None:
    """UsageError led by `option` (the flag that gave `samples_per_rank`, "(the default)" where the user gave
    none) when the workload file's `available` samples are fewer than `num_ranks` × `samples_per_rank`."""
    if args.workload_file is not None and num_ranks * samples_per_rank > available:
        most = available // num_ranks
        raise UsageError(f"{option}: workload file {args.workload_file} has {available} samples; {num_ranks} ranks × "
                         f"{samples_per_rank} samples per rank need {num_ranks * samples_per_rank}: "
                         + (f"at most {most} per rank" if most else "fewer than one per rank")
                         + f" on {num_ranks} ranks")


def workload_batch(args, num_ranks: int, samples_per_rank: int, available: int | None, option: str):
    """The batch of a validated workload source with `available` samples (`check_workload_source`); `option`
    the flag that gave `samples_per_rank` (`check_file_holds`)."""
    from ..study.workloads import load_workload_file, sample_workload

    if args.workload_file is None:
        return sample_workload(args.workload, num_ranks, samples_per_rank, args.seed)
    check_file_holds(args, num_ranks, samples_per_rank, available, option)
    return load_workload_file(args.workload_file, samples_per_rank, num_ranks)


def require_file(path, what: str) -> None:
    """UsageError unless `path` names an existing regular file (`what` says which, e.g. "workload file"):
    not found, or what it is instead (a directory, a FIFO, a device such as /dev/null).

    >>> require_file("/", "lengths file")
    Traceback (most recent call last):
    ...
    orchmllm.cli.errors.UsageError: lengths file '/' is a directory, not a regular file
    """
    path = Path(path)
    if path.is_file():
        return
    if not path.exists():
        raise UsageError(f"{what} {str(path)!r} not found")
    kinds = ((path.is_dir, "a directory"), (path.is_fifo, "a FIFO"), (path.is_char_device, "a character device"),
             (path.is_block_device, "a block device"), (path.is_socket, "a socket"))
    kind = next((name for test, name in kinds if test()), "something else")
    raise UsageError(f"{what} {str(path)!r} is {kind}, not a regular file")


@contextmanager
def utf8_text(path):
    """A text file read in the block that is not UTF-8 as a UsageError saying what it is and what to do:
    UTF-16 by its byte-order mark (a spreadsheet's "Unicode text"), else the first byte UTF-8 cannot
    read (Latin-1, another code page, or binary)."""
    try:
        yield
    except UnicodeDecodeError as error:
        if error.object[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
            raise UsageError(f"{path}: UTF-16 text (its byte-order mark says so); save it as UTF-8 (a spreadsheet's "
                             f"CSV UTF-8)") from None
        raise UsageError(f"{path}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start}); "
                         f"save it as UTF-8") from None
