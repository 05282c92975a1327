"""The preflight from any training loop: ``run_preflight(model, optimizer, train_loader, ...)``.

The checks only need what a loop already has (model, optimizer, loaders, a loss, the
precision and accumulation it trains with). This builds the context a recipe would
(a config from the schema defaults plus the given settings, a TrainingContext that
takes the device from the model and seeds nothing) and runs the same runner, so the
guarantee is the recipe's: model, optimizer, scheduler, scaler, RNG and loader state are
bitwise what they were before the call.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.config.schema import FAIL_ON, Config, DataConfig, GradScalerConfig
from optimus_preflight.errors import PreflightFailed
from optimus_preflight.preflight.defaults import default_checks
from optimus_preflight.preflight.framework import Check, Issue
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.preflight.framework.runner import REPORT_FILE, run_preflight_checks
from optimus_preflight.training.distributed import DistEnv, unwrap
from optimus_preflight.training.precision import PrecisionPlan, make_grad_scaler, resolve_precision
from optimus_preflight.training.training_context import TrainingContext

LossFn = Callable[[nn.Module, Any], Any]
STANDALONE_PRECISIONS = ("fp32", "bf16", "fp16")

# Settings of the loop and of the preflight that run_preflight takes as keywords.
_KEYWORD_OF_KEY = {
    "trainer.accumulation_steps": "accumulation_steps",
    "trainer.precision": "precision",
    "trainer.clip_grad_norm": "clip_grad_norm",
    "trainer.max_steps": "max_steps",
    "preflight.memory.target_gib": "target_gib",
    "preflight.first_batch_timeout_s": "first_batch_timeout_s",
    "preflight.overfit_steps": "overfit_steps",
    "preflight.lr_finder": "lr_finder",
    "preflight.verbose": "verbose",
    "preflight.disable": "disable",
    "preflight.fail_on": "fail_on",
}
# Where the equivalent of a config group lives in a plain PyTorch loop.
_PLAIN_EQUIVALENT = {
    "data": "the arguments of the DataLoader you train with",
    "model": "the code that builds your model",
    "optimizer": "the code that builds your optimizer (its arguments or param_groups)",
    "scheduler": "the code that builds your LR scheduler",
    "trainer": "your training loop",
    "checkpoint": "the way your loop saves checkpoints",
}
# A check's code fix names the recipe builder it belongs in; outside a recipe it is the
# user's own construction code.
_RECIPE_PHRASES = (
    (" your build_dataloaders() returns", " you train with"),
    ("In your build_optimizer,", "Where you build the optimizer,"),
)


def fix_for_foreign_loop(issue: Issue) -> str:
    """An issue's fix phrased for a loop that reads no config: a run_preflight keyword
    for the preflight's own settings, the code change for everything else."""
    key = issue.config_key or ""
    keyword = _KEYWORD_OF_KEY.get(key)
    if keyword and key.startswith("preflight."):
        return issue.fix.replace(f"Set {key}", f"Pass {keyword}").replace(key, keyword)
    if keyword:
        return (f"{issue.fix.replace(key, keyword)} (Make the change in your training loop, and pass the new value "
                f"as run_preflight({keyword}=...) so the preflight checks what the loop does.)")
    if issue.code_fix:
        fix = issue.code_fix
        for recipe_phrase, plain in _RECIPE_PHRASES:
            fix = fix.replace(recipe_phrase, plain)
        return fix
    where = _PLAIN_EQUIVALENT.get(key.split(".", 1)[0], "your own code")
    return f"{issue.fix} (Outside a TrainRecipe, {key} stands for {where}: make the equivalent change there.)"


class ForeignLoopContext(PreflightContext):
    """A context whose config nobody reads: every fix is phrased for the user's code."""

    def key_applies(self, key: str) -> bool:
        return False

    def fix_for_unread_key(self, issue: Issue) -> str:
        return fix_for_foreign_loop(issue)


def loss_adapter(loss_fn: Any) -> LossFn:
    """``compute_loss(model, batch)`` from what a user has:

    - None: ``model(**batch).loss`` for mapping batches (Hugging Face models given
      ``labels``), else cross-entropy of ``model(inputs)`` against ``targets``;
    - a loss module or a ``torch.nn.functional`` loss (``nn.CrossEntropyLoss()``,
      ``F.mse_loss``): ``loss_fn(model(inputs), targets)`` for ``(inputs, targets)`` batches,
      ``loss_fn(model(x), x)`` for a batch of one tensor ``x`` or ``(x,)`` (an autoencoder);
    - any other callable: called as ``loss_fn(model, batch)``, returning the loss or
      ``(loss, count)`` as ``TrainRecipe.compute_loss`` does.
    """
    if loss_fn is None:
        return default_compute_loss
    if isinstance(loss_fn, nn.Module) or getattr(loss_fn, "__module__", "") == "torch.nn.functional":

        def criterion_loss(model: nn.Module, batch: Any) -> torch.Tensor:
            if isinstance(batch, torch.Tensor):
                inputs = targets = batch  # a reconstruction: the input is its own target
            elif isinstance(batch, (list, tuple)) and len(batch) == 1:
                inputs = targets = batch[0]  # TensorDataset(x) of an autoencoder
            else:
                inputs, targets = batch
            return loss_fn(model(inputs), targets)

        return criterion_loss
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(model, batch), got {type(loss_fn).__name__}")
    return loss_fn


def default_compute_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    if isinstance(batch, Mapping):
        output = model(**batch)
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if loss is None:
            raise ValueError("the model returned no .loss for a mapping batch: pass labels in the batch or loss_fn=")
        return loss
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=-100)


def _model_device(model: nn.Module) -> torch.device:
    first = next(unwrap(model).parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _optimizer_steps_per_epoch(loader: Any, accumulation_steps: int) -> int | None:
    try:
        return max(1, len(loader) // accumulation_steps)
    except TypeError:  # an IterableDataset without __len__
        return None


def foreign_loop_config(
    train_loader: Any,
    *,
    precision: str,
    device: torch.device,
    accumulation_steps: int,
    max_steps: int,
    clip_grad_norm: float | None,
    fail_on: str,
    disable: Sequence[str],
    first_batch_timeout_s: float,
    overfit_steps: int,
    lr_finder: bool,
    target_gib: float | None,
    verbose: bool = False,
) -> DictConfig:
    """The schema's defaults, with what the user's loop really does written in: the
    DataLoader's own settings, the loop's precision, accumulation, clipping and length."""
    cfg = OmegaConf.structured(Config)
    cfg.model = {}
    cfg.optimizer = {}
    cfg.data = OmegaConf.structured(DataConfig)
    batch_size = getattr(train_loader, "batch_size", None)
    cfg.data.batch_size = int(batch_size or 1)
    cfg.data.num_workers = int(getattr(train_loader, "num_workers", 0) or 0)
    cfg.data.pin_memory = bool(getattr(train_loader, "pin_memory", False))
    cfg.data.prefetch_factor = getattr(train_loader, "prefetch_factor", None) if cfg.data.num_workers else None
    cfg.data.persistent_workers = bool(getattr(train_loader, "persistent_workers", False))
    cfg.data.drop_last = bool(getattr(train_loader, "drop_last", False))
    cfg.trainer.precision = precision
    cfg.trainer.device = device.type
    cfg.trainer.accumulation_steps = accumulation_steps
    cfg.trainer.max_steps = max_steps
    cfg.trainer.clip_grad_norm = clip_grad_norm
    cfg.preflight.fail_on = fail_on
    cfg.preflight.disable = list(disable)
    cfg.preflight.first_batch_timeout_s = first_batch_timeout_s
    cfg.preflight.overfit_steps = overfit_steps
    cfg.preflight.lr_finder = lr_finder
    cfg.preflight.memory.target_gib = target_gib
    cfg.preflight.verbose = verbose
    return cfg


def failure_outcome(raise_on_failure: bool) -> str:
    """What a failed verdict does in a loop of the user's own, for the console's last line."""
    if raise_on_failure:
        return "run_preflight raises PreflightFailed, before your loop's first step"
    return ("nothing stops your loop: run_preflight only returns the report (raise_on_failure=True raises "
            "PreflightFailed instead)")


def _refuse_lazy(model: nn.Module) -> None:
    """A model whose lazy modules (nn.LazyLinear, LazyConv*) have not run yet has no weights to
    check, copy or restore: say how to give it some, as torch asks before an optimizer is built."""
    lazy = [name for name, module in model.named_modules()
            if any(nn.parameter.is_lazy(p) for p in module.parameters(recurse=False))]
    if lazy:
        raise ValueError(
            f"run_preflight: {len(lazy)} lazy module(s) of the model ({', '.join(lazy[:3])}) have not been "
            "initialised yet (their shapes are set by the first forward): call the model once on a batch, "
            "model(next(iter(train_loader))[0]) or as your loss function does, before building the optimizer and "
            "calling run_preflight, as torch recommends for lazy modules")


def _validate(precision: str, accumulation_steps: int, max_steps: int | None, fail_on: str, device: torch.device) -> str:
    if precision not in STANDALONE_PRECISIONS:
        raise ValueError(f"run_preflight(precision=...) must be one of {', '.join(STANDALONE_PRECISIONS)}, "
                         f"got {precision!r}: the precision your loop trains in (its autocast dtype)")
    if not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"run_preflight(accumulation_steps=...) must be an integer >= 1, got {accumulation_steps!r}")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"run_preflight(max_steps=...) must be an integer >= 1 (optimizer steps), got {max_steps!r}")
    if fail_on not in FAIL_ON:
        raise ValueError(f"run_preflight(fail_on=...) must be one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    # Refuses what the device cannot do (fp16 autocast needs CUDA for a GradScaler to matter).
    return resolve_precision(precision, device)


def run_preflight(
    model: nn.Module,
    optimizer: Optimizer,
    train_loader: Iterable[Any],
    *,
    loss_fn: Any = None,
    scheduler: Any = None,
    val_loader: Iterable[Any] | None = None,
    scaler: torch.amp.GradScaler | None = None,
    precision: str = "fp32",
    accumulation_steps: int = 1,
    max_steps: int | None = None,
    clip_grad_norm: float | None = None,
    run_dir: str | Path | None = None,
    checks: Sequence[Check] | None = None,
    disable: Sequence[str] = (),
    fail_on: str = "error",
    first_batch_timeout_s: float = 300.0,
    overfit_steps: int = 0,
    lr_finder: bool = False,
    target_gib: float | None = None,
    verbose: bool = False,
    raise_on_failure: bool = False,
    loop_calls_train: bool = False,
    dist: DistEnv | None = None,
) -> PreflightReport:
    """Run the preflight checks on your own model, optimizer and loaders; return the report.

    Nothing the loop owns changes: the weights, gradients, optimizer, scheduler and
    scaler state, the RNGs and the loaders' samplers are bitwise what they were, so the
    run that follows is the run you would have had without the call.

    - ``loss_fn``: see ``loss_adapter`` (``loss_fn(model, batch)``, a loss module such as
      ``nn.CrossEntropyLoss()``, or None for ``model(**batch).loss`` / cross-entropy).
    - ``precision``: ``fp32``, ``bf16`` or ``fp16``, the autocast your loop uses;
      ``accumulation_steps``, ``clip_grad_norm``: as your loop does them.
    - ``max_steps``: optimizer steps the run will take (the LR schedule and the ETA are
      checked against it); default one epoch of ``train_loader``.
    - ``run_dir``: where ``preflight.json`` is written (and the disk checks look);
      without it nothing is written and scratch files go to a temporary directory.
    - ``checks``: instances to run instead of the defaults; ``disable``: check names or
      issue codes to skip; ``fail_on``: ``error``, ``warning`` or ``never``.
    - ``verbose``: a console line for every check (by default: the issues, a count of the
      passed checks and the memory table); ``preflight.json`` has every check either way.
    - ``raise_on_failure``: raise ``PreflightFailed`` (carrying the report) when the
      verdict is failed under ``fail_on``, as a recipe exits 3.
    - ``loop_calls_train``: your loop calls ``model.train()`` itself before its first step
      (Lightning's and the Hugging Face Trainer's do); otherwise a model in eval mode
      now is reported, as the loop would train it in eval mode.
    - Under torchrun, call it on every rank: the ranks agree on one verdict.
    """
    device = _model_device(model)
    resolved = _validate(precision, accumulation_steps, max_steps, fail_on, device)
    _refuse_lazy(model)
    run_length_known = max_steps is not None
    if max_steps is None:
        max_steps = _optimizer_steps_per_epoch(train_loader, accumulation_steps) or 1
    cfg = foreign_loop_config(
        train_loader,
        precision=resolved,
        device=device,
        accumulation_steps=accumulation_steps,
        max_steps=max_steps,
        clip_grad_norm=clip_grad_norm,
        fail_on=fail_on,
        disable=disable,
        first_batch_timeout_s=first_batch_timeout_s,
        overfit_steps=overfit_steps,
        lr_finder=lr_finder,
        target_gib=target_gib,
        verbose=verbose,
    )
    plan = PrecisionPlan(resolved, device)
    training = TrainingContext(
        device=device,
        plan=plan,
        scaler=scaler if scaler is not None else make_grad_scaler(plan, GradScalerConfig()),
        dist=dist or DistEnv.from_environment(),
    )
    with ExitStack() as stack:
        # The checks step the optimizer before the scheduler; torch cannot see that through an
        # optimizer whose step() a library re-wrapped after the scheduler was built
        # (accelerate does, under the Hugging Face Trainer), and warns of the wrong order.
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        directory = Path(run_dir) if run_dir is not None else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="preflight-")))
        directory.mkdir(parents=True, exist_ok=True)
        # No recipe: the checks copy the live objects, and nothing has trained yet.
        ctx = ForeignLoopContext.from_objects(cfg, model, optimizer, train_loader, loss_adapter(loss_fn),
                                              run_dir=directory, scheduler=scheduler, val_loader=val_loader,
                                              training=training)
        ctx.loop_sets_train_mode = loop_calls_train
        ctx.run_length_known = run_length_known
        ctx.failure_outcome = failure_outcome(raise_on_failure)
        chosen = list(checks) if checks is not None else default_checks(cfg)
        report = run_preflight_checks(chosen, ctx, report_path=directory / REPORT_FILE if run_dir is not None else None)
    if raise_on_failure and report.failed:
        raise PreflightFailed(report)
    return report

