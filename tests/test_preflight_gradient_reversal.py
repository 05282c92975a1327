"""step.gradients: GRADIENT_REVERSED_ON_LABELS, a gradient reversal layer in front of the
label head (the features trained to hide the labels); quiet with the reversal in front of
the domain classifier, as domain-adversarial training has it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.gradient_reversal import reversal_factor, reversals_on
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.alpha * grad, None


class StraightThrough(torch.autograd.Function):
    """Rounds forward, passes the gradient unchanged: a custom Function that is no reversal."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class DANN(nn.Module):
    def __init__(self, reverse_on_labels: bool):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(12, 32), nn.ReLU())
        self.label_head, self.domain_head = nn.Linear(32, 3), nn.Linear(32, 2)
        self.reverse_on_labels = reverse_on_labels

    def forward(self, x):
        h = self.features(x)
        if self.reverse_on_labels:
            return self.label_head(GradReverse.apply(h, 0.5)), self.domain_head(h)
        return self.label_head(StraightThrough.apply(h * 4) / 4), self.domain_head(GradReverse.apply(h, 0.5))


def dann_loss(model, batch):
    x, labels, domains = batch
    label_logits, domain_logits = model(x)
    return F.cross_entropy(label_logits, labels) + F.cross_entropy(domain_logits, domains)


def reversal_issues(model):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 12, generator=g), torch.randint(0, 3, (256,), generator=g),
                         torch.randint(0, 2, (256,), generator=g))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32, shuffle=True),
                           loss_fn=dann_loss, checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    return [issue for issue in report.check("step.gradients").issues if issue.code == "GRADIENT_REVERSED_ON_LABELS"]


@pytest.mark.parametrize("reverse_on_labels", [True, False], ids=["in_front_of_the_label_head", "in_front_of_the_domain_head"])
def test_a_reversal_fires_only_on_the_labels_path(reverse_on_labels):
    issues = reversal_issues(DANN(reverse_on_labels))
    assert bool(issues) == reverse_on_labels
    if issues:
        assert "GradReverse" in issues[0].message and "-0.5 x the gradient" in issues[0].message
        assert "other loss term" in issues[0].message and "domain_head(GradReverse.apply(h, alpha))" in issues[0].fix


def test_only_a_negative_scaling_backward_counts_as_a_reversal():
    x = torch.randn(4, 3, requires_grad=True)
    assert reversal_factor(GradReverse.apply(x * 1, 2.0).grad_fn) == pytest.approx(-2.0)
    assert reversal_factor(StraightThrough.apply(x * 1).grad_fn) is None
    assert reversals_on((StraightThrough.apply(x * 1) ** 2).sum()) == []
    assert [name for name, _ in reversals_on(GradReverse.apply(x, 1.0).sum())] == ["GradReverse"]


def test_a_reentrant_checkpoint_or_a_backward_that_keeps_tensors_is_never_called():
    from torch.utils.checkpoint import checkpoint

    layer = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    out = checkpoint(layer, x, use_reentrant=True)
    assert reversals_on(out.sum()) == []
    assert layer.weight.grad is None  # its backward (a whole backward pass) did not run

    class KeepsInput(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h):
            ctx.save_for_backward(h)
            return h.clone()

        @staticmethod
        def backward(ctx, grad):
            raise AssertionError("called")

    assert reversals_on(KeepsInput.apply(x * 1).sum()) == []
