"""Which trainable parameters of a model changed: their version counters plus the optimizer steps taken on them.

`accumulate` holds DDP's gradient sync to a step's last micro-batch; an optimizer step before it (or after a loop
left early) updates each replica on its own gradients.  In-place writes bump a tensor's version counter, but fused
optimizers (`Adam(fused=True)`, the usual choice on GPUs) write without bumping it, so every optimizer step is also
counted by a global step hook, registered on first use.  Frozen parameters are left out: a forward may write them
(a momentum encoder's update, an embedding's `max_norm`) and they hold no gradient to synchronise.  Writes through
`.data` are seen by neither."""
from __future__ import annotations

import weakref

from torch.optim.optimizer import register_optimizer_step_post_hook

_listed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its parameters (listing costs 15x)
_stepped: dict[int, int] = {}  # id(parameter) -> optimizer steps taken on it since the hook was registered
_hook: list = []


def _count_step(optimizer, args, kwargs) -> None:
    """The global optimizer step post-hook: one more step on every parameter of `optimizer`."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            _stepped[id(parameter)] = _stepped.get(id(parameter), 0) + 1


def trainable_versions(model) -> tuple:
    """The version counter plus the optimizer steps of each of `model`'s trainable parameters."""
    if not _hook:
        _hook.append(register_optimizer_step_post_hook(_count_step))
    parameters = _listed.get(model) or _listed.setdefault(model, tuple(model.parameters()))
    return tuple(parameter._version + _stepped.get(id(parameter), 0) for parameter in parameters
                 if parameter.requires_grad)
