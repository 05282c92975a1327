"""End to end through the real CLI, in subprocesses."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import CLI, REPO, run_cli

TINY = ("recipe=char_lm_tiny", "logging.progress=none")

# The tiny recipe's per-step training losses and its validation losses at steps 10/20/30,
# recorded with torch 2.13.0 (CPU). A change here means the numerics of training changed.
GOLDEN_LOSSES = [
    4.60846, 4.554847, 4.439731, 4.330709, 4.2982, 4.131689, 4.06056, 4.075782, 3.912105, 3.863385,
    3.723008, 3.737218, 3.62918, 3.627461, 3.567822, 3.501696, 3.424388, 3.452773, 3.437185, 3.422913,
    3.29103, 3.386127, 3.494719, 3.164568, 3.314563, 3.139089, 3.452823, 3.313145, 3.29353, 3.331982,
]
GOLDEN_VAL_LOSSES = [3.730617, 3.263226, 3.156911]


def _losses(result):
    records = result.metrics()
    return [r["loss"] for r in records if "loss" in r], [r["val_loss"] for r in records if "val_loss" in r]


@pytest.mark.slow
def test_tiny_run_matches_golden_losses_in_a_plain_process_and_from_the_warm_launcher(tmp_path):
    """The other CLI tests fork their runs from a warm launcher (conftest.run_cli): it runs
    what a plain process runs, to the bit."""
    cold = _golden_run(run_cli(tmp_path / "cold", *TINY, cold=True))
    warm = _golden_run(run_cli(tmp_path / "warm", *TINY))
    assert warm.summary()["params_sha256"] == cold.summary()["params_sha256"]


def _golden_run(result):
    assert result.returncode == 0, result.output
    losses, val_losses = _losses(result)
    assert losses == pytest.approx(GOLDEN_LOSSES, abs=1e-4)
    assert val_losses == pytest.approx(GOLDEN_VAL_LOSSES, abs=1e-4)
    summary = result.summary()
    assert summary["status"] == "completed" and summary["steps"] == 30
    assert summary["final_loss"] == pytest.approx(GOLDEN_LOSSES[-1], abs=1e-4)
    assert summary["final_val_loss"] == pytest.approx(GOLDEN_VAL_LOSSES[-1], abs=1e-4)
    assert len(summary["params_sha256"]) == 64
    assert (result.run_dir / "preflight.json").is_file()
    assert result.output.count("completed after 30 steps") == 1  # no duplicated log lines
    return result


@pytest.mark.slow
def test_batch_16_equals_batch_4_with_4_accumulation_steps(tmp_path):
    steps = ("trainer.max_steps=20", "trainer.eval_every_n_steps=10")
    full = run_cli(tmp_path / "full", *TINY, *steps, "data.batch_size=16")
    accumulated = run_cli(tmp_path / "acc", *TINY, *steps, "data.batch_size=4", "trainer.accumulation_steps=4")
    assert full.returncode == 0 and accumulated.returncode == 0, full.output + accumulated.output
    full_losses, full_val = _losses(full)
    acc_losses, acc_val = _losses(accumulated)
    assert len(full_losses) == 20
    assert acc_losses == pytest.approx(full_losses, abs=1e-4)
    assert acc_val == pytest.approx(full_val, abs=1e-4)


SUBCLASS = '''
import torch
from optimus_preflight.recipes.char_lm import CharLMRecipe


class PlainSGDRecipe(CharLMRecipe):
    """Overrides one builder: SGD instead of the configured AdamW."""

    def build_optimizer(self, model):
        return torch.optim.SGD(model.parameters(), lr=0.125)


if __name__ == "__main__":
    PlainSGDRecipe.main()
'''


@pytest.mark.slow
def test_subclass_overriding_one_builder_runs_by_target_and_by_main(tmp_path):
    (tmp_path / "my_recipes.py").write_text(SUBCLASS)
    by_target = run_cli(tmp_path / "a", *TINY, "trainer.max_steps=3", "scheduler.total_steps=10", "recipe._target_=my_recipes.PlainSGDRecipe", cwd=tmp_path)
    assert by_target.returncode == 0, by_target.output
    # Warmup of 5 steps (of a 10-step schedule) from the subclass's LR: 0.125 / 5 on the first step.
    assert by_target.metrics()[0]["lr"] == pytest.approx(0.025)

    by_main = subprocess.run(
        [sys.executable, "my_recipes.py", *TINY, "trainer.max_steps=3", "scheduler.total_steps=10", f"hydra.run.dir={tmp_path / 'b'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert by_main.returncode == 0, by_main.stderr
    assert '"lr": 0.025' in (tmp_path / "b" / "metrics.jsonl").read_text()

    # A bad value through the user's own script: the one error line names their script, not optimus-train.
    bad = subprocess.run([sys.executable, "my_recipes.py", "trainer.max_steps=many", f"hydra.run.dir={tmp_path / 'c'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    errors = [line for line in bad.stderr.splitlines() if line.startswith("my_recipes.py: error: ") and "trainer.max_steps" in line]
    assert len(errors) == 1 and "optimus-train" not in bad.stderr, bad.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "override, key, fix",
    [
        ("trainer.accumulation_steps=0", "trainer.accumulation_steps", "Set trainer.accumulation_steps=1"),
        ("trainer.precision=fp9", "trainer.precision", "trainer.precision=auto"),
        ("trainer.max_step=5", "trainer.max_step", "Did you mean trainer.max_steps?"),
        ("recipe._target_=no.such.Class", "recipe._target_", "import path"),
        ("trainer.max_steps=many", "trainer.max_steps", "type"),
        ("optimizer=adam", "optimizer", "Available options: adamw, sgd"),
    ],
)
@pytest.mark.slow
def test_bad_input_exits_2_with_one_message_and_no_traceback(tmp_path, override, key, fix):
    result = run_cli(tmp_path / "run", *TINY, override)
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("optimus-train: error:")]
    assert len(errors) == 1, result.stderr
    assert key in errors[0] and fix in errors[0]
    assert not (tmp_path / "run").exists()  # nothing touched before validation


@pytest.mark.slow
def test_help_and_cfg_job_work(tmp_path):
    help_text = subprocess.run([*CLI, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert help_text.returncode == 0 and "trainer" in help_text.stdout
    job = subprocess.run([*CLI, "--cfg", "job", "trainer.max_steps=7"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert job.returncode == 0 and "max_steps: 7" in job.stdout


@pytest.mark.slow
def test_wheel_ships_conf_and_recipes_and_runs_from_any_directory(tmp_path):
    """`pip install .` (not editable) must carry conf/ and recipes/ inside the package."""
    wheel_dir, target, source = tmp_path / "wheel", tmp_path / "site", tmp_path / "source"
    # A copy, so setuptools' build/ directory does not land in the checkout.
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", "outputs", "multirun", "results"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheel_dir), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(wheel_dir.glob("*.whl"))
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = textwrap.dedent(
        """
        import sys, optimus_preflight, optimus_preflight.recipes.char_lm
        assert optimus_preflight.__file__.startswith(sys.argv[1]), optimus_preflight.__file__
        sys.argv = ["optimus-train", "--cfg", "job", "recipe=char_lm_tiny"]
        from optimus_preflight.cli import main
        main()
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(target)],
        cwd=elsewhere, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    assert "CharLMRecipe" in run.stdout and "n_layer: 2" in run.stdout
