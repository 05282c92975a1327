"""Whether a weight still holds what PyTorch's default init drew (pure functions): frozen
layers nothing was loaded into (``model.structure``) and a model that has not been trained
yet, whose own predictions the batch's labels should not match (``pseudo_labels``)."""

from __future__ import annotations

import torch
from torch import nn

from optimus_preflight.training.sharding import held_whole

MIN_INIT_VALUES = 256  # a smaller weight says too little about its histogram
UNIFORM_STD = 3 ** -0.5  # std of U(-b, b) / b


def at_default_init(weight: torch.Tensor) -> bool:
    """``weight`` (out, in, ...) looks drawn by ``kaiming_uniform_(a=sqrt(5))``: every value within
    1/sqrt(fan_in), with the std of a uniform over that box (pure)."""
    if weight.dim() < 2 or weight.numel() < MIN_INIT_VALUES:
        return False
    bound = (weight[0].numel()) ** -0.5
    values = weight.detach().float()
    if float(values.abs().max()) > bound * (1 + 1e-5):
        return False
    return abs(float(values.std()) / bound - UNIFORM_STD) < 0.05 * UNIFORM_STD


JUDGED_LAYERS = 8  # a model whose first eight judged layers hold their default init has not been trained


def untrained(model: nn.Module) -> bool:
    """The first Linear/Conv weights large enough to judge are still at the default init, and there
    is one at least: the model's outputs are its random initial function, not anything learnt.
    Sharded weights (FSDP's DTensors) are not judged: reading one whole would gather it."""
    judged = [module.weight for module in model.modules()
              if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))
              and module.weight.numel() >= MIN_INIT_VALUES][:JUDGED_LAYERS]
    if not judged or not all(held_whole(weight) for weight in judged):
        return False
    with torch.no_grad():
        return all(at_default_init(weight) for weight in judged)
