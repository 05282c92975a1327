"""Typed schemas, one dataclass per concern; every default lives here.

Each dataclass is registered in Hydra's ConfigStore (see ``store.py``) as the schema of
its YAML group, so a misspelled key or a wrong type fails at composition time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

# Bounds every number must respect even where the meaning sets none: values end up in
# int64 tensors, C calls and time arithmetic, which fail far from the config key.
INT_MAX = 2**63 - 1
FLOAT_MAX = 1e300  # finite: inf and nan are never a setting
# Waits: well inside threading.TIMEOUT_MAX (~9.2e9 s) and datetime's range; ~3 years.
SECONDS_MAX = 1e8
# torch takes seeds below 2**64; the loaders add the epoch and rank to it.
SEED_MAX = 2**63 - 1 - 2**32
RANGE = "range"  # the key of a field's range in dataclasses.field(metadata=...)


@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts: lo..hi, each end closed unless marked open.
    null is governed by the field's Optional type, not here. ``example``: a good value
    for the fix (defaults to the field's default); ``hint``: what that value means."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    example: Any = None
    hint: str = ""

    def __contains__(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below


def ranged(default: Any, lo: float, hi: float = INT_MAX, *, lo_open: bool = False, hi_open: bool = False,
           example: Any = None, hint: str = "") -> Any:
    """A schema field with its range: ``x: int = ranged(1, 1)`` is ``x: int = 1`` that must be >= 1."""
    return field(default=default, metadata={RANGE: Range(lo, hi, lo_open, hi_open, example, hint)})


PRECISIONS = ("fp32", "bf16", "fp16", "auto")
MONITOR_MODES = ("min", "max")
DEVICES = ("auto", "cpu", "cuda")
FAIL_ON = ("error", "warning", "never")
PROGRESS_MODES = ("auto", "bar", "lines", "none")
STRATEGIES = ("ddp", "fsdp", "auto")
# Signals a Python handler can catch and that nothing else needs: not SIGKILL/SIGSTOP (the
# kernel refuses a handler), not the faults (SIGSEGV...), not SIGINT/SIGTERM (always handled).
EXTRA_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGXCPU", "SIGPWR")


@dataclass
class RecipeConfig:
    # Import path of the TrainRecipe subclass to run.
    _target_: str = "optimus_preflight.recipes.char_lm.CharLMRecipe"


@dataclass
class GradScalerConfig:
    # torch.amp.GradScaler settings; used only when the resolved precision is fp16.
    init_scale: float = ranged(2.0**16, 0, FLOAT_MAX, lo_open=True, hint=" (torch's default)")
    growth_factor: float = ranged(2.0, 1, FLOAT_MAX, lo_open=True, hint=" (torch's default)")
    backoff_factor: float = ranged(0.5, 0, 1, lo_open=True, hi_open=True, hint=" (torch's default)")
    growth_interval: int = ranged(2000, 1, hint=" (torch's default)")


@dataclass
class FSDPConfig:
    # Class names of the modules each sharded on its own (one all-gather per block);
    # empty: the children of the largest list of identical modules (e.g. `layers`, `h`).
    block_classes: list[str] = field(default_factory=list)
    # Free each block's gathered parameters after its forward (re-gathered for backward):
    # the memory of one block instead of the whole model, at one more all-gather.
    reshard_after_forward: bool = True
    # Keep the sharded parameters, gradients and optimizer state in host memory.
    cpu_offload: bool = False


@dataclass
class EarlyStoppingConfig:
    # A metric of the evaluation records (val_loss, or val_<name> a recipe logs); null: off.
    monitor: Optional[str] = None
    # min: lower is better (a loss); max: higher is better (an accuracy).
    mode: str = "min"
    # Evaluations in a row without an improvement of more than min_delta before the run stops.
    patience: int = ranged(3, 1, hint=" (evaluations without improvement before stopping)")
    min_delta: float = ranged(0.0, 0, FLOAT_MAX)


@dataclass
class TrainerConfig:
    # Optimizer steps to run; null: as many as trainer.max_epochs takes. Either limit ends the run.
    max_steps: Optional[int] = ranged(None, 1, example=500, hint=" (optimizer steps)")
    # Passes over the training loader; null: no epoch limit (trainer.max_steps ends the run).
    max_epochs: Optional[int] = ranged(None, 1, example=10, hint=" (passes over the training data)")
    accumulation_steps: int = ranged(1, 1, hint=" (no accumulation)")
    # Samples per forward pass (per rank). The batch of one optimizer step stays what
    # data.batch_size x accumulation_steps asks; the loader yields micro-batches of this
    # size and accumulation becomes that batch / micro_batch_size (a divisor of it).
    # null: data.batch_size as it is; auto: the largest divisor the memory estimate fits.
    micro_batch_size: Any = None
    # auto: bf16 where the device runs it natively (a CUDA GPU with bf16), else fp32.
    precision: str = "auto"
    device: str = "auto"
    seed: int = ranged(0, 0, SEED_MAX)
    # Clip the total gradient norm to this value; null logs the norm without clipping.
    clip_grad_norm: Optional[float] = ranged(None, 0, FLOAT_MAX, lo_open=True, example=1.0, hint=", or null to log the norm without clipping")
    # Evaluate every N optimizer steps; 0: at the end of every epoch and of the run only.
    eval_every_n_steps: int = ranged(0, 0, hint=" (evaluate at the end of each epoch and of the run)")
    # Validation batches per evaluation; null evaluates the whole validation loader.
    eval_max_batches: Optional[int] = ranged(None, 1, example="null", hint=" (the whole validation set)")
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    # Only run the recipe's test loader on the weights of checkpoint.resume, then exit.
    test_only: bool = False
    skip_nonfinite: bool = True
    max_consecutive_skips: int = ranged(20, 1, hint=" (steps with non-finite gradients in a row before the run stops)")
    # Opt-in because deterministic kernels are slower and some ops have none.
    deterministic: bool = False
    # DDP: needed when some parameters get no gradient in a step; costs a graph walk per step.
    ddp_find_unused_parameters: bool = False
    # torchrun: seconds a rank waits for its peers in any collective before it exits (2)
    # naming the ranks that did not answer. Must cover the slowest step and checkpoint save.
    dist_timeout_s: float = ranged(600.0, 0, SECONDS_MAX, lo_open=True, hint=" (longer than the slowest step or checkpoint save)")
    # Under torchrun: ddp replicates the model on every rank; fsdp shards parameters,
    # gradients and optimizer state (FSDP2); auto picks fsdp when the step does not fit one device.
    strategy: str = "ddp"
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    # Recompute each block's activations in backward instead of keeping them.
    activation_checkpointing: bool = False
    # torch.compile the model (each block under FSDP) after the preflight; checkpoints keep
    # the eager names. The first step pays the compile (compile_warmup_s in summary.json).
    compile: bool = False
    # null: torch's default mode; or reduce-overhead, max-autotune, max-autotune-no-cudagraphs.
    compile_mode: Optional[str] = None
    compile_backend: str = "inductor"
    # null: torch decides (recompiles once with dynamic shapes when a shape changes); true:
    # dynamic from the start (varying sequence lengths); false: one graph per shape.
    compile_dynamic: Optional[bool] = None
    grad_scaler: GradScalerConfig = field(default_factory=GradScalerConfig)


@dataclass
class DataConfig:
    batch_size: int = ranged(32, 1, hint=" (the micro-batch size per step)")
    num_workers: int = ranged(0, 0, 1024, hint=" (load data in the main process)")
    pin_memory: bool = False
    # Batches prefetched per worker; null keeps torch's default (2) when workers > 0.
    prefetch_factor: Optional[int] = ranged(None, 1, 1024, example="null", hint=" (torch's default of 2)")
    persistent_workers: bool = False
    drop_last: bool = False
    shuffle: bool = True
    # Defaults to batch_size.
    eval_batch_size: Optional[int] = ranged(None, 1, example="null", hint=" (use data.batch_size)")
    # The data watchdog: no training batch within this many seconds stops the run at the
    # last step boundary with a checkpoint, naming the frame the data code blocks in
    # (exit 2). null: no watchdog (a hung worker then hangs the run).
    fetch_timeout_s: Optional[float] = ranged(600.0, 0, SECONDS_MAX, lo_open=True, example=600,
                                              hint=" (10 minutes), or null for no watchdog")
    # Dataset nodes instantiated through Hydra (`_target_` plus arguments).
    train: Any = None
    val: Any = None


@dataclass
class AdamWConfig:
    _target_: str = "torch.optim.AdamW"
    lr: float = ranged(1e-3, 0, FLOAT_MAX, lo_open=True)
    betas: tuple[float, float] = ranged((0.9, 0.999), 0, 1, hi_open=True, example="[0.9,0.999]")
    eps: float = ranged(1e-8, 0, FLOAT_MAX)
    weight_decay: float = ranged(0.01, 0, FLOAT_MAX, hint=" (or 0 for none)")
    # Biases and normalisation weights have no capacity to overfit; decaying them hurts (O6).
    decay_bias_and_norm: bool = False


@dataclass
class SGDConfig:
    _target_: str = "torch.optim.SGD"
    lr: float = ranged(0.1, 0, FLOAT_MAX, lo_open=True)
    momentum: float = ranged(0.9, 0, 1)
    nesterov: bool = False
    weight_decay: float = ranged(0.0, 0, FLOAT_MAX)
    decay_bias_and_norm: bool = False


@dataclass
class WarmupCosineConfig:
    _target_: str = "optimus_preflight.training.optim.warmup_cosine"
    # Linear warmup steps; a run shorter than its warmup is clamped with a warning.
    warmup_steps: int = ranged(0, 0, hint=" (no warmup)")
    # Warmup as a fraction of the schedule's length (e.g. 0.05); overrides warmup_steps when set.
    warmup_fraction: Optional[float] = ranged(None, 0, 1, hi_open=True, example=0.05, hint=" (5% of the run), or null")
    # LR at the end of the schedule, as a fraction of the peak LR.
    min_lr_ratio: float = ranged(0.1, 0, 1, hint=" (the final LR as a fraction of the peak)")
    # Length of the schedule in optimizer steps; null follows trainer.max_steps.
    total_steps: Optional[int] = ranged(None, 1, example="null", hint=" (follow trainer.max_steps)")


@dataclass
class ConstantLRConfig:
    _target_: str = "optimus_preflight.training.optim.constant"
    warmup_steps: int = ranged(0, 0, hint=" (no warmup)")


@dataclass
class MLflowConfig:
    enabled: bool = False
    # null: a local file store, mlruns/ in the working directory; or a server's URI.
    tracking_uri: Optional[str] = None
    # null: the recipe class's name. A sweep's jobs share the experiment.
    experiment_name: Optional[str] = None


@dataclass
class WandbConfig:
    enabled: bool = False
    # null: the recipe class's name.
    project: Optional[str] = None
    entity: Optional[str] = None
    # online|offline|disabled; null: the WANDB_MODE environment variable, else online.
    mode: Optional[str] = None


@dataclass
class LoggingConfig:
    every_n_steps: int = ranged(10, 1)
    # metrics.csv beside metrics.jsonl: one row per record, a column per metric.
    csv: bool = False
    mlflow: MLflowConfig = field(default_factory=MLflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    tensorboard: bool = False
    # auto: a tqdm bar on a terminal, plain log lines otherwise (CI, SLURM logs).
    progress: str = "auto"
    # Seconds between flushes of metrics.jsonl; flushing every record costs time per step.
    flush_every_s: float = ranged(5.0, 0, SECONDS_MAX)
    # Training-dynamics metrics (update/weight ratio, dead activations, scale, skip rate;
    # histograms when tensorboard=true) and their warnings, every N steps; 0 disables.
    # Not every step: they snapshot the weights and read tensors back from the device.
    dynamics_every_n_steps: int = ranged(50, 0, hint=", or 0 to turn the dynamics metrics and warnings off")


@dataclass
class MemoryPreflightConfig:
    # Check the step against a GPU of this many GiB instead of the local device.
    target_gib: Optional[float] = ranged(None, 0, FLOAT_MAX, lo_open=True, example=80, hint=" for an 80 GiB GPU, or null to check the local device")
    # Usable share of a GPU's total memory, and what to leave free for other processes.
    usable_fraction: float = ranged(0.95, 0, 1, lo_open=True)
    reserve_gib: float = ranged(0.5, 0, FLOAT_MAX)
    # Ranks the model is sharded over (FSDP2): the check is then per rank of this many.
    # null: the run's own world size under trainer.strategy=fsdp, else one unsharded device.
    world_size: Optional[int] = ranged(None, 1, example=8, hint=" to check one rank of 8 sharding the model (FSDP), or null")


@dataclass
class PreflightConfig:
    enabled: bool = True
    only: bool = False
    fail_on: str = "error"
    # Check names or issue codes to skip.
    disable: list[str] = field(default_factory=list)
    first_batch_timeout_s: float = ranged(300.0, 0, SECONDS_MAX, lo_open=True)
    # Steps of the overfit-one-batch smoke test; 0 disables it.
    overfit_steps: int = ranged(0, 0, hint=" to skip the overfit smoke test")
    oom_observer: bool = False
    # LR range test (O7) on copies of the model and optimizer: suggests optimizer.lr and
    # writes lr_finder.json/.png. Off by default: it costs ~100 extra training steps.
    lr_finder: bool = False
    # Console: a line for every check (passed and skipped ones too); by default only the
    # issues, a count of the passed checks and the memory table. preflight.json has all.
    verbose: bool = False
    memory: MemoryPreflightConfig = field(default_factory=MemoryPreflightConfig)


@dataclass
class CheckpointConfig:
    # 0 disables periodic saves; a final checkpoint is still written at the end.
    every_n_steps: int = ranged(200, 0, hint=", or 0 to save only at the end")
    keep_last: int = ranged(3, 1)
    # auto: newest valid checkpoint in the run dir; none: start fresh; or a path.
    resume: str = "auto"
    # Besides SIGINT and SIGTERM; SLURM sends SIGUSR1 ahead of its time limit.
    extra_signal: Optional[str] = "SIGUSR1"
    # torchrun: once a rank has a stop request, seconds it waits for the others to reach
    # the step boundary (a healthy peer needs about one step) before rank 0 saves alone.
    stop_timeout_s: float = ranged(60.0, 0, SECONDS_MAX, lo_open=True, hint=" (longer than one training step)")
    # Copy periodic checkpoints to host memory and write them on a background thread (not under FSDP).
    async_save: bool = False
    # Keep the best checkpoint by this evaluation metric as checkpoints/best (never pruned); null: off.
    monitor: Optional[str] = None
    # min: lower is better (val_loss); max: higher is better (val_acc).
    mode: str = "min"
    # A resume whose config changes what is trained (batch size, accumulation, precision,
    # seed, model, data): true warns listing old -> new; false refuses it (exit 2).
    allow_config_change: bool = True


@dataclass
class SweepConfig:
    # In a multirun (-m), stop at the first failed job instead of running the rest.
    fail_fast: bool = False


@dataclass
class Config:
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    model: Any = MISSING
    data: Any = MISSING
    optimizer: Any = MISSING
    scheduler: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    # Callbacks at the training loop's events: [{_target_: my_module.MyCallback, ...}]
    # (optimus_preflight.callbacks.Callback).
    callbacks: list[Any] = field(default_factory=list)
