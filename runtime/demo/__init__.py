"""The demo's room: the tiny vision + audio + text model trained with and without post-balancing
on local gloo ranks (`orchmllm demo`), apart from the runtime a user embeds.

- `run`: `run_demo` (spawned ranks), `run_demo_in_process_group` (torchrun), the per-rank `train`.
- `report`: `DemoReport` and its pass/fail check.
- `costs`, `calibration`: the stage cost models, timed in isolation and fitted.
- `replay`: every rank's recorded work replayed in isolation (the busy figures the check uses).
- `model`, `data`: the toy model and its synthetic multimodal data.
- `giants`: `--workload giants`, a giant item a step split over context-parallel groups by the
  dispatcher (`run_giants`, `GiantsReport`), against the unsplit single-process reference.
"""

from .report import DemoReport
from .run import (MAX_SPAWNED_RANKS, DemoOptions, check_run, compare_gradients, demo_stages, gradient_terms, run_demo,
                  run_demo_in_process_group)

__all__ = ["MAX_SPAWNED_RANKS", "DemoOptions", "DemoReport", "check_run", "compare_gradients", "demo_stages",
           "gradient_terms", "run_demo", "run_demo_in_process_group"]
