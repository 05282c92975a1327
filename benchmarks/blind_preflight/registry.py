"""The case registry: each case is a function building what a user would pass to
``run_preflight`` (model, optimizer, train_loader and the keywords), with its metadata."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader

CASES: dict[str, Case] = {}


@dataclass
class Case:
    name: str
    family: str
    bug: str                      # one sentence: the right cause ("" for a healthy case)
    cause_pattern: str | None     # regex a correct diagnosis must match; None: healthy
    build: Callable[[], dict[str, Any]]
    module: str

    @property
    def healthy(self) -> bool:
        return self.cause_pattern is None


def case(name: str, family: str, bug: str = "", cause_pattern: str | None = None):
    def register(fn):
        if name in CASES:
            raise ValueError(f"duplicate case {name}")
        CASES[name] = Case(name, family, bug, cause_pattern, fn, fn.__module__)
        return fn
    return register


def healthy(name: str, description: str):
    return case(name, "healthy", description, None)


def seed(s: int = 0) -> None:
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def loader(dataset, batch_size: int = 32, shuffle: bool = True, **kw) -> DataLoader:
    generator = torch.Generator().manual_seed(1234) if shuffle else None
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator, **kw)


def teacher_classes(n: int, d: int, c: int, s: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels from a random linear teacher (balanced-ish, learnable)."""
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, c, generator=g)
    return x, (x @ w).argmax(1)


def teacher_regression(n: int, d: int, s: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d ** 0.5
    y = torch.tanh(x @ w) * 2 + 0.1 * torch.randn(n, generator=g)
    return x, y


def token_sequences(n: int, length: int, vocab: int, s: int = 0, low: int = 3) -> torch.Tensor:
    """Learnable token streams: arithmetic progressions modulo the vocabulary (ids >= low)."""
    g = torch.Generator().manual_seed(s)
    start = torch.randint(0, vocab - low, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    return (start + step * torch.arange(length)) % (vocab - low) + low


def all_case_modules() -> list[str]:
    return [
        "benchmarks.blind_preflight.cases_shapes",
        "benchmarks.blind_preflight.cases_targets",
        "benchmarks.blind_preflight.cases_trained",
        "benchmarks.blind_preflight.cases_data",
        "benchmarks.blind_preflight.cases_own",
        "benchmarks.blind_preflight.cases_healthy",
    ]


def load_all() -> dict[str, Case]:
    import importlib
    for module in all_case_modules():
        importlib.import_module(module)
    return CASES
