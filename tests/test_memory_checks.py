"""The memory preflight checks on the tiny recipe: quiet when it fits, errors/warnings when not."""

from __future__ import annotations

import copy
from collections import namedtuple

import pytest
from omegaconf import OmegaConf

from optimus_preflight.memory.cuda_rules import CUDA_CONTEXT_BYTES
from optimus_preflight.preflight.analyses.step_inputs import step_inputs
from optimus_preflight.preflight.checks import memory_checks as memory_checks_module
from optimus_preflight.preflight.checks.memory_checks import HostMemoryCheck, VRAMHeadroomCheck, memory_checks
from optimus_preflight.preflight.framework import Findings, Stage
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import tiny_config

GIB = 1 << 30
BATCH = 256


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    recipe = CharLMRecipe(tiny_config(f"data.batch_size={BATCH}"), run_dir=tmp_path_factory.mktemp("memory_checks"))
    recipe.setup()
    return recipe


def make_context(recipe, *, first_batch=True, **overrides):
    ctx = PreflightContext.from_recipe(recipe)
    ctx.cfg = copy.deepcopy(recipe.cfg)
    for key, value in overrides.items():
        OmegaConf.update(ctx.cfg, key.replace("__", "."), value)
    if first_batch:
        ctx.artifacts.first_batch = next(iter(recipe.train_loader))
    return ctx


def target_for(limit_bytes: float) -> float:
    """target_gib whose usable limit is ``limit_bytes`` with usable_fraction=1, reserve_gib=0."""
    return (limit_bytes + CUDA_CONTEXT_BYTES) / GIB


def run(check, ctx) -> Findings:
    findings = Findings()
    check.run(ctx, findings)
    return findings


def codes(findings: Findings) -> list[tuple[str, str]]:
    return [(issue.code, issue.severity.value) for issue in findings.issues]


# With these the usable limit is the target less the CUDA context allowance.
EXACT = {"preflight__memory__usable_fraction": 1.0, "preflight__memory__reserve_gib": 0.0}


def test_memory_checks_are_registered_for_the_model_stage():
    checks = memory_checks()
    assert [c.name for c in checks] == ["memory.vram_headroom", "memory.host_ram"]
    assert all(c.stage is Stage.MODEL and c.requires == ("data.first_batch",) for c in checks)


def test_vram_check_is_quiet_when_the_job_fits_an_80_gib_target(recipe):
    findings = run(VRAMHeadroomCheck(), make_context(recipe, preflight__memory__target_gib=80))
    assert findings.issues == []
    assert 0 < findings.data["need_bytes"] < findings.data["limit_bytes"]
    assert findings.data["estimate"]["method"] == "fake" and findings.data["estimate"]["device"] == "cuda"


def test_vram_check_reports_not_applicable_for_cpu_training_without_a_target(recipe):
    findings = run(VRAMHeadroomCheck(), make_context(recipe))
    assert codes(findings) == [("MEM0", "info")]
    assert findings.issues[0].config_key == "preflight.memory.target_gib"


def test_vram_check_errors_when_the_step_does_not_fit_and_finds_the_largest_batch(recipe):
    base = run(VRAMHeadroomCheck(), make_context(recipe, preflight__memory__target_gib=80))
    limit = 0.75 * base.data["need_bytes"]
    ctx = make_context(recipe, preflight__memory__target_gib=target_for(limit), **EXACT)
    findings = run(VRAMHeadroomCheck(), ctx)
    assert codes(findings) == [("MEM1", "error")]
    largest = findings.data["largest_micro_batch"]
    assert largest >= 1 and largest < BATCH
    issue = findings.issues[0]
    assert f"largest micro-batch predicted to fit is {largest}" in issue.message
    assert "params" in issue.message and "activations" in issue.message  # the breakdown
    assert f"data.batch_size={largest}" in issue.fix and issue.config_key == "data.batch_size"
    # The answer is the boundary: it fits, one more sample does not.
    inputs = step_inputs(ctx)

    def need(n):
        estimate = inputs.estimate(n, device="cuda", precision="fp32")
        return estimate.required_bytes - estimate.context_bytes

    assert need(largest) <= findings.data["limit_bytes"] < need(largest + 1)
    assert ctx.artifacts.largest_micro_batch == largest


def test_vram_check_warns_within_10_percent_of_the_limit(recipe):
    base = run(VRAMHeadroomCheck(), make_context(recipe, preflight__memory__target_gib=80))
    limit = base.data["need_bytes"] / 0.95
    findings = run(VRAMHeadroomCheck(), make_context(recipe, preflight__memory__target_gib=target_for(limit), **EXACT))
    assert codes(findings) == [("MEM2", "warning")]
    assert findings.data["largest_micro_batch"] >= BATCH


def test_vram_check_fetches_a_batch_itself_when_run_alone(recipe):
    ctx = make_context(recipe, first_batch=False, preflight__memory__target_gib=80)
    findings = run(VRAMHeadroomCheck(), ctx)
    assert findings.issues == [] and findings.data["need_bytes"] > 0


def _untraceable(ctx):
    real_loss = ctx.compute_loss

    def loss_with_item(model, batch):
        loss, count = real_loss(model, batch)
        print(f"loss {loss.item():.3f}")  # data-dependent: impossible on fake tensors
        return loss, count

    ctx.compute_loss = loss_with_item
    return ctx


def test_vram_check_notes_the_formula_fallback_far_below_the_limit(recipe):
    findings = run(VRAMHeadroomCheck(), _untraceable(make_context(recipe, preflight__memory__target_gib=80)))
    assert codes(findings) == [("MEM3", "info")]
    assert "_local_scalar_dense" in findings.issues[0].message and findings.data["estimate"]["method"] == "analytic"


def test_vram_check_warns_of_the_formula_fallback_near_the_limit(recipe):
    """A lower bound within 10% of the limit may hide a step that does not fit: a warning."""
    formula = run(VRAMHeadroomCheck(), _untraceable(make_context(recipe, preflight__memory__target_gib=80)))
    limit = formula.data["need_bytes"] / 0.95
    ctx = _untraceable(make_context(recipe, preflight__memory__target_gib=target_for(limit), **EXACT))
    findings = run(VRAMHeadroomCheck(), ctx)
    assert ("MEM3", "warning") in codes(findings) and ("MEM2", "warning") in codes(findings)


VirtualMemory = namedtuple("VirtualMemory", "available total")


def test_host_ram_check_is_quiet_for_the_tiny_recipe(recipe):
    findings = run(HostMemoryCheck(), make_context(recipe))
    assert findings.issues == []
    assert findings.data["estimate"]["device"] == "cpu" and findings.data["need_bytes"] < findings.data["limit_bytes"]


@pytest.mark.parametrize("share, expected", [(0.7, ("MEM4", "error")), (0.95, ("MEM5", "warning"))])
def test_host_ram_check_fires_when_ram_is_short(recipe, monkeypatch, share, expected):
    ctx = make_context(recipe, preflight__memory__reserve_gib=0.0)
    need = run(HostMemoryCheck(), ctx).data["need_bytes"]
    held = memory_checks_module.host_memory_held(ctx)
    available = int(need / share) if expected[0] == "MEM5" else int(need * share)
    monkeypatch.setattr(
        memory_checks_module.psutil, "virtual_memory", lambda: VirtualMemory(available - held, 2 * available)
    )
    findings = run(HostMemoryCheck(), ctx)
    assert codes(findings) == [expected]
    assert "host memory" in findings.issues[0].message and findings.data["largest_micro_batch"] >= 1
