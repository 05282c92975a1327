"""What a noise-prediction diffusion loss feeds its model, against the noise it asks for (pure).

The probe knows the loss's target is a standard-normal draw made inside the loss (``drawn_noise``)
and the model's first input ``x_t`` of the same shape, computed in the loss from a batch tensor
``x0`` of that shape. A DDPM step builds ``x_t = sqrt(a_t) * x0 + sqrt(1 - a_t) * noise`` and asks
for that noise back. Three mistakes keep every shape and value plausible:

- ``alphas_cumprod = torch.cumprod(betas, 0)`` (for ``cumprod(1 - betas)``): every ``a_t`` is ~0,
  so every sample is pure noise, even at t = 0, and the model never sees the data;
- data at a scale far from the unit-variance noise the schedule assumes (raw values of ~50, or
  latents left unscaled): the signal-to-noise ratio is off by the scale squared at every t;
- a second ``torch.randn_like`` for the target: the noise asked for is not the noise in ``x_t``,
  and the best prediction is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from optimus_preflight.training.batches import leaves

MIN_ROWS = 8
PURE_NOISE = 0.1  # ||x_t - noise|| / ||x_t|| of every sample at most this: no sample holds the data
SCALE_RANGE = (0.1, 4.0)  # the clean data's std the schedule's unit-variance noise is made for
UNRELATED_NOISE = 0.15  # |corr(x_t, target)| under this: the target is not the noise mixed into x_t


@dataclass
class DiffusionInputs:
    rows: int
    clean_std: float  # of the batch tensor x_t is made from
    least_noisy: float  # max over samples of ||x_t - noise|| / ||x_t||: how far the least noisy one is from noise
    target_correlation: float  # corr(x_t, target) over every value of the batch

    @property
    def pure_noise(self) -> bool:
        return self.least_noisy <= PURE_NOISE

    @property
    def off_scale(self) -> bool:
        return not SCALE_RANGE[0] <= self.clean_std <= SCALE_RANGE[1]

    @property
    def target_not_in_input(self) -> bool:
        return not self.pure_noise and not self.off_scale and abs(self.target_correlation) < UNRELATED_NOISE


def diffusion_inputs(noise: torch.Tensor | None, model_inputs: list[torch.Tensor], batch: Any,
                     batch_storages: set[int]) -> DiffusionInputs | None:
    """Of a drawn-noise target and the model's first input, when that input is made in the loss
    (not a batch tensor) from a float batch tensor of its shape."""
    x_t = model_inputs[0] if model_inputs else None
    if noise is None or x_t is None or x_t.shape != noise.shape or x_t.dim() < 2 or x_t.shape[0] < MIN_ROWS \
            or not x_t.is_floating_point() or x_t.untyped_storage().data_ptr() in batch_storages:
        return None
    clean = next((leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
                  and leaf.shape == x_t.shape), None)
    if clean is None:
        return None
    with torch.no_grad():
        rows = x_t.shape[0]
        made = x_t.detach().double().reshape(rows, -1)
        drawn = noise.detach().double().reshape(rows, -1).to(made.device)
        data = clean.detach().double().reshape(rows, -1).to(made.device)
        if not (bool(torch.isfinite(made).all()) and bool(torch.isfinite(data).all())):
            return None
        distance = (made - drawn).norm(dim=1) / made.norm(dim=1).clamp_min(1e-12)
        centred_made, centred_drawn = made - made.mean(), drawn - drawn.mean()
        correlation = float((centred_made * centred_drawn).sum()
                            / (centred_made.norm() * centred_drawn.norm()).clamp_min(1e-12))
        return DiffusionInputs(rows, float(data.std()), float(distance.max()), correlation)
