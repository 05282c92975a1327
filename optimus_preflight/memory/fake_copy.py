"""Fake CPU copies of live models (what the estimator traces when it is given real
weights), and builders of the same optimizer over such a copy."""

from __future__ import annotations

import copy
import inspect
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.training.distributed import unwrap


def fake_copy_factory(model: nn.Module) -> Callable[[], nn.Module]:
    """A factory that, called under ``FakeTensorMode``, returns a copy of ``model`` whose
    parameters and buffers are fake CPU tensors of the same shapes, strides and dtypes
    (no data is copied, so this works for a model that sits on a GPU)."""
    source = unwrap(model)

    def build() -> nn.Module:
        memo: dict[int, Any] = {}
        for tensor in itertools.chain(source.parameters(), source.buffers()):
            if id(tensor) in memo:
                continue
            fake = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
            if isinstance(tensor, nn.Parameter):
                fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = fake
        # Plain tensor attributes too: a non-leaf one (nn.Parameter(x).float() kept as an
        # attribute, a user's bug the preflight must survive to report) refuses deepcopy.
        for module in source.modules():
            for value in vars(module).values():
                if isinstance(value, torch.Tensor) and id(value) not in memo:
                    memo[id(value)] = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                                          device="cpu").requires_grad_(value.requires_grad
                                                                                       and value.is_floating_point())
        return copy.deepcopy(source, memo)

    return build


def optimizer_factory_like(optimizer: Optimizer, model: nn.Module) -> Callable[[nn.Module], Optimizer]:
    """A builder of the same optimizer (class, hyperparameters, parameter groups) over a
    copy of ``model``: groups are matched by parameter name."""
    source = unwrap(model)
    names = {id(p): name for name, p in source.named_parameters()}
    accepted = inspect.signature(type(optimizer).__init__).parameters
    kwargs = {key: value for key, value in optimizer.defaults.items() if key in accepted}
    groups = [
        ({key: value for key, value in group.items() if key != "params"}, [names.get(id(p)) for p in group["params"]])
        for group in optimizer.param_groups
    ]

    def build(copy_of_model: nn.Module) -> Optimizer:
        params = dict(copy_of_model.named_parameters())
        param_groups = [
            {**options, "params": [params[name] for name in group_names if name in params]}
            for options, group_names in groups
        ]
        return type(optimizer)(param_groups, **kwargs)

    return build
