"""The bad-input campaign of issue 29, rerun on demand through the real CLI:

    .venv/bin/python benchmarks/bad_inputs.py [--only SUBSTRING]

Each entry is a command line a user could type (values only a builder, a system call or a
parser can reject; contract breaches in a recipe). An input is CLEAN when the process
exits 2 with no traceback on stderr, its error line names what to change (the key, the
override or the recipe method), and the run dir holds no checkpoint or metrics (nothing
ran). Anything else is listed with its exit code and last stderr line. Prints one line per
input and the totals.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "optimus_preflight.cli"]
BASE = ["recipe=char_lm_tiny", "preflight.enabled=false", "trainer.max_steps=2", "logging.progress=none"]

# (override(s), a word the error must contain: the key or what names the fix)
INPUTS: list[tuple[tuple[str, ...], str]] = [
    (("scheduler.warmup_steps=-3",), "scheduler.warmup_steps"),
    (("scheduler.min_lr_ratio=2",), "scheduler.min_lr_ratio"),
    (("data.train.val_fraction=1.5",), "data.train.val_fraction"),
    (("trainer.seed=99999999999999999999999",), "trainer.seed"),
    (("checkpoint.extra_signal=SIGKILL",), "checkpoint.extra_signal"),
    (("checkpoint.extra_signal=SIGNOPE",), "checkpoint.extra_signal"),
    (("preflight.enabled=true", "preflight.first_batch_timeout_s=1e300"), "preflight.first_batch_timeout_s"),
    (("trainer.max_steps=${nope.x}",), "trainer.max_steps"),
    (("data.train.max_chars=0",), "data.train.max_chars"),
    (("optimizer.betas=[0.9,0.95",), "optimizer.betas"),
    (("=5",), "=5"),
    (("trainer.max_step=10",), "trainer.max_steps"),
    (("trainer.max_steps=-1",), "trainer.max_steps"),
    (("trainer.max_steps=abc",), "trainer.max_steps"),
    (("trainer.accumulation_steps=0",), "trainer.accumulation_steps"),
    (("trainer.micro_batch_size=0",), "trainer.micro_batch_size"),
    (("trainer.micro_batch_size=5",), "trainer.micro_batch_size"),
    (("trainer.micro_batch_size=huge",), "trainer.micro_batch_size"),
    (("trainer.precision=fp8",), "trainer.precision"),
    (("trainer.device=tpu",), "trainer.device"),
    (("trainer.strategy=zero3",), "trainer.strategy"),
    (("trainer.clip_grad_norm=-1",), "trainer.clip_grad_norm"),
    (("data.batch_size=0",), "data.batch_size"),
    (("data.num_workers=-2",), "data.num_workers"),
    (("data.fetch_timeout_s=0",), "data.fetch_timeout_s"),
    (("data.fetch_timeout_s=1e300",), "data.fetch_timeout_s"),
    (("optimizer.lr=-0.1",), "optimizer.lr"),
    (("optimizer.lr=nan",), "optimizer.lr"),
    (("optimizer.weight_decay=-1",), "optimizer.weight_decay"),
    (("checkpoint.keep_last=0",), "checkpoint.keep_last"),
    (("checkpoint.every_n_steps=-5",), "checkpoint.every_n_steps"),
    (("checkpoint.resume=/no/such/checkpoint",), "checkpoint.resume"),
    (("checkpoint.mode=best",), "checkpoint.mode"),
    (("logging.every_n_steps=0",), "logging.every_n_steps"),
    (("logging.progress=fancy",), "logging.progress"),
    (("preflight.fail_on=sometimes",), "preflight.fail_on"),
    (("preflight.disable=step.throughput",), "preflight.disable"),
    (("preflight.disable=[step.thruput]",), "preflight.disable"),
    (("preflight.memory.target_gib=-80",), "preflight.memory.target_gib"),
    (("preflight.overfit_steps=-1",), "preflight.overfit_steps"),
    (("model.d_model=0",), "model.d_model"),
    (("model.n_head=3",), "model.n_head"),
    (("data.train.block_size=0",), "data.train.block_size"),
    (("recipe=no_such_recipe",), "recipe"),
    (("recipe._target_=no.such.Recipe",), "recipe._target_"),
    (("callbacks=[{_target_:no.such.Callback}]",), "callbacks"),
    (("hydra.run.dir=/proc/optimus",), "/proc/optimus"),
    # The recipe's contracts, through a test recipe whose compute_loss/builders misbehave.
    (("recipe._target_=tests.bad_input_recipes.LossReturnsNone",), "compute_loss"),
    (("recipe._target_=tests.bad_input_recipes.LossReturnsString",), "compute_loss"),
    (("recipe._target_=tests.bad_input_recipes.LossReturnsVector",), "compute_loss"),
    (("recipe._target_=tests.bad_input_recipes.ModelIsNone",), "build_model"),
    (("recipe._target_=tests.bad_input_recipes.OptimizerIsString",), "build_optimizer"),
]


def attempt(overrides: tuple[str, ...], must_name: str, root: Path) -> tuple[bool, str]:
    run_dir = root / f"run_{abs(hash(overrides))}"
    started = time.perf_counter()
    own_dir = any(override.startswith("hydra.run.dir=") for override in overrides)
    where = [] if own_dir else [f"hydra.run.dir={run_dir}"]
    done = subprocess.run([*CLI, *BASE, *overrides, *where], cwd=REPO, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    err_lines = [line for line in done.stderr.splitlines() if line.strip()]
    last = err_lines[-1] if err_lines else (done.stdout.strip().splitlines() or [""])[-1]
    # A contract breach can only show when compute_loss is first called, after the (new) run
    # dir exists: what counts is that no step was recorded and no checkpoint written.
    metrics, checkpoints = run_dir / "metrics.jsonl", run_dir / "checkpoints"
    ran = (metrics.exists() and metrics.stat().st_size > 0) or (checkpoints.exists() and any(checkpoints.iterdir()))
    problems = []
    if done.returncode != 2:
        problems.append(f"exit {done.returncode}")
    if "Traceback" in done.stderr or "Traceback" in done.stdout:
        problems.append("traceback")
    if must_name not in done.stderr + done.stdout:
        problems.append(f"does not name {must_name}")
    if ran:
        problems.append("the run dir holds training output")
    verdict = "CLEAN" if not problems else "NOT CLEAN (" + ", ".join(problems) + ")"
    return not problems, f"{verdict:<40} {elapsed:5.1f}s  {' '.join(overrides)}\n    -> {last[:220]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the inputs whose overrides contain this text")
    args = parser.parse_args()
    chosen = [(o, n) for o, n in INPUTS if args.only in " ".join(o)]
    clean = 0
    with tempfile.TemporaryDirectory(prefix="bad-inputs-") as root:
        for overrides, must_name in chosen:
            ok, line = attempt(overrides, must_name, Path(root))
            clean += ok
            print(line, flush=True)
    print(f"\nbad inputs: {clean}/{len(chosen)} clean (exit 2, one message naming the key, no traceback, nothing run)")


if __name__ == "__main__":
    main()
