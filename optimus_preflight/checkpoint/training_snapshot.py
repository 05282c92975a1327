"""Snapshot and restore of everything a real trial step could change (preflight checks,
the memory check's GPU step).

Preflight runs real steps on the real objects (so autocast, the GradScaler and the
optimizer are the ones training will use) and must leave no trace: after ``restore``,
training continues bitwise as if preflight had never run. Covered: parameters and
buffers (persistent or not, e.g. BatchNorm running stats) including which tensor object
each module attribute holds, gradients, ``requires_grad`` flags, the tensors the optimizer
holds besides the model's parameters and the gradients of learnable tensors outside
them (``training.learnable``), train/eval modes, the
optimizer (state, param groups, the scheduler's step-tracking flag), the LR scheduler,
the GradScaler, the Python/numpy/torch/CUDA RNGs and the DataLoaders' generators and
sampler positions (iterating a loader draws worker seeds from its generator).

Copies go to host memory so a snapshot does not double a GPU's footprint.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.training import rng
from optimus_preflight.training.batches import map_batch
from optimus_preflight.training.learnable import unregistered_tensors

_SIMPLE = (int, float, bool, str, type(None))


def _to_host(value: Any) -> Any:
    """A deep copy with every tensor cloned to the CPU."""
    # A meta tensor (a model kept for the memory verdict only) has no values to keep.
    return map_batch(lambda leaf: (leaf if leaf.is_meta else leaf.detach().to("cpu", copy=True)) if isinstance(leaf, torch.Tensor)
                     else copy.deepcopy(leaf), value)


@dataclass
class _ModuleTensors:
    # (module, attribute name, the tensor object it held, a host copy of its values)
    entries: list[tuple[nn.Module, str, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    grads: list[tuple[nn.Parameter, torch.Tensor | None]] = field(default_factory=list)
    requires_grad: list[tuple[nn.Parameter, bool]] = field(default_factory=list)
    modes: list[tuple[nn.Module, bool]] = field(default_factory=list)

    @classmethod
    def capture(cls, model: nn.Module) -> _ModuleTensors:
        _reshard(model)
        snap = cls()
        for module in model.modules():
            snap.modes.append((module, module.training))
            for name, tensor in list(module._parameters.items()) + list(module._buffers.items()):
                if tensor is not None:
                    snap.entries.append((module, name, tensor, _to_host(tensor)))
        for param in model.parameters():
            snap.grads.append((param, None if param.grad is None else _to_host(param.grad)))
            snap.requires_grad.append((param, param.requires_grad))
        return snap

    @torch.no_grad()
    def restore(self) -> None:
        _reshard(self.modes[0][0] if self.modes else None)
        for module, training in self.modes:
            module.training = training
        for module, name, tensor, saved in self.entries:
            store = module._parameters if name in module._parameters else module._buffers
            store[name] = tensor  # a check may have rebound the attribute
            tensor.copy_(saved)
        for param, requires_grad in self.requires_grad:
            param.requires_grad = requires_grad  # the attribute: a user typo (p.requires_grad_ = True) can shadow the method
        for param, grad in self.grads:
            param.grad = None if grad is None else grad.to(param.device, copy=True)


@dataclass
class _LooseTensors:
    """Tensors a step can change that ``model.parameters()`` does not list: what the
    optimizer holds besides the model's parameters (a loss module's weights, a learnable
    loss weight), which a step updates, and learnable tensors kept as plain attributes of
    the model or reached by the loss, whose gradients a backward accumulates."""

    values: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    grads: list[tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=list)
    requires_grad: list[tuple[torch.Tensor, bool]] = field(default_factory=list)

    @classmethod
    def capture(cls, model: nn.Module | None, optimizer: Optimizer | None, extra: Iterable[torch.Tensor]) -> _LooseTensors:
        owned = {id(param) for param in model.parameters()} if model is not None else set()
        stepped = [param for group in optimizer.param_groups for param in group["params"]
                   if id(param) not in owned] if optimizer is not None else []
        loose = list(stepped)
        if model is not None:
            loose += [tensor for _, tensor in unregistered_tensors(model)]
        loose += list(extra)
        snap, seen = cls(), set(owned)
        for tensor in loose:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            snap.grads.append((tensor, None if tensor.grad is None else _to_host(tensor.grad)))
            snap.requires_grad.append((tensor, tensor.requires_grad))
        snap.values = [(param, _to_host(param)) for param in dict.fromkeys(stepped)]
        return snap

    @torch.no_grad()
    def restore(self) -> None:
        for tensor, saved in self.values:
            tensor.copy_(saved)
        for tensor, requires_grad in self.requires_grad:
            tensor.requires_grad = requires_grad
        for tensor, grad in self.grads:
            tensor.grad = None if grad is None else grad.to(tensor.device, copy=True)


def _reshard(model: nn.Module | None) -> None:
    """FSDP2 swaps a module's parameters between its shard (a DTensor) and the gathered
    tensor; a forward without backward (an eval probe) leaves some gathered. Snapshots
    are taken and restored in the sharded state, the one training steps start from."""
    if model is None or not any(type(module).__name__.startswith("FSDP") for module in model.modules()):
        return
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _loader_state(loader: Any) -> list[tuple[Any, Any]]:
    """Generators' states and a sampler's plain attributes (epoch, start offset...)."""
    saved: list[tuple[Any, Any]] = []
    generator = getattr(loader, "generator", None)
    if isinstance(generator, torch.Generator):
        saved.append((generator, generator.get_state()))
    for sampler in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        if sampler is None or not hasattr(sampler, "__dict__"):
            continue
        plain = {key: value for key, value in vars(sampler).items() if isinstance(value, _SIMPLE)}
        saved.append((sampler, plain))
        for value in vars(sampler).values():
            if isinstance(value, torch.Generator):
                saved.append((value, value.get_state()))
    return saved


def _restore_loader_state(saved: list[tuple[Any, Any]]) -> None:
    for owner, state in saved:
        if isinstance(owner, torch.Generator):
            owner.set_state(state)
        else:
            vars(owner).update(state)


class TrainingStateSnapshot:
    """Captures the training state at construction; ``restore()`` puts it back exactly,
    as many times as needed (the saved copies are never handed out)."""

    def __init__(
        self,
        model: nn.Module | None,
        optimizer: Optimizer | None = None,
        scheduler: Any = None,
        scaler: Any = None,
        loaders: Iterable[Any] = (),
        extra_tensors: Iterable[torch.Tensor] = (),
        held_modules: Iterable[nn.Module] = (),
    ):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self._tensors = _ModuleTensors.capture(model) if model is not None else None
        self._loose = _LooseTensors.capture(model, optimizer, extra_tensors) if model is not None else None
        # Modules outside the model that a step changes in place: a momentum encoder or an
        # EMA teacher the loss function holds, a teacher's BatchNorm statistics.
        self._held = [_ModuleTensors.capture(module) for module in held_modules]
        self._optimizer_state = _to_host(optimizer.state_dict()) if optimizer is not None else None
        # Set by an LR scheduler's step tracking; it decides whether torch warns later.
        self._optimizer_flags = {k: v for k, v in vars(optimizer).items() if k == "_opt_called"} if optimizer else {}
        self._scheduler_state = _to_host(scheduler.state_dict()) if scheduler is not None else None
        # The whole (small) scaler object state, including per-optimizer unscale stages.
        self._scaler_state = copy.deepcopy(vars(scaler)) if scaler is not None else None
        self._rng = rng.capture()
        self._loaders = [item for loader in loaders if loader is not None for item in _loader_state(loader)]

    def restore(self) -> None:
        if self._tensors is not None:
            self._tensors.restore()
        if self._loose is not None:
            self._loose.restore()
        for held in self._held:
            held.restore()
        if self.optimizer is not None:
            self.optimizer.load_state_dict(_to_host(self._optimizer_state))
            vars(self.optimizer).pop("_opt_called", None)
            vars(self.optimizer).update(self._optimizer_flags)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(_to_host(self._scheduler_state))
        if self.scaler is not None:
            vars(self.scaler).clear()
            vars(self.scaler).update(copy.deepcopy(self._scaler_state))
        rng.restore(self._rng)
        _restore_loader_state(self._loaders)
