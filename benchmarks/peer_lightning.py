"""The recipe against PyTorch Lightning's Trainer doing the same work.

    python benchmarks/peer_lightning.py [--rounds 3] [--steps 30] [--skip 5] [overrides ...]

Lightning is a benchmark-only dependency (``pip install -e ".[lightning]"``; ``.[dev]``
has it). Without it the script prints a "skipped" line and no figure.

Both sides train the default char-LM recipe as ``compose(overrides)`` resolves it: the
same ``CharTransformer`` (built from ``cfg.model``, seeded alike), the same stdlib
character windows (``cfg.data.train``/``val``, batch size, workers), AdamW with the same
decay/no-decay groups (``training.optim.build_optimizer``) and the same warmup-cosine
schedule stepped per optimizer step, the same precision (``trainer.precision`` resolved
as the recipe resolves it: fp32 on a CPU without native bf16, where Lightning gets
``32-true``; ``bf16-mixed``/``16-mixed`` otherwise), accumulation
(``accumulate_grad_batches``), clipping (``gradient_clip_val``, norm), and the nearest
equivalents of what else a recipe run does:

- validation every ``steps // 2`` steps, ``trainer.eval_max_batches`` batches
  (``val_check_interval``, ``limit_val_batches``); Lightning keeps its default sanity
  validation (2 batches) before training;
- a checkpoint (weights + optimizer + scheduler) every ``steps // 2`` steps, keeping
  ``checkpoint.keep_last``, and one at the end (``ModelCheckpoint`` on the step count,
  plus a final ``trainer.save_checkpoint`` when the last step was not a save step);
- metrics every ``logging.every_n_steps`` steps to a file: the recipe's metrics.jsonl,
  Lightning's ``CSVLogger`` with the loss (``self.log``) and the LR (``LearningRateMonitor``);
- no progress bar on either side (``logging.progress=none``, ``enable_progress_bar=False``).
The recipe side is ``CharLMRecipe(cfg).run()``, the TrainRecipe API ``optimus-train`` calls,
with its default preflight on; Lightning's side is ``Trainer(...).fit(module)``.

Each round is one whole fresh run of each side, in this process, in lockstep
(benchmarks/lockstep.py): the two runs take turns, each working until its next
``optimizer.step()`` and then handing over (each on a thread of its own; only one runs
at a time). On a shared machine a stall then costs whichever side holds the turn for a
step or so, not a whole run, and over a round both meet the same conditions. Rounds
alternate which side starts; one short warm-up round (lazy imports, the corpus read,
allocator and oneDNN warm-up) is not counted. Off the main thread the recipe installs
no signal handlers (they cost nothing until a signal comes). Two ratios per round:

- per step (steady state): a side's step period is the time from one
  ``optimizer.step()`` call to its next, so all the per-step work counts (logging, the
  recipe's checks) and the once-per-run work does not; the round's ratio is the median,
  over the steps after the first ``--skip``, of the recipe's period over Lightning's
  period of the same step (the two ran back to back); the ms/step shown are the medians;
- whole run: the sum of the side's own time from building the objects to the end of
  training (setup, the recipe's preflight, Lightning's sanity validation, validation,
  checkpoints, closing files); interpreter start and imports excluded. The recipe's
  preflight time is also reported on its own, since Lightning runs no equivalent.

The recipe vs a hand-written loop is benchmarks/loop_overhead.py's figure, not repeated
here. Last line: ``lightning_step_ratio=<median> lightning_step_ratio_min=...
lightning_step_ratio_max=... lightning_run_ratio=... (and _min, _max)``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from optimus_preflight import compose
from optimus_preflight.config.instantiate import instantiate_node
from optimus_preflight.recipes.char_lm import CharLMRecipe
from optimus_preflight.training.optim import build_optimizer
from optimus_preflight.training.precision import resolve_device, resolve_precision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lockstep import Lockstep, run_threads  # noqa: E402

try:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger
except ImportError:  # the unified package ships the same API under lightning.pytorch
    try:
        import lightning.pytorch as pl  # type: ignore[no-redef]
        from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint  # type: ignore[no-redef]
        from lightning.pytorch.loggers import CSVLogger  # type: ignore[no-redef]
    except ImportError:
        pl = None  # type: ignore[assignment]

LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


# ------------------------------------------------------------------ recipe side
def run_recipe(cfg: Any, run_dir: Path, steps: int, lockstep: Lockstep) -> dict[str, Any]:
    class TimedRecipe(CharLMRecipe):
        timing = False

        def build_optimizer(self, model):
            optimizer = super().build_optimizer(model)
            # Only the training loop's steps: a preflight stepping a copy hands nothing over.
            optimizer.register_step_pre_hook(lambda *_: lockstep.handoff("recipe") if self.timing else None)
            return optimizer

        def train(self) -> None:
            self.timing = True
            super().train()

    recipe = TimedRecipe(cfg, run_dir=run_dir)
    summary = recipe.run()
    if summary["status"] != "completed" or summary["steps"] != steps:
        raise RuntimeError(f"recipe run ended {summary['status']} at step {summary['steps']}")
    return {"preflight_s": recipe.preflight_report.elapsed_s if recipe.preflight_report is not None else 0.0}


# --------------------------------------------------------------- Lightning side
def lightning_classes():
    class CharLMModule(pl.LightningModule):
        """The recipe's model, loss, optimizer and schedule as a LightningModule."""

        def __init__(self, cfg: Any, step_hook: Callable[[], None]):
            super().__init__()
            self.cfg = cfg
            self.step_hook = step_hook
            self.model = instantiate_node(cfg.model, "model")

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return self.model(inputs)

        def _loss(self, batch: Any) -> torch.Tensor:
            inputs, targets = batch
            return F.cross_entropy(self.model(inputs).flatten(0, 1), targets.flatten())

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = self._loss(batch)
            self.log("loss", loss, on_step=True, on_epoch=False)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self._loss(batch), on_step=False, on_epoch=True)

        def configure_optimizers(self) -> dict[str, Any]:
            optimizer = build_optimizer(OmegaConf.to_container(self.cfg.optimizer, resolve=True), self.model)
            optimizer.register_step_pre_hook(lambda *_: self.step_hook())
            scheduler = instantiate_node(self.cfg.scheduler, "scheduler", optimizer=optimizer, total_steps=self.cfg.trainer.max_steps)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}

    class FinalCheckpoint(Callback):
        """The recipe saves at the end of training; ModelCheckpoint on a step count does
        not when the last step is off its period."""

        def __init__(self, directory: Path, every: int):
            self.directory = directory
            self.every = every

        def on_train_end(self, trainer, pl_module) -> None:
            if trainer.global_step % self.every:
                trainer.save_checkpoint(self.directory / f"final-step={trainer.global_step}.ckpt")

    return CharLMModule, FinalCheckpoint


def loader(cfg: Any, split_node: Any, train: bool) -> DataLoader:
    data = cfg.data
    return DataLoader(
        instantiate_node(split_node, f"data.{'train' if train else 'val'}"),
        batch_size=data.batch_size if train else (data.eval_batch_size or data.batch_size),
        shuffle=data.shuffle and train,
        drop_last=data.drop_last and train,
        num_workers=data.num_workers,
        pin_memory=data.pin_memory,
        generator=torch.Generator().manual_seed(cfg.trainer.seed),
    )


def run_lightning(cfg: Any, run_dir: Path, steps: int, lockstep: Lockstep, precision: str, device: torch.device) -> None:
    CharLMModule, FinalCheckpoint = lightning_classes()
    trainer_cfg = cfg.trainer
    pl.seed_everything(trainer_cfg.seed, verbose=False)
    module = CharLMModule(cfg, lambda: lockstep.handoff("lightning"))
    train_loader = loader(cfg, cfg.data.train, train=True)
    val_loader = loader(cfg, cfg.data.val, train=False) if cfg.data.val is not None and trainer_cfg.eval_every_n_steps else None
    every = cfg.checkpoint.every_n_steps
    checkpoints = run_dir / "checkpoints"
    trainer = pl.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision=LIGHTNING_PRECISION[precision],
        max_steps=steps,
        accumulate_grad_batches=trainer_cfg.accumulation_steps,
        gradient_clip_val=trainer_cfg.clip_grad_norm,
        gradient_clip_algorithm="norm",
        # An int val_check_interval counts training batches, i.e. micro-batches.
        val_check_interval=(trainer_cfg.eval_every_n_steps or steps) * trainer_cfg.accumulation_steps,
        check_val_every_n_epoch=None,
        limit_val_batches=trainer_cfg.eval_max_batches if val_loader is not None else 0,
        logger=CSVLogger(run_dir, name="lightning"),
        log_every_n_steps=cfg.logging.every_n_steps,
        callbacks=[
            ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=every, save_top_k=cfg.checkpoint.keep_last, monitor="step", mode="max"),
            FinalCheckpoint(checkpoints, every),
            LearningRateMonitor(logging_interval="step"),
        ],
        enable_progress_bar=False,
        deterministic=trainer_cfg.deterministic,
        default_root_dir=run_dir,
    )
    trainer.fit(module, train_dataloaders=train_loader, val_dataloaders=val_loader)
    if trainer.global_step != steps:
        raise RuntimeError(f"Lightning stopped at step {trainer.global_step}, expected {steps}")


def run_round(cfg: Any, root: Path, steps: int, skip: int, first: str, precision: str, device: torch.device) -> dict[str, dict[str, float]]:
    """One fresh run of each side, in lockstep, each on a thread of its own (the same
    placement for both; off the main thread the recipe installs no signal handlers, which
    cost nothing until a signal comes, and Lightning installs none either)."""
    lockstep = Lockstep(("recipe", "lightning"), first)
    results = run_threads(lockstep, {
        "recipe": lambda: run_recipe(cfg, root / "recipe", steps, lockstep),
        "lightning": lambda: run_lightning(cfg, root / "lightning", steps, lockstep, precision, device),
    })
    return {"recipe": {**lockstep.figures("recipe", steps, skip), **results["recipe"],
                       "step_ratio": lockstep.paired_ratio("recipe", "lightning", steps, skip)},
            "lightning": lockstep.figures("lightning", steps, skip)}


# ------------------------------------------------------------------------ main
def quiet() -> None:
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*litlogger.*")


class QuietRecipeLogs(logging.Filter):
    """The recipe's INFO lines (run dir, preflight summary) once per run, and its warning
    that off the main thread it installs no signal handlers: noise here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and "not on the main thread" not in record.getMessage()


def spread(values: list[float]) -> str:
    return f"min {min(values):.3f}  median {statistics.median(values):.3f}  max {max(values):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run (even; validation and a checkpoint at steps/2)")
    parser.add_argument("--skip", type=int, default=5, help="first steps of each run left out of the steady-state figure")
    parser.add_argument("--warmup-steps", type=int, default=8, help="steps of the uncounted warm-up run of each side")
    parser.add_argument("overrides", nargs="*", help="config overrides for both sides, e.g. trainer.accumulation_steps=2")
    args = parser.parse_args()
    if pl is None:
        print("skipped: Lightning is not installed (pip install -e '.[lightning]')")
        return 0
    if args.steps < 2 * args.skip + 4:
        parser.error(f"--steps must be at least {2 * args.skip + 4} with --skip {args.skip}")
    quiet()
    logging.basicConfig(level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(QuietRecipeLogs())

    def config(steps: int):
        half = max(steps // 2, 1)
        return compose([
            "logging.progress=none", f"trainer.max_steps={steps}", f"trainer.eval_every_n_steps={half}",
            f"checkpoint.every_n_steps={half}", *args.overrides,
        ])

    cfg = config(args.steps)
    device = resolve_device(cfg.trainer.device)
    precision = resolve_precision(cfg.trainer.precision, device)
    print(f"pytorch-lightning {pl.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}, "
          f"precision {precision} (Lightning {LIGHTNING_PRECISION[precision]})")
    print(f"{args.rounds} rounds x {args.steps} steps, batch {cfg.data.batch_size} x {cfg.trainer.accumulation_steps} accumulation, "
          f"block {cfg.data.train.block_size}; validation and checkpoint every {cfg.trainer.eval_every_n_steps} steps; "
          f"recipe preflight {'on' if cfg.preflight.enabled else 'off'}", flush=True)

    results: dict[str, list[dict[str, float]]] = {"recipe": [], "lightning": []}
    with tempfile.TemporaryDirectory(prefix="peer-lightning-") as tmp:
        root = Path(tmp)
        with contextlib.redirect_stdout(sys.stderr):  # Lightning's model summary
            run_round(config(args.warmup_steps), root / "warmup", args.warmup_steps, 1, "recipe", precision, device)
        for index in range(args.rounds):
            first = "recipe" if index % 2 == 0 else "lightning"
            with contextlib.redirect_stdout(sys.stderr):
                figures = run_round(cfg, root / f"round{index}", args.steps, args.skip, first, precision, device)
            r, lt = figures["recipe"], figures["lightning"]
            results["recipe"].append(r)
            results["lightning"].append(lt)
            print(f"round {index + 1} ({first} first): per step recipe {1000 * r['step_s']:.1f} ms, "
                  f"Lightning {1000 * lt['step_s']:.1f} ms (ratio {r['step_ratio']:.3f}); whole run recipe "
                  f"{r['run_s']:.2f} s, Lightning {lt['run_s']:.2f} s (ratio {r['run_s'] / lt['run_s']:.3f})", flush=True)
            print(f"    recipe:    {r['start_s']:6.2f} s to the first step (preflight {r['preflight_s']:.2f} s), {r['steps_s']:6.2f} s "
                  f"of steps (validation and checkpoint within), {r['end_s']:5.2f} s after the last (validation, checkpoint, summary)")
            print(f"    Lightning: {lt['start_s']:6.2f} s to the first step (sanity validation), {' ' * 17}{lt['steps_s']:6.2f} s "
                  f"of steps (validation and checkpoint within), {lt['end_s']:5.2f} s after the last (validation, checkpoint)", flush=True)

    pairs = list(zip(results["recipe"], results["lightning"]))
    step_ratios = [r["step_ratio"] for r, _ in pairs]
    run_ratios = [r["run_s"] / lt["run_s"] for r, lt in pairs]
    no_preflight = [(r["run_s"] - r["preflight_s"]) / lt["run_s"] for r, lt in pairs]
    print("    (a step's optimizer.step() call comes after its forward/backward in the recipe, before them in Lightning's\n"
          "     closure: Lightning's first part holds one forward/backward less than the recipe's, its last part one more)")
    print()
    print(f"recipe / Lightning, time per step (steady state): {spread(step_ratios)}")
    print(f"recipe / Lightning, whole run:                    {spread(run_ratios)}")
    print(f"  the same without the recipe's preflight:        {spread(no_preflight)}")
    print(f"recipe preflight: median {statistics.median(r['preflight_s'] for r in results['recipe']):.2f} s = "
          f"{statistics.median(r['preflight_s'] / r['step_s'] for r in results['recipe']):.1f} steady-state steps")
    print("recipe / hand-written loop: see benchmarks/loop_overhead.py")
    print(f"lightning_step_ratio={statistics.median(step_ratios):.4f} lightning_step_ratio_min={min(step_ratios):.4f} "
          f"lightning_step_ratio_max={max(step_ratios):.4f} lightning_run_ratio={statistics.median(run_ratios):.4f} "
          f"lightning_run_ratio_min={min(run_ratios):.4f} lightning_run_ratio_max={max(run_ratios):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
