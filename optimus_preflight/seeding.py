"""Seeding of every RNG a training run draws from."""

from __future__ import annotations

import random

import torch


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy as np
    except ImportError:  # numpy is optional; torch runs without it
        pass
    else:
        np.random.seed(seed % 2**32)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.benchmark = False
