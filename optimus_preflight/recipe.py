"""TrainRecipe: the lifecycle setup -> preflight -> train (with eval) -> test -> finalize.

Subclass it and override a builder (``build_model``, ``build_optimizer``,
``build_scheduler``, ``build_dataloaders``, ``build_test_dataloader``), ``compute_loss`` or
``validation_step``; the defaults build from the config's ``_target_`` entries.

``TrainRecipe`` is one composition of the four mixins (mixins/): it builds the objects
from the config and calls the mixins' own interface (``setup_training_context``,
``run_training_iteration``, ``setup_interruption``/``exit_interrupted``,
``run_preflight_checks``), as a loop of a user's own does.

Why this module is long (~690 lines): the builders, the lifecycle and the training loop
with its evaluation, test and callback events are in one class, so a reader sees the
whole loop top to bottom. The logic around it lives in the mixins and in components
(training/, reporting/, callbacks/, checkpoint/).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from optimus_preflight.app import check_before_work, run_app
from optimus_preflight.callbacks import CallbackList
from optimus_preflight.callbacks.compile_watch import CompileWatchCallback
from optimus_preflight.callbacks.monitors import BestCheckpoint, EarlyStopping
from optimus_preflight.checkpoint import resume_command
from optimus_preflight.checkpoint.resume import refuse_to_start_over
from optimus_preflight.checkpoint.resume_command import hydra_task_overrides
from optimus_preflight.checkpoint.run_dir import RunDirectory, open_run_directory
from optimus_preflight.checkpoint.signals import StopRequested
from optimus_preflight.checkpoint.store import CheckpointStore
from optimus_preflight.config.instantiate import config_rejections, instantiate_node, node_target
from optimus_preflight.config.reads import check_overrides_read, recording_reads
from optimus_preflight.config.schema import DataConfig
from optimus_preflight.dynamics.callback import DynamicsCallback
from optimus_preflight.errors import PreflightFailed, TrainingInterrupted, UserError
from optimus_preflight.memory.oom_callback import OOMRecorderCallback
from optimus_preflight.mixins import (
    PreflightMixin,
    TrainingContextMixin,
    TrainingInterruptionMixin,
    TrainingIterationMixin,
)
from optimus_preflight.preflight.analyses.micro_batch import micro_batch_plan
from optimus_preflight.preflight.defaults import default_checks
from optimus_preflight.preflight.framework import Check
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.reporting.model_summary import format_model_summary, summarize_model, write_model_summary
from optimus_preflight.reporting.progress import Progress
from optimus_preflight.reporting.sinks import JsonlSink, MetricsLogger, make_tensorboard_sink
from optimus_preflight.reporting.step_log import StepLogger
from optimus_preflight.reporting.summary import memory_peaks, params_sha256, peak_memory_bytes, write_json_atomic
from optimus_preflight.reporting.trackers import Trackers
from optimus_preflight.training import rng
from optimus_preflight.training.compiling import check_compile_config, compile_model
from optimus_preflight.training.contracts import check_built, check_loaders, check_scheduler, check_test_loader
from optimus_preflight.training.distributed import all_reduce_sum, union_of_names, unwrap
from optimus_preflight.training.evaluation import evaluate_metrics
from optimus_preflight.training.load_report import recording_loads
from optimus_preflight.training.loaders import build_loader
from optimus_preflight.training.monitoring import MetricMonitor
from optimus_preflight.training.optim import build_optimizer, group_names
from optimus_preflight.training.run_length import optimizer_steps_per_epoch, planned_max_steps
from optimus_preflight.training.run_state import RunState
from optimus_preflight.training.step import StepResult, StepRunner, split_loss_output
from optimus_preflight.training.strategy import build_for_verdict, place_model, verdict_only
from optimus_preflight.training.user_metrics import MetricCollector, prefixed
from optimus_preflight.training.worker_deaths import WorkerDeathGuard, WorkerDied

log = logging.getLogger("optimus_preflight")


def default_run_dir() -> Path:
    """Hydra's job dir inside the app; outputs/<date>/<time> from a notebook or script."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")


def fetch_timeout_s(cfg: DictConfig) -> float | None:
    """data.fetch_timeout_s; the schema's default for a recipe whose own data_config has no such key."""
    default = DataConfig.__dataclass_fields__["fetch_timeout_s"].default
    value = OmegaConf.select(cfg, "data.fetch_timeout_s", default=default)
    return None if value is None else float(value)


def _ensure_logging() -> None:
    # Under Hydra the root logger is configured; elsewhere INFO lines would vanish.
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    log.setLevel(logging.INFO)


class TrainRecipe(TrainingContextMixin, PreflightMixin, TrainingIterationMixin, TrainingInterruptionMixin):
    model: nn.Module
    optimizer: Optimizer
    scheduler: Any
    train_loader: DataLoader
    val_loader: DataLoader | None

    def __init__(self, cfg: DictConfig, run_dir: str | Path | None = None, callbacks: list[Any] | None = None):
        """``callbacks``: Callback objects (optimus_preflight.callbacks) besides the config's."""
        check_before_work(cfg)
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
        # The recipe is one composition of the four mixins, each given its settings here.
        TrainingContextMixin.__init__(self, cfg.trainer)
        TrainingIterationMixin.__init__(self, cfg.trainer, log_freq=0)  # the StepLogger logs the recipe's steps
        checkpoint = cfg.checkpoint
        TrainingInterruptionMixin.__init__(
            self, save_freq=checkpoint.every_n_steps, output_path=self.run_dir, keep_last=checkpoint.keep_last,
            extra_signal=checkpoint.extra_signal, stop_timeout_s=checkpoint.stop_timeout_s, resume=checkpoint.resume,
            resume_hint=lambda: resume_command(self.run_dir), fetch_timeout_s=fetch_timeout_s(cfg),
            fetch_timeout_key="data.fetch_timeout_s")
        self.state = RunState()
        self._is_set_up = False
        self.started_at = time.monotonic()  # reset by run()
        # The default builders that ran (a subclass's override may call them): their
        # config groups are what the run reads, so preflight fixes may name those keys.
        self.default_builders_used: set[str] = set()
        self.run_directory: RunDirectory | None = None
        self.worker_deaths = WorkerDeathGuard()
        self._running = False  # run(): the run dir is locked
        self.strategy = "single"  # single|ddp|fsdp, once setup placed the model
        self.metric_sinks: list[Any] = []  # where step records go, once training opened them
        self.metrics = MetricCollector()  # what self.log records
        self.steps_per_epoch: int | None = None  # optimizer steps per pass over train_loader, when it has a length
        self.test_loader: DataLoader | None = None
        self.trackers = Trackers()  # CSV, MLflow, W&B (logging.*): finished with the run's summary
        self._given_callbacks = list(callbacks or [])
        self.callbacks = CallbackList([])  # the config's and the given ones, once setup built them

    @classmethod
    def main(cls) -> None:
        """Run the Hydra app with this class as the recipe (``MyRecipe.main()``)."""
        run_app(cls)

    # ------------------------------------------------------------------ builders
    def build_model(self) -> nn.Module:
        self.default_builders_used.add("build_model")
        return instantiate_node(self.cfg.model, "model")

    def build_optimizer(self, model: nn.Module) -> Optimizer:
        self.default_builders_used.add("build_optimizer")
        node_target(self.cfg.optimizer, "optimizer")
        return build_optimizer(OmegaConf.to_container(self.cfg.optimizer, resolve=True), model)

    def build_scheduler(self, optimizer: Optimizer) -> Any:
        self.default_builders_used.add("build_scheduler")
        node = self.cfg.scheduler
        if node is None or len(node) == 0:
            return None
        extra: dict[str, Any] = {"optimizer": optimizer}
        if "total_steps" in node and node.total_steps is None:
            extra["total_steps"] = self.cfg.trainer.max_steps
        return instantiate_node(node, "scheduler", **extra)

    def build_dataloaders(self) -> tuple[DataLoader, DataLoader | None]:
        self.default_builders_used.add("build_dataloaders")
        data = self.cfg.data
        dist = self.training_context.dist
        options = dict(seed=self.cfg.trainer.seed, rank=dist.rank, world_size=dist.world_size)
        train = build_loader(instantiate_node(data.train, "data.train"), data, train=True, **options)
        val = None
        if data.val is not None:
            val = build_loader(instantiate_node(data.val, "data.val"), data, train=False, **options)
        return train, val

    def compute_loss(self, model: nn.Module, batch: Any) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """Cross-entropy for ``(inputs, targets)`` batches; targets equal to -100 are ignored.

        Returns the mean loss and the number of targets it averages, so accumulation
        weights micro-batches by targets (token-level losses stay exact).
        """
        inputs, targets = batch
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=-100)
        return loss, (targets != -100).sum()

    def validation_step(self, model: nn.Module, batch: Any) -> Any:
        """One evaluation batch: a dict of metrics, a loss tensor, or either with a count
        as ``(x, count)``; or None after ``self.log`` calls. Each metric is averaged over
        the whole loader (weighted by the count, else the batch size) and recorded as
        ``val_<name>`` (``test_<name>`` on the test loader). Default: the training loss."""
        loss, count = split_loss_output(self.compute_loss(model, batch), batch)
        return {"loss": loss}, count

    def build_test_dataloader(self) -> DataLoader | None:
        """A loader evaluated once after training (and by ``trainer.test_only=true``);
        None: no test."""
        return None

    def log(self, name: str, value: Any, *, prog_bar: bool = False) -> None:
        """Record a metric of your own from ``compute_loss`` or ``validation_step``: a
        number or a one-element tensor (left on its device until a logged step reads it).
        Training values appear in the step records as ``name``; evaluation values as
        ``val_<name>``. ``prog_bar=True`` also shows it on the progress bar/lines."""
        self.metrics.log(name, value, prog_bar=prog_bar)

    @classmethod
    def compose(cls, overrides: list[str] | None = None) -> DictConfig:
        """The config ``python my_recipe.py <overrides>`` builds for this class: its own
        model/data groups and defaults (``model_config``, ``data_config``, ``config_defaults``)."""
        from optimus_preflight.config.compose import compose

        return compose(overrides, recipe=cls)

    # ----------------------------------------------------------------- lifecycle
    def setup(self) -> None:
        """Build everything and resume, writing nothing to the run dir; then commit to it.

        Under ``run()`` the run dir is locked first. Everything that can reject the run
        (a builder refusing a value, a checkpoint that does not fit) happens before
        ``commit``, so a bad input leaves an existing run dir untouched.
        """
        if self._is_set_up:
            return
        _ensure_logging()
        context = self.setup_training_context()
        if not context.dist.is_main:
            log.setLevel(logging.WARNING)  # one rank speaks for the job
        self.run_directory = open_run_directory(self.run_dir, context.dist, lock=self._running)
        refuse_to_start_over(self.cfg.checkpoint.resume, CheckpointStore(self.run_dir / "checkpoints"))
        self._build_objects(context)
        self._build_callbacks()
        self.batches = self.training_batches(self.train_loader)
        if self.callbacks.listens("before_optimizer_step"):
            self.runner.optimizer_step_hooks.append(
                lambda: self.callbacks.fire("before_optimizer_step", self, self.state.step + 1))
        checkpointer = self.setup_interruption(
            model=self.model, optimizer=self.optimizer, batches=self.batches, scheduler=self.scheduler,
            training_context=context, run_state=self.state, config=OmegaConf.to_container(self.cfg, resolve=True),
            resume=False)
        self.add_last_words(self.write_forced_summary)
        self.batches.interruptible = self._guarded_fetch  # a dead DataLoader worker is reported in the same waits
        self._is_set_up = True
        checkpointer.resume(self.cfg.checkpoint.resume, training=not self.cfg.preflight.only)  # the run state too: losses, a pending eval
        self.callbacks.load_state_dict(self.state.callbacks)
        checkpointer.mark_boundary()
        self.run_directory.commit(self.cfg)
        checkpointer.settle()
        self._report_model()
        log.info(
            "run dir %s | device %s | precision %s | %d trainable parameters",
            self.run_dir,
            context.device,
            context.precision,
            sum(p.numel() for p in self.model.parameters() if p.requires_grad),
        )

    def _build_callbacks(self) -> None:
        """The config's ``callbacks`` (each a ``_target_`` node) and the ones given in code;
        their state goes into every checkpoint through the run state."""
        built = []
        for index, node in enumerate(self.cfg.get("callbacks") or []):
            with config_rejections("callbacks", node):
                built.append(instantiate_node(node, f"callbacks[{index}]"))
        self.callbacks = CallbackList([*self._toolkit_callbacks(), *self._monitoring_callbacks(), *built, *self._given_callbacks])
        self.state.callback_state = self.callbacks.state_dict

    def _toolkit_callbacks(self) -> list[Any]:
        """The loop's own features that run on its events: first, so a user's callback
        sees the records they complete."""
        cfg, found = self.cfg, []
        if cfg.logging.dynamics_every_n_steps:
            found.append(DynamicsCallback())
        if cfg.trainer.compile:
            found.append(CompileWatchCallback())
        if cfg.preflight.oom_observer:
            found.append(OOMRecorderCallback())
        return found

    def _monitoring_callbacks(self) -> list[Any]:
        """checkpoint.monitor and trainer.early_stopping: the toolkit's own callbacks."""
        cfg, found = self.cfg, []
        if cfg.checkpoint.monitor:
            found.append(BestCheckpoint(cfg.checkpoint.monitor, cfg.checkpoint.mode))
        stopping = cfg.trainer.early_stopping
        if stopping.monitor:
            found.append(EarlyStopping(stopping.monitor, stopping.mode, stopping.patience, stopping.min_delta))
        return found

    def _report_model(self) -> None:
        """The model summary (parameters per top-level module, trainable vs frozen,
        bytes): in train.log and the run dir, before the preflight and training."""
        if not self.training_context.dist.is_main or any(p.is_meta for p in self.model.parameters()):
            return
        summary = summarize_model(unwrap(self.model))
        log.info("model %s:\n%s", summary.model_type, format_model_summary(summary))
        try:
            write_model_summary(summary, self.run_dir)
        except OSError as error:
            log.warning("model_summary.txt could not be written: %s", error)

    @contextlib.contextmanager
    def _guarded_fetch(self) -> Iterator[None]:
        """Around each training-data fetch: a stop signal or the data watchdog ends the
        wait, and a dead worker is reported there (where the weights are at a step boundary)."""
        with self.stop_control.fetching(), self.worker_deaths.fetching():
            yield

    def _build_objects(self, context: Any) -> None:
        """The builders, then the check that every command-line override of a builder's
        group was read (config/reads.py): both before the run dir is touched."""
        with recording_reads(self.cfg) as reads:
            self._call_builders(context)
        check_overrides_read(hydra_task_overrides(), reads, type(self))

    def _call_builders(self, context: Any) -> None:
        """The builders, each of whose rejection of a config value is a UserError
        naming the key (``config_rejections``)."""
        cfg = self.cfg
        # recording_loads: what the builder's load_state_dict calls dropped (O20, model.loaded_weights).
        with config_rejections("model", cfg.get("model")), recording_loads():
            model = build_for_verdict(self.build_model) if verdict_only(cfg) else self.build_model()
        check_built(model, nn.Module, "build_model")
        # The optimizer is built after the model is placed (moved, wrapped, sharded) so it
        # holds the tensors training updates (O2): FSDP2's are sharded DTensors.
        self.model, self.strategy = place_model(model, cfg.trainer, context)
        check_compile_config(cfg.trainer)
        with config_rejections("optimizer", cfg.get("optimizer")):
            self.optimizer = self.build_optimizer(model)
        check_built(self.optimizer, Optimizer, "build_optimizer")
        # The loaders before the scheduler: with trainer.max_epochs, the schedule's length
        # follows the training loader's.
        before_loaders = rng.capture()  # a dataset may draw from the generators: a rebuild draws the same
        self._build_loaders()
        self._split_batch(context, before_loaders)
        self.steps_per_epoch = optimizer_steps_per_epoch(self.train_loader, cfg.trainer.accumulation_steps)
        cfg.trainer.max_steps = planned_max_steps(cfg.trainer.max_steps, cfg.trainer.max_epochs, self.steps_per_epoch)
        with config_rejections("scheduler", cfg.get("scheduler")):
            self.scheduler = self.build_scheduler(self.optimizer)
        check_scheduler(self.scheduler)

    def _build_loaders(self) -> None:
        with config_rejections("data", self.cfg.get("data")):
            self.train_loader, self.val_loader = check_loaders(self.build_dataloaders())
            self.test_loader = check_test_loader(self.build_test_dataloader())

    def _split_batch(self, context: Any, before_loaders: dict[str, Any]) -> None:
        """``trainer.micro_batch_size``: micro-batches of that size (or auto's), accumulated
        to the batch per optimizer step the config asks; the loaders are rebuilt with it
        (evaluation keeps the configured size) from the generators' state of the first build,
        so they hold the same data. Before the run length and the scheduler, which count
        optimizer steps."""
        cfg = self.cfg
        ctx = PreflightContext(cfg=cfg, recipe=self, model=self.model, optimizer=self.optimizer, scheduler=None,
                               train_loader=self.train_loader, val_loader=self.val_loader,
                               compute_loss=self.compute_loss, training=context, run_dir=self.run_dir)
        plan = micro_batch_plan(ctx)
        if plan is None:
            return
        log.info("%s", plan.describe(cfg))
        unchanged = (plan.micro_batch, plan.accumulation_steps) == (cfg.data.batch_size, cfg.trainer.accumulation_steps)
        if unchanged and cfg.trainer.micro_batch_size != "auto":  # auto fetched a batch: start the loader afresh
            return
        if "eval_batch_size" in cfg.data and cfg.data.eval_batch_size is None:
            cfg.data.eval_batch_size = cfg.data.batch_size
        cfg.data.batch_size, cfg.trainer.accumulation_steps = plan.micro_batch, plan.accumulation_steps
        # The mixins hold their own copy of the trainer settings: the step's windows follow it.
        self.optimization_config.accumulation_steps = plan.accumulation_steps
        rng.restore(before_loaders)
        self._build_loaders()
        built = getattr(self.train_loader, "batch_size", None)
        if built is not None and built != plan.micro_batch:  # accumulating the wrong batches would change the step
            raise UserError(
                f"trainer.micro_batch_size={cfg.trainer.micro_batch_size} set data.batch_size={plan.micro_batch}, but "
                f"{type(self).__qualname__}.build_dataloaders() built a training loader of batch_size={built}",
                key="trainer.micro_batch_size",
                fix="Build the training loader with batch_size=self.cfg.data.batch_size, or set trainer.micro_batch_size=null.")

    def run(self) -> dict[str, Any]:
        """setup -> preflight -> train -> finalize; returns the summary. The run dir is
        locked for the whole call."""
        started = self.started_at = time.monotonic()
        status: str | None = "failed"
        self._running = True
        try:
            self.setup()
            if self.cfg.trainer.test_only:  # the resumed weights on the test loader, nothing else
                self.test()
            else:
                if self.cfg.preflight.enabled:
                    try:
                        report = self.preflight()
                    except StopRequested:  # e.g. Ctrl+C while the first batch will not come
                        self.exit_interrupted()
                    if report.failed:
                        status = "preflight_failed"
                        raise PreflightFailed(report)
                    if self.cfg.preflight.only:
                        status = None
                        return {"status": report.status, "preflight": report.to_dict()}
                if self.cfg.trainer.compile:  # after the preflight: its checks and estimate see the eager model
                    self.callbacks.find(CompileWatchCallback).start(len(compile_model(self.model, self.cfg.trainer, self.strategy)))
                self.train()
            status = "completed"
        except TrainingInterrupted as error:
            status = "interrupted"
            # After the checkpoint was written: a resumed run does not inherit the stop.
            self.state.stop_reason = self.state.stop_reason or error.reason
            self.callbacks.fire("on_exception", self, error)
            raise
        except KeyboardInterrupt:
            status = None  # a second Ctrl+C: leave at once, write nothing more
            raise
        except Exception as error:
            self.callbacks.fire("on_exception", self, error)
            raise
        finally:
            self.callbacks.close()
            if status is not None:
                summary = self.finalize(status, time.monotonic() - started)
            self.close()
        return summary

    def close(self) -> None:
        """Give back what setup took: the signal handlers and the run dir's lock.
        ``run()`` does this itself; call it after a bare ``setup()`` or ``preflight()``."""
        self._running = False
        self.close_interruption()
        if self.run_directory is not None:
            self.run_directory.close()

    def train(self) -> None:
        step_logger = self._open_step_logger()
        self.model.train()
        self.callbacks.fire("on_fit_start", self)
        try:
            with self.worker_deaths:
                self._train_loop(step_logger)
                self._test(step_logger)
        except WorkerDied as died:
            self._stop_after_worker_death(died)
        finally:
            step_logger.close()

    def test(self) -> dict[str, float]:
        """``trainer.test_only=true``: the test loader on the resumed weights, nothing else."""
        if self.test_loader is None:
            raise UserError(f"trainer.test_only=true, but {type(self).__qualname__}.build_test_dataloader() returns None",
                            key="trainer.test_only", fix="Return a DataLoader from build_test_dataloader(), or drop trainer.test_only.")
        if self.checkpointer.resumed_from is None:
            raise UserError("trainer.test_only=true, but there is no checkpoint to test: the model would be untrained",
                            key="checkpoint.resume",
                            fix="Point checkpoint.resume at a checkpoint (e.g. RUN_DIR/checkpoints/best), or run in a run dir that has one.")
        step_logger = self._open_step_logger()
        try:
            with self.worker_deaths:
                self._test(step_logger)
        except WorkerDied as died:
            self._stop_after_worker_death(died)
        finally:
            step_logger.close()
        return self.state.final_metrics

    @property
    def runner(self) -> StepRunner:
        """The component that runs this recipe's optimizer steps."""
        return self.step_runner(self.model, self.optimizer, self.compute_loss, self.training_context, self.scheduler)

    def train_step(self) -> StepResult | None:
        """One optimizer step on the recipe's objects (TrainingIterationMixin); None when a
        stop request abandoned it."""
        return self.run_training_iteration(self.model, self.optimizer, self.compute_loss, self.batches,
                                           self.training_context, self.scheduler)

    def _eval_due(self, step: int) -> bool:
        """Every trainer.eval_every_n_steps; 0: at the end of each epoch (of a loader with a
        length), as Lightning does. The loop adds the end of the run."""
        trainer = self.cfg.trainer
        if trainer.eval_every_n_steps:
            return step % trainer.eval_every_n_steps == 0
        return bool(self.steps_per_epoch) and step % self.steps_per_epoch == 0

    def _train_loop(self, step_logger: StepLogger) -> None:
        trainer = self.cfg.trainer
        checkpointer = self.checkpointer
        if self.state.eval_pending:
            self._evaluate(step_logger)
        while self.state.step < trainer.max_steps and self.state.stop_reason is None:
            if self.interruption_requested():
                self.exit_interrupted()
            if self.callbacks.listens("on_step_start"):
                self.callbacks.fire("on_step_start", self, self.state.step + 1)
            self.metrics.start_step()
            try:
                result = self.train_step()
            finally:
                self.metrics.end_step()
            if result is None:  # stopped mid-window: the gradients are dropped, the last boundary is saved
                self.exit_interrupted()
            self.state.record_step(result.stepped, result.samples)
            checkpointer.mark_boundary()
            done = self.state.step >= trainer.max_steps
            record = step_logger.on_step(self.state.step, result, self.state.skipped_steps, force=done,
                                         epoch=self.batches.position.epoch, user_metrics=self.metrics)
            if record is not None:
                self.state.final_loss = record["loss"]
            if self.callbacks.listens("on_step_end"):
                self.callbacks.fire("on_step_end", self, self.state.step, record)
            if not result.stepped:
                self.state.check_divergence(trainer.max_consecutive_skips, self.training_context.precision, result.loss.item())
            if done or self._eval_due(self.state.step):
                self.state.eval_pending = True
                self._evaluate(step_logger)
                if self.state.eval_pending:
                    self.exit_interrupted()
                checkpointer.mark_boundary()
            if checkpointer.due(self.state.step):
                self._saved(checkpointer.save())
        if self.state.stop_reason is not None:
            log.info("stopping at step %d: %s", self.state.step, self.state.stop_reason)
        self._saved(checkpointer.save())  # the final checkpoint

    def _saved(self, path: Path | None) -> None:
        if path is not None:
            self.callbacks.fire("on_checkpoint", self, path)

    def validation_metric_names(self, key: str) -> list[str] | None:
        """The ``val_*`` names an evaluation produces, from one validation batch with every
        RNG put back (the run stays bit-exact); None when the first batch has none. For a
        monitor (``key``) to check its name before the first step."""
        if getattr(self, "_validation_names", None) is None:
            if self.val_loader is None:
                raise UserError(f"{key} is set, but {type(self).__qualname__}.build_dataloaders() returns no validation loader",
                                key=key, fix=f"Return a validation DataLoader, or set {key}=null.")
            saved = rng.capture()
            try:
                metrics = self._run_evaluation(self.val_loader, max_batches=1)
            finally:
                rng.restore(saved)
            self._validation_names = sorted(prefixed(metrics, "val_")) if metrics else []
        return self._validation_names or None

    def keep_best(self, monitor: MetricMonitor) -> None:
        """A new best: this step's checkpoint (written now if it is not yet), linked as
        checkpoints/best."""
        path = self.checkpointer.save()
        self._saved(path)
        if path is not None and self.training_context.dist.is_main:
            best = self.checkpointer.store.keep_as_best(path)
            log.info("new best %s %.6g at step %d: %s", monitor.metric, monitor.best, self.state.step, best)

    def _test(self, step_logger: StepLogger) -> None:
        if self.test_loader is None:
            return
        metrics = self._run_evaluation(self.test_loader, max_batches=None)
        if metrics is None:  # a stop during the test: the final checkpoint is on disk
            self.exit_interrupted()
        metrics = prefixed(metrics, "test_")
        self.state.final_metrics.update(metrics)
        step_logger.on_eval(self.state.step, metrics, epoch=self._epoch())
        self.callbacks.fire("on_eval_end", self, self.state.step, metrics)

    def _run_evaluation(self, loader: DataLoader, max_batches: int | None) -> dict[str, float] | None:
        """None when a stop ended it: a stop signal, or the data watchdog (its waits for
        batches are watched like training's, ``watched_batches``)."""
        dist = self.training_context.dist
        try:
            with self.worker_deaths.fetching():  # evaluation leaves the weights as they are
                return evaluate_metrics(
                    self.model,
                    self.watched_batches(loader),
                    self.validation_step,
                    self.training_context.plan,
                    self.metrics,
                    max_batches=max_batches,
                    should_stop=self.stop_requested,
                    reduce_sum=all_reduce_sum if dist.is_distributed else None,
                    union=union_of_names if dist.is_distributed else None,
                )
        except StopRequested:
            return None

    def _stop_after_worker_death(self, died: WorkerDied) -> NoReturn:
        """A worker death surfaces only in a data fetch (WorkerDeathGuard), where the
        weights are those of the last completed step: save them, then stop."""
        self.optimizer.zero_grad(set_to_none=True)
        path = self.checkpointer.save()
        knobs = ("data.num_workers, data.prefetch_factor or data.batch_size" if "build_dataloaders" in self.default_builders_used
                 else "the DataLoader options in your build_dataloaders()")
        raise WorkerDied(
            f"{died.message}; stopped at step {self.state.step} with checkpoint {path}",
            key="data.num_workers",
            fix=f"{died.fix.rstrip('.')} ({knobs}). Then resume with: {resume_command(self.run_dir)}",
        ) from None

    def _evaluate(self, step_logger: StepLogger) -> None:
        if self.val_loader is None:
            self.state.eval_pending = False
            return
        metrics = self._run_evaluation(self.val_loader, self.cfg.trainer.eval_max_batches)
        if metrics is not None or not self.stop_requested():
            self.state.eval_pending = False
        if metrics is None:
            return
        if not metrics:
            log.warning("the validation loader produced no batches at step %d: no val_loss (check the split and "
                        "data.eval_batch_size / drop_last)", self.state.step)
            return
        metrics = prefixed(metrics, "val_")
        self.state.final_metrics.update(metrics)
        if "val_loss" in metrics:
            self.state.final_val_loss = metrics["val_loss"]
        step_logger.on_eval(self.state.step, metrics, epoch=self._epoch())
        self.callbacks.fire("on_eval_end", self, self.state.step, metrics)

    def _open_step_logger(self) -> StepLogger:
        logging_cfg = self.cfg.logging
        context = self.training_context
        sinks: list[Any] = []
        if context.dist.is_main:
            # Training continues after this step: what an earlier attempt logged past it is superseded.
            after = self.state.step
            sinks.append(JsonlSink(self.run_dir / "metrics.jsonl", logging_cfg.flush_every_s, after_step=after))
            if logging_cfg.tensorboard and (sink := make_tensorboard_sink(self.run_dir / "tensorboard", after_step=after)):
                sinks.append(sink)
            self.trackers.open(self.cfg, self.run_dir, experiment=type(self).__name__, after_step=after,
                               ids=self.state.logger_ids)
            sinks += self.trackers.for_step_logger()
        self.metric_sinks = sinks
        progress_mode = logging_cfg.progress if context.dist.is_main else "none"
        metrics = MetricsLogger(sinks)
        self.add_last_words(lambda status: metrics.flush())  # a second Ctrl+C keeps what was logged
        self.checkpointer.before_save.append(metrics.sync)  # records up to a checkpoint are as durable as it
        return StepLogger(
            metrics,
            Progress(progress_mode, self.cfg.trainer.max_steps, self.state.step),
            every_n_steps=logging_cfg.every_n_steps,
            device=context.device,
            scaler=context.scaler,
            group_names=group_names(self.optimizer),
            world_size=context.dist.world_size,
            reduce_sum=all_reduce_sum if context.dist.is_distributed else None,
            union_names=union_of_names if context.dist.is_distributed else None,
            wants_record=lambda step: self.callbacks.any_wants_step_logged(self, step),
            extend_record=lambda step, result, record: self.callbacks.fire("on_step_record", self, step, result, record),
        )

    def build_summary(self, status: str, wall_time_s: float, *, hash_params: bool = True) -> dict[str, Any]:
        """The summary.json payload. ``hash_params=False`` where the weights may be
        mid-update (a forced quit from another thread): the hash is then null."""
        model = getattr(self, "model", None)
        context = getattr(self, "training_context", None)
        # Gathering FSDP shards is a collective: after a failure, or this rank's data stall
        # (its peers have already exited), a peer may never join it.
        stop_control = getattr(self, "stop_control", None)
        peers_may_be_gone = status == "failed" or (stop_control is not None and stop_control.stall is not None)
        hash_params = hash_params and not (peers_may_be_gone and self.strategy == "fsdp")
        hash_params = hash_params and model is not None and not any(p.is_meta for p in model.parameters())
        return {
            "status": status,
            "steps": self.state.step,
            "final_loss": self.state.final_loss,
            "final_val_loss": self.state.final_val_loss,
            "wall_time_s": round(wall_time_s, 3),
            "peak_memory_bytes": peak_memory_bytes(context.device) if context else None,
            "memory": memory_peaks(context.device) if context else None,
            "resumed_from": str(self.checkpointer.resumed_from) if self.checkpointer and self.checkpointer.resumed_from else None,
            "params_sha256": params_sha256(unwrap(model)) if model is not None and hash_params else None,
            "skipped_steps": self.state.skipped_steps,
            "epoch": self._epoch(),
            "metrics": dict(self.state.final_metrics),
            "test": {k: v for k, v in self.state.final_metrics.items() if k.startswith("test_")} or None,
            "stop_reason": self.state.stop_reason,
            "best_checkpoint": self._best_summary(),
            **(watch.summary() if (watch := self.callbacks.find(CompileWatchCallback)) is not None else {}),
        }

    def _epoch(self) -> int | None:
        batches = getattr(self, "batches", None)
        return batches.position.epoch if batches is not None else None

    def _best_summary(self) -> dict[str, Any] | None:
        best = self.callbacks.find(BestCheckpoint)
        path = self.run_dir / "checkpoints" / "best"
        if best is None or best.monitor.best is None or not path.is_dir():  # e.g. test_only on another run's checkpoint
            return None
        return {"path": str(path), "metric": best.monitor.metric, "value": best.monitor.best, "step": best.monitor.best_step}

    def write_forced_summary(self, status: str) -> bool:
        """summary.json from a forced exit's thread: the weights may be mid-update, so
        they are not hashed."""
        stop = getattr(self, "stop_control", None)
        if stop is not None and stop.peer_stall is not None:
            self.state.stop_reason = self.state.stop_reason or stop.peer_stall
        return self.write_summary(self.build_summary(status, time.monotonic() - self.started_at, hash_params=False))

    def preflight_checks(self) -> list[Check]:
        """The checks ``preflight()`` runs: override to add or drop checks."""
        return default_checks(self.cfg)

    def preflight(self) -> PreflightReport:
        """Set up (if not yet), then run the preflight checks on this recipe's objects."""
        self.setup()
        return self.run_preflight_checks(self.preflight_context(), self.preflight_checks())

    def preflight_context(self) -> PreflightContext:
        """What the preflight checks look at: this recipe's objects."""
        return PreflightContext.from_recipe(self)

    def write_summary(self, summary: dict[str, Any]) -> bool:
        """Write summary.json from the main rank; False when nothing was written: the
        run failed before its directory existed, or before it was known to be valid in
        a directory that holds an earlier run, or the disk refused the file."""
        context = getattr(self, "training_context", None)
        if context is not None and not context.dist.is_main:
            return False
        directory = self.run_directory
        if directory is None or not directory.may_write:
            return False
        directory.commit(self.cfg)  # a new dir keeps the failed run's config and log
        try:
            write_json_atomic(self.run_dir / "summary.json", summary)
        except OSError as error:
            log.error("summary.json could not be written: %s", error)
            return False
        return True

    def finalize(self, status: str, wall_time_s: float) -> dict[str, Any]:
        summary = self.build_summary(status, wall_time_s)
        if status == "completed":
            self.callbacks.fire("on_fit_end", self, summary)
        self.trackers.finish(summary, status)
        if self.write_summary(summary):
            log.info(
                "%s after %d steps | final loss %s | val loss %s | %.1f s",
                status,
                self.state.step,
                _fmt(self.state.final_loss),
                _fmt(self.state.final_val_loss),
                wall_time_s,
            )
        return summary


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
