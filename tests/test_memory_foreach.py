"""O11: foreach optimizer temporaries in the step's peak, and the memory checks' advice on them."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimus_preflight.memory import estimate_step_memory, measure_step_memory
from optimus_preflight.memory.cuda_rules import CUDA_CONTEXT_BYTES
from optimus_preflight.memory.optimizer_paths import FOR_LOOP, FOREACH, FUSED, fused, per_tensor, step_implementation
from optimus_preflight.preflight.checks import memory_checks as memory_checks_module
from optimus_preflight.preflight.checks.memory_checks import HostMemoryCheck, VRAMHeadroomCheck
from tests.preflight_support import CLASSES, FEATURES, assert_quiet, codes, make_recipe, plain_context, run

GIB = 1 << 30
WIDTH = 256
LAYERS = 8


def wide_mlp(width: int = 4 * WIDTH) -> nn.Module:
    """Parameters dominate (8.4M: their 5 copies under foreach AdamW dwarf the 64 MiB cuBLAS
    workspace allowance), activations are tiny: the step's peak is at optimizer.step."""
    inner = [layer for _ in range(LAYERS) for layer in (nn.Linear(width, width), nn.ReLU())]
    return nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(), *inner, nn.Linear(width, CLASSES))


def stacked() -> nn.Module:
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))


BATCH = (torch.randn(4, WIDTH), torch.randn(4, WIDTH))


def mse(model, batch):
    return F.mse_loss(model(batch[0]), batch[1])


def param_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in stacked().parameters())


@pytest.mark.parametrize(
    "make, foreach_copies",
    [
        (lambda p, **kw: torch.optim.AdamW(p, **kw), 1.0),
        (lambda p, **kw: torch.optim.Adam(p, weight_decay=0.1, **kw), 1.0),
        (lambda p, **kw: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4, **kw), 1.0),
        (lambda p, **kw: torch.optim.Adagrad(p, **kw), 2.0),
    ],
    ids=["adamw", "adam_wd", "sgd_momentum_wd", "adagrad"],
)
def test_foreach_temporaries_span_all_parameters_and_the_loop_and_fused_do_not(make, foreach_copies):
    # Verified on torch 2.13 on real tensors, and the fake-tensor estimate agrees.
    params = param_bytes()
    peaks = {}
    for name, options in {"foreach": {"foreach": True}, "loop": {"foreach": False}, "fused": {"fused": True}}.items():
        measured = measure_step_memory(stacked, BATCH, mse, lambda p, o=options: make(p, **o))
        estimated = estimate_step_memory(stacked, BATCH, mse, lambda p, o=options: make(p, **o))
        assert estimated.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.02)
        peaks[name] = measured.detail.get("optimizer_temporaries", 0), measured.peak_bytes
    foreach_temporaries, foreach_peak = peaks["foreach"]
    loop_temporaries, loop_peak = peaks["loop"]
    # foreach: whole copies of every parameter at once; the loop: a few layers' worth at most.
    assert foreach_temporaries == pytest.approx(foreach_copies * params, rel=0.01)
    assert loop_temporaries <= 3 * params / LAYERS + 1024
    assert peaks["fused"][0] == 0
    assert loop_peak < foreach_peak and peaks["fused"][1] < foreach_peak


def test_the_estimate_names_the_optimizer_path_it_traced():
    cuda_default = estimate_step_memory(stacked, BATCH, mse, lambda p: torch.optim.AdamW(p), device="cuda")
    cpu_default = estimate_step_memory(stacked, BATCH, mse, lambda p: torch.optim.AdamW(p))
    fused_cuda = estimate_step_memory(stacked, BATCH, mse, lambda p: torch.optim.AdamW(p, fused=True), device="cuda")
    assert (cuda_default.optimizer_step, cpu_default.optimizer_step, fused_cuda.optimizer_step) == (FOREACH, FOR_LOOP, FUSED)
    assert "optimizer.step temporaries" in cuda_default.describe()


def test_path_builders_switch_every_group():
    model = stacked()

    def build(m):
        return torch.optim.AdamW([{"params": list(m.parameters())[:2]}, {"params": list(m.parameters())[2:]}])

    assert step_implementation(build(model), "cuda") == FOREACH
    assert step_implementation(per_tensor(build)(model), "cuda") == FOR_LOOP
    assert step_implementation(fused(build)(model), "cuda") == FUSED
    assert step_implementation(torch.optim.LBFGS(model.parameters()), "cuda") == "custom"


def target_for(limit_bytes: float) -> float:
    return (limit_bytes + CUDA_CONTEXT_BYTES) / GIB


EXACT = ("preflight.memory.usable_fraction=1.0", "preflight.memory.reserve_gib=0.0")


def vram_need(tmp_path, optimizer) -> int:
    ctx = plain_context(tmp_path / "probe", "preflight.memory.target_gib=80", model=wide_mlp, optimizer=optimizer)
    return run(ctx, VRAMHeadroomCheck)["memory.vram_headroom"].data["need_bytes"]


def test_vram_check_names_foreach_false_when_foreach_temporaries_make_the_step_not_fit(tmp_path):
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)  # noqa: E731 - CUDA's default: foreach
    need = vram_need(tmp_path, adamw)
    recipe = make_recipe(tmp_path, f"preflight.memory.target_gib={target_for(0.95 * need)}", *EXACT,
                         model=wide_mlp, optimizer=adamw)
    result = run(recipe, VRAMHeadroomCheck)["memory.vram_headroom"]
    assert codes(result) == {"MEM1", "O11"}
    issue = next(issue for issue in result.issues if issue.code == "O11")
    assert issue.severity.value == "warning"
    assert "inside optimizer.step()" in issue.message and "foreach" in issue.message
    assert result.data["need_bytes_foreach_false"] < 0.95 * need  # the loop fits
    assert result.data["need_bytes_fused"] < result.data["need_bytes_foreach_false"]
    assert "With foreach=False the step needs" in issue.message and "fits" in issue.message
    mem1 = next(issue for issue in result.issues if issue.code == "MEM1")
    assert mem1.fix.startswith("Pass foreach=False to the optimizer and the step fits")
    # The recipe overrides build_optimizer, so the fix is the code change, not the config key.
    assert issue.config_key is None and "In your build_optimizer, pass foreach=False" in issue.fix


def test_the_config_key_is_named_when_the_default_optimizer_builder_reads_it(tmp_path):
    need = vram_need(tmp_path, None)
    recipe = make_recipe(tmp_path, f"preflight.memory.target_gib={target_for(0.95 * need)}", *EXACT, model=wide_mlp)
    issue = next(i for i in run(recipe, VRAMHeadroomCheck)["memory.vram_headroom"].issues if i.code == "O11")
    assert issue.config_key == "optimizer.foreach" and "++optimizer.foreach=false" in issue.fix
    # The fix works: with it the default builder builds the per-tensor optimizer, which fits
    # (within 10% of the limit here, as the message predicted).
    fixed = make_recipe(tmp_path / "fixed", f"preflight.memory.target_gib={target_for(0.95 * need)}", *EXACT,
                        "++optimizer.foreach=false", model=wide_mlp)
    assert fixed.optimizer.defaults["foreach"] is False
    result = run(fixed, VRAMHeadroomCheck)["memory.vram_headroom"]
    assert codes(result) <= {"MEM2"} and result.data["need_bytes"] <= result.data["limit_bytes"]


@pytest.mark.parametrize("options", [{"foreach": False}, {"fused": True}], ids=["foreach_false", "fused"])
def test_vram_check_is_quiet_about_o11_when_the_optimizer_does_not_use_foreach(tmp_path, options):
    def optimizer(m):
        return torch.optim.AdamW(m.parameters(), lr=1e-3, **options)

    need = vram_need(tmp_path, optimizer)
    ctx = plain_context(tmp_path, f"preflight.memory.target_gib={target_for(0.95 * need)}", *EXACT,
                         model=wide_mlp, optimizer=optimizer)
    result = run(ctx, VRAMHeadroomCheck)["memory.vram_headroom"]
    assert codes(result) == {"MEM1"}


def test_vram_check_says_nothing_of_foreach_when_the_step_fits(tmp_path):
    ctx = plain_context(tmp_path, "preflight.memory.target_gib=80", model=wide_mlp)
    result = run(ctx, VRAMHeadroomCheck)["memory.vram_headroom"]
    assert_quiet(result)
    assert result.data["optimizer_step"] == FOREACH and result.data["optimizer_temporaries_bytes"] > 0


VirtualMemory = namedtuple("VirtualMemory", "available total")


def test_host_check_names_foreach_when_a_cpu_job_asks_for_it(tmp_path, monkeypatch):
    def optimizer(m):
        return torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)

    ctx = plain_context(tmp_path, "preflight.memory.reserve_gib=0.0", model=wide_mlp, optimizer=optimizer)
    need = run(ctx, HostMemoryCheck)["memory.host_ram"].data["need_bytes"]

    held = memory_checks_module.host_memory_held(ctx)
    monkeypatch.setattr(memory_checks_module.psutil, "virtual_memory",
                        lambda: VirtualMemory(int(0.97 * need) - held, 4 * need))
    result = run(ctx, HostMemoryCheck)["memory.host_ram"]
    assert codes(result) == {"MEM4", "O11"}
    assert result.data["optimizer_step"] == FOREACH


@pytest.mark.parametrize("unscale_first", [False, True], ids=["scaler_step", "unscale_clip_step"])
def test_fused_adamw_under_grad_scaler_matches_the_loop_on_torch_2_13(unscale_first):
    # Why O11 reports no fused-under-AMP caveat: GradScaler hands fused optimizers grad_scale and
    # found_inf (None grad_scale once unscale_ ran, as this project's step does before clipping),
    # and an inf step is skipped by both paths alike (CPU kernels; CUDA shares the plumbing).
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(64, 16), torch.randn(64, 4)

    def train(**options) -> torch.Tensor:
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        model.load_state_dict(base.state_dict())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **options)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for step in range(6):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            if step == 2:
                model[0].weight.grad[0, 0] = float("inf")
            if unscale_first:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        assert float(optimizer.state[model[0].weight]["step"]) == 5  # the inf step was skipped
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    assert torch.allclose(train(fused=True), train(foreach=False), atol=1e-6)
