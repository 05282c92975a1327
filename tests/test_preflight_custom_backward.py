"""step.custom_backward: a user's autograd.Function whose backward is not its forward's
derivative fires; correct Functions and deliberate gradient tricks stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.custom_functions import FunctionCall, audit_function, recorded_functions
from optimus_preflight.preflight.checks.custom_backward import CustomBackwardCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class Swish(torch.autograd.Function):
    """A memory-saving SiLU, as people write them: correct."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s * (1 + x * (1 - s)))


class SwishNoChainRule(torch.autograd.Function):
    """The derivative alone: grad_output left out."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return s * (1 + x * (1 - s))


class SigmoidWrongDerivative(torch.autograd.Function):
    """sigma'(x) written as sigma(x) (1 + sigma(x))."""

    @staticmethod
    def forward(ctx, x):
        out = torch.sigmoid(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out * (1 + out)


class LinearFn(torch.autograd.Function):
    """y = x W^T + b with its three gradients; ``swapped`` returns them as the other input's."""

    swapped = False

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x, grad_w = grad @ weight, grad.t() @ x
        if LinearFn.swapped:  # a transposed weight gradient: right shape only when square
            grad_w = grad_w.t()
        return grad_x, grad_w, grad.sum(0)


class NegatedSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return -2 * x * grad


class HalvedSquare(torch.autograd.Function):
    """d(x^2)/dx written as x: half the derivative, tenfold further below."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return HalvedSquare.factor * x * grad


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ClampPassThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(-0.5, 0.5)

    @staticmethod
    def backward(ctx, grad):
        return grad


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.alpha * grad, None


class NumpyTanh(torch.autograd.Function):
    """The forward in NumPy (no graph there), the backward supplied by hand: correct."""

    @staticmethod
    def forward(ctx, x):
        out = torch.from_numpy(__import__("numpy").tanh(x.detach().cpu().numpy())).to(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * (1 - out * out)


class DropoutInside(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.5).to(x)
        ctx.save_for_backward(mask)
        return x * mask * 3

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask  # wrong by a factor 3, but the forward is random: nothing to compare


def _call(cls, *args):
    args = tuple(a.requires_grad_(True) if isinstance(a, torch.Tensor) else a for a in args)
    differentiable = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad)
    return FunctionCall(cls, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), {}, differentiable)


def x():
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("cls,kind", [(SwishNoChainRule, "direction"), (SigmoidWrongDerivative, "direction"),
                                      (NegatedSquare, "sign")])
def test_a_backward_that_is_not_the_derivative_is_found(cls, kind):
    found = audit_function(_call(cls, x()))
    assert found is not None and found.kind == kind and found.position == 0 and found.shape == (16, 8)
    assert found.function == cls.__name__ and "test_preflight_custom_backward.py:" in found.where


def test_gradients_returned_for_the_wrong_input_are_found_and_the_right_ones_pass(monkeypatch):
    g = torch.Generator().manual_seed(1)
    args = (torch.randn(8, 6, generator=g), torch.randn(6, 6, generator=g), torch.randn(6, generator=g))
    assert audit_function(_call(LinearFn, *[a.clone() for a in args])) is None
    monkeypatch.setattr(LinearFn, "swapped", True)
    found = audit_function(_call(LinearFn, *[a.clone() for a in args]))
    assert found is not None and found.position == 1 and found.kind == "direction"


def test_a_constant_factor_is_named_as_a_scale():
    HalvedSquare.factor = 1.0
    found = audit_function(_call(HalvedSquare, x()))
    assert found is not None and found.kind == "scale" and found.ratio == pytest.approx(0.5, rel=1e-3)


@pytest.mark.parametrize("cls,args", [(Swish, ()), (NumpyTanh, ()), (RoundSTE, ()), (ClampPassThrough, ()),
                                      (GradReverse, (0.3,)), (DropoutInside, ())],
                         ids=["swish", "numpy_forward", "straight_through_round", "clamp_pass_through",
                              "gradient_reversal", "random_forward"])
def test_correct_functions_and_deliberate_tricks_pass(cls, args):
    assert audit_function(_call(cls, x() * 2, *args)) is None


def test_only_the_users_functions_are_recorded():
    from torch.utils.checkpoint import checkpoint

    calls: list[FunctionCall] = []
    layer = nn.Linear(8, 8)
    inputs = x().requires_grad_(True)
    with recorded_functions(calls):
        checkpoint(layer, inputs, use_reentrant=True)  # torch's own CheckpointFunction
        Swish.apply(inputs)
        Swish.apply(inputs * 2)  # a second call of the same Function is not recorded again
        with torch.no_grad():
            SwishNoChainRule.apply(inputs)  # no graph: it trains nothing
    assert [call.cls for call in calls] == [Swish]
    assert torch.autograd.Function.apply.__func__.__qualname__ == "Function.apply"  # restored


# ----------------------------------------------------------------- through run_preflight
class Tagger(nn.Module):
    """A tabular classifier whose hidden activation is a custom Function."""

    def __init__(self, activation):
        super().__init__()
        self.inp, self.out = nn.Linear(10, 32), nn.Linear(32, 3)
        self.activation = activation

    def forward(self, features):
        return self.out(self.activation.apply(self.inp(features)))


def _issues(activation):
    g = torch.Generator().manual_seed(0)
    features = torch.randn(512, 10, generator=g)
    labels = (features[:, :3]).argmax(1)
    model = Tagger(activation)
    loader = DataLoader(TensorDataset(features, labels), batch_size=64, shuffle=True)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader,
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), CustomBackwardCheck()])
    return report.check("step.custom_backward")


def test_the_check_fires_through_run_preflight_and_names_the_function_and_the_fix():
    found = _issues(SwishNoChainRule)
    (issue,) = found.issues
    assert issue.code == "CUSTOM_BACKWARD_WRONG" and issue.severity.name == "ERROR"
    assert "SwishNoChainRule.backward" in issue.message and "first input of forward (shape (64, 32))" in issue.message
    assert "grad_output" in issue.message
    assert "torch.autograd.gradcheck(SwishNoChainRule.apply" in issue.fix and "chain rule" in issue.fix


def test_a_tenfold_scale_warns_and_a_correct_function_is_quiet(monkeypatch):
    monkeypatch.setattr(HalvedSquare, "factor", 20.0)  # 10x the derivative
    (issue,) = _issues(HalvedSquare).issues
    assert issue.code == "CUSTOM_BACKWARD_SCALED" and "10 times the derivative" in issue.message
    quiet = _issues(Swish)
    assert not quiet.issues and quiet.data["summary"] == "1/1 custom autograd Function(s) agree"


class SignSTENoReturn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sign(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad_input = grad.clone()
        grad_input[x.abs() > 1] = 0  # the return statement went missing


class SignSTE(SignSTENoReturn):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1)


def test_a_backward_that_returns_none_is_named_and_the_step_does_not_crash():
    found = _issues(SignSTENoReturn)
    (issue,) = [i for i in found.issues if i.code == "CUSTOM_BACKWARD_NONE"]
    assert "SignSTENoReturn.backward" in issue.message and "returns None for the first input" in issue.message
    assert "return grad_input" in issue.fix
    assert _issues(SignSTE).issues == []


def test_the_layers_left_without_gradient_are_blamed_on_the_missing_return():
    from optimus_preflight.preflight.checks.step_checks import GradientsCheck

    g = torch.Generator().manual_seed(0)
    features = torch.randn(256, 10, generator=g)
    model = Tagger(SignSTENoReturn)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(features, features[:, :3].argmax(1)), batch_size=64, shuffle=True),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    (issue,) = [i for i in report.check("step.gradients").issues if i.code == "GRAD_NONE"]
    assert "inp.weight" in issue.message and "SignSTENoReturn.backward" in issue.message and ".detach()" not in issue.message
