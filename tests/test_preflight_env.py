"""Environment checks and the size measurements they use."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from optimus_preflight.preflight.analyses.sizes import checkpoint_bytes_estimate, optimizer_state_bytes, tensor_bytes
from optimus_preflight.preflight.checks import env_checks
from optimus_preflight.preflight.checks.env_checks import (
    DeviceCheck,
    DiskSpaceCheck,
    HostRamCheck,
    RunDirCheck,
    SharedMemoryCheck,
    device_findings,
)
from optimus_preflight.preflight.framework import CheckStatus
from optimus_preflight.preflight.framework.context import PreflightContext
from tests.preflight_support import assert_quiet, classifier, codes, make_recipe, plain_context, run

ENV = (DeviceCheck, SharedMemoryCheck, HostRamCheck, RunDirCheck, DiskSpaceCheck)


def test_healthy_environment_is_quiet(tmp_path):
    results = run(plain_context(tmp_path), *ENV)
    for result in results.values():
        assert_quiet(result)
    assert results["env.disk_space"].data["checkpoint_bytes"] > 0


def _codes(findings):
    return {(severity, code) for severity, code, _, _ in findings}


def test_device_requests_this_machine_cannot_serve():
    assert _codes(device_findings("cuda", "cpu", False, 0, 1, 1, 0)) == {("error", "ENV_NO_CUDA")}
    assert _codes(device_findings("cuda", "cuda", True, 2, 4, 4, 3)) == {("error", "ENV_GPU_COUNT")}
    assert _codes(device_findings("auto", "cuda", True, 2, 2, 1, 2)) == {("error", "ENV_GPU_COUNT")}
    assert _codes(device_findings("auto", "cuda", True, 8, 8, 8, 7)) == set()
    assert _codes(device_findings("auto", "cpu", False, 0, 1, 1, 0)) == {("info", "ENV_CPU")}


Usage = namedtuple("Usage", "total used free")


def test_small_dev_shm_with_workers_warns(tmp_path, monkeypatch):
    monkeypatch.setattr(env_checks.shutil, "disk_usage", lambda path: Usage(64 * 2**20, 0, 64 * 2**20))
    result = run(plain_context(tmp_path, "data.num_workers=2"), SharedMemoryCheck)["env.shared_memory"]
    assert codes(result) == {"DP15"} and result.status == CheckStatus.WARNING
    assert_quiet(run(plain_context(tmp_path), SharedMemoryCheck)["env.shared_memory"])  # no workers, no shm use


Memory = namedtuple("Memory", "total available")


@pytest.mark.parametrize(("available_gib", "status"), [(1.0, CheckStatus.WARNING), (0.2, CheckStatus.ERROR)])
def test_low_host_ram(tmp_path, monkeypatch, available_gib, status):
    monkeypatch.setattr(env_checks.psutil, "virtual_memory", lambda: Memory(2**34, int(available_gib * 2**30)))
    result = run(plain_context(tmp_path), HostRamCheck)["env.host_ram"]
    assert codes(result) == {"ENV_LOW_RAM"} and result.status == status


def test_run_dir_that_cannot_be_written(tmp_path):
    ctx = PreflightContext.from_recipe(make_recipe(tmp_path))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    ctx.run_dir = blocker / "run"
    result = run(ctx, RunDirCheck)["env.run_dir"]
    assert codes(result) == {"ENV_RUN_DIR"} and result.issues[0].config_key == "hydra.run.dir"


@pytest.mark.parametrize(("free_factor", "status"), [(3.0, CheckStatus.ERROR), (4.5, CheckStatus.WARNING),
                                                     (100.0, CheckStatus.PASSED)])
def test_disk_space_vs_kept_checkpoints(tmp_path, monkeypatch, free_factor, status):
    ctx = plain_context(tmp_path, "checkpoint.keep_last=3")
    one = checkpoint_bytes_estimate(ctx.model, ctx.optimizer)
    monkeypatch.setattr(env_checks.shutil, "disk_usage", lambda path: Usage(0, 0, int(one * free_factor)))
    result = run(ctx, DiskSpaceCheck)["env.disk_space"]
    assert result.status == status and result.data["needed_bytes"] == 4 * one
    if status != CheckStatus.PASSED:
        assert codes(result) == {"ENV_DISK"} and result.issues[0].config_key == "checkpoint.keep_last"


@pytest.mark.parametrize(("make", "moments"), [
    (lambda p: torch.optim.AdamW(p), 2),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),
    (lambda p: torch.optim.SGD(p, lr=0.1), 0),
])
def test_optimizer_state_size_is_predicted_before_the_first_step_and_measured_after(make, moments):
    model = classifier()
    optimizer = make(model.parameters())
    params = tensor_bytes(list(model.parameters()))
    predicted = optimizer_state_bytes(optimizer)
    assert predicted == moments * params
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    measured = optimizer_state_bytes(optimizer)
    assert predicted <= measured <= predicted + 4 * 8 * len(list(model.parameters()))  # + Adam's step counters
