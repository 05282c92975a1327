"""The recipe's cost over a hand-written loop doing the same work.

    python benchmarks/loop_overhead.py [--rounds 5] [--steps 60] [--precision auto] [overrides ...]

(a) TrainRecipe.train() of the default char-LM recipe with default logging, and (b) the
plain PyTorch loop an expert would write for the same work: same model, data order,
autocast, accumulation, clipping, warmup-cosine schedule, AdamW groups, and a loss
printout every logging.every_n_steps. Both run in this process, interleaved round by
round (alternating which goes first) after a warm-up round, so machine noise hits both.
Each round adds ``--steps`` optimizer steps to each. Validation is off for both, since
its cost is the same in either loop. Last line: ``overhead_ratio=<median>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from optimus_preflight.recipes.char_lm import CharLMRecipe

from optimus_preflight import compose
from optimus_preflight.data import move_to_device


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

        def run_recipe(steps: int) -> float:
            recipe.cfg.trainer.max_steps = recipe.state.step + steps
            started = time.perf_counter()
            recipe.train()
            return time.perf_counter() - started

        def run_hand(steps: int) -> float:
            started = time.perf_counter()
            hand.run(steps)
            return time.perf_counter() - started

        run_recipe(10), run_hand(10)  # warm-up: allocator, oneDNN kernel selection
        recipe_times, hand_times = [], []
        for index in range(args.rounds):
            order = [(run_recipe, recipe_times), (run_hand, hand_times)]
            for runner, times in order if index % 2 == 0 else reversed(order):
                times.append(runner(args.steps) / args.steps)
    ratios = [r / h for r, h in zip(recipe_times, hand_times)]
    print(" " * 40)
    print(f"precision {recipe.training_context.precision}, {args.rounds} rounds x {args.steps} steps, batch {cfg.data.batch_size} x {cfg.trainer.accumulation_steps}")
    print(f"recipe       {1 / statistics.median(recipe_times):7.2f} steps/s  (median {1000 * statistics.median(recipe_times):.1f} ms/step)")
    print(f"hand-written {1 / statistics.median(hand_times):7.2f} steps/s  (median {1000 * statistics.median(hand_times):.1f} ms/step)")
    print(f"ratio per round: {[round(r, 3) for r in ratios]}  (min {min(ratios):.3f}, max {max(ratios):.3f})")
    print(f"overhead_ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
