"""Precision matrix: autocast dtype per setting, scaler only for fp16, scaler state."""

from __future__ import annotations

import pytest
import torch

from optimus_preflight.config.schema import GradScalerConfig
from optimus_preflight.errors import UserError
from optimus_preflight.training import precision
from optimus_preflight.training.precision import PrecisionPlan, make_grad_scaler, resolve_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "name, dtype, scaler_on",
    [("fp32", torch.float32, False), ("bf16", torch.bfloat16, False), ("fp16", torch.float16, True)],
)
def test_autocast_dtype_and_scaler_per_precision(name, dtype, scaler_on):
    plan = PrecisionPlan(resolve_precision(name, CPU), CPU)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with plan.autocast():
        assert (a @ b).dtype == dtype
    assert plan.uses_grad_scaler is scaler_on
    assert make_grad_scaler(plan, GradScalerConfig()).is_enabled() is scaler_on


@pytest.mark.parametrize("native_bf16", [True, False])
def test_auto_on_cpu_is_fp32_even_where_bf16_is_native(monkeypatch, native_bf16):
    """Mixed precision changes a model's numerics: auto picks it only on a GPU."""
    monkeypatch.setattr(precision, "device_supports_bf16", lambda device: native_bf16)
    assert resolve_precision("auto", CPU) == "fp32"


@pytest.mark.parametrize("bf16, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_on_cuda_is_bf16_where_native_else_fp32(monkeypatch, bf16, expected):
    monkeypatch.setattr(precision, "device_supports_bf16", lambda device: bf16)
    assert resolve_precision("auto", torch.device("cuda", 0)) == expected


def test_bf16_on_a_cuda_device_without_bf16_is_a_user_error(monkeypatch):
    monkeypatch.setattr(precision, "device_supports_bf16", lambda device: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    with pytest.raises(UserError) as error:
        resolve_precision("bf16", torch.device("cuda", 0))
    assert "trainer.precision" in str(error.value) and "fp16" in str(error.value)


def test_unknown_precision_names_key_and_fix():
    with pytest.raises(UserError, match=r"trainer\.precision.*fp9.*Set trainer\.precision=auto"):
        resolve_precision("fp9", CPU)


def test_cuda_requested_without_cuda_is_a_user_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="trainer.device=cpu"):
        precision.resolve_device("cuda")


def test_grad_scaler_state_round_trips():
    plan = PrecisionPlan("fp16", CPU)
    config = GradScalerConfig(init_scale=1024.0, growth_interval=7)
    scaler = make_grad_scaler(plan, config)
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scaler.scale((param * float("inf")).sum()).backward()
    scaler.step(optimizer)  # inf gradient: skipped, scale backs off
    scaler.update()
    state = scaler.state_dict()
    assert state["scale"] == 512.0 and state["growth_interval"] == 7
    assert torch.equal(param.detach(), torch.ones(3))

    restored = make_grad_scaler(plan, GradScalerConfig())
    restored.load_state_dict(state)
    assert restored.get_scale() == 512.0
    assert restored.state_dict() == state
