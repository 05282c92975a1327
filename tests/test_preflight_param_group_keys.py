"""PARAM_GROUP_KEY_UNREAD: a hyperparameter-named param-group key that torch.optim keeps
and ignores (a head's ``lr_scale`` copied from timm/MAE-style code) fires; the key stays
quiet when the optimizer reads it, when loaded code applies it to the group's lr, when a
scheduler from another library may read it, and when it changes nothing."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.param_group_keys import ParamGroupKeysCheck, module_reading, unread_keys


def backbone_and_head():
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(12, 32), nn.ReLU()), nn.Linear(32, 4))


def loader():
    x = torch.randn(256, 12, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x[:, :4].argmax(1)), batch_size=32, shuffle=True)


def findings(model, optimizer, scheduler=None):
    report = run_preflight(model, optimizer, loader(), loss_fn=nn.CrossEntropyLoss(), scheduler=scheduler,
                           checks=[ParamGroupKeysCheck()])
    return [issue for issue in report.check("model.param_group_keys").issues if issue.code == "PARAM_GROUP_KEY_UNREAD"]


def head_scaled(model, key="lr_scale", value=100.0, optimizer=torch.optim.AdamW):
    return optimizer([{"params": model[0].parameters()}, {"params": model[1].parameters(), key: value}], lr=1e-5)


@pytest.mark.parametrize("key", ["lr_scale", "lr_mult", "layer_decay", "decay_mult"])
def test_a_group_key_the_optimizer_ignores_fires_and_names_the_fix(key):
    model = backbone_and_head()
    found = findings(model, head_scaled(model, key=key, value=100.0 if "scale" in key or "mult" in key else 0.75))
    assert len(found) == 1
    assert repr(key) in found[0].message and "lr=1e-05" in found[0].message
    if key in ("lr_scale", "lr_mult"):
        assert "'lr': 0.001" in found[0].fix
    assert f"g.get({key!r}, 1.0)" in found[0].fix
    if key == "decay_mult":
        assert "'weight_decay': 1" in found[0].fix  # AdamW's 0.01, times 100


def test_a_torch_scheduler_does_not_read_it_either():
    model = backbone_and_head()
    optimizer = head_scaled(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    assert findings(model, optimizer, scheduler)


def test_the_optimizers_own_keys_labels_and_neutral_scales_are_quiet():
    model = backbone_and_head()
    optimizer = torch.optim.SGD([{"params": model[0].parameters(), "name": "backbone", "lr_scale": 1.0},
                                 {"params": model[1].parameters(), "lr": 1e-3, "momentum": 0.9, "name": "head"}],
                                lr=1e-5)
    assert unread_keys(optimizer) == {}
    misnamed = torch.optim.AdamW([{"params": model.parameters(), "wd": 0.05}], lr=1e-3)  # OPTIM_GROUP_UNKNOWN_KEY's
    assert unread_keys(misnamed) == {}
    assert not findings(model, optimizer)
    named = torch.optim.AdamW(model.named_parameters(), lr=1e-3)  # torch's own 'param_names'
    onecycle = torch.optim.lr_scheduler.OneCycleLR(named, max_lr=1e-2, total_steps=100)  # its max_lr, min_lr, ...
    assert not findings(model, named, onecycle)


def test_a_scheduler_from_another_library_may_read_it():
    class LayerwiseScheduler:  # as timm's schedulers do: they scale each group's lr by its key, out of torch's sight
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def step(self):
            pass

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    LayerwiseScheduler.__module__ = "timm.scheduler.cosine_lr"
    model = backbone_and_head()
    optimizer = head_scaled(model)
    assert not findings(model, optimizer, LayerwiseScheduler(optimizer))


LAYER_KEY = "layer_lr_factor"


def test_a_loaded_module_that_applies_the_key_keeps_it_quiet(tmp_path, monkeypatch):
    # MAE/BEiT-style: the user's own lr_sched.adjust_learning_rate sets each group's lr from it
    (tmp_path / "my_lr_sched.py").write_text(
        "def adjust_learning_rate(optimizer, lr):\n"
        "    for group in optimizer.param_groups:\n"
        f"        group['lr'] = lr * group[{LAYER_KEY!r}]\n")  # not written out here: this module is scanned too
    monkeypatch.syspath_prepend(str(tmp_path))
    model = backbone_and_head()
    optimizer = head_scaled(model, key="layer_lr_factor", value=0.5)
    assert module_reading("layer_lr_factor") is None
    assert findings(model, optimizer)
    try:
        importlib.import_module("my_lr_sched")
        assert module_reading("layer_lr_factor") == "my_lr_sched"
        assert not findings(model, optimizer)
    finally:
        sys.modules.pop("my_lr_sched", None)
