"""Preflight never changes training state: snapshot/restore, and bitwise equality
of every piece of state before and after the full default preflight."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from optimus_preflight.preflight.framework import Check, Stage
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.preserve import TrainingStateSnapshot
from optimus_preflight.preflight.framework.runner import run_preflight_checks
from optimus_preflight.reporting.summary import params_sha256
from tests.conftest import tiny_config


def _state_bytes(value):
    """A comparable, bitwise form of nested state (tensors as raw bytes)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        return ("tensor", str(tensor.dtype), tuple(tensor.shape), tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    if isinstance(value, dict):
        return {key: _state_bytes(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_state_bytes(item) for item in value]
    return value


def _everything(recipe) -> dict:
    context = recipe.training_context
    loader = recipe.train_loader
    return {
        "model": _state_bytes(dict(recipe.model.state_dict())),
        "buffers": _state_bytes({name: b for name, b in recipe.model.named_buffers()}),
        "grads": [p.grad is None for p in recipe.model.parameters()],
        "modes": [m.training for m in recipe.model.modules()],
        "optimizer": _state_bytes(recipe.optimizer.state_dict()),
        "opt_called": getattr(recipe.optimizer, "_opt_called", None),
        "scheduler": _state_bytes(recipe.scheduler.state_dict()),
        "scaler": _state_bytes(context.scaler.state_dict()),
        "python_rng": random.getstate(),
        "numpy_rng": [x.tobytes() if isinstance(x, np.ndarray) else x for x in np.random.get_state()],
        "torch_rng": _state_bytes(torch.get_rng_state()),
        "loader_generator": _state_bytes(loader.generator.get_state()),
        "sampler": dict(vars(loader.sampler)),
        "stream": recipe.batches.state_dict(),
    }


def _recipe(tmp_path, *overrides):
    from optimus_preflight.recipes.char_lm import CharLMRecipe

    recipe = CharLMRecipe(tiny_config(*overrides), run_dir=tmp_path)
    recipe.setup()
    return recipe


def test_full_preflight_leaves_training_bitwise_unchanged(tmp_path):
    # Accumulation and the overfit smoke enable the checks that run the most extra steps.
    overrides = ("trainer.accumulation_steps=2", "preflight.overfit_steps=3", "data.num_workers=1")
    with_preflight = _recipe(tmp_path / "a", *overrides)
    for _ in range(2):  # give the optimizer, scheduler and RNGs a non-initial state
        with_preflight.train_step()
    before = _everything(with_preflight)
    report = with_preflight.preflight()
    after = _everything(with_preflight)
    # 3 overfit steps are too few to halve the loss (O1 fires): the point is that it ran.
    assert all(c.status.value not in ("crashed", "skipped") for c in report.checks), [
        (c.name, c.status, c.detail) for c in report.checks
    ]
    assert {c.name for c in report.checks} >= {"step.accumulation", "step.overfit", "step.checkpoint", "step.throughput"}
    for key in before:
        assert before[key] == after[key], f"preflight changed {key}"
    for _ in range(2):
        with_preflight.train_step()

    without = _recipe(tmp_path / "b", *overrides)
    for _ in range(4):
        without.train_step()
    assert params_sha256(with_preflight.model) == params_sha256(without.model)
    assert _everything(with_preflight)["optimizer"] == _everything(without)["optimizer"]


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
        self.register_buffer("calls", torch.zeros(()), persistent=False)

    def forward(self, x):
        self.calls += 1
        return self.layers(x)


def test_snapshot_restores_params_buffers_optimizer_scheduler_scaler_and_rngs():
    torch.manual_seed(0)
    model = _Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, enabled=True)
    frozen_mode = model.layers[1]
    frozen_mode.eval()

    def step():
        loss = model(torch.randn(6, 4)).square().mean() + float(np.random.rand()) * 0 + random.random() * 0
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()

    step()
    before = (
        _state_bytes(model.state_dict()), _state_bytes(model.calls), _state_bytes(optimizer.state_dict()),
        scheduler.state_dict(), _state_bytes(scaler.state_dict()), random.getstate(),
        _state_bytes(torch.get_rng_state()), [m.training for m in model.modules()],
        [p.grad.clone() for p in model.parameters()],
    )
    snapshot = TrainingStateSnapshot(model, optimizer, scheduler, scaler)
    for _ in range(2):  # a snapshot restores as often as needed
        model.train()
        for _ in range(3):
            step()
        model.layers[0].weight = nn.Parameter(torch.zeros(8, 4))  # a check that rebinds an attribute
        snapshot.restore()
    after = (
        _state_bytes(model.state_dict()), _state_bytes(model.calls), _state_bytes(optimizer.state_dict()),
        scheduler.state_dict(), _state_bytes(scaler.state_dict()), random.getstate(),
        _state_bytes(torch.get_rng_state()), [m.training for m in model.modules()],
        [p.grad.clone() for p in model.parameters()],
    )
    assert before[:-1] == after[:-1]
    assert all(torch.equal(a, b) for a, b in zip(before[-1], after[-1], strict=True))
    # The optimizer still updates the model's own parameter objects.
    assert model.layers[0].weight is optimizer.param_groups[0]["params"][0]


class CarelessCheck(Check):
    """Changes the weights and the RNG without protecting them."""

    name = "test.careless"
    stage = Stage.STEP

    def run(self, ctx, findings):
        with torch.no_grad():
            next(ctx.model.parameters()).add_(1.0)
        torch.rand(3)


def test_run_preflight_restores_the_state_even_after_a_careless_check(tmp_path):
    recipe = _recipe(tmp_path)
    before = _everything(recipe)
    run_preflight_checks([CarelessCheck()], PreflightContext.from_recipe(recipe))
    assert _everything(recipe) == before
