"""The case registry: each case is a function building what a user would pass to
``run_preflight`` (model, optimizer, train_loader and the keywords), with its metadata."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader


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


FAMILY_MODULES = ("cases_shapes", "cases_targets", "cases_trained", "cases_mechanics", "cases_data", "cases_healthy")


class CaseTable:
    """One set's cases: the ``case``/``healthy`` decorators its modules use, and
    ``load_all`` importing those modules. Sets b and c make their own from this."""

    def __init__(self, modules: list[str]):
        self.modules = modules
        self.cases: dict[str, Case] = {}

    @classmethod
    def by_family(cls, package: str) -> CaseTable:
        """The table of a set laid out as sets g-i are: one module per family, then the healthy cases."""
        return cls([f"{package}.{name}" for name in FAMILY_MODULES])

    def case(self, name: str, family: str, bug: str = "", cause_pattern: str | None = None):
        def register(fn):
            if name in self.cases:
                raise ValueError(f"duplicate case {name}")
            self.cases[name] = Case(name, family, bug, cause_pattern, fn, fn.__module__)
            return fn
        return register

    def healthy(self, name: str, description: str):
        return self.case(name, "healthy", description, None)

    def load_all(self) -> dict[str, Case]:
        import importlib
        for module in self.modules:
            importlib.import_module(module)
        return self.cases


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


TABLE = CaseTable([f"benchmarks.blind_preflight.{name}" for name in (
    "cases_shapes", "cases_targets", "cases_trained", "cases_data", "cases_own", "cases_healthy")])
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all


def gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(s)


def twin(builder: Callable[..., dict]) -> Callable[[], dict]:
    """The corrected twin of a broken case's builder (``builder(fixed=True)``), as a plain
    function filed under its set's healthy family."""
    def build() -> dict:
        return builder(fixed=True)
    build.__module__ = builder.__module__.rsplit(".", 1)[0] + ".cases_healthy"
    build.__name__ = builder.__name__ + "_fixed"
    return build


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def mean_over(model: torch.nn.Module, batches: Any, fn: Callable[[Any, Any], tuple[float, float]]) -> float:
    """Average of fn(model, batch) -> (sum, count) over the batches, the model in eval mode."""
    was = model.training
    model.eval()
    total = n = 0.0
    for batch in batches:
        s, c = fn(model, batch)
        total += float(s)
        n += float(c)
    model.train(was)
    return total / max(n, 1.0)
