"""The recipe's cost over a hand-written loop doing the same work.

    python benchmarks/loop_overhead.py [--rounds 5] [--steps 60] [--precision auto] [overrides ...]

(a) TrainRecipe.train() of the default char-LM recipe with default logging, and (b) the
plain PyTorch loop an expert would write for the same work: same model, data order,
autocast, accumulation, clipping, warmup-cosine schedule, AdamW groups, and a loss
printout every logging.every_n_steps. Both run in this process, interleaved round by
round (alternating which goes first) after a warm-up round, so machine noise hits both.
Each round adds ``--steps`` optimizer steps to each. Validation is off for both, since
its cost is the same in either loop.

Two figures per round: the steady-state time per step (the median interval between
consecutive optimizer.step() calls, so everything that happens every step counts and
what happens once per train() call does not), and the whole round's time (which also
charges the recipe's once-per-call work: opening the metrics file, the final checkpoint).
Last line: ``overhead_ratio=<median steady-state ratio>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from optimus_preflight import compose
from optimus_preflight.recipes.char_lm import CharLMRecipe
from optimus_preflight.training.batches import move_to_device


class HandWrittenLoop:
    """What the recipe does per step, written out by hand."""

    def __init__(self, recipe: CharLMRecipe):
        cfg = recipe.cfg
        torch.manual_seed(cfg.trainer.seed)
        self.model = recipe.build_model().to(recipe.training_context.device)
        self.optimizer = recipe.build_optimizer(self.model)
        self.scheduler = recipe.build_scheduler(self.optimizer)
        self.loader, _ = recipe.build_dataloaders()
        self.plan = recipe.training_context.plan
        self.accumulation = cfg.trainer.accumulation_steps
        self.clip = cfg.trainer.clip_grad_norm
        self.log_every = cfg.logging.every_n_steps
        self.epoch = 0
        self.iterator = iter(self.loader)
        self.step = 0

    def _next_batch(self):
        try:
            return next(self.iterator)
        except StopIteration:
            self.epoch += 1
            self.loader.sampler.set_epoch(self.epoch)
            self.iterator = iter(self.loader)
            return next(self.iterator)

    def run(self, steps: int) -> None:
        self.model.train()
        for _ in range(steps):
            for _ in range(self.accumulation):
                inputs, targets = move_to_device(self._next_batch(), self.plan.device)
                with self.plan.autocast():
                    logits = self.model(inputs)
                    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
                (loss / self.accumulation).backward()
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip or float("inf"))
            if torch.isfinite(norm):  # the same one sync per step the recipe spends on skipping
                self.optimizer.step()
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            if self.step % self.log_every == 0:
                print(f"step {self.step} loss {loss.item():.4f}", end="\r")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = compose(["logging.progress=none", "data.val=null", "trainer.eval_every_n_steps=0", "preflight.enabled=false", *args.overrides])
    with tempfile.TemporaryDirectory() as tmp:
        recipe = CharLMRecipe(cfg, run_dir=Path(tmp) / "run")
        recipe.setup()
        hand = HandWrittenLoop(recipe)

        stamps: list[float] = []
        for optimizer in (recipe.optimizer, hand.optimizer):
            optimizer.register_step_pre_hook(lambda *_: stamps.append(time.perf_counter()))

        def timed(run, steps: int) -> tuple[float, float]:
            """(steady-state seconds per step, whole-call seconds per step)"""
            stamps.clear()
            started = time.perf_counter()
            run(steps)
            whole = (time.perf_counter() - started) / steps
            return statistics.median(b - a for a, b in zip(stamps, stamps[1:])), whole

        def run_recipe(steps: int) -> None:
            recipe.cfg.trainer.max_steps = recipe.state.step + steps
            recipe.train()

        timed(run_recipe, 10), timed(hand.run, 10)  # warm-up: allocator, oneDNN kernel selection
        recipe_times, hand_times = [], []
        for index in range(args.rounds):
            order = [(run_recipe, recipe_times), (hand.run, hand_times)]
            for runner, times in order if index % 2 == 0 else reversed(order):
                times.append(timed(runner, args.steps))
    steady = [r[0] / h[0] for r, h in zip(recipe_times, hand_times)]
    whole = [r[1] / h[1] for r, h in zip(recipe_times, hand_times)]
    recipe_step = statistics.median(r[0] for r in recipe_times)
    hand_step = statistics.median(h[0] for h in hand_times)
    print(" " * 40)
    print(f"precision {recipe.training_context.precision}, {args.rounds} rounds x {args.steps} steps, batch {cfg.data.batch_size} x {cfg.trainer.accumulation_steps}")
    print(f"recipe       {1 / recipe_step:7.2f} steps/s  (median {1000 * recipe_step:.2f} ms/step, steady state)")
    print(f"hand-written {1 / hand_step:7.2f} steps/s  (median {1000 * hand_step:.2f} ms/step, steady state)")
    print(f"steady-state ratio per round: {[round(r, 4) for r in steady]}  (min {min(steady):.4f}, max {max(steady):.4f})")
    print(f"whole-round ratio per round:  {[round(r, 4) for r in whole]}  (median {statistics.median(whole):.4f}; includes once-per-call work)")
    print(f"overhead_ratio={statistics.median(steady):.4f}")


if __name__ == "__main__":
    main()
