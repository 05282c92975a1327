"""Random masks and random decisions drawn inside the model's forward in eval mode.

Hand-written dropout variants (modality dropout, stochastic depth, token or patch
dropping, a "drop the condition" branch) draw ``torch.rand(...)`` and compare it with a
rate: ``torch.rand(()) < p`` to decide, ``(torch.rand(B, 1) < keep)`` to mask. Written
without ``if self.training``, they run in eval mode too: validation and inference randomly
lose a modality, a layer or tokens, and predictions change from call to call.

Observed, not guessed from code: while the model's forward runs (its own hooks bracket it),
the outputs of uniform draws (``rand``, ``rand_like``, ``bernoulli``) are tracked, and a
comparison that reads one is a random mask or decision. Sampling on purpose (a VAE's
``randn`` noise, Gumbel noise through a log) makes no comparison and is not reported.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.data_access.worker_stacks import user_frame_text

UNIFORM_DRAWS = {"rand", "rand_like", "bernoulli", "bernoulli_", "uniform_"}
COMPARISONS = {"lt", "le", "gt", "ge", "__lt__", "__le__", "__gt__", "__ge__", "less", "greater", "less_equal",
               "greater_equal"}
MAX_DRAWS = 256


class RandomMaskWatch(TorchFunctionMode):
    """Records, for the model's forward only, comparisons that read a uniform random draw."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inside = 0
        self.draws: set[int] = set()
        self.kept: list[torch.Tensor] = []  # the draws, kept alive so their ids stay unique
        self.found: list[str] = []  # the user's line of each random mask or decision
        self._handles = [model.register_forward_pre_hook(self._enter), model.register_forward_hook(self._leave)]

    def _enter(self, *_: Any) -> None:
        self.inside += 1

    def _leave(self, *_: Any) -> None:
        self.inside -= 1

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.inside <= 0:
            return out
        name = getattr(func, "__name__", "")
        if name in UNIFORM_DRAWS and isinstance(out, torch.Tensor) and len(self.kept) < MAX_DRAWS:
            self.draws.add(id(out))
            self.kept.append(out)
        elif name in COMPARISONS and any(isinstance(a, torch.Tensor) and id(a) in self.draws for a in args):
            line = user_frame_text(sys._getframe(1)) or "the model's forward"
            if line not in self.found:
                self.found.append(line)
        return out
