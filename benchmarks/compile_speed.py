"""What ``trainer.compile=true`` buys on the default recipe, and what the recipe costs
over a hand-written loop compiled the same way.

    python benchmarks/compile_speed.py [--rounds 3] [--steps 20] [--warmup-steps 3] [overrides ...]

Three arms in one process, each set up once: (a) the default char-LM recipe eager,
(b) the same recipe with ``trainer.compile=true`` (compiled as ``run()`` compiles it, with
``trainer.compile_mode``/``_backend``/``_dynamic`` as the config sets them), (c)
benchmarks/loop_overhead.py's hand-written loop (same model, data order, autocast,
accumulation, clipping, schedule, AdamW groups, loss printout) with its model compiled
in place with the same options. Validation and the preflight are off (their cost is
the same either way).

A first call of ``--warmup-steps`` steps per arm, one arm after another (compilation,
allocator and oneDNN warm-up), is not counted; its time is printed beside the recipe's
own ``compile_warmup_s``. Then each round adds ``--steps`` optimizer steps to every arm
in lockstep (benchmarks/lockstep.py: each arm on its own thread, taking turns step by
step, the first arm rotating per round), so a stall of the shared machine hits all
three alike. Per round, the ratio of two arms is the median, over the steps after the
first ``--skip``, of their periods for the same step (from one ``optimizer.step()`` to
the next; the two ran back to back); the ms/step shown are each arm's median period.
Figures: recipe compiled/eager and recipe compiled/hand-written compiled, min/median/max
over rounds. The recipe against the hand-written loop, both eager, is loop_overhead.py's.

``trainer.compile`` is part of the performance work (issue 17); on a checkout without it
the script prints ``skipped: trainer.compile not available`` and no figure. On a 2-core
CPU the speed-up is small (the step is dominated by oneDNN matmuls that compilation does
not change) and the warm-up is seconds; a GPU is where it can be judged. Last line: ``compile_speedup_ratio=<median
compiled/eager> ...  compile_vs_hand_ratio=<median recipe/hand, both compiled> ...``
(each with ``_min`` and ``_max``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from optimus_preflight import compose
from optimus_preflight.recipes.char_lm import CharLMRecipe
from optimus_preflight.training.distributed import unwrap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lockstep import Lockstep, run_threads  # noqa: E402
from loop_overhead import HandWrittenLoop  # noqa: E402

BASE = ["logging.progress=none", "data.val=null", "trainer.eval_every_n_steps=0", "preflight.enabled=false"]


def compile_available() -> bool:
    return "compile" in compose().trainer


class Arm:
    """One way of training, advanced ``steps`` optimizer steps per call. Its optimizer's
    step pre-hook hands the turn over when a round's lockstep is running."""

    def __init__(self, name: str, optimizer: torch.optim.Optimizer, advance: Callable[[int], None], current: list):
        self.name = name
        self.advance = advance
        self.step_s: list[float] = []
        optimizer.register_step_pre_hook(lambda *_: current[0].handoff(name) if current else None)

    def timed(self, steps: int) -> float:
        started = time.perf_counter()
        self.advance(steps)
        return time.perf_counter() - started


def compile_like_run(recipe: CharLMRecipe) -> None:
    """What ``run()`` does between the preflight and ``train()`` with trainer.compile=true
    (this script calls ``setup()`` and ``train()`` itself, to step the arms in turns)."""
    from optimus_preflight.training.compiling import CompileWatch, compile_model

    recipe.compile_watch = CompileWatch(len(compile_model(recipe.model, recipe.cfg.trainer, recipe.strategy)))
    if getattr(unwrap(recipe.model), "_compiled_call_impl", None) is None:
        raise RuntimeError("trainer.compile=true left the model uncompiled: compile_speed.py needs updating")


def hand_compile_options(trainer) -> dict:
    """torch.compile's options as the recipe passes them (training/compiling.py)."""
    options = {"backend": trainer.get("compile_backend", "inductor"), "dynamic": trainer.get("compile_dynamic")}
    if trainer.get("compile_mode") is not None:
        options["mode"] = trainer.compile_mode
    return options


def recipe_arm(name: str, recipe: CharLMRecipe, current: list) -> Arm:
    def advance(steps: int) -> None:
        recipe.cfg.trainer.max_steps = recipe.state.step + steps
        recipe.train()

    return Arm(name, recipe.optimizer, advance, current)


def spread(values: list[float]) -> str:
    return f"min {min(values):.3f}  median {statistics.median(values):.3f}  max {max(values):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--skip", type=int, default=2, help="first steps of each round left out of the steady-state figure")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if not compile_available():
        print("skipped: trainer.compile not available (optimus_preflight.compose() has no trainer.compile key)")
        return 0
    with tempfile.TemporaryDirectory(prefix="compile-speed-") as tmp:
        eager = CharLMRecipe(compose([*BASE, "trainer.compile=false", *args.overrides]), run_dir=Path(tmp) / "eager")
        compiled = CharLMRecipe(compose([*BASE, "trainer.compile=true", *args.overrides]), run_dir=Path(tmp) / "compiled")
        eager.setup()
        compiled.setup()
        logging.getLogger("optimus_preflight").setLevel(logging.WARNING)  # setup() sets INFO
        compile_like_run(compiled)
        options = hand_compile_options(compiled.cfg.trainer)
        hand = HandWrittenLoop(eager)
        hand.model.compile(**options)  # in place, as the recipe compiles
        current: list[Lockstep] = []  # the round's lockstep, while one runs
        arms = [recipe_arm("recipe eager", eager, current), recipe_arm("recipe compiled", compiled, current),
                Arm("hand-written compiled", hand.optimizer, hand.run, current)]
        speedup: list[float] = []  # per round: recipe compiled / eager
        vs_hand: list[float] = []  # per round: recipe compiled / hand-written compiled
        warmup = {arm.name: arm.timed(args.warmup_steps) for arm in arms}  # one after another: compiling
        for index in range(args.rounds):
            lockstep = Lockstep([arm.name for arm in arms], first=arms[index % len(arms)].name)
            current.append(lockstep)
            with contextlib.redirect_stdout(io.StringIO()):  # the hand loop's loss printout
                run_threads(lockstep, {arm.name: functools.partial(arm.advance, args.steps) for arm in arms})
            current.clear()
            for arm in arms:
                arm.step_s.append(lockstep.figures(arm.name, args.steps, args.skip)["step_s"])
            speedup.append(lockstep.paired_ratio("recipe compiled", "recipe eager", args.steps, args.skip))
            vs_hand.append(lockstep.paired_ratio("recipe compiled", "hand-written compiled", args.steps, args.skip))
            print(f"round {index + 1}: " + ", ".join(f"{arm.name} {1000 * arm.step_s[-1]:.1f} ms/step" for arm in arms)
                  + f"; compiled/eager {speedup[-1]:.3f}, compiled recipe/hand {vs_hand[-1]:.3f}", flush=True)
        precision = compiled.training_context.precision
        batch, accumulation = compiled.cfg.data.batch_size, compiled.cfg.trainer.accumulation_steps
    print(" " * 40)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, precision {precision}, compile {', '.join(f'{k}={v}' for k, v in options.items() if v is not None)}, "
          f"{args.rounds} rounds x {args.steps} steps, batch {batch} x {accumulation}")
    for arm in arms:
        print(f"{arm.name:24s} median {1000 * statistics.median(arm.step_s):.1f} ms/step (steady state)")
    watch = compiled.compile_watch.summary() if compiled.compile_watch is not None else {}
    print(f"recipe compile warm-up (summary.json's compile_warmup_s): {watch.get('compile_warmup_s')} s; "
          f"recompiles after it: {watch.get('compile_recompiles')} (counted process-wide: the hand loop's compile is in it)")
    print(f"first {args.warmup_steps} steps (warm-up, one arm after another): "
          + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in warmup.items())
          + " (the hand loop's compile reuses the recipe's compiled code where it can)")
    print(f"recipe compiled / recipe eager, per step:        {spread(speedup)}")
    print(f"recipe compiled / hand-written compiled, per step: {spread(vs_hand)}")
    print("recipe eager / hand-written eager: see benchmarks/loop_overhead.py")
    print(f"compile_speedup_ratio={statistics.median(speedup):.4f} compile_speedup_ratio_min={min(speedup):.4f} "
          f"compile_speedup_ratio_max={max(speedup):.4f} compile_vs_hand_ratio={statistics.median(vs_hand):.4f} "
          f"compile_vs_hand_ratio_min={min(vs_hand):.4f} compile_vs_hand_ratio_max={max(vs_hand):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
