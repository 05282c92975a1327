"""Which axis of a sequence batch the model's sequence modules treat as the batch.

``nn.LSTM``/``GRU``/``RNN``, ``nn.MultiheadAttention``, ``nn.Transformer*Layer`` and
``nn.Transformer`` declare their layout: ``batch_first=True`` reads ``(batch, time,
features)``, ``False`` reads ``(time, batch, features)``. A batch collated time-major
(``pad_sequence`` without ``batch_first=True``) reaching a ``batch_first=True`` module, or
a batch-major one reaching a ``batch_first=False`` module, raises nothing when the
targets are laid out the same way: the recurrence (or attention) runs across the samples
and treats the time steps as independent sequences.

The batch alone cannot tell: a model may transpose before the module, and that is fine.
So this records what each such module *receives* during the observed step (forward
pre-hooks), and the check compares the received axes with the loader's batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class ModuleInput:
    name: str
    kind: str  # the class name: LSTM, TransformerEncoderLayer, ...
    batch_first: bool
    shape: tuple[int, ...]
    recurrent: bool  # an RNN mixes along time by recurrence, the others by attention


def layout_modules(model: nn.Module) -> dict[nn.Module, str]:
    """Modules that declare a ``batch_first`` layout, by name."""
    return {module: name or type(module).__name__ for name, module in model.named_modules()
            if isinstance(getattr(module, "batch_first", None), bool)}


class LayoutWatch:
    """Forward pre-hooks recording the first (batched, unpacked) input of each layout
    module; ``close()`` removes them."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: list[ModuleInput] = []
        modules = layout_modules(model)
        self._names = modules
        self._handles = [module.register_forward_pre_hook(self._record) for module in modules]

    def _record(self, module: nn.Module, args: tuple) -> None:
        first = args[0] if args else None
        name = self._names[module]
        # A PackedSequence carries its own layout; an unbatched 2-D input has no batch axis.
        if isinstance(first, torch.Tensor) and first.dim() >= 3 and all(s.name != name for s in self.seen):
            self.seen.append(ModuleInput(name, type(module).__name__, bool(module.batch_first), tuple(first.shape),
                                         isinstance(module, nn.RNNBase)))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def misread_axis(seen: list[ModuleInput], batch_size: int) -> ModuleInput | None:
    """The first module whose batch axis does not hold the ``batch_size`` samples while
    its other leading axis does (a batch of ``batch_size`` at dim 1 of a batch_first
    module, or at dim 0 of a time-major one). Equal leading sizes say nothing."""
    for record in seen:
        batch_axis, other = (0, 1) if record.batch_first else (1, 0)
        if record.shape[other] == batch_size and record.shape[batch_axis] != batch_size:
            return record
    return None
