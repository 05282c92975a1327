"""Interrupted-and-resumed runs end bit-identical to an uninterrupted run."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, run_cli

COMMON = (
    "recipe=char_lm_tiny",
    "logging.progress=none",
    "recipe._target_=tests.signal_recipe.SelfSignalRecipe",
    "data.batch_size=8",
    "trainer.accumulation_steps=2",
    "trainer.max_steps=16",
    "trainer.eval_every_n_steps=6",
    "checkpoint.every_n_steps=5",
)


def _per_step(records):
    """(step, kind) -> value, over all records of a run dir's metrics.jsonl."""
    table = {}
    for record in records:
        kind = "val_loss" if "val_loss" in record else "loss"
        key = (record["step"], kind)
        assert key not in table, f"{key} logged twice"
        table[key] = record[kind]
    return table


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result = run_cli(tmp_path_factory.mktemp("reference") / "run", *COMMON, cwd=REPO)
    assert result.returncode == 0, result.output
    return result


CASES = [
    # name, signal, phase, at (count in that phase), expected exit code
    ("sigint-mid-window", "SIGINT", "train", 9, 130),  # 9th micro-batch = 1st of step 5's window
    ("sigterm-window-end", "SIGTERM", "train", 14, 143),  # last micro-batch of step 7
    ("sigterm-during-eval", "SIGTERM", "eval", 2, 143),  # inside the eval at step 6
    ("sigusr1-waiting-for-data", "SIGUSR1", "data", 44, 138),  # reading step 3's second micro-batch
]


@pytest.mark.slow
@pytest.mark.parametrize("name, signal_name, phase, at, exit_code", CASES, ids=[c[0] for c in CASES])
def test_interrupt_then_resume_is_bit_identical(tmp_path, reference, name, signal_name, phase, at, exit_code):
    run_dir = tmp_path / "run"
    env = {"SIGNAL_NAME": signal_name, "SIGNAL_PHASE": phase, "SIGNAL_AT": str(at)}
    interrupted = run_cli(run_dir, *COMMON, cwd=REPO, env=env)
    assert interrupted.returncode == exit_code, interrupted.output
    assert "Traceback" not in interrupted.output
    assert interrupted.summary()["status"] == "interrupted"
    assert "checkpoint.resume=auto" in interrupted.output  # the resume command is printed
    stopped_at = interrupted.summary()["steps"]
    assert 0 < stopped_at < 16

    resumed = run_cli(run_dir, *COMMON, "checkpoint.resume=auto", cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    summary = resumed.summary()
    assert summary["status"] == "completed" and summary["steps"] == 16
    assert summary["resumed_from"].endswith(f"step_{stopped_at:08d}")
    assert summary["params_sha256"] == reference.summary()["params_sha256"]
    assert _per_step(resumed.metrics()) == _per_step(reference.metrics())
    assert summary["final_val_loss"] == reference.summary()["final_val_loss"]


# A corpus of 11 batches of 8 per epoch: the 24 batches of a run cross two epoch ends.
PLAIN = (*COMMON, "recipe._target_=tests.plain_loader_recipe.PlainLoaderRecipe", "trainer.max_steps=12",
         "data.train.max_chars=3000")


@pytest.fixture(scope="module")
def plain_reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("plain") / "run"
    result = run_cli(run_dir, *PLAIN, cwd=REPO)
    assert result.returncode == 0, result.output
    preflight = (run_dir / "preflight.json").read_text()
    assert "RESUME_ORDER" not in preflight and '"status": "passed"' in preflight
    return result


@pytest.mark.slow
def test_a_plain_shuffled_dataloader_resumes_bit_identical(tmp_path, plain_reference):
    """DataLoader(shuffle=True) without a generator, with its own collate_fn, stopped in
    its second epoch: the epoch's order is replayed from the RNG states recorded when it
    started. (Loaders with workers and other samplers: tests/test_resume_order.py.)"""
    run_dir = tmp_path / "run"
    signal = {"SIGNAL_NAME": "SIGINT", "SIGNAL_PHASE": "train", "SIGNAL_AT": "15"}
    stopped = run_cli(run_dir, *PLAIN, cwd=REPO, env=signal)
    assert stopped.returncode == 130, stopped.output
    assert stopped.summary()["steps"] == 7
    resumed = run_cli(run_dir, *PLAIN, cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    assert resumed.summary()["params_sha256"] == plain_reference.summary()["params_sha256"]
    assert _per_step(resumed.metrics()) == _per_step(plain_reference.metrics())
