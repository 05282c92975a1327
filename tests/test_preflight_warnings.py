"""Preflight warnings for settings that run but waste the machine (issue 13): fp16
autocast on a CPU, more loader workers than cores, and a memory target too small to
hold the CUDA context."""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from optimus_preflight.memory.cuda_rules import CUDA_CONTEXT_BYTES
from optimus_preflight.preflight.analyses.memory_limit import gpu_memory_limit
from optimus_preflight.preflight.checks import env_checks
from optimus_preflight.preflight.checks.config_checks import CPU_FP16_SLOWDOWN, PrecisionCheck, cpu_fp16_finding
from optimus_preflight.preflight.checks.env_checks import CpuCoresCheck, available_cores, workers_finding
from optimus_preflight.preflight.checks.memory_checks import (
    VRAMHeadroomCheck,
    smallest_target_gib,
    undersized_target,
)
from optimus_preflight.preflight.defaults import DEFAULT_CHECKS
from optimus_preflight.preflight.framework import CheckStatus, Findings
from tests.conftest import tiny_config
from tests.preflight_support import assert_quiet, classification_data, codes, make_recipe, plain_context, run

TORCH_WARNING = "This DataLoader will create"


def _run(check, ctx) -> Findings:
    findings = Findings()
    check.run(ctx, findings)
    return findings


def _precision_ctx(precision: str, device: str) -> SimpleNamespace:
    """What PrecisionCheck reads, for a device this machine may not have."""
    return SimpleNamespace(training=SimpleNamespace(plan=SimpleNamespace(precision=precision)),
                           device=torch.device(device))


def test_the_new_checks_are_in_the_default_list():
    names = [cls.name for cls in DEFAULT_CHECKS]
    assert {"config.precision", "env.cpu_cores"} <= set(names)


# ------------------------------------------------------------------ fp16 on a CPU
def test_fp16_autocast_on_a_cpu_is_named_with_the_measured_slowdown_and_both_fixes():
    message, fix = cpu_fp16_finding("fp16", "cpu")
    assert f"measured ~{CPU_FP16_SLOWDOWN}x slower than bf16 on a CPU" in message
    assert "trainer.precision=bf16" in fix and "trainer.precision=fp32" in fix


@pytest.mark.parametrize(("precision", "device"), [("bf16", "cpu"), ("fp32", "cpu"), ("fp16", "cuda")])
def test_other_precisions_and_fp16_on_a_gpu_are_quiet(precision, device):
    assert cpu_fp16_finding(precision, device) is None
    findings = _run(PrecisionCheck(), _precision_ctx(precision, device))
    assert findings.issues == [] and findings.data["summary"] == f"{precision} on {device}"


def test_fp16_on_a_cpu_warns_through_the_check_on_a_real_recipe(tmp_path):
    result = run(plain_context(tmp_path, "trainer.precision=fp16", "trainer.device=cpu"), PrecisionCheck)["config.precision"]
    assert result.status == CheckStatus.WARNING and codes(result) == {"PRECISION_CPU_FP16"}
    assert result.issues[0].config_key == "trainer.precision"


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_bf16_and_fp32_on_a_real_recipe_are_quiet(tmp_path, precision):
    assert_quiet(run(plain_context(tmp_path, f"trainer.precision={precision}"), PrecisionCheck)["config.precision"])


# ------------------------------------------------------------------ loader workers vs cores
def test_available_cores_follows_the_affinity_mask_then_the_cpu_count(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert available_cores() == 1
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert available_cores() == 6


def test_more_workers_than_cores_is_named_with_the_core_count_as_the_fix():
    assert workers_finding(0, 2) is None and workers_finding(2, 2) is None
    message, fix, code_fix = workers_finding(5, 2)
    assert "data.num_workers=5" in message and "2 CPU core(s)" in message
    assert fix == "Set data.num_workers=2 (or fewer)."
    assert "num_workers=2" in code_fix and "build_dataloaders()" in code_fix


def test_workers_check_warns_on_a_recipe_with_more_workers_than_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(env_checks, "available_cores", lambda: 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the filter the check installs must not outlive this test
        result = run(plain_context(tmp_path, "data.num_workers=2"), CpuCoresCheck)["env.cpu_cores"]
    assert result.status == CheckStatus.WARNING and codes(result) == {"ENV_WORKERS"}
    assert result.issues[0].config_key == "data.num_workers" and "data.num_workers=1" in result.issues[0].fix
    assert result.data["cores"] == 1 and result.data["num_workers"] == 2


@pytest.mark.parametrize("workers", [0, 1])
def test_workers_within_the_cores_are_quiet(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(env_checks, "available_cores", lambda: 1)
    assert_quiet(run(plain_context(tmp_path, f"data.num_workers={workers}"), CpuCoresCheck)["env.cpu_cores"])


def test_a_recipe_building_its_own_loader_gets_a_code_fix(tmp_path, monkeypatch):
    """data.num_workers does nothing for a loader the recipe builds itself."""
    monkeypatch.setattr(env_checks, "available_cores", lambda: 1)
    recipe = make_recipe(tmp_path, loader=lambda data: DataLoader(data, batch_size=8, num_workers=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        issue = run(recipe, CpuCoresCheck)["env.cpu_cores"].issues[0]
    assert issue.config_key is None
    assert issue.fix.startswith("Pass num_workers=1 (or fewer) to the DataLoader")


def test_torchs_own_warning_is_silenced_once_the_check_has_named_the_key():
    too_many = available_cores() + 1
    ctx = SimpleNamespace(train_loader=SimpleNamespace(num_workers=too_many))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DataLoader(classification_data(), num_workers=too_many)
        assert any(TORCH_WARNING in str(w.message) for w in caught)  # torch says it today
        caught.clear()
        assert [issue.code for issue in _run(CpuCoresCheck(), ctx).issues] == ["ENV_WORKERS"]
        # Construction runs the same worker-count check as every iter() does.
        DataLoader(classification_data(), num_workers=too_many)
        assert not [w for w in caught if TORCH_WARNING in str(w.message)]


# ------------------------------------------------------------------ memory target vs the CUDA context
def _memory(target_gib, usable_fraction=0.95, reserve_gib=0.5):
    return SimpleNamespace(target_gib=target_gib, usable_fraction=usable_fraction, reserve_gib=reserve_gib)


@pytest.mark.parametrize(("fraction", "reserve"), [(0.95, 0.5), (1.0, 0.0), (0.2, 0.0), (0.95, 4.0)])
def test_the_smallest_target_is_where_the_usable_memory_reaches_zero(fraction, reserve):
    smallest = smallest_target_gib(fraction, reserve)
    for target, undersized in [(smallest * 0.99, True), (smallest, True), (smallest * 1.01, False)]:
        cfg = SimpleNamespace(preflight=SimpleNamespace(memory=_memory(target, fraction, reserve)))
        usable = gpu_memory_limit(cfg, torch.device("cpu")).bytes
        assert (undersized_target(cfg.preflight.memory) is not None) == undersized == (usable <= 0), (target, usable)


def test_a_target_smaller_than_the_cuda_context_fails_the_check_naming_the_context_and_the_key():
    ctx = SimpleNamespace(cfg=tiny_config("preflight.memory.target_gib=0.25"))
    findings = _run(VRAMHeadroomCheck(), ctx)  # decided before any estimate: ctx has no model to trace
    [issue] = findings.issues
    assert (issue.code, issue.severity.value, issue.config_key) == ("MEM6", "error", "preflight.memory.target_gib")
    assert "too small to hold the" in issue.message and f"{CUDA_CONTEXT_BYTES >> 20}.0 MiB CUDA context" in issue.message
    assert "preflight.memory.target_gib" in issue.fix and "above 1.00" in issue.fix


def test_a_real_gpu_size_is_not_undersized():
    assert undersized_target(_memory(80)) is None and undersized_target(_memory(None)) is None
