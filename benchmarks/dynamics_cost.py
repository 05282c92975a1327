"""Per-step cost of the training loop with the dynamics metrics on vs off.

    python benchmarks/dynamics_cost.py [--rounds 3] [--steps 50] [--every 50] [--tiny]

One recipe (the default char-LM, or the tiny preset with --tiny) in one process. Each
round runs ``--steps`` optimizer steps with ``logging.dynamics_every_n_steps=0`` and
``--steps`` with it at ``--every``, through the real loop pieces (``_open_step_logger``,
``train_step``, ``StepLogger.on_step``), in alternating order, so both
see the same machine conditions. With steps == every, each "on" segment holds exactly
one measured step.

On a shared machine single steps stall for hundreds of ms when another process takes
the cores, so a segment's total time is mostly noise. The headline uses medians: per
round, the "on" cost is the median unmeasured step times the unmeasured steps plus the
measured steps' own times, over the steps, against the median "off" step. Last line:
``dynamics_overhead_ratio=<median over rounds>``; the raw total-time ratios are printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from optimus_preflight import compose
from optimus_preflight.recipes.char_lm import CharLMRecipe


def segment(recipe: CharLMRecipe, every: int, steps: int) -> tuple[float, list[float], list[int]]:
    """Run ``steps`` steps; returns total seconds, per-step seconds, and measured steps."""
    recipe.cfg.logging.dynamics_every_n_steps = every
    logger = recipe._open_step_logger()
    per_step, measured = [], []
    try:
        started = time.perf_counter()
        for _ in range(steps):
            step_started = time.perf_counter()
            result = recipe.train_step()
            recipe.state.record_step(result.stepped, result.samples)
            record = logger.on_step(recipe.state.step, result, recipe.state.skipped_steps)
            per_step.append(time.perf_counter() - step_started)
            if record is not None and any(key.startswith("update_ratio/") for key in record):
                measured.append(len(per_step) - 1)
        total = time.perf_counter() - started
    finally:
        logger.close()
    return total, per_step, measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny preset instead of the default recipe")
    args = parser.parse_args()

    overrides = ["logging.progress=none", "checkpoint.every_n_steps=0", "trainer.max_steps=1000000000", "preflight.enabled=false"]
    cfg = compose((["recipe=char_lm_tiny"] if args.tiny else []) + overrides)
    with tempfile.TemporaryDirectory() as directory:
        recipe = CharLMRecipe(cfg, run_dir=Path(directory))
        recipe.setup()
        recipe.model.train()
        segment(recipe, 0, args.warmup)
        ratios, raw_ratios, on_steps, measured_steps, plain_steps = [], [], [], [], []
        for index in range(args.rounds):
            order = [0, args.every] if index % 2 == 0 else [args.every, 0]
            results = {every: segment(recipe, every, args.steps) for every in order}
            (off_total, off_steps, _), (on_total, on_per_step, measured) = results[0], results[args.every]
            unmeasured = [t for i, t in enumerate(on_per_step) if i not in measured]
            on_cost = (statistics.median(unmeasured) * len(unmeasured) + sum(on_per_step[i] for i in measured)) / len(on_per_step)
            ratios.append(on_cost / statistics.median(off_steps))
            raw_ratios.append(on_total / off_total)
            plain_steps += off_steps
            on_steps += unmeasured
            measured_steps += [on_per_step[i] for i in measured]
            print(
                f"round {index + 1}: off median {statistics.median(off_steps) * 1000:7.2f} ms/step | on {on_cost * 1000:7.2f} ms/step "
                f"({len(measured)} measured) | ratio {ratios[-1]:.4f} | total-time ratio {raw_ratios[-1]:.4f}"
            )
    params = sum(p.numel() for p in recipe.model.parameters())
    print(f"recipe {'char_lm_tiny' if args.tiny else 'char_lm (default)'}: {params} parameters, dynamics every {args.every} steps")
    print(f"median step without dynamics             {statistics.median(plain_steps) * 1000:10.2f} ms")
    print(f"median unmeasured step with dynamics on  {statistics.median(on_steps) * 1000:10.2f} ms")
    if measured_steps:
        print(f"median measured (dynamics) step          {statistics.median(measured_steps) * 1000:10.2f} ms")
    print(f"per-round on/off ratios: {[round(r, 4) for r in ratios]} (total-time: {[round(r, 3) for r in raw_ratios]})")
    print(f"dynamics_overhead_ratio={statistics.median(ratios):.4f}")


if __name__ == "__main__":
    main()
