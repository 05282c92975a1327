"""trainer.compile: the same losses as eager, checkpoints that keep the eager names (a
compiled run resumes uncompiled and back), the warm-up reported and left out of
samples_per_s, and a recompilation storm named with its fix.

The backend is aot_eager (dynamo's tracing and AOTAutograd, no code generation): on
this 2-core CPU inductor's C++ compiles take minutes; the plumbing under test is the
same for every backend."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from optimus_preflight.checkpoint.export import export
from optimus_preflight.config.instantiate import instantiate_node
from optimus_preflight.reporting.summary import params_sha256
from optimus_preflight.training import compiling
from optimus_preflight.training.compiling import CompileWatch
from tests.conftest import REPO, run_cli, tiny_config

TINY = ("recipe=char_lm_tiny", "logging.progress=none", "trainer.eval_every_n_steps=0", "checkpoint.every_n_steps=0")
COMPILED = ("trainer.compile=true", "trainer.compile_backend=aot_eager")


@pytest.mark.slow
def test_compiled_training_matches_eager_and_resumes_across_compiled_and_eager(tmp_path):
    eager = run_cli(tmp_path / "eager", *TINY, "trainer.max_steps=4", "scheduler.total_steps=30", cwd=REPO)
    compiled = run_cli(tmp_path / "compiled", *TINY, *COMPILED, "trainer.max_steps=3", "scheduler.total_steps=30", cwd=REPO)
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.output
    eager_losses = {r["step"]: r["loss"] for r in eager.metrics() if "loss" in r}
    records = [r for r in compiled.metrics() if "loss" in r]
    for record in records:
        assert record["loss"] == pytest.approx(eager_losses[record["step"]], abs=1e-5)
    # The warm-up is reported once and kept out of the throughput figures.
    assert "compile_warmup_s" in records[0] and "samples_per_s" not in records[0]
    assert all("samples_per_s" in r for r in records[1:])
    summary = compiled.summary()
    assert summary["compile_warmup_s"] > 0 and "torch.compile warm-up" in compiled.output

    # The compiled run's checkpoint holds the eager names and exactly its weights.
    _, weights, _ = export(compiled.run_dir)
    state = torch.load(weights, weights_only=True)
    assert not any("_orig_mod" in name for name in state)
    model = instantiate_node(tiny_config().model, "model")
    model.load_state_dict(state)
    assert params_sha256(model) == summary["params_sha256"]

    # Compiled -> eager: one more step from the compiled checkpoint.
    resumed = run_cli(compiled.run_dir, *TINY, "trainer.max_steps=4", "scheduler.total_steps=30", cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    [step_4] = [r for r in resumed.metrics() if r.get("step") == 4 and "loss" in r]
    assert step_4["loss"] == pytest.approx(eager_losses[4], abs=1e-5)


@pytest.mark.slow
def test_an_unknown_backend_is_a_user_error_before_any_work(tmp_path):
    result = run_cli(tmp_path / "run", *TINY, "trainer.compile=true", "trainer.compile_backend=turbo", cwd=REPO)
    assert result.returncode == 2, result.output
    assert "trainer.compile_backend" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "checkpoints").exists()


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x).relu()


def test_a_recompilation_storm_is_named_with_its_fix(caplog):
    torch._dynamo.reset()
    model = _Tiny()
    cfg = tiny_config("trainer.compile=true", "trainer.compile_backend=eager", "trainer.compile_dynamic=false")
    compiled = compiling.compile_model(model, cfg.trainer, "single")
    watch = CompileWatch(len(compiled))
    with caplog.at_level(logging.WARNING, logger="optimus_preflight"):
        for step, length in enumerate([2, 2, 2, 3, 4], start=1):  # one new shape after the warm-up: quiet
            watch.start_step()
            model(torch.randn(length, 4))
            watch.end_step(step)
        assert watch.warmup_s is not None and watch.recompiles == 2
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        for step, length in enumerate(range(5, 9), start=6):  # a new length every step: a storm
            watch.start_step()
            model(torch.randn(length, 4))
            watch.end_step(step)
    assert watch.recompiles >= compiling.STORM_RECOMPILES
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "trainer.compile_dynamic=true" in warning and "pad batches" in warning
    assert watch.summary()["compile_recompiles"] == watch.recompiles
    torch._dynamo.reset()
