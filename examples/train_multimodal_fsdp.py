"""Train a vision + audio + text model under FSDP2, torchtitan-style, every stage post-balanced.

Each encoder, the LLM's token embedding and the LLM are `fully_shard`ed, then the root
module, and the multi-stage runtime's `forward` runs inside the root's `forward` (`plan` and
`dispatch` move data, not parameters, and run before it):

    model = BalancedMultimodal({"image": vit, "audio": audio_encoder}, llm, runtime)
    for module in (*model.encoders.values(), model.llm.embed, model.llm):
        fully_shard(module)
    fully_shard(model)
    loss_sum, loss_tokens = model(routes, moved)    # encoders, embedding exchange, LLM, loss
    normalize_loss(loss_sum, loss_tokens).backward()

Why this shape.  FSDP2 gathers a module's parameters only while that module's own forward
runs: `text_embedding=llm.embed` with only `fully_shard(llm)` calls the embedding outside
`llm.forward`, on sharded parameters ("mixed torch.Tensor and DTensor"), so the embedding is
sharded as a module of its own (as torchtitan shards `tok_embeddings`).  FSDP2 sets itself up
from the first sharded module that runs, which must be the root: hence the runtime inside the
root's forward.  And every encoder uses every parameter on every call, empty input included
(`orchmllm.runtime.demo.model`), because a rank holding none of a stage's items still runs it.

Step 0's gradients are compared with one pass over the global batch in one process, in
float64 and without the runtime: each sample's segments encoded alone and spliced into its
text, the summed token loss divided by the global number of loss tokens.  Post-balancing
moves samples, not terms of that sum, so the two agree to rounding.

    python3.11 examples/train_multimodal_fsdp.py                    # 3 local gloo processes
    torchrun --nproc-per-node 8 examples/train_multimodal_fsdp.py   # NCCL on GPUs (gloo on CPUs)
"""

from __future__ import annotations

import numpy as np
import torch
import torch._dynamo  # noqa: F401  the first optimizer step imports it; do it once, before forking ranks
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

from orchmllm import CostModel
from orchmllm.orchestrator import Stage
from orchmllm.runtime import MultiStageRuntime, Prefetcher, accumulate, normalize_loss
from orchmllm.runtime.comm import comm_device, is_distributed
from orchmllm.runtime.demo.data import IGNORE, SyntheticMultimodal
from orchmllm.runtime.launch import run_script
from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel

CONFIG = ModelConfig(vocab=64, llm_hidden=16, encoder_hidden=16, heads=2, patch_dim=12, frame_dim=10, pool=2, stride=2)
SAMPLES_PER_RANK, STEPS = 6, 3
ENCODER_COST = CostModel.from_transformer(num_layers=CONFIG.encoder_layers, hidden_size=CONFIG.encoder_hidden,
                                          num_heads=CONFIG.heads, causal=False)
STAGES = (Stage("vision", "image", ENCODER_COST), Stage("audio", "audio", ENCODER_COST),
          Stage("llm", "llm", CostModel.from_transformer(num_layers=CONFIG.llm_layers, hidden_size=CONFIG.llm_hidden,
                                                         num_heads=CONFIG.heads, causal=True)))


class BalancedMultimodal(nn.Module):
    """The root module: the balanced encoder stages, the embedding exchange, the LLM and the loss."""

    def __init__(self, encoders: dict[str, nn.Module], llm: nn.Module, runtime: MultiStageRuntime | None):
        super().__init__()
        self.encoders, self.llm, self.runtime = nn.ModuleDict(encoders), llm, runtime

    def forward(self, routes, moved) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's summed token loss and its number of loss tokens."""
        packed = self.runtime.forward(routes, moved, encoders=self.encoders, text_embedding=self.llm.embed)
        logits = self.llm(packed.embeddings, packed.sample_lengths)
        labels = packed.scatter_text("labels", IGNORE)  # this micro-batch's own `moved.text["labels"]`
        return F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum"), (labels != IGNORE).sum()


def loss_tokens_of(data, step: int, rank: int) -> list[int]:
    """Each local sample's loss tokens (labels other than IGNORE): planned with the step, every micro-batch's loss
    is divided by the step's sum of them (`normalize_loss(loss_sum, micro)`)."""
    local = data.local_batch(step, rank)
    return [int(part.ne(IGNORE).sum()) for part in local.text["labels"].split([s.text for s in local.samples])]


def apply_fsdp(model: BalancedMultimodal) -> None:
    """Each encoder, the token embedding (it runs outside `llm.forward`) and the LLM, then the root."""
    for module in (*model.encoders.values(), model.llm.embed, model.llm):
        fully_shard(module)
    fully_shard(model)


def reference_gradients(data: SyntheticMultimodal, world_size: int) -> dict[str, torch.Tensor]:
    """Gradients of one pass over step 0's global batch in one process, float64, without the runtime."""
    torch.manual_seed(0)
    tiny = TinyMultimodalModel(CONFIG).double()
    model = BalancedMultimodal(tiny.encoders(), tiny.llm, runtime=None)  # the parameters' names of the root
    sequences, labels = [], []
    for sample in (s for rank in range(world_size) for s in data.samples(0, rank)):
        local = data.tensors([sample], torch.float64)
        text, text_labels = model.llm.embed(local.text["input_ids"]), local.text["labels"]
        inputs = {modality: iter(local.inputs[modality].split([s.length for s in sample.segments
                                                               if s.modality == modality]))
                  for modality in ("image", "audio")}
        pieces, label_pieces, position, taken = [], [], 0, 0
        for segment in sample.segments:  # text up to the segment, then its embeddings
            before = segment.position - position
            pieces += [text[taken: taken + before],
                       model.encoders[segment.modality](next(inputs[segment.modality]), [segment.length])]
            label_pieces += [text_labels[taken: taken + before], torch.full((segment.tokens,), IGNORE)]
            position, taken = segment.position + segment.tokens, taken + before
        sequences.append(torch.cat([*pieces, text[taken:]]))
        labels.append(torch.cat([*label_pieces, text_labels[taken:]]))
    all_labels = torch.cat(labels)
    logits = model.llm(torch.cat(sequences), [len(sequence) for sequence in sequences])
    (tiny.loss_sum(logits, all_labels) / (all_labels != IGNORE).sum()).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def balance_figures(routes) -> dict[str, tuple[float, float]]:
    """Per stage, the slowest rank's cost over the mean: as sampled, and as planned."""
    figures = {}
    for plan in routes.step.microbatches[0].stage_plans:  # a step of one pass (no token budget)
        home = np.bincount(plan.source, weights=plan.stage.cost.item_costs(plan.item_length),
                           minlength=plan.loads.size)
        if home.sum() > 0:
            figures[plan.stage.name] = (float(home.max() / home.mean()), float(plan.loads.max() / plan.loads.mean()))
    return figures


def global_mean(loss_sum: torch.Tensor, loss_tokens: torch.Tensor) -> float:
    """The mean token loss of the global batch."""
    both = torch.stack([loss_sum.detach(), loss_tokens.to(loss_sum.dtype)])
    if is_distributed():
        dist.all_reduce(both)
    return float(both[0] / both[1])


def train(rank: int, world_size: int) -> dict:
    """The training loop of one rank; returns what rank 0 prints."""
    torch.manual_seed(0)  # same initial parameters on every rank
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    data = SyntheticMultimodal(CONFIG, samples_per_rank=SAMPLES_PER_RANK, seed=0)
    tiny = TinyMultimodalModel(CONFIG).to(comm_device(), torch.float64)
    vit, audio_encoder, llm = tiny.vision, tiny.audio, tiny.llm
    runtime = MultiStageRuntime(STAGES)  # orchestrator Stages: encoders, then the LLM
    model = BalancedMultimodal({"image": vit, "audio": audio_encoder}, llm, runtime)
    apply_fsdp(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    report = {"steps": []}
    with Prefetcher(lambda samples, loss_tokens, group: runtime.plan(samples, loss_tokens=loss_tokens,
                                                                     metadata_group=group)) as prefetcher:
        prefetcher.submit(data.samples(0, rank), loss_tokens_of(data, 0, rank))
        for step in range(STEPS):
            routes = prefetcher.result()
            if step + 1 < STEPS:
                prefetcher.submit(data.samples(step + 1, rank), loss_tokens_of(data, step + 1, rank))  # overlapped
            local = data.local_batch(step, rank, torch.float64).to(comm_device())  # text: input_ids, labels
            moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs,
                                     samples=local.samples)  # refuse routes kept from another step
            for micro in runtime.microbatches(routes, moved):  # one pass per step without a token budget
                with accumulate(model, micro):  # the model check; gradient sync on the last micro-batch only
                    loss_sum, loss_tokens = model(micro.routes, micro.data)
                    normalize_loss(loss_sum, micro).backward()  # / the step's loss tokens; undoes FSDP2's average
            if step == 0:
                grads = {name: p.grad.full_tensor().cpu() for name, p in model.named_parameters()}  # a collective
            optimizer.step()
            optimizer.zero_grad()
            report["steps"].append({"loss": global_mean(loss_sum, loss_tokens), "balance": balance_figures(routes)})
    if rank == 0:
        reference = reference_gradients(data, world_size)
        report["grad_max_abs_diff"] = max(float((grads[name] - r).abs().max()) for name, r in reference.items())
        report["grad_max_abs"] = max(float(r.abs().max()) for r in reference.values())
    return report


def show(report: dict, world_size: int) -> None:
    for step, figures in enumerate(report["steps"]):
        stages = ", ".join(f"{name} {before:.2f} -> {after:.2f}"
                           for name, (before, after) in figures["balance"].items())
        print(f"step {step}: loss {figures['loss']:.4f}  slowest rank / mean, as sampled -> balanced: {stages}")
    print(f"step 0 gradients, FSDP2 vs one process in float64: max |diff| {report['grad_max_abs_diff']:.3g} "
          f"(largest gradient {report['grad_max_abs']:.3g}) on {world_size} ranks")


if __name__ == "__main__":
    run_script(train, 3, show)  # under torchrun this process is one rank; alone, 3 local gloo ranks
