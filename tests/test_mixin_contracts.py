"""The four mixins' contracts: each declares what it reads from its host (``HOST``, a
Protocol), reads nothing else, owns exactly one attribute, shares no method with another
mixin, and works composed alone into a minimal recipe."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.checkpoint.checkpoint_state import Restorable
from optimus_preflight.checkpoint.store import CheckpointStore
from optimus_preflight.mixins import (
    PreflightMixin,
    TrainingContextMixin,
    TrainingInterruptionMixin,
    TrainingIterationMixin,
)
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.recipe import TrainRecipe
from optimus_preflight.training.run_state import RunState
from optimus_preflight.training.step import StepResult
from optimus_preflight.training.stream import BatchStream
from optimus_preflight.training.training_context import build_training_context
from tests.conftest import tiny_config
from tests.preflight_support import make_recipe

MIXINS = [TrainingContextMixin, PreflightMixin, TrainingIterationMixin, TrainingInterruptionMixin]


def owned_attributes(mixin: type) -> set[str]:
    return {name for name in mixin.__dict__.get("__annotations__", {}) if name != "HOST"}


def own_methods(mixin: type) -> set[str]:
    return {name for name, value in vars(mixin).items()
            if callable(value) and not name.startswith("__") and name != "HOST"}


def contract_members(protocol: type) -> set[str]:
    members: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object,) or cls.__module__ == "typing":
            continue
        members |= set(cls.__dict__.get("__annotations__", {}))
        members |= {name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}
    return members


def attributes_read_on_self(mixin: type) -> set[str]:
    """Every ``self.<name>`` in the mixin's methods (the host is the first parameter)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(mixin)))
    names: set[str] = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef) or not function.args.args:
            continue
        host = function.args.args[0].arg
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == host:
                names.add(node.attr)
    return names


@pytest.mark.parametrize("mixin", MIXINS, ids=lambda mixin: mixin.__name__)
def test_each_mixin_owns_one_attribute_and_declares_its_host(mixin):
    assert len(owned_attributes(mixin)) == 1, owned_attributes(mixin)
    host = mixin.HOST
    assert getattr(host, "_is_protocol", False), f"{mixin.__name__}.HOST must be a typing.Protocol"
    assert owned_attributes(mixin).isdisjoint(contract_members(host)), "a mixin does not ask its host for what it owns"


@pytest.mark.parametrize("mixin", MIXINS, ids=lambda mixin: mixin.__name__)
def test_each_mixin_reads_only_its_contract_and_its_own_members(mixin):
    """What another mixin owns arrives as an argument, never as ``self.<its attribute>``."""
    allowed = contract_members(mixin.HOST) | owned_attributes(mixin) | own_methods(mixin)
    strays = attributes_read_on_self(mixin) - allowed
    assert not strays, f"{mixin.__name__} reads {sorted(strays)} from its host without declaring them in HOST"
    others = set().union(*(owned_attributes(other) for other in MIXINS if other is not mixin))
    assert attributes_read_on_self(mixin).isdisjoint(others)


def test_no_two_mixins_define_the_same_method_or_attribute():
    seen: dict[str, str] = {}
    for mixin in MIXINS:
        for name in own_methods(mixin) | owned_attributes(mixin):
            assert name not in seen, f"{name} is defined by both {seen[name]} and {mixin.__name__}"
            seen[name] = mixin.__name__


def test_the_recipe_satisfies_every_mixins_host_contract(tmp_path):
    recipe = make_recipe(tmp_path)
    try:
        for mixin in MIXINS:
            assert isinstance(recipe, mixin.HOST), f"TrainRecipe does not satisfy {mixin.HOST.__name__}"
        assert all(issubclass(TrainRecipe, mixin) for mixin in MIXINS)
    finally:
        recipe.close()


# ---------------------------------------------------------------- each mixin alone


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=generator), torch.randint(0, 3, (32,), generator=generator))
    return DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))


def _loss(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


class _Objects:
    """What a recipe's builders made; the minimal recipes below take them from here."""

    def __init__(self, cfg):
        torch.manual_seed(0)
        self.cfg = cfg
        self.model = nn.Linear(4, 3)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scheduler = None
        self.loader = _loader()


def _added_attributes(host, action) -> set[str]:
    before = set(vars(host))
    action()
    return set(vars(host)) - before


def test_context_mixin_alone():
    class ContextOnly(TrainingContextMixin):
        def __init__(self, cfg):
            self.cfg = cfg

    host = ContextOnly(tiny_config())
    assert _added_attributes(host, host.setup_training_context) == {"training_context"}
    assert host.training_context.device == torch.device("cpu")


def test_iteration_mixin_alone():
    class IterationOnly(TrainingIterationMixin):
        def __init__(self, objects):
            self.cfg, self.model, self.optimizer, self.scheduler = (
                objects.cfg, objects.model, objects.optimizer, objects.scheduler)

        def compute_loss(self, model, batch):
            return _loss(model, batch)

    objects = _Objects(tiny_config("trainer.accumulation_steps=2"))
    host = IterationOnly(objects)
    context = build_training_context(objects.cfg.trainer)
    added = _added_attributes(host, lambda: host.setup_training_iteration(context, objects.loader, lambda: False))
    assert added == {"training_iteration"}
    before = objects.model.weight.detach().clone()
    result = host.run_training_iteration()
    assert isinstance(result, StepResult) and result.stepped
    assert not torch.equal(before, objects.model.weight)
    assert host.training_iteration.stream.position.samples_consumed == 16  # one window of two batches of 8


def test_interruption_mixin_alone(tmp_path):
    class InterruptionOnly(TrainingInterruptionMixin):
        def __init__(self, cfg, run_dir: Path):
            self.cfg, self.run_dir, self.state = cfg, run_dir, RunState()
            self.forced: list[str] = []

        def write_forced_summary(self, status):
            self.forced.append(status)
            return True

    objects = _Objects(tiny_config())
    host = InterruptionOnly(objects.cfg, tmp_path)
    context = build_training_context(objects.cfg.trainer)
    parts = Restorable(objects.model, objects.optimizer, None, context.scaler, host.state,
                       BatchStream(objects.loader, 1))
    added = _added_attributes(host, lambda: host.setup_interruption(context, parts))
    try:
        assert added == {"interruption"}
        assert not host.stop_requested()
        host.state.record_step(True, 8)
        host.interruption.mark_boundary()
        path = host.interruption.save()
        assert path is not None
        assert CheckpointStore(tmp_path / "checkpoints").last_good() == path
    finally:
        host.interruption.close()


def test_preflight_mixin_alone(tmp_path):
    class PreflightOnly(PreflightMixin):
        def __init__(self, objects, run_dir: Path):
            self.cfg, self.objects, self.run_dir = objects.cfg, objects, run_dir
            self.set_up = 0

        def setup(self):
            self.set_up += 1

        def preflight_checks(self):
            return [FirstBatchCheck(), FirstStepCheck()]

        def preflight_context(self):
            objects = self.objects
            return PreflightContext(
                cfg=self.cfg, recipe=self, model=objects.model, optimizer=objects.optimizer, scheduler=None,
                train_loader=objects.loader, val_loader=None, compute_loss=_loss,
                training=build_training_context(self.cfg.trainer), run_dir=self.run_dir,
            )

    host = PreflightOnly(_Objects(tiny_config()), tmp_path)
    assert _added_attributes(host, host.preflight) == {"preflight_report"}
    assert host.set_up == 1
    assert host.preflight_report.status == "passed", host.preflight_report.to_dict()
    assert [result.name for result in host.preflight_report.checks] == ["data.first_batch", "step.first_step"]
    assert (tmp_path / "preflight.json").exists()
