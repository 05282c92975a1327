"""Fake CPU copies of live models: what the estimator traces when it is given real weights."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside DDP/DataParallel wrappers."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def fake_copy_factory(model: nn.Module) -> Callable[[], nn.Module]:
    """A factory that, called under ``FakeTensorMode``, returns a copy of ``model`` whose
    parameters and buffers are fake CPU tensors of the same shapes, strides and dtypes
    (no data is copied, so this works for a model that sits on a GPU)."""
    source = unwrap_model(model)

    def build() -> nn.Module:
        memo: dict[int, Any] = {}
        for tensor in itertools.chain(source.parameters(), source.buffers()):
            if id(tensor) in memo:
                continue
            fake = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
            if isinstance(tensor, nn.Parameter):
                fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = fake
        return copy.deepcopy(source, memo)

    return build
