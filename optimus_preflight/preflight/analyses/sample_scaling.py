"""How each sample of a batch was normalised on its own, where it was (a hint for messages).

Normalising a sample by its own statistics erases what those statistics held: a cloud scaled
to the unit sphere loses its size, one min-max scaled per axis loses its aspect ratio, a series
z-scored loses its level and amplitude. When the label depended on them, the inputs no longer
carry it. Exact values (a centroid of 0, a largest norm of 1 in every sample) are the mark of a
per-sample transform: data never lands there by chance.
"""

from __future__ import annotations

import torch

EXACT = 1e-4
MIN_SAMPLES = 4


def _exact(values: torch.Tensor, target: float) -> bool:
    return bool(((values - target).abs() <= EXACT * (1 + abs(target))).all())


def sample_normalisation(inputs: object) -> str | None:
    """What a per-sample normalisation of ``inputs`` erased, in words; None when each sample
    keeps its own scale (pure)."""
    if not isinstance(inputs, torch.Tensor) or inputs.layout != torch.strided or not inputs.is_floating_point() \
            or inputs.dim() < 2 or len(inputs) < MIN_SAMPLES:
        return None
    x = inputs.detach().float().cpu()
    if x.dim() == 3 and x.shape[-1] <= 4 and x.shape[1] >= 8:  # (B, N, 3) point sets
        norms = x.norm(dim=-1).amax(dim=1)
        if _exact(x.mean(dim=1), 0.0) and _exact(norms, 1.0):
            return ("each point cloud was centred and scaled to the unit sphere on its own (its largest point norm is "
                    "1 in every sample), which erases its size")
        low, high = x.amin(dim=1), x.amax(dim=1)
        if _exact(high, 1.0) and (_exact(low, 0.0) or _exact(low, -1.0)):
            return ("each point cloud was min-max scaled per axis on its own (every coordinate spans exactly "
                    f"[{float(low.mean()):.0f}, 1] in every sample), which stretches every cloud to a cube and erases "
                    "its proportions (aspect ratio) and size")
    rows = x.reshape(len(x), -1)
    if rows.shape[1] >= 8 and _exact(rows.mean(1), 0.0) and (_exact(rows.std(1), 1.0) or _exact(rows.std(1, unbiased=False), 1.0)):
        return "each sample was standardised with its own mean and std, which erases its level and amplitude"
    return None
