"""The torch calls a loss makes outside the model: what it compares its predictions with.

A ``TorchFunctionMode`` sees every torch call of ``compute_loss``, inside the model's modules as
well as in the loss's own code. ``watched_loss_ops`` counts the module forwards under way (hooks
on every module, the root included) so that only calls made outside every module reach
``observe``: the loss combining the model's output (a tensor in the graph) with targets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from optimus_preflight.training.batches import leaves


class LossOps(TorchFunctionMode):
    """Calls ``observe(tensors)`` with the tensor arguments of each torch call made outside every
    module's forward, when one of them is in the graph."""

    def __init__(self, observe: Callable[[list[torch.Tensor]], None]) -> None:
        super().__init__()
        self.observe = observe
        self.depth = 0  # module forwards under way

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.depth == 0:
            given = [leaf for leaf in leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
            if any(leaf.requires_grad for leaf in given):
                self.observe(given)
        return func(*args, **kwargs)


@contextlib.contextmanager
def watched_loss_ops(model: nn.Module, observe: Callable[[list[torch.Tensor]], None],
                     on_module: Callable[[nn.Module, tuple, dict], Any] | None = None) -> Iterator[LossOps]:
    """Within the block, ``observe`` gets the loss's own calls (see ``LossOps``) and ``on_module``
    every module call's arguments (the root's too)."""
    mode = LossOps(observe)

    def enter(module: nn.Module, args: tuple, kwargs: dict) -> None:
        mode.depth += 1
        if on_module is not None:
            on_module(module, args, kwargs)

    def leave(module: nn.Module, args: tuple, output: Any) -> None:
        mode.depth -= 1

    modules = list(model.modules())
    handles = [module.register_forward_pre_hook(enter, with_kwargs=True) for module in modules] + \
        [module.register_forward_hook(leave) for module in modules]
    try:
        with mode:
            yield mode
    finally:
        for handle in handles:
            handle.remove()
