"""The watchdog: each warning fires on a constructed bad run, once per episode, and
stays quiet on the healthy tiny recipe (see test_dynamics_run.py)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from optimus_preflight.dynamics.monitor import DynamicsMonitor
from optimus_preflight.dynamics.watchdog import Watchdog, default_rules
from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import tiny_config
from tests.step_helpers import make_runner, mean_squared_error
from tests.test_dynamics_metrics import _batch, drive


def codes(records):
    return [w["code"] for r in records for w in r.get("warnings", [])]


def test_warning_needs_a_sustained_window_and_fires_once_per_episode():
    dog = Watchdog(default_rules(), patience=3)
    low = {"update_ratio/decay": 1e-7, "update_ratio/no_decay": 1e-3}
    assert dog.observe(1, low) == [] and dog.observe(2, low) == []
    [warning] = dog.observe(3, low)
    assert (warning.code, warning.metric, warning.key) == ("O22_LOW", "update_ratio/decay", "optimizer.lr")
    assert "group 'decay'" in warning.message and "3 measurements in a row" in warning.message
    assert "optimizer.lr" in warning.fix
    assert dog.observe(4, low) == []  # same episode: no repeat
    dog.observe(5, {"update_ratio/decay": 1e-3})  # back in band: the episode ends
    assert [dog.observe(s, low) for s in (6, 7)] == [[], []]
    assert [w.code for w in dog.observe(8, low)] == ["O22_LOW"]  # a new episode warns again


def test_an_interrupted_streak_does_not_warn():
    dog = Watchdog(default_rules(), patience=3)
    for step, value in enumerate([0.5, 0.5, 1e-3, 0.5, 0.5], start=1):
        assert dog.observe(step, {"update_ratio/all": value}) == []


def test_fix_names_the_precision_knob_for_fp16():
    [warning] = Watchdog(default_rules("fp16"), patience=1).observe(1, {"loss": float("nan")})
    assert warning.code == "LOSS_NAN" and warning.key == "trainer.precision" and "bf16" in warning.fix
    assert json.loads(json.dumps(warning.to_dict()))["value"] == "nan"
    [warning] = Watchdog(default_rules("fp32"), patience=1).observe(1, {"loss": float("inf")})
    assert warning.key == "optimizer.lr"


def _tiny_run(tmp_path, *overrides):
    cfg = tiny_config(
        "logging.dynamics_every_n_steps=1",
        "trainer.max_steps=4",
        "trainer.eval_max_batches=1",
        "checkpoint.every_n_steps=0",
        *overrides,
    )
    CharLMRecipe(cfg, run_dir=tmp_path).run()
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_lr_far_too_low_warns_o22_low(tmp_path):
    records = _tiny_run(tmp_path, "optimizer.lr=1e-7")
    assert codes(records) == ["O22_LOW", "O22_LOW"]  # both parameter groups, once each
    assert max(r["update_ratio/decay"] for r in records if "update_ratio/decay" in r) < 1e-5


def test_lr_far_too_high_warns_o22_high(tmp_path):
    records = _tiny_run(tmp_path, "optimizer.lr=10")
    assert "O22_HIGH" in codes(records)
    warning = next(w for r in records for w in r.get("warnings", []) if w["code"] == "O22_HIGH")
    assert warning["config_key"] == "optimizer.lr" and "Lower optimizer.lr" in warning["fix"]


def test_dead_relu_layer_warns_o25_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every pre-activation negative: the layer is dead
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    runner, _ = make_runner(model, mean_squared_error, optimizer=optimizer)
    monitor = DynamicsMonitor(model, optimizer, runner.scaler, every_n_steps=1, group_names=["all"])
    records = drive(runner, monitor, [_batch()], 6)
    assert all(r["dead_fraction/1"] == 1.0 for r in records)
    assert codes(records) == ["O25"]
    [warning] = records[2]["warnings"]
    assert "'1'" in warning["message"] and "LeakyReLU" in warning["fix"]


def test_overflowing_fp16_model_warns_o24_scale_and_skips():
    """The loss prints fine while fp16 backward overflows: the scaler halves every step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

    def huge_loss(m, batch):
        inputs, targets = batch
        return ((m(inputs).float() - targets) ** 2).mean() * 1e5

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
    runner, _ = make_runner(model, huge_loss, optimizer=optimizer, precision="fp16", init_scale=1024.0)
    monitor = DynamicsMonitor(model, optimizer, runner.scaler, every_n_steps=1, group_names=["all"], precision="fp16")
    batch = (torch.randn(16, 8), torch.randn(16, 1))
    records = drive(runner, monitor, [batch], 9)
    assert all(r["loss"] == pytest.approx(records[0]["loss"]) for r in records)  # finite and plausible
    assert [r["grad_scale"] for r in records] == [1024.0 / 2**k for k in range(1, 10)]
    found = {w["code"]: w for r in records for w in r.get("warnings", [])}
    assert set(found) == {"O24", "O24_SKIPS"}
    assert found["O24"]["step"] == 9  # the scale is below 16 at steps 7, 8 and 9
    assert found["O24"]["config_key"] == "trainer.precision" and "bf16" in found["O24"]["fix"]
    assert found["O24_SKIPS"]["step"] == 3
