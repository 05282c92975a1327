"""What is logged is what happened: the LR the optimizer used, torch's grad norm."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from optimus_preflight.recipes.char_lm import CharLMRecipe
from optimus_preflight.reporting.sinks import lr_metrics
from optimus_preflight.training.optim import warmup_cosine
from tests.conftest import tiny_config
from tests.step_helpers import GradRecorder, make_runner, mean_squared_error, window


def _batch(seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(6, 3, generator=generator), torch.randn(6, 2, generator=generator)


@pytest.mark.parametrize("clip", [None, 0.05])
def test_result_lr_and_grad_norm_match_torch(clip):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = GradRecorder(model.parameters(), lr=0.5)
    scheduler = warmup_cosine(optimizer, warmup_steps=3, min_lr_ratio=0.0, total_steps=6)
    runner, _ = make_runner(model, mean_squared_error, optimizer=optimizer, scheduler=scheduler, clip=clip)
    for step in range(5):
        reference = [p.detach().clone() for p in model.parameters()]
        reference_model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        with torch.no_grad():
            for target, source in zip(reference_model.parameters(), reference):
                target.copy_(source)
        mean_squared_error(reference_model, _batch(step)).backward()
        expected_norm = torch.nn.utils.clip_grad_norm_(reference_model.parameters(), float("inf"))

        result = runner.run(window([_batch(step)]))
        assert result.lrs == optimizer.seen_lrs[-1]
        torch.testing.assert_close(result.grad_norm, expected_norm)
        if clip is not None:
            applied = torch.linalg.vector_norm(torch.stack([g.norm() for g in optimizer.seen_grads[-1]]))
            assert applied <= clip * (1 + 1e-4)


def test_lr_metrics_split_by_group_only_when_groups_differ():
    assert lr_metrics([0.1, 0.1], ["decay", "no_decay"]) == {"lr": 0.1}
    assert lr_metrics([0.1, 0.01], ["backbone", "head"]) == {"lr": 0.1, "lr/backbone": 0.1, "lr/head": 0.01}


def test_recipe_logs_the_lr_each_step_used(tmp_path):
    cfg = tiny_config("trainer.max_steps=8", "scheduler.warmup_steps=4", "optimizer.lr=0.01", "preflight.enabled=false")
    recipe = CharLMRecipe(cfg, run_dir=tmp_path)
    used = []
    recipe.setup()
    recipe.optimizer.register_step_pre_hook(lambda optimizer, args, kwargs: used.append(optimizer.param_groups[0]["lr"]))
    recipe.run()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r["lr"] for r in records if "lr" in r]
    assert logged == pytest.approx(used, rel=1e-12)
    assert logged[:4] == pytest.approx([0.0025, 0.005, 0.0075, 0.01])
    for record in records:
        if "loss" in record:
            for key in ("step", "grad_norm", "skipped_steps", "samples_per_s", "time/data_ms", "time/forward_ms", "time/backward_ms", "time/optimizer_ms", "memory/host_rss_bytes"):
                assert key in record
