"""The encoder contract under DDP and FSDP2 (`fully_shard`) on real gloo ranks: an encoder that
returns early on empty input is named on every rank before any gradient is reduced; one that
keeps the contract trains to the single-process gradient."""

import functools
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.orchestrator.samples import Sample, Segment
from orchmllm.orchestrator.stages import Stage
from orchmllm.runtime import EncoderContractError, MultiStageRuntime, normalize_loss
from orchmllm.runtime.encoders import checked_call, unseen_module
from orchmllm.runtime.launch import run_processes

STAGES = (Stage("vision", "image", CostModel(per_item=1, linear=1)), Stage("llm", "llm", CostModel(linear=1)))
TEXT = {0: [5, 4], 1: [3, 6], 2: [2, 7], 3: [6, 3]}  # text tokens of each rank's samples
IMAGE_ROWS = 3  # rank 0's first sample holds the batch's only image: three ranks encode nothing
COLLECTIVE_TIMEOUT_S = 20


class Encoder(nn.Module):
    def __init__(self, early_return: bool):
        super().__init__()
        self.early_return = early_return
        self.proj = nn.Linear(4, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, patches, lengths):
        if self.early_return and patches.shape[0] == 0:
            return patches.new_zeros(0, 8)  # the natural thing to write, which leaves proj and out unused
        return self.out(torch.tanh(self.proj(patches)))


class Model(nn.Module):
    """The runtime runs inside the root module's forward, as a DDP or FSDP2 training loop calls it; each
    token sees its sample's earlier tokens (a running sum), so the text's loss depends on the image.
    `form` is how the encoder is handed to the runtime (a key of FORMS)."""

    def __init__(self, early_return: bool, form: str = "module"):
        super().__init__()
        self.vision = Encoder(early_return)
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)
        self.form = form

    def forward(self, runtime, routes, moved):
        packed = runtime.forward(routes, moved, encoders={"image": FORMS[self.form](self.vision)},
                                 text_embedding=self.embed)
        labels = packed.scatter_text(moved.text["labels"], -100)
        mixed = torch.cat([part.cumsum(0) for part in packed.embeddings.split(packed.sample_lengths.tolist())])
        return F.cross_entropy(self.head(mixed), labels, ignore_index=-100, reduction="sum")  # text after the image


FORMS = {"module": lambda vision: vision, "lambda": lambda vision: lambda patches, lengths: vision(patches, lengths),
         "partial": lambda vision: functools.partial(vision.forward)}


def samples_of(rank):
    return [Sample(text=text, segments=(Segment("image", IMAGE_ROWS, IMAGE_ROWS),) if (rank, k) == (0, 0) else (),
                   source=rank, id=10 * rank + k) for k, text in enumerate(TEXT[rank])]


def tensors_of(rank):
    generator = torch.Generator().manual_seed(rank)
    tokens = sum(TEXT[rank])
    text = {"input_ids": torch.randint(0, 16, (tokens,), generator=generator),
            "labels": torch.randint(0, 16, (tokens,), generator=generator)}
    image = torch.randn(IMAGE_ROWS if rank == 0 else 0, 4, generator=generator, dtype=torch.float64)
    return text, {"image": image}


def train_step(model, runtime, rank):
    routes = runtime.plan(samples_of(rank))
    text, inputs = tensors_of(rank)
    [micro] = runtime.microbatches(routes, runtime.dispatch(routes, text=text, inputs=inputs))
    loss_sum = model(runtime, micro.routes, micro.data)
    normalize_loss(loss_sum, int(micro.data.text["labels"].numel())).backward()


def contract_job(rank, size, wrapper, early_return, form="module"):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Model(early_return, form).double()
    if wrapper == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model)
    else:
        fully_shard(model.vision)
        wrapped = fully_shard(model)
    runtime = MultiStageRuntime(STAGES)
    try:
        for _ in range(2):
            train_step(wrapped, runtime, rank)
    except EncoderContractError as error:
        return "EncoderContractError", str(error)
    grads = [p.grad.full_tensor() if wrapper == "fsdp2" else p.grad for p in model.parameters()]
    return "trained", [g.numpy().copy() for g in grads]


def reference_gradients():
    """Two steps of the whole batch in this process (no process group: the runtime's one-rank path)."""
    torch.manual_seed(0)
    model = Model(early_return=False).double()
    runtime = MultiStageRuntime(STAGES)
    samples = [sample for rank in TEXT for sample in samples_of(rank)]
    tensors = [tensors_of(rank) for rank in TEXT]
    text = {key: torch.cat([t[key] for t, _ in tensors]) for key in ("input_ids", "labels")}
    inputs = {"image": torch.cat([i["image"] for _, i in tensors])}
    for _ in range(2):
        routes = runtime.plan(samples)
        [micro] = runtime.microbatches(routes, runtime.dispatch(routes, text=text, inputs=inputs))
        normalize_loss(model(runtime, micro.routes, micro.data), int(text["labels"].numel())).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_regression_an_encoder_returning_early_on_empty_input_is_named_on_every_rank(wrapper):
    """Cause: the runtime calls every encoder on every rank, with empty inputs on ranks holding none of
    its modality; an early return left its parameters unused there, and DDP's gradients came out off
    by a relative 2.16 with no error (the reducer failed a step later), FSDP2's reduce-scatter aborted
    gloo.  Now the first forward names the encoder, the rank and the parameters on every rank."""
    outcomes = run_processes(contract_job, 4, args=(wrapper, True), timeout_s=90,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == "EncoderContractError", o.value
        assert re.search(r"ranks \[\d, \d, \d\] disagree with ranks \[\d\]", message)  # the 3 with no image
        assert "encoder 'image' on rank" in message and "(0 items)" in message
        assert "out.bias, out.weight, proj.bias, proj.weight" in message
        assert "instead of returning early" in message
    finished = [o.seconds for o in outcomes]  # no rank waited for the collective timeout (load delays only the start)
    assert max(finished) - min(finished) < COLLECTIVE_TIMEOUT_S


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_an_encoder_keeping_the_contract_trains_to_the_single_process_gradient(wrapper):
    """The check sees FSDP2's unsharded parameters in the graph (no false alarm) and changes nothing."""
    outcomes = run_processes(contract_job, 4, args=(wrapper, False), timeout_s=90,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok and o.value[0] == "trained" for o in outcomes), [o.error or o.value for o in outcomes]
    reference = reference_gradients()
    for o in outcomes:
        worst = max(float(np.abs(g - r).max() / np.abs(r).max()) for g, r in zip(o.value[1], reference))
        assert worst <= 1e-12


def test_regression_an_encoder_under_functools_partial_went_unchecked():
    """Cause: `module_of` saw no module in `functools.partial(vision.forward)`, so the early return went
    unnoticed and DDP's gradients came out off by a relative 2.3 with no error."""
    outcomes = run_processes(contract_job, 4, args=("ddp", True, "partial"), timeout_s=90,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert o.value[0] == "EncoderContractError" and "out.bias, out.weight, proj.bias, proj.weight" in o.value[1]


def test_regression_an_encoder_passed_as_a_lambda_went_unchecked():
    """Cause: a lambda calling the encoder hides its module, so `check_encoders` checked nothing and DDP's
    gradients came out off by a relative 2.4 with no error (rank 2 died on gloo's 'Connection closed').
    Such an encoder is now refused on every rank, saying how to pass it."""
    outcomes = run_processes(contract_job, 4, args=("ddp", True, "lambda"), timeout_s=90,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert o.value[0] == "EncoderContractError", o.value
        assert ("encoder 'image' is a function, not an nn.Module, a bound method of one or a functools.partial of "
                "either, so the runtime cannot find its parameters") in o.value[1]
        assert "pass the module itself or its bound method" in o.value[1] and "check_encoders=False" in o.value[1]


def test_a_wrapper_naming_its_module_is_checked_and_a_lambda_refused():
    encoder = Encoder(early_return=True).double()
    empty = torch.zeros(0, 4, dtype=torch.float64)

    def recorded(patches, lengths):  # as the demo's WorkRecorder wraps each encoder
        return encoder(patches, lengths)
    recorded.__wrapped__ = encoder
    assert checked_call(recorded, empty, [])[1] == ["out.bias", "out.weight", "proj.bias", "proj.weight"]
    assert unseen_module("encoder 'image'", recorded) is None
    assert unseen_module("encoder 'image'", functools.partial(encoder)) is None
    with pytest.raises(EncoderContractError, match=r"encoder 'image' is a function, not an nn.Module"):
        raise unseen_module("encoder 'image'", lambda patches, lengths: encoder(patches, lengths))


def test_checked_call_names_unused_parameters_and_trusts_what_it_cannot_see():
    encoder = Encoder(early_return=True).double()
    empty = torch.zeros(0, 4, dtype=torch.float64)
    assert checked_call(encoder, empty, [])[1] == ["out.bias", "out.weight", "proj.bias", "proj.weight"]
    assert checked_call(encoder.forward, empty, [])[1] == ["out.bias", "out.weight", "proj.bias", "proj.weight"]
    assert checked_call(encoder, torch.ones(2, 4, dtype=torch.float64), [2])[1] == []
    assert checked_call(lambda x, lengths: encoder(x, lengths), empty, [])[1] == []  # no module to check
    with torch.no_grad():
        assert checked_call(encoder, empty, [])[1] == []  # no backward, no reduction to spoil
    frozen = Encoder(early_return=True).requires_grad_(False)
    assert checked_call(frozen, empty.float(), [])[1] == []


class RootWithMethod(Model):
    def encode_image(self, patches, lengths):  # the HF `get_image_features` pattern: a method of the root
        return self.vision(patches, lengths)


def test_regression_a_root_models_encoder_method_was_refused_for_the_llms_parameters():
    """Cause: a bound method's whole module (here the root, LLM included) was taken as the encoder's, so a
    correct `model.encode_image` was refused for not using `embed` and `head`; a method may use part of
    its module, and is flagged only when its output reaches none of it (the early return)."""
    empty = torch.zeros(0, 4, dtype=torch.float64)
    assert checked_call(RootWithMethod(early_return=False).double().encode_image, empty, [])[1] == []
    lax = RootWithMethod(early_return=True).double()
    assert checked_call(lax.encode_image, empty, [])[1] == sorted(name for name, _ in lax.named_parameters())
    assert checked_call(lax.encode_image, torch.ones(2, 4, dtype=torch.float64), [2])[1] == []



class Language(nn.Module):
    """An LLM holding its token embedding and its vision tower (HF's Qwen2-VL shape)."""

    def __init__(self):
        super().__init__()
        self.vision = Encoder(early_return=False)
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, embeddings):
        return self.head(embeddings)


class Root(nn.Module):
    """The root, whose forward calls the runtime on the LLM's vision tower and embedding, outside the LLM's
    forward, as the README's FSDP2 pattern does."""

    def __init__(self):
        super().__init__()
        self.llm = Language()

    def forward(self, runtime, routes, moved):
        packed = runtime.forward(routes, moved, encoders={"image": self.llm.vision}, text_embedding=self.llm.embed)
        labels = packed.scatter_text(moved.text["labels"], -100)
        return F.cross_entropy(self.llm(packed.embeddings), labels, ignore_index=-100, reduction="sum")


def sharded_slip_job(rank, size, sharded):
    """`fully_shard` on each module of `sharded` (paths in `Root`), then on the root; one step."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Root().double()
    for path in sharded:
        fully_shard(model.get_submodule(path))
    fully_shard(model)
    try:
        train_step(model, MultiStageRuntime(STAGES), rank)
    except RuntimeError as error:
        return type(error).__name__, str(error)
    return "trained", ""


@pytest.mark.parametrize("sharded, what", [(("llm",), "encoder 'image' (Encoder)"),
                                           (("llm.vision", "llm"), "`text_embedding` (Embedding)")],
                         ids=["llm_holding_the_encoder", "llm_holding_the_embedding"])
def test_regression_a_part_the_runtime_calls_sharded_only_with_its_holder_gave_torchs_dtensor_error(sharded, what):
    """Cause: FSDP2 gathers a module's parameters only inside that module's own forward; the runtime
    calls an encoder or the text embedding (`llm.embed` with only `fully_shard(llm)`) outside it, and
    every rank ended in torch's "aten.embedding.default got mixed torch.Tensor and DTensor" (or
    "aten.addmm.default" for the encoder), naming neither the part nor the fix.  Sharded on its own, it trains."""
    outcomes = run_processes(sharded_slip_job, 2, args=(sharded,), timeout_s=90,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == "RuntimeError" and message.startswith(f"{what} ran on FSDP2-sharded parameters"), o.value
        assert "`fully_shard` it on its own" in message and "mixed torch.Tensor and DTensor" in message
    fixed = run_processes(sharded_slip_job, 2, args=(("llm.vision", "llm.embed", "llm"),), timeout_s=90,
                          collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok and o.value[0] == "trained" for o in fixed), [o.error or o.value for o in fixed]


class TowerAndProjector(nn.Module):
    """A root model's `encode_image` runs its tower then its projector (HF's `get_image_features`); `skip`: on
    empty input it skips the tower and keeps the projector."""

    def __init__(self, skip: bool):
        super().__init__()
        self.tower, self.projector, self.skip = Encoder(early_return=False), nn.Linear(8, 8), skip

    def encode_image(self, patches, lengths):
        if self.skip and patches.shape[0] == 0:
            return self.projector(patches.new_zeros(0, 8))
        return self.projector(self.tower(patches, lengths))


@pytest.mark.parametrize("skip", [True, False], ids=["tower skipped when empty", "tower run when empty"])
def test_regression_a_method_skipping_its_tower_but_keeping_its_projector_on_empty_input_passed(skip):
    """Cause (probe10 P10-11): a method of a module (which may use part of it) was flagged only when its output
    reached none of the module, so `encode_image` skipping its tower on empty input but keeping its projector
    passed, and under DDP the tower got no gradient on that rank (0.115 off).  An empty call must now reach what
    the method's first call with items reached (one process: a step with the image, then one without)."""
    root = TowerAndProjector(skip).double()
    runtime = MultiStageRuntime(STAGES)
    embed = nn.Embedding(16, 8).double()
    for with_image in (True, False):
        samples = [Sample(text=4, segments=(Segment("image", IMAGE_ROWS, IMAGE_ROWS),) if with_image else (),
                          source=0, id=0)]
        text = {"input_ids": torch.zeros(4, dtype=torch.int64)}
        image = torch.ones(IMAGE_ROWS if with_image else 0, 4, dtype=torch.float64)
        routes = runtime.plan(samples)
        [micro] = runtime.microbatches(routes, runtime.dispatch(routes, text=text, inputs={"image": image}))
        if skip and not with_image:
            unused = r"tower\.out\.bias, tower\.out\.weight, tower\.proj\.bias, tower\.proj\.weight"
            with pytest.raises(EncoderContractError, match=r"does not depend on its parameters " + unused):
                runtime.forward(micro.routes, micro.data, encoders={"image": root.encode_image}, text_embedding=embed)
            return
        runtime.forward(micro.routes, micro.data, encoders={"image": root.encode_image}, text_embedding=embed)


def test_regression_a_frozen_tower_made_every_later_empty_call_of_its_method_refused():
    """Cause (review7 R7-02): an empty call must reach what the method's first call with items reached, and that
    set was kept with parameters frozen since (a later training stage, LoRA), which no call can reach: after
    `tower.requires_grad_(False)` every empty call of a method running everything was refused."""
    root = TowerAndProjector(False).double()
    patches = torch.ones(IMAGE_ROWS, 4, dtype=torch.float64)
    _, unused, reached = checked_call(root.encode_image, patches, torch.tensor([IMAGE_ROWS]))
    assert not unused and {"tower.proj.weight", "projector.weight"} <= reached
    root.tower.requires_grad_(False)
    empty = torch.ones(0, 4, dtype=torch.float64)
    assert checked_call(root.encode_image, empty, torch.tensor([], dtype=torch.int64), expected=reached)[1] == []


class CheckpointFunction(torch.autograd.Function):
    """A third-party reentrant checkpoint (Megatron-LM's and DeepSpeed's share the name and the shape)."""

    @staticmethod
    def forward(ctx, run, *args):
        ctx.run_function = run  # the name torch's, Megatron-LM's and DeepSpeed's give it
        ctx.save_for_backward(*args)
        with torch.no_grad():
            return run(*args)

    @staticmethod
    def backward(ctx, *grads):
        args = [arg.detach().requires_grad_() for arg in ctx.saved_tensors]
        with torch.enable_grad():
            torch.autograd.backward(ctx.run_function(*args), grads)
        return (None, *(arg.grad for arg in args))


def test_regression_a_third_party_reentrant_checkpoint_made_its_parameters_unreached():
    """Cause (review7 R7-01): the modules a reentrant checkpoint ran were recorded only under frames of torch's own
    checkpoint, while the walk stops at any `CheckpointFunctionBackward`: inside Megatron-LM's or DeepSpeed's
    checkpoint every parameter read as left out, a false alarm on every rank.  A checkpoint whose forward ran no
    recorded module cannot be judged (cannot tell), not flagged."""
    import weakref

    from orchmllm.runtime.encoders import reached_leaves, recording

    block, head = nn.Linear(4, 4), nn.Linear(4, 1)
    model = nn.ModuleDict({"block": block, "head": head})
    wanted = {name for name, _ in model.named_parameters()}
    x = torch.randn(3, 4, requires_grad=True)
    hidden = weakref.WeakKeyDictionary()
    with recording(model, hidden) as names:
        loss = head(CheckpointFunction.apply(block, x)).sum()
    assert reached_leaves([loss], names, wanted, hidden) == (wanted, False)
    hidden, weight = weakref.WeakKeyDictionary(), block.weight
    with recording(model, hidden) as names:
        direct = head(CheckpointFunction.apply(lambda t: t @ weight, x)).sum()  # no module runs inside
    assert reached_leaves([direct], names, wanted, hidden) == ({"head.weight", "head.bias"}, True)  # cannot tell


def test_regression_another_models_reentrant_checkpoint_switched_the_check_off():
    """Cause (review7 R7-19, from 279b90f): a checkpoint the recording saw no module of counted as 'cannot tell',
    and with nested `accumulate` blocks the LLM's checkpoint runs modules of the LLM only, so the vision model's
    check was off whenever the LLM was checkpointed: a tower skipped on empty input passed silently.  A checkpoint
    that ran another model's modules is seen and hides none of this model's; a checkpoint inside a checkpointed
    function credits its modules to both (R7-20: the outer one alone is in the graph)."""
    import weakref

    from torch.utils.checkpoint import checkpoint

    from orchmllm.runtime.encoders import reached_leaves, recording

    block, head, tower, proj = (nn.Linear(4, 4) for _ in range(4))
    llm, vision = nn.ModuleDict({"block": block, "head": head}), nn.ModuleDict({"tower": tower, "proj": proj})
    hidden_llm, hidden_vision = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()
    with recording(llm, hidden_llm) as names_llm, recording(vision, hidden_vision) as names_vision:
        embedded = proj(torch.randn(0, 4))  # the tower skipped on empty input
        loss = head(checkpoint(block, embedded, use_reentrant=True)).sum()
    assert reached_leaves([loss], names_vision, set(dict(vision.named_parameters())), hidden_vision) == \
        ({"proj.weight", "proj.bias"}, False)
    assert reached_leaves([loss], names_llm, set(dict(llm.named_parameters())), hidden_llm) == \
        (set(dict(llm.named_parameters())), False)
    hidden = weakref.WeakKeyDictionary()
    with recording(llm, hidden) as names:
        inner = lambda x: checkpoint(block, x, use_reentrant=True)  # noqa: E731
        loss = head(checkpoint(inner, torch.randn(3, 4, requires_grad=True), use_reentrant=True)).sum()
    assert reached_leaves([loss], names, set(dict(llm.named_parameters())), hidden) == \
        (set(dict(llm.named_parameters())), False)


class RecomputeFunction(torch.autograd.Function):
    """A framework's own reentrant recompute, under another name than `CheckpointFunction`."""

    forward, backward = CheckpointFunction.forward, CheckpointFunction.backward


class Trunk(nn.Module):
    def __init__(self, skip_empty: bool):
        super().__init__()
        self.skip_empty, self.lin1, self.lin2 = skip_empty, nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        hidden = torch.tanh(self.lin1(x))
        return hidden if self.skip_empty and x.shape[0] == 0 else self.lin2(hidden)


class CheckpointedNet(nn.Module):
    """`head(recompute(self.embed, x))`: `embed` adds a parameter of the root directly, then runs the trunk."""

    def __init__(self, skip_empty: bool, function=CheckpointFunction):
        super().__init__()
        self.pos, self.trunk, self.head, self.function = nn.Parameter(torch.zeros(4)), Trunk(skip_empty), \
            nn.Linear(4, 1), function

    def embed(self, x):
        return self.trunk(x + self.pos)

    def forward(self, x):
        return self.head(self.function.apply(self.embed, x))


@pytest.mark.parametrize("function", [CheckpointFunction, RecomputeFunction], ids=["CheckpointFunction", "recompute"])
@pytest.mark.parametrize("rows", [3, 0], ids=["items", "empty"])
def test_regression_a_reentrant_checkpoint_credited_every_parameter_below_a_module_it_entered(function, rows):
    """Causes (probe11 P11-01, P11-02, P11-06): a module entered inside a reentrant checkpoint credited its whole
    subtree, so a trunk skipping `lin2` on empty input passed (silently wrong under DDP); a parameter the
    checkpointed method uses directly (`x + self.pos`) was named unused; a recompute Function under another name
    than `CheckpointFunction` had every parameter inside it named unused.  Each module that runs credits its own
    parameters, the checkpointed method's module its own too, and any autograd Function's forward is recorded."""
    import weakref

    from orchmllm.runtime.encoders import reached_leaves, recording

    for skip in (False, True):
        model = CheckpointedNet(skip, function)
        hidden, wanted = weakref.WeakKeyDictionary(), set(dict(model.named_parameters()))
        with recording(model, hidden) as names:
            loss = model(torch.randn(rows, 4, requires_grad=True)).sum()
        left_out = wanted - reached_leaves([loss], names, wanted, hidden)[0]
        assert left_out == ({"trunk.lin2.weight", "trunk.lin2.bias"} if skip and rows == 0 else set())


class SkippingEncoder(nn.Module):
    """Two layers, the second skipped on empty input (a broken encoder)."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(4, 8).double(), nn.Linear(8, 8).double()

    def forward(self, x):
        hidden = self.first(x)
        return hidden if x.shape[0] == 0 else self.second(hidden)


@pytest.mark.filterwarnings("ignore:Using `torch.compile")  # torch's: global hooks fire for its wrapper too
def test_regression_a_compiled_encoder_failed_in_dynamo_tracing_the_checks_hooks():
    """Cause (probe15 P15-08): `checked_call`'s global module hooks (closures) were traced into a `torch.compile`d
    encoder's forward and dynamo failed ('UnspecializedNNModuleVariable ... is already tracked for mutation'): a
    compiled encoder could not run with `check_encoders=True`, the default.  The hooks run eagerly
    (`torch.compiler.disable`); the check still names what a compiled encoder leaves out."""
    torch.manual_seed(0)
    compiled = torch.compile(SkippingEncoder())
    _, unused, reached = checked_call(compiled, torch.randn(5, 4, dtype=torch.float64))
    assert unused == [] and reached == {f"_orig_mod.{layer}.{name}" for layer in ("first", "second")
                                        for name in ("weight", "bias")}
    _, unused, _ = checked_call(compiled, torch.randn(0, 4, dtype=torch.float64))
    assert unused == ["_orig_mod.second.bias", "_orig_mod.second.weight"]
