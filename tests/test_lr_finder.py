"""LR range test: a sane suggestion on the tiny recipe, nothing of the real state
changed, and the preflight check's findings and files."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
from torch import nn

from optimus_preflight.dynamics.lr_finder import LRRangeResult, geometric_lrs, lr_range_test
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.lr_finder_check import LRFinderCheck, dynamics_checks, report
from optimus_preflight.preflight.framework import CheckStatus, Findings, run_checks
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import tiny_config


def _state_bytes(recipe) -> dict:
    """Everything the test must leave bitwise unchanged, as comparable values."""
    optimizer = recipe.optimizer.state_dict()
    return {
        "model": {k: v.clone() for k, v in recipe.model.state_dict().items()},
        "optimizer_state": {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for i, s in optimizer["state"].items()},
        "param_groups": [dict(g) for g in optimizer["param_groups"]],
        "scheduler": recipe.scheduler.state_dict()["last_epoch"],
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    recipe = CharLMRecipe(tiny_config("preflight.lr_finder=true"), run_dir=tmp_path_factory.mktemp("lr_finder"))
    recipe.setup()
    recipe.train_step()  # real optimizer state (Adam moments) and a stepped scheduler
    return recipe


@pytest.fixture(scope="module")
def sweep(recipe):
    before = _state_bytes(recipe)

    def batches():
        while True:
            yield from recipe.train_loader

    result = lr_range_test(
        recipe.model,
        recipe.optimizer,
        recipe.compute_loss,
        batches(),
        start_lr=1e-5,
        end_lr=10.0,
        num_steps=60,
        clip_grad_norm=1.0,
    )
    return result, before, _state_bytes(recipe)


def test_suggests_a_sane_lr_for_the_tiny_recipe(sweep):
    result, _, _ = sweep
    # The recipe trains well at its configured 3e-3; the suggestion must be in that band.
    assert 3e-4 <= result.suggested_lr <= 3e-2
    assert result.suggested_lr == pytest.approx(result.min_loss_lr / 10)
    assert result.steepest_lr <= result.min_loss_lr
    assert result.diverged_lr is not None and result.diverged_lr > result.min_loss_lr
    assert len(result.lrs) < 60 and result.lrs == geometric_lrs(1e-5, 10.0, 60)[: len(result.lrs)]


def test_leaves_model_optimizer_scheduler_and_rng_bitwise_unchanged(sweep):
    _, before, after = sweep
    assert _same(before, after)


def test_report_compares_the_configured_lr(sweep):
    result, _, _ = sweep
    for lr, expected in ((1e-7, ["O7", "O7"]), (3e-3, ["O7"]), (10.0, ["O7", "O7_HIGH"])):
        findings = Findings()
        report(result, lr, findings)
        assert [issue.code for issue in findings.issues] == expected, lr
    assert findings.issues[1].config_key == "optimizer.lr" and f"{result.suggested_lr:.1e}" in findings.issues[1].fix


def test_a_loss_that_never_falls_warns_o7_flat():
    flat = LRRangeResult([1e-3, 1e-2, 1e-1], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0], None, None, None, None, "reached end_lr")
    findings = Findings()
    report(flat, 1e-3, findings)
    assert [issue.code for issue in findings.issues] == ["O7_FLAT"]


def test_check_writes_json_and_png_and_reports(recipe):
    ctx = PreflightContext.from_recipe(recipe)
    generator_state = recipe.train_loader.generator.get_state()
    first, result = run_checks([FirstBatchCheck(), LRFinderCheck(num_steps=40, start_lr=1e-4)], ctx)
    assert first.status == CheckStatus.PASSED
    assert torch.equal(recipe.train_loader.generator.get_state(), generator_state)
    assert result.status == CheckStatus.PASSED, result.detail
    assert [issue.code for issue in result.issues] == ["O7"]
    assert result.data["configured_lr"] == 3e-3 and result.data["suggested_lr"] > 0
    saved = json.loads((recipe.run_dir / "lr_finder.json").read_text())
    assert saved["suggested_lr"] == result.data["suggested_lr"] and len(saved["lrs"]) == result.data["steps"]
    png = (recipe.run_dir / "lr_finder.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5_000


def test_check_does_nothing_unless_enabled(tmp_path):
    recipe = CharLMRecipe(tiny_config(), run_dir=tmp_path)
    recipe.setup()
    _, result = run_checks([FirstBatchCheck(), *dynamics_checks()], PreflightContext.from_recipe(recipe))
    assert result.status == CheckStatus.PASSED and result.data == {"enabled": False}
    assert not (tmp_path / "lr_finder.json").exists()


def test_fp16_sweep_runs_on_copies_of_model_optimizer_and_scaler():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    inputs = torch.randn(64, 4)
    targets = inputs.sum(dim=1, keepdim=True)
    batches = [(inputs[i : i + 16], targets[i : i + 16]) for i in range(0, 64, 16)]
    weights = [p.detach().clone() for p in model.parameters()]

    def loss_fn(m, batch):
        return torch.nn.functional.mse_loss(m(batch[0]).float(), batch[1])

    result = lr_range_test(
        model, optimizer, loss_fn, itertools.cycle(batches), start_lr=1e-4, end_lr=10.0, num_steps=40,
        autocast=lambda: torch.autocast("cpu", dtype=torch.float16), scaler=scaler,
    )
    assert result.suggested_lr is not None and result.min_loss_lr > 1e-3
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))
    assert optimizer.state_dict()["state"] == {} and scaler.get_scale() == 256.0
