"""TARGETS_NOT_AFTER_WINDOW: multi-step forecast targets stacked per lead time as (H, N) and
reshaped to (N, H) instead of transposed: each window's targets are values of the series at
another distance past it. The transposed stack, targets a fixed gap ahead, and targets of
another variable stay quiet."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.target_offset import scattered, target_offsets
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.target_offset import TargetOffsetCheck

W, H = 36, 12


def panel(series_count: int = 12, length: int = 160) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = torch.arange(length, dtype=torch.float32)
    return [torch.sin(2 * math.pi * (t + 5 * k) / 24) + 0.3 * torch.randn(length, generator=g)
            for k in range(series_count)]


def windows(stack: str, gap: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for s in panel():  # windows cut per series, as a global forecasting model's data
        n = s.numel() - W - H - gap + 1
        xs.append(torch.stack([s[i:i + W] for i in range(n)]))
        by_lead = torch.stack([s[W + gap + h:W + gap + h + n] for h in range(H)])  # (H, N)
        ys.append(by_lead.reshape(n, H) if stack == "reshape" else by_lead.T.contiguous())
    return torch.cat(xs), torch.cat(ys)


def issues(x: torch.Tensor, y: torch.Tensor) -> dict:
    model = nn.Linear(W, H)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), TargetOffsetCheck()])
    return {i.code: i for i in report.check("data.target_offset").issues}


def test_a_per_lead_stack_reshaped_instead_of_transposed_is_named():
    issue = issues(*windows("reshape"))["TARGETS_NOT_AFTER_WINDOW"]
    assert "do not follow their own window" in issue.message and ".reshape(N, H)" in issue.fix


@pytest.mark.parametrize("gap", [0, 24], ids=["next_steps", "a_day_ahead"])
def test_targets_at_one_lead_past_every_window_stay_quiet(gap):
    assert issues(*windows("transpose", gap)) == {}
    found = target_offsets(*windows("transpose", gap))
    # A day ahead of short series, many targets lie past every window's inputs: not judged.
    assert (found is None and gap) or (found.best_lead == gap + 1 and not scattered(found))


def test_targets_of_another_variable_are_not_judged():
    x, _ = windows("transpose")
    other = torch.randn(x.shape[0], H, generator=torch.Generator().manual_seed(3))
    assert target_offsets(x, other) is None and issues(x, other) == {}
