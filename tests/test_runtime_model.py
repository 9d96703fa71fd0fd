"""The demo's tiny model keeps the runtime's encoder contract: every parameter takes part in every call."""

import pytest
import torch

from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel

CONFIG = ModelConfig(vocab=32, llm_hidden=8, encoder_hidden=8, heads=2, patch_dim=6, frame_dim=5, pool=2, stride=2)


def empty_call(model, name):
    """The module called as the runtime calls it on a rank that holds none of its items."""
    lengths = torch.zeros(0, dtype=torch.int64)
    if name == "vision":
        return model.vision(torch.zeros(0, CONFIG.patch_dim), lengths)
    if name == "audio":
        return model.audio(torch.zeros(0, CONFIG.frame_dim), lengths)
    return model.llm(model.llm.embed(torch.zeros(0, dtype=torch.int64)), lengths)


@pytest.mark.parametrize("name", ["vision", "audio", "llm"])
def test_regression_attention_on_empty_input_left_qkv_without_gradient(name):
    """Cause: `Block.attend` returned fresh zeros when no sequence had a token, so the qkv
    projection and its norm got no gradient on a rank that held none of a stage's items: under
    FSDP2 that rank's reduce-scatter had other sizes than its peers' and gloo aborted."""
    torch.manual_seed(0)
    model = TinyMultimodalModel(CONFIG)
    output = empty_call(model, name)
    assert output.shape == (0, CONFIG.vocab if name == "llm" else CONFIG.llm_hidden)
    output.sum().backward()
    module = model.llm if name == "llm" else getattr(model, name)
    missing = [key for key, p in module.named_parameters() if p.grad is None]
    assert missing == []
    assert all(float(p.grad.abs().max()) == 0.0 for p in module.parameters())  # empty input: zero gradient
