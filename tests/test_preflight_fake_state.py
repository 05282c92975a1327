"""The memory estimate's fake trace leaves the user's objects as it found them.

The host/VRAM estimate calls the user's loss function (and builders, and the model's
forward) under FakeTensorMode. A loss object that keeps state between calls would keep a
FAKE tensor, and the real first step would fail reading it (STEP_ERROR:
DataDependentOutputException), blaming the user's code for the preflight's doing. Fires /
quiet: the state is put back (the default preflight passes the step, the loss is finite);
a fake tensor that still reached the real step crashes step.first_step with its traceback
instead of a STEP_ERROR, while a genuine error of the user's loss stays a STEP_ERROR."""

from __future__ import annotations

import collections
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses import FakeTensor
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.memory import estimate_step_memory
from optimus_preflight.memory import user_state as user_state_module
from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.memory_checks import HostMemoryCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.framework import CheckStatus

g = torch.Generator().manual_seed(0)
X = torch.randn(256, 16, generator=g)
Y = (X[:, 0] > 0).long()


class SmoothedLoss:
    def __init__(self):
        self.smoothed = None

    def __call__(self, model, batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        self.smoothed = loss if self.smoothed is None else 0.98 * self.smoothed.detach() + 0.02 * loss
        return self.smoothed


def model_and_optimizer(extra=()):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    return model, torch.optim.SGD([*model.parameters(), *extra], lr=0.1)


def preflight(loss_fn, checks=None, extra=()):
    model, optimizer = model_and_optimizer(extra)
    loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)
    options = {} if checks is None else {"checks": checks}
    return run_preflight(model, optimizer, loader, loss_fn=loss_fn, **options)


def test_a_stateful_loss_runs_the_whole_default_preflight():
    loss_fn = SmoothedLoss()
    report = preflight(loss_fn)
    assert "STEP_ERROR" not in report.codes()
    assert report.check("memory.host_ram").status != CheckStatus.SKIPPED  # the fake trace did run
    first_step = report.check("step.first_step")
    # The smoothed loss is itself a bug the step names (LOSS_MOSTLY_DETACHED), not a crash of the trace.
    assert {issue.code for issue in first_step.issues} <= {"LOSS_MOSTLY_DETACHED"}, first_step.detail
    assert math.isfinite(first_step.data["loss"])
    assert not isinstance(loss_fn.smoothed, FakeTensor)


def stateful_losses():
    """Other places a loss keeps what it computed: a list, a closure, a learnable weight
    (the fake backward sets its .grad), a tensor counter (in-place, all-real operands)."""

    class History:
        def __init__(self):
            self.losses, self.calls = [], torch.zeros((), dtype=torch.long)

        def __call__(self, model, batch):
            loss = F.cross_entropy(model(batch[0]), batch[1])
            self.losses.append(loss.detach())
            self.calls += 1
            return loss + 0 * self.losses[0]

    def closure():
        previous = None

        def loss_fn(model, batch):
            nonlocal previous
            loss = F.cross_entropy(model(batch[0]), batch[1])
            previous = loss if previous is None else 0.5 * previous.detach() + 0.5 * loss
            return previous

        return loss_fn

    class Uncertainty:
        def __init__(self):
            self.log_var = torch.zeros((), requires_grad=True)

        def __call__(self, model, batch):
            return torch.exp(-self.log_var) * F.cross_entropy(model(batch[0]), batch[1]) + self.log_var

    class ClassLevel:
        last = None  # kept on the class, shared by every instance

        def __call__(self, model, batch):
            loss = F.cross_entropy(model(batch[0]), batch[1])
            out = loss if type(self).last is None else 0.5 * type(self).last.detach() + 0.5 * loss
            type(self).last = out
            return out

    return {"history": History(), "closure": closure(), "uncertainty": Uncertainty(), "class": ClassLevel()}


@pytest.mark.parametrize("name", ["history", "closure", "uncertainty", "class"])
def test_the_estimate_puts_back_what_the_loss_kept(name):
    loss_fn = stateful_losses()[name]
    model, _ = model_and_optimizer()
    estimate = estimate_step_memory(lambda: model, (X[:32], Y[:32]), loss_fn,
                                    lambda params: torch.optim.SGD(params, lr=0.1))
    assert estimate.method == "fake"
    if name == "history":
        assert loss_fn.losses == [] and loss_fn.calls.item() == 0
    elif name == "closure":
        assert loss_fn.__closure__[0].cell_contents is None
    elif name == "class":
        assert type(loss_fn).last is None
    else:
        assert loss_fn.log_var.grad is None
    extra = [loss_fn.log_var] if name == "uncertainty" else []
    assert "STEP_ERROR" not in preflight(loss_fn, extra=extra).codes()


_CACHE: dict[int, torch.Tensor] = {}


class CachedScale(nn.Module):
    """A forward that fills a module-level cache (as rotary-embedding tables often are)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 2)

    def forward(self, x):
        if x.shape[1] not in _CACHE:
            _CACHE[x.shape[1]] = torch.full((x.shape[1],), 0.5)
        return self.linear(x * _CACHE[x.shape[1]])


def test_a_global_cache_the_forward_fills_is_put_back():
    _CACHE.clear()
    estimate_step_memory(CachedScale, (X[:32], Y[:32]), lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                         lambda params: torch.optim.SGD(params, lr=0.1))
    assert _CACHE == {}


def test_a_fake_tensor_that_still_leaks_is_not_the_users_step_error(monkeypatch):
    monkeypatch.setattr(user_state_module.UserState, "restore", lambda self: None)  # a leak the guard missed
    report = preflight(SmoothedLoss(), checks=[FirstBatchCheck(), HostMemoryCheck(), FirstStepCheck()])
    first_step = report.check("step.first_step")
    assert "STEP_ERROR" not in report.codes()
    assert first_step.status == CheckStatus.CRASHED and "preflight" in first_step.detail
    assert "DataDependentOutputException" in first_step.data["traceback"]
    assert "fake_tensor.py" in first_step.data["traceback"]  # the original traceback, kept


def test_a_real_error_of_the_loss_stays_a_step_error():
    def broken(model, batch):
        raise ValueError("the user's own bug")

    report = preflight(broken, checks=[FirstBatchCheck(), FirstStepCheck()])
    assert "STEP_ERROR" in report.codes()
    assert report.check("step.first_step").status == CheckStatus.ERROR


class BuildsOnLookup(collections.OrderedDict):
    """transformers' ACT2FN: an OrderedDict of classes whose lookup returns a new instance (dict()
    of an OrderedDict goes through __getitem__)."""

    def __getitem__(self, key):
        return super().__getitem__(key)()


REGISTRY = BuildsOnLookup(relu=nn.ReLU)


def test_a_mapping_that_builds_on_lookup_keeps_its_classes():
    # A loss whose globals reach such a registry: recording it through __getitem__ stored
    # instances, and restoring them replaced the classes (the next model built crashed).
    def loss_fn(model, batch):
        return REGISTRY["relu"](model(batch[0])).mean()

    state = user_state_module.UserState(loss_fn)
    REGISTRY["gelu"] = nn.GELU
    state.restore()
    assert dict.get(REGISTRY, "relu") is nn.ReLU and "gelu" not in REGISTRY
    assert isinstance(REGISTRY["relu"], nn.ReLU)
