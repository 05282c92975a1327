"""Forward hooks that live for one measured step only.

A forward hook costs a Python call per module per forward; left on, it would tax
every step. The probe is attached before the dynamics step's forward and removed
when the step is measured. Counts stay on the device until ``dead_fractions()``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from optimus_preflight.dynamics.measures import ZERO_OFF_ACTIVATIONS

# Enough values for a histogram's shape; a whole activation tensor can be huge.
HISTOGRAM_SAMPLE = 65_536


class ActivationProbe:
    """Counts exact zeros per ReLU-family module and keeps a sample of every activation.

    Only training-mode forwards count: an evaluation that runs between arming and
    measuring (the model is then in eval mode) is ignored.
    """

    def __init__(self, modules: list[tuple[str, nn.Module]], *, keep_samples: bool):
        self.keep_samples = keep_samples
        self.zeros: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.samples: dict[str, torch.Tensor] = {}
        self._handles = [
            module.register_forward_hook(self._hook(name, isinstance(module, ZERO_OFF_ACTIVATIONS)))
            for name, module in modules
            if keep_samples or isinstance(module, ZERO_OFF_ACTIVATIONS)
        ]

    def _hook(self, name: str, zero_off: bool) -> Callable[[nn.Module, Any, Any], None]:
        def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
            if not module.training or not isinstance(output, torch.Tensor):
                return
            with torch.no_grad():
                if zero_off:
                    zeros = (output == 0).sum()
                    self.zeros[name] = self.zeros[name] + zeros if name in self.zeros else zeros
                    self.counts[name] = self.counts.get(name, 0) + output.numel()
                if self.keep_samples and name not in self.samples:
                    # A copy: an in-place op later in the forward may overwrite the output.
                    self.samples[name] = output.detach().flatten()[:HISTOGRAM_SAMPLE].float().clone()

        return hook

    def dead_fractions(self) -> dict[str, float]:
        """Share of zero outputs per ReLU-family module over the measured step (one sync)."""
        names = list(self.zeros)
        if not names:
            return {}
        zeros = torch.stack([self.zeros[name].to(self.zeros[names[0]].device) for name in names]).cpu().tolist()
        return {name: count / self.counts[name] for name, count in zip(names, zeros) if self.counts[name]}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
