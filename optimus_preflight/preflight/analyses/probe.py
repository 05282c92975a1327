"""One real optimizer step on the first batch, observed, then undone.

The step is the project's ``StepRunner`` on the real model, optimizer, scheduler,
GradScaler and precision plan, so autocast, accumulation weighting, clipping and
the scaler are exactly what training runs. Around it:
- a ``LossSpy`` inside ``compute_loss`` records what reaches the criterion;
- a wrapper records what ``compute_loss`` returned (scalar? finite? attached?);
- post-accumulate-grad hooks record which trainable parameters got a gradient;
- forward pre-hooks on the model and on its dropout/BatchNorm layers record the
  train/eval mode each really ran in (forwards that build a graph: a no-grad teacher
  pass in eval mode is deliberate), and the modes are read again after the step, for
  a ``compute_loss`` that switches to eval after its forward and so leaves every
  later step in eval (the training loop calls ``model.train()`` once).
Modules already in eval right after ``model.train()`` are ``ModesCheck``'s (an
overridden ``train()``), and BatchNorm of a frozen part is O18's: neither counts here.
Everything is restored afterwards (``preserved_training_state``).
Several checks read the result, so it is computed once per context.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from optimus_preflight.memory.user_state import raised_by_fake_tensor
from optimus_preflight.preflight.analyses.api_pitfalls import Pitfalls
from optimus_preflight.preflight.analyses.argmaxed_labels import ArgmaxedMultiHot, argmaxed_multi_hot
from optimus_preflight.preflight.analyses.autograd_calls import watched_autograd_grad
from optimus_preflight.preflight.analyses.batch_layout import LayoutWatch, ModuleInput
from optimus_preflight.preflight.analyses.channel_axis import ChannelReduction, ClassesMisread
from optimus_preflight.preflight.analyses.criterion_args import CriterionArgs
from optimus_preflight.preflight.analyses.custom_functions import FunctionCall, recorded_functions
from optimus_preflight.preflight.analyses.diffusion_inputs import DiffusionInputs, diffusion_inputs
from optimus_preflight.preflight.analyses.flatten_order import FlattenMismatch, flattened_from
from optimus_preflight.preflight.analyses.gradient_reversal import Reversal, find_reversals
from optimus_preflight.preflight.analyses.graph_cuts import GraphCut, task_cut_by_detach, task_cut_by_pick
from optimus_preflight.preflight.analyses.graph_propagation import Propagation
from optimus_preflight.preflight.analyses.init_state import untrained
from optimus_preflight.preflight.analyses.loss_spy import ColumnBroadcast, CriterionCall, LossSpy, SlicedPair
from optimus_preflight.preflight.analyses.loss_terms import MixedReductions, mixed_reductions
from optimus_preflight.preflight.analyses.padding import sequence_shapes
from optimus_preflight.preflight.analyses.pair_mask import PairMask
from optimus_preflight.preflight.analyses.per_sample_broadcast import PerSampleBroadcast
from optimus_preflight.preflight.analyses.pseudo_labels import labels_are_initial_guesses
from optimus_preflight.preflight.analyses.range_watch import RangeMismatch
from optimus_preflight.preflight.analyses.spectral_axis import FftOverChannels
from optimus_preflight.preflight.analyses.target_columns import ColumnScales, target_column_scales
from optimus_preflight.preflight.analyses.update_audit import GroupStep, UpdateRecorder
from optimus_preflight.preflight.analyses.view_permute import ViewAsPermute
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import batch_size_of, leaves, storages
from optimus_preflight.training.learnable import loss_modules, walk_loss_graph
from optimus_preflight.training.step import runner_from_config

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

@dataclass
class LossReturn:
    kind: str  # type of what compute_loss returned (the loss part)
    shape: tuple[int, ...] | None = None
    finite: bool = True
    requires_grad: bool = False
    value: float | None = None
    leaf: bool = False  # a tensor with no grad_fn: torch.tensor(value, requires_grad=True), no graph at all


@dataclass
class StepProbe:
    loss: LossReturn | None = None
    error: str | None = None
    error_frame: str | None = None
    error_traceback: str | None = None  # the whole of it, for preflight.json (the console has one line)
    # The error came from a fake tensor that outlived the memory estimate's trace: the
    # preflight's bug, not the user's code (step.first_step crashes with its traceback).
    preflight_fault: bool = False
    stepped: bool = False
    grad_norm: float | None = None
    step_s: float = 0.0
    params_without_grad: list[str] = field(default_factory=list)
    params_nonfinite_grad: list[str] = field(default_factory=list)
    trainable_params: int = 0
    forward_calls: int = 0
    forward_in_eval: bool = False  # the model's own forward, building a graph, in eval mode
    modules_in_eval: list[str] = field(default_factory=list)  # dropout/BatchNorm that ran in eval
    modules_left_in_eval: list[str] = field(default_factory=list)  # in train before the step, eval after
    criterion_calls: list[CriterionCall] = field(default_factory=list)
    activations: dict[str, int] = field(default_factory=dict)
    column_broadcasts: list[ColumnBroadcast] = field(default_factory=list)
    batch_normalize: tuple[tuple[int, ...], int] | None = None  # F.normalize over the batch: (shape, dim)
    batch_softmax: tuple[str, tuple[int, ...]] | None = None  # softmax over the samples: (function, shape)
    sliced_pair: SlicedPair | None = None  # a paired criterion's inputs cut from the same rows
    loss_side_effects: list[str] = field(default_factory=list)  # "lr", "weights": changed inside compute_loss
    zero_one_sign_target: str | None = None  # a +1/-1 criterion (cosine_embedding_loss, ...) given 0/1 targets
    attention_over_heads: tuple[tuple[int, ...], int] | None = None  # (SDPA query shape, sequence length)
    # (largest share of x_t's variance from the noise, samples): a diffusion loss's forward process
    diffusion_noise: tuple[float, int] | None = None
    diffusion_inputs: DiffusionInputs | None = None  # x_t against the drawn noise and the clean batch tensor
    # (criterion, shape, whether the input was computed in the loss): trained towards its own input
    target_is_input: tuple[str, tuple[int, ...], bool] | None = None
    target_fed_beside: tuple[str, tuple[int, ...], int] | None = None  # a later model input that is the target
    channel_reduction: ChannelReduction | None = None  # a conv map reduced over channels + one spatial axis
    classes_misread: ClassesMisread | None = None  # class scores read from a conv map along the wrong axes
    view_as_permute: ViewAsPermute | None = None  # a view/reshape to the same sizes in another order
    flatten_mismatch: FlattenMismatch | None = None  # predictions and targets flattened in different orders
    scaler_enabled: bool = False
    layout_inputs: list[ModuleInput] = field(default_factory=list)  # batch_first modules (batch_layout)
    updates: list[GroupStep] = field(default_factory=list)  # per parameter group, around optimizer.step()
    symmetric_weights: list[str] = field(default_factory=list)  # units identical, gradients too
    # Learnable leaves the loss reached outside the model and the optimizer
    # (trained_tensors.FreshTensorsCheck asks whether each forward makes them anew).
    outside_leaves: list[torch.Tensor] = field(default_factory=list)
    # The model's forward built a graph, and the loss's graph never reaches its output: the
    # data term became a number (.item()) and only another term (a weight penalty) trains.
    loss_ignores_output: bool = False
    zero_gradient_ops: list[str] = field(default_factory=list)  # torch.round, floor, sign in the loss's graph
    graph_cuts: list[GraphCut] = field(default_factory=list)  # .detach()/.numpy() on tensors with a graph
    # (criterion, argmin/argmax, parameters): parameters the task term cannot reach past a pick
    task_cut: tuple[str, str, list[str]] | None = None
    # (criterion, ".detach()", parameters, the criterion that trains them): the task's branch detached
    task_cut_by_detach: tuple[str, str, list[str], str] | None = None
    propagation_without_self: Propagation | None = None  # A @ H over an adjacency with a zero diagonal, no root term
    messages_to_source: tuple[int, int] | None = None  # (nodes, edges): h[src] scattered back into src
    complete_adjacency: int | None = None  # nodes of a fixed propagation matrix without a zero entry
    zero_factors: int = 0  # multiplications by a constant 0 in the loss's graph (a loss weight of 0.0)
    clamp_ops: list[str] = field(default_factory=list)  # torch.clamp and kin in the loss's graph
    # (shape, dim) of softmaxes over a dimension of size 1 in the loss's graph: constants, gradient 0
    singleton_softmax: list[tuple[tuple[int, ...], int]] = field(default_factory=list)
    log_of_probability: list[str] = field(default_factory=list)  # torch.log straight of a sigmoid / softmax
    mixed_reductions: MixedReductions | None = None  # a per-element mean added to a term summed over the batch
    params_zero_grad: list[str] = field(default_factory=list)  # got a gradient of exactly 0 everywhere
    hooked_params: list[str] = field(default_factory=list)  # with a gradient hook of the user's (register_hook)
    loss_reseeds: list[str] = field(default_factory=list)  # seeding calls made inside compute_loss
    derivative_calls: list[bool] = field(default_factory=list)  # create_graph of each autograd.grad in compute_loss
    derivative_zero: list[bool] = field(default_factory=list)  # ... whether all it returned was exactly zero
    derivative_fields: list[bool] = field(default_factory=list)  # ... whether it differentiated a per-point field
    whole_gradients: list[tuple[int, ...]] = field(default_factory=list)  # a multi-column gradient differentiated whole
    loss_gradient_share: tuple[float, float] | None = None  # see _gradient_share
    loss_constant_factor: float | None = None  # see constant_factor: the returned loss = this x what it scales
    pitfalls: Pitfalls = field(default_factory=Pitfalls)  # torch calls whose defaults mislead (api_pitfalls)
    target_column_reused: tuple[list[str], int, int, int] | None = None  # see target_column_reused
    argmaxed_multi_hot: ArgmaxedMultiHot | None = None  # class ids argmaxed from multi-hot labels
    batch_rows: int | None = None  # the rows of the batch compute_loss got
    normalised_shapes: set[tuple[int, ...]] = field(default_factory=set)  # shapes given softmax / log_softmax
    range_mismatch: RangeMismatch | None = None  # a layer fed data outside a tanh / sigmoid output's range
    # (criterion, blocks, rows, the shape the model's input was flattened from): a paired criterion given
    # row blocks of a forward over (B, k, ...) samples flattened sample-major, so each block mixes roles
    pairs_interleaved: tuple[str, int, int, tuple[int, ...]] | None = None
    # (criterion, views per sample, the shape the model's input was flattened from): class targets tiled
    # with .repeat(k) beside a forward over each sample's k views kept together
    labels_tiled: tuple[str, int, tuple[int, ...]] | None = None
    # (op, rows, k): batch targets tiled with .repeat(k) against a model output flattened from (rows, k)
    targets_tiled_against_rows: tuple[str, int, int] | None = None
    sampling_ops: list[str] = field(default_factory=list)  # torch.normal(mu, std) in the loss's graph: no gradient
    # a class criterion whose batch targets are the untrained model's own argmax (pseudo-labels made at init)
    labels_from_initial_guesses: CriterionCall | None = None
    boxes_beyond_image: BoxesBeyondImage | None = None  # see boxes_beyond_image
    target_column_scales: ColumnScales | None = None  # see analyses.target_columns
    step_warnings: list[str] = field(default_factory=list)  # what torch warned during the step
    # A class target flattened from a (T, B) batch tensor while the model read (B, ...) inputs:
    # (criterion, the tensor's shape, the model input's shape).
    time_major_target: tuple[str, tuple[int, ...], tuple[int, ...]] | None = None
    # Names of the modules owning trainable parameters whose forward ran during the step: a
    # parameter without a gradient in one of them had its output dropped on the way to the loss.
    modules_run: set[str] = field(default_factory=set)
    modules_run_without_grad: set[str] = field(default_factory=set)  # ran while torch.is_grad_enabled() was False
    # Modules with forward hooks of the user's whose output, after those hooks, is cut from the graph
    # although their input was attached (a hook returning a stored detached copy replaces the output).
    hooks_detaching: list[str] = field(default_factory=list)
    criterion_args: CriterionArgs = field(default_factory=CriterionArgs)  # CTC blank, Poisson log_input, [:, labels]
    fft_over_channels: FftOverChannels | None = None  # a spectral transform across (B, T, C) channels
    gradient_reversals: list[Reversal] = field(default_factory=list)  # see gradient_reversal
    custom_functions: list[FunctionCall] = field(default_factory=list)  # the user's autograd.Functions, first calls
    per_sample_broadcast: PerSampleBroadcast | None = None  # a (B,) coefficient broadcast along (B, B) features
    symmetric_similarity: str | None = None  # a similarity between two tensors with gradients (step.collapse)
    normalized: bool = False  # F.normalize ran in the step
    pair_mask: PairMask | None = None  # the in-batch positives of a metric-learning loss

    @property
    def completed(self) -> bool:
        return self.error is None


def mode_sensitive_modules(model: nn.Module) -> dict[nn.Module, str]:
    """Dropout (p > 0) and running-statistics BatchNorm layers whose mode changes what
    trains, by name. Not those of a frozen part (no trainable parameter around them: a
    frozen teacher or backbone kept in eval on purpose), nor a frozen BatchNorm (O18)."""
    by_name = dict(model.named_modules())
    sensitive: dict[nn.Module, str] = {}
    for name, module in by_name.items():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            relevant = module.p > 0
        elif isinstance(module, _BatchNorm):
            own = list(module.parameters(recurse=False))
            relevant = module.track_running_stats and not (own and not any(p.requires_grad for p in own))
        else:
            continue
        parent = by_name[name.rpartition(".")[0]] if name else module
        if relevant and (name == "" or any(p.requires_grad for p in parent.parameters())):
            sensitive[module] = name or type(module).__name__
    return sensitive


SIDE_EFFECT_PARAMS = 16  # parameters sampled to see compute_loss change weights
SIDE_EFFECT_VALUES = 1024  # values read per parameter, strided over all of it


def _side_effect_state(optimizer: Any, trainable: list[nn.Parameter]) -> tuple[list[float], list[torch.Tensor]]:
    lrs = [float(group.get("lr", 0.0)) for group in getattr(optimizer, "param_groups", [])
           if isinstance(group.get("lr", 0.0), (int, float))]
    weights = []
    for param in trainable[:SIDE_EFFECT_PARAMS]:
        flat = param.detach().reshape(-1)
        stride = max(1, flat.numel() // SIDE_EFFECT_VALUES)  # spread over the tensor: a masked row anywhere shows
        weights.append(flat[::stride].to("cpu", copy=True))
    return lrs, weights


def _frozen_samples(modules: list[nn.Module], trainable: list[nn.Parameter]) -> dict[tuple[int, ...], list[torch.Tensor]]:
    """Strided samples (as _side_effect_state takes them) of the frozen parameters whose shape
    one of the sampled trainable parameters has: a momentum encoder's or teacher's copies, in
    the model or held by the loss function (a target network)."""
    shapes = {tuple(param.shape) for param in trainable[:SIDE_EFFECT_PARAMS]}
    found: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for param in (param for module in modules for param in module.parameters()):
        if param.requires_grad or tuple(param.shape) not in shapes:
            continue
        flat = param.detach().reshape(-1)
        stride = max(1, flat.numel() // SIDE_EFFECT_VALUES)
        found.setdefault(tuple(param.shape), []).append(flat[::stride].to("cpu", copy=True))
    return found


def _toward_frozen(before: list[torch.Tensor], after: list[torch.Tensor],
                   frozen: dict[tuple[int, ...], list[torch.Tensor]]) -> bool:
    """Whether the trained weights compute_loss changed moved part of the way to a frozen copy of
    the same shape: new = m * old + (1 - m) * frozen, a momentum update written backwards."""
    copies = [sample for samples in frozen.values() for sample in samples]
    moved = 0
    for old, new in zip(before, after, strict=False):
        if torch.equal(old, new):
            continue
        step = (new - old).double()
        for copy in copies:
            if copy.shape != old.shape:
                continue
            gap = (copy - old).double()
            if float(gap.norm()) == 0:
                continue
            share = float(step @ gap) / float(gap @ gap)
            if 0 < share < 1 and float((step - share * gap).norm()) <= 1e-3 * float(step.norm()):
                moved += 1
                break
        else:
            return False
    return moved > 0


def _side_effects(before: tuple[list[float], list[torch.Tensor]],
                  after: tuple[list[float], list[torch.Tensor]]) -> list[str]:
    """What compute_loss changed that only the training loop should: the learning rate (a
    scheduler.step() inside it), the weights (an optimizer.step() inside it)."""
    found = []
    if before[0] != after[0]:
        found.append("lr")
    changed = [(a, b) for a, b in zip(before[1], after[1], strict=False) if not torch.equal(a, b)]
    if changed:
        # Every changed value now exactly 0: a mask written into the weight itself, not an update.
        zeroed = all(bool((b[a != b] == 0).all()) for a, b in changed)
        quantised = not zeroed and all(on_a_grid(b) and not on_a_grid(a) for a, b in changed)
        found.append("weights_zeroed" if zeroed else "weights_quantised" if quantised else "weights")
    return found


GRID_VALUES = 256  # distinct values of a tensor of many more: an 8-bit grid at most


def on_a_grid(values: torch.Tensor) -> bool:
    """Whether a float tensor of 32 values or more holds at most GRID_VALUES distinct values,
    evenly spaced (integer multiples of the smallest gap): a fake-quantised weight (pure)."""
    if not values.is_floating_point() or values.numel() < 32:
        return False
    levels = torch.unique(values.detach().float().flatten())
    if len(levels) < 2 or len(levels) > min(GRID_VALUES, values.numel() // 4):
        return False
    gaps = levels[1:] - levels[:-1]
    step = float(gaps.min())
    return step > 0 and bool(((gaps / step - (gaps / step).round()).abs() < 1e-3).all())


def _user_frame(error: BaseException) -> str | None:
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if "site-packages/torch" not in frame.filename and "optimus_preflight/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} in {frame.name}: {frame.line}"
    return None


SEEDING = (("torch", torch, "manual_seed"), ("torch.random", torch.random, "manual_seed"),
           ("numpy.random", None, "seed"), ("random", None, "seed"))


# Seeded generators made on the spot: fine once, the same draws again when made per call.
SEEDED_GENERATORS = (("numpy.random", None, "default_rng"),)


@contextlib.contextmanager
def seeding_watched(calls: list[str], watched: tuple = SEEDING) -> Iterator[None]:
    """Record ``torch.manual_seed(...)``, ``np.random.seed(...)`` and ``random.seed(...)``
    calls (and those of ``watched``) made inside the block; they still run."""
    import random

    import numpy

    owners = {"numpy.random": numpy.random, "random": random}
    patched = []
    for label, owner, attribute in watched:
        owner = owner if owner is not None else owners[label]
        original = getattr(owner, attribute)

        def recording(*args: Any, _original: Any = original, _label: str = label, _attribute: str = attribute,
                      **kwargs: Any) -> Any:
            calls.append(f"{_label}.{_attribute}({', '.join(map(repr, args))})")
            return _original(*args, **kwargs)

        setattr(owner, attribute, recording)
        patched.append((owner, attribute, original))
    try:
        yield
    finally:
        for owner, attribute, original in patched:
            setattr(owner, attribute, original)


def _gradient_share(loss: Any, criteria: list[torch.Tensor]) -> tuple[float, float] | None:
    """(d loss / d criterion, loss / criterion) for a returned loss built from one criterion's
    scalar output; None otherwise. A loss whose value is the criterion's but whose gradient is
    a small share of it is mostly detached (a running average kept for logging)."""
    if len(criteria) != 1 or not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
        return None
    criterion = criteria[0]
    if float(criterion.detach()) == 0:
        return None
    try:
        (slope,) = torch.autograd.grad(loss, criterion, retain_graph=True, allow_unused=True)
    except RuntimeError:  # a graph autograd cannot differentiate twice: judge nothing, break nothing
        return None
    if slope is None:
        return None
    return float(slope), float(loss.detach()) / float(criterion.detach())


def constant_factor(loss: Any) -> float | None:
    """The constant the returned loss was last multiplied or divided by (``loss / 8``,
    ``0.125 * loss``, several in a row multiplied together), read from its autograd node;
    None when its last op is anything else. A hand-written loss has no criterion to compare
    its value with, but its graph still shows the factor."""
    node = getattr(loss, "grad_fn", None) if isinstance(loss, torch.Tensor) else None
    factor, found = 1.0, False
    while node is not None and type(node).__name__ in ("DivBackward0", "MulBackward0"):
        other, own = getattr(node, "_saved_other", None), getattr(node, "_saved_self", None)
        if own is not None or not isinstance(other, torch.Tensor) or other.numel() != 1 or other.requires_grad:
            break
        value = float(other)
        if value == 0 or not math.isfinite(value):
            break
        factor *= 1 / value if type(node).__name__ == "DivBackward0" else value
        found = True
        node = node.next_functions[0][0] if node.next_functions else None
    return factor if found else None


def run_probe(ctx: PreflightContext, batch: Any) -> StepProbe:
    probe = StepProbe(scaler_enabled=ctx.training.scaler.is_enabled())
    model = ctx.model
    spy = LossSpy(sequence_shapes(batch), {id(param): name for name, param in model.named_parameters()
                                           if param.requires_grad})
    probe.pitfalls = spy.pitfalls.found

    step_batches: list[Any] = []  # as compute_loss received it, on the device

    def observed_loss(module: nn.Module, data: Any) -> Any:
        step_batches.append(data)
        spy.batch_rows = batch_size_of(data)
        probe.batch_rows = spy.batch_rows
        spy.ranges.batch_storages = storages(data)
        spy.criterion_args.watch_batch(data)
        before = _side_effect_state(ctx.optimizer, watched)
        frozen_before = _frozen_samples([module, *(held for _, held in loss_modules(ctx.compute_loss, module))], watched)
        with spy, seeding_watched(probe.loss_reseeds), watched_autograd_grad(probe.derivative_calls, False, probe.derivative_zero, probe.derivative_fields,
                                      probe.whole_gradients), \
                recorded_functions(probe.custom_functions):
            output = ctx.compute_loss(module, data)
        after = _side_effect_state(ctx.optimizer, watched)
        probe.loss_side_effects = _side_effects(before, after)
        if "weights" in probe.loss_side_effects and frozen_before:
            probe.loss_side_effects.append("weights_toward_frozen" if _toward_frozen(before[1], after[1], frozen_before)
                                           else "weights_beside_frozen_copy")
        loss = output[0] if isinstance(output, tuple) else output
        probe.loss_gradient_share = _gradient_share(loss, spy.scalar_outputs)
        probe.loss_constant_factor = constant_factor(loss)
        probe.gradient_reversals = find_reversals(spy.scalar_outputs, spy.scalar_sources, data)
        spy.scalar_outputs.clear()
        spy.scalar_sources.clear()
        if isinstance(loss, torch.Tensor):
            detached = loss.detach()
            probe.loss = LossReturn(
                kind="tensor",
                shape=tuple(loss.shape),
                finite=bool(torch.isfinite(detached).all()),
                requires_grad=loss.requires_grad,
                value=float(detached.float().mean()) if detached.numel() else None,
                leaf=loss.grad_fn is None,
            )
            if loss.requires_grad:
                probe.mixed_reductions = mixed_reductions(loss, batch_size_of(data) or 0)
                graph = walk_loss_graph(loss, known_leaves)
                if graph.complete:
                    probe.outside_leaves = graph.outside_leaves
                    probe.zero_gradient_ops = graph.zero_gradient_ops
                    probe.zero_factors = graph.zero_factors
                    probe.sampling_ops = graph.sampling_ops
                    probe.clamp_ops = graph.clamp_ops
                    probe.singleton_softmax = graph.singleton_softmax
                    probe.log_of_probability = graph.log_of_probability
                    probe.loss_ignores_output = bool(outputs) and not any(id(node) in graph.nodes for node in outputs)
        else:
            probe.loss = LossReturn(kind=type(loss).__name__)
        outputs.clear()
        return output

    sensitive = mode_sensitive_modules(model)
    stuck: set[nn.Module] = set()  # in eval right after model.train(): ModesCheck reports them
    top_stuck = False

    # The graph nodes of the model's outputs (forwards that built a graph), held only until
    # compute_loss returns: a held node keeps no id free for another node to reuse.
    outputs: list[Any] = []

    def on_output(module: nn.Module, args: Any, output: Any) -> None:
        outputs.extend(leaf.grad_fn for leaf in leaves(output) if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None)

    model_inputs: list[tuple[int, ...]] = []
    model_input_tensors: list[torch.Tensor] = []
    first_call_args: list[torch.Tensor] = []  # every tensor the first forward was given, in order

    def on_forward(module: nn.Module, args: Any) -> None:
        probe.forward_calls += 1
        first = next((arg for arg in args if isinstance(arg, torch.Tensor) and arg.dim() >= 2), None)
        if first is not None and not model_inputs:
            model_inputs.append(tuple(first.shape))
            model_input_tensors.append(first)
            first_call_args.extend(arg for arg in args if isinstance(arg, torch.Tensor) and arg.dim() >= 1)
        if not module.training and not top_stuck and torch.is_grad_enabled():
            probe.forward_in_eval = True

    def on_sensitive_forward(module: nn.Module, args: Any) -> None:
        name = sensitive[module]
        if not module.training and module not in stuck and torch.is_grad_enabled() and name not in probe.modules_in_eval:
            probe.modules_in_eval.append(name)

    names = {param: name for name, param in model.named_parameters()}
    trainable = [param for param in names if param.requires_grad]
    known_leaves = {id(param) for param in names} | {
        id(param) for group in getattr(ctx.optimizer, "param_groups", []) for param in group.get("params", [])}
    probe.trainable_params = len(trainable)
    probe.hooked_params = [names[param] for param in trainable if getattr(param, "_backward_hooks", None)]
    # An embedding built with max_norm renormalises the rows it looks up in place, in the forward:
    # a weight change compute_loss makes by design, not an optimizer step inside it.
    renormalised = {id(module.weight) for module in model.modules()
                    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.max_norm is not None}
    watched = [param for param in trainable if id(param) not in renormalised]
    received: dict[nn.Parameter, torch.Tensor | None] = {}

    zero_grad: set[nn.Parameter] = set()

    def on_grad(param: nn.Parameter) -> None:
        if param.grad is None:
            # The hook fires even when nothing reached the parameter: a custom autograd Function whose
            # backward returns None for its input passes an undefined gradient on.
            return
        # Scaled fp16 gradients may be inf by design; the scaler handles those.
        received[param] = None if probe.scaler_enabled else torch.isfinite(param.grad).all()
        if not param.grad.is_sparse and not bool(param.grad.any()):
            zero_grad.add(param)

    with preserved_training_state(ctx):
        model.train()  # what the training loop does before its first step
        top_stuck = not model.training
        stuck.update(module for module in sensitive if not module.training)
        # The user's own forward hooks, read before the probe adds any.
        user_hooked = [(name, module) for name, module in model.named_modules() if module._forward_hooks]
        handles = [model.register_forward_pre_hook(on_forward), model.register_forward_hook(on_output)]
        handles += [module.register_forward_pre_hook(on_sensitive_forward) for module in sensitive]
        handles += [param.register_post_accumulate_grad_hook(on_grad) for param in trainable]

        def on_hooked_output(module: nn.Module, args: Any, output: Any, name: str) -> None:
            attached_in = any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args)
            outs = [leaf for leaf in leaves(output) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]
            if torch.is_grad_enabled() and attached_in and outs and not any(out.requires_grad for out in outs) \
                    and name not in probe.hooks_detaching:
                probe.hooks_detaching.append(name)

        # Registered after the user's hooks, so they see the output those hooks returned.
        handles += [module.register_forward_hook(lambda module, args, output, name=name: on_hooked_output(module, args, output, name))
                    for name, module in user_hooked]
        def on_run(name: str) -> None:
            probe.modules_run.add(name)
            if not torch.is_grad_enabled():  # inside torch.no_grad() / inference_mode in the forward
                probe.modules_run_without_grad.add(name)

        handles += [module.register_forward_hook(lambda module, args, output, name=name: on_run(name))
                    for name, module in model.named_modules()
                    if any(p.requires_grad for p in module.parameters(recurse=False))]
        layout = LayoutWatch(model)
        model_untrained = untrained(model)  # before the probe's own step moves the weights
        runner = runner_from_config(ctx.cfg.trainer, ctx.training, model, ctx.optimizer, observed_loss,
                                    scheduler=ctx.scheduler)
        recorder = UpdateRecorder(ctx.optimizer, names)
        runner.optimizer_step_hooks.append(recorder.before_step)  # last: after unscaling and clipping
        started = time.perf_counter()
        caught = warnings.catch_warnings(record=True)
        try:
            with caught as seen:
                warnings.simplefilter("always")
                result = runner.run(iter([(batch, True)]))
            probe.step_warnings = [str(warning.message) for warning in seen]
            recorder.after_step()
            probe.updates = recorder.groups
            probe.symmetric_weights = recorder.symmetric
            probe.stepped = result.stepped
            probe.grad_norm = float(result.grad_norm)
            probe.modules_left_in_eval = [name for module, name in sensitive.items()
                                          if module not in stuck and not module.training]
        except Exception as error:
            probe.error = "".join(traceback.format_exception_only(type(error), error)).strip()
            probe.error_frame = _user_frame(error)
            probe.error_traceback = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            probe.preflight_fault = raised_by_fake_tensor(error)
        finally:
            probe.step_s = time.perf_counter() - started
            for handle in handles:
                handle.remove()
            layout.close()
    probe.layout_inputs = layout.seen
    probe.criterion_calls = spy.calls
    probe.activations = spy.activations
    probe.normalised_shapes = spy.normalised_shapes
    probe.column_broadcasts = spy.column_broadcasts
    probe.batch_normalize = spy.batch_normalize
    probe.batch_softmax = spy.batch_softmax
    probe.sliced_pair = spy.sliced_pair
    probe.zero_one_sign_target = spy.zero_one_sign_target
    probe.attention_over_heads = attention_over_heads(spy.attention_queries, model_inputs)
    probe.target_is_input = target_is_input(spy.calls, model_input_tensors, step_batches[0] if step_batches else batch)
    probe.target_fed_beside = target_fed_beside(spy.calls, first_call_args) if probe.target_is_input is None else None
    probe.target_column_reused = target_column_reused(spy.calls, step_batches[0] if step_batches else batch)
    probe.boxes_beyond_image = boxes_beyond_image(spy.calls, model_input_tensors)
    probe.target_column_scales = target_column_scales(spy.calls)
    probe.argmaxed_multi_hot = argmaxed_multi_hot(spy.calls, step_batches[0] if step_batches else batch)
    held = storages(step_batches[0] if step_batches else batch)
    # the shape the model's first input was flattened from: (B, k, ...) views kept together per sample
    input_source = flattened_from(model_input_tensors[0], spy.flattened) if model_input_tensors else None
    probe.labels_tiled = labels_tiled(spy.calls, step_batches[0] if step_batches else batch, input_source)
    probe.targets_tiled_against_rows = spy.tiled_against_rows
    if model_untrained:
        probe.labels_from_initial_guesses = next(
            (call for call in spy.calls if call.target_storage in held
             and labels_are_initial_guesses(call.argmax_agreement)), None)
    for call in spy.calls:
        call.target_is_drawn_noise = drawn_noise(call.target_tensor, held)
        if call.target_is_drawn_noise and probe.diffusion_inputs is None:
            probe.diffusion_inputs = diffusion_inputs(call.target_tensor, model_input_tensors,
                                                      step_batches[0] if step_batches else batch, held)
        if call.target_is_drawn_noise and probe.diffusion_noise is None:
            probe.diffusion_noise = largest_noise_share(call.target_tensor, model_input_tensors,
                                                        step_batches[0] if step_batches else batch)
        call.target_tensor = None  # the probe keeps statistics, not the batch's tensors
        call.class_target = None
    probe.channel_reduction = spy.channel_axis.found
    probe.classes_misread = spy.channel_axis.misread
    probe.view_as_permute = spy.views.found
    probe.flatten_mismatch = spy.flatten_mismatch
    probe.graph_cuts = spy.graph_cuts.cuts
    detached = [cut for cut in spy.graph_cuts.cuts if cut.call == ".detach()"]
    if probe.completed and (spy.graph_cuts.picks or (detached and len(spy.graph_cuts.reaches) > 1)):
        # Most models pick nothing and detach nothing: no walk of their modules.
        layers = {f"{module_name}.{name}" if module_name else name for module_name, module in model.named_modules()
                  if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd, nn.RNNBase, nn.EmbeddingBag))
                  for name, _ in module.named_parameters(recurse=False)}
        got = {names[p] for p in received}
        probe.task_cut = task_cut_by_pick(spy.graph_cuts.picks, spy.graph_cuts.task_reach, got, layers)
        if probe.task_cut is None:
            probe.task_cut_by_detach = task_cut_by_detach(detached, spy.graph_cuts.reaches, got, layers,
                                                          spy.graph_cuts.constant_targets)
    spy.graph_cuts.release()
    spy.pitfalls.release()
    probe.per_sample_broadcast = spy.per_sample.found
    probe.range_mismatch = spy.ranges.found
    probe.pairs_interleaved = pairs_interleaved(spy.row_blocks, input_source)
    spy.ranges.release()
    probe.symmetric_similarity = spy.symmetric_similarity
    probe.normalized = spy.normalized
    probe.pair_mask = spy.pair_mask
    spy.per_sample.release()
    probe.propagation_without_self = spy.propagation.found if not spy.propagation.root_term else None
    probe.messages_to_source = spy.propagation.to_source
    probe.complete_adjacency = spy.propagation.complete
    spy.propagation.release()
    probe.criterion_args = spy.criterion_args.found
    probe.fft_over_channels = spy.spectral.found
    probe.time_major_target = time_major_target(spy.calls, step_batches[0] if step_batches else batch, model_inputs,
                                                getattr(ctx.train_loader, "batch_size", None))
    if probe.completed:
        probe.params_without_grad = [names[p] for p in trainable if p not in received]
        probe.params_nonfinite_grad = [names[p] for p, ok in received.items() if ok is not None and not bool(ok)]
        probe.params_zero_grad = [names[p] for p in trainable if p in zero_grad]
    return probe


NOISE_STD = (0.8, 1.25)  # the spread of a standard-normal draw of 64 values or more


def drawn_noise(target: torch.Tensor | None, batch_storages: set[int]) -> bool:
    """A floating target made in the loss (no batch tensor) that reads as a standard-normal draw."""
    if target is None or not target.is_floating_point() or target.numel() < 64 \
            or target.untyped_storage().data_ptr() in batch_storages:
        return False
    values = target.detach().float()
    return NOISE_STD[0] <= float(values.std()) <= NOISE_STD[1] and abs(float(values.mean())) < 0.2


MIN_NOISED_SAMPLES = 16


def largest_noise_share(noise: torch.Tensor | None, model_inputs: list[torch.Tensor],
                        batch: Any) -> tuple[float, int] | None:
    """(the largest b**2 / (a**2 + b**2) over the samples, samples) where the model's input is
    x_t = a * x0 + b * noise per sample, x0 a float batch tensor and noise the drawn target:
    the share of x_t's variance the forward process gives the noise at the sampled timesteps."""
    x_t = model_inputs[0] if model_inputs else None
    if noise is None or x_t is None or x_t.shape != noise.shape or x_t.dim() < 2 or x_t.shape[0] < MIN_NOISED_SAMPLES:
        return None
    clean = next((leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
                  and leaf.shape == x_t.shape), None)
    if clean is None or x_t[0].numel() < 4:
        return None
    rows = x_t.shape[0]
    target = x_t.detach().double().reshape(rows, -1, 1)
    basis = torch.stack([clean.detach().double().reshape(rows, -1).to(target.device),
                         noise.detach().double().reshape(rows, -1).to(target.device)], dim=2)
    solution = torch.linalg.lstsq(basis, target).solution  # (rows, 2, 1): a and b per sample
    residual = (basis @ solution - target).norm(dim=(1, 2)) / target.norm(dim=(1, 2)).clamp_min(1e-12)
    if float(residual.max()) > 1e-3:
        return None  # the input is not a per-sample mix of the batch and the noise
    a, b = solution[:, 0, 0], solution[:, 1, 0]
    share = b ** 2 / (a ** 2 + b ** 2).clamp_min(1e-12)
    return float(share.max()), rows


def pairs_interleaved(blocks: tuple[str, int, int] | None,
                      source: tuple[int, ...] | None) -> tuple[str, int, int, tuple[int, ...]] | None:
    """A paired criterion fed ``chunk(k)`` row blocks of one forward whose input was a (n, k, ...)
    batch tensor flattened to (n * k, ...): rows run a0, p0, n0, a1, ..., so each block holds every
    role of a third of the samples, not one role of all of them."""
    if blocks is None:
        return None
    name, count, rows = blocks
    if source is None or len(source) < 3 or source[1] != count or source[0] * count != count * rows:
        return None
    return name, count, rows, source


def labels_tiled(calls: list[CriterionCall], batch: Any,
                 source: tuple[int, ...] | None) -> tuple[str, int, tuple[int, ...]] | None:
    """A class criterion whose (B * k,) target is a (B,) batch label tensor tiled, y.repeat(k) (label i at
    rows i, i + B, ...), while the model read a (B, k, ...) batch tensor flattened sample by sample (sample
    i's k crops or views at rows i * k .. i * k + k - 1): every view is scored against another sample's
    label. y.repeat_interleave(k) is the order the rows are in."""
    if source is None or len(source) < 3 or source[1] < 2:
        return None
    rows, views = source[0], source[1]
    labels = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() == 1
              and len(leaf) == rows and not leaf.is_floating_point() and leaf.layout == torch.strided]
    for call in calls:
        target = call.class_target
        if target is None or target.numel() != rows * views:
            continue
        for y in labels:
            y = y.to(target.device)
            if int(y.unique().numel()) >= 2 and torch.equal(target, y.repeat(views)) \
                    and not torch.equal(target, y.repeat_interleave(views)):
                return call.function, views, source
    return None


def target_is_input(calls: list[CriterionCall], model_inputs: list[torch.Tensor],
                    batch: Any) -> tuple[str, tuple[int, ...], bool] | None:
    """A regression criterion whose target is the model's own input while the batch holds
    another, different tensor of that shape (a denoiser's clean signal): the model is trained
    towards the identity. A plain autoencoder's batch has no such second tensor."""
    source = model_inputs[0] if model_inputs else None
    if source is None or not source.is_floating_point():
        return None
    for call in calls:
        target = call.target_tensor
        if target is None or target.shape != source.shape or not torch.equal(target, source):
            continue
        others = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.shape == source.shape
                  and leaf.is_floating_point() and leaf.data_ptr() != source.data_ptr()
                  and not torch.equal(leaf.to(source.device), source)]
        if others:
            made_in_loss = source.untyped_storage().data_ptr() not in storages(batch)
            return call.function, tuple(source.shape), made_in_loss
    return None


def target_fed_beside(calls: list[CriterionCall], model_inputs: list[torch.Tensor]) -> tuple[str, tuple[int, ...], int] | None:
    """(criterion, shape, which input) when a regression target is, value for value, one of the
    model's inputs after the first: a sequence decoder given the very values it must predict
    (teacher forcing without the shift right), beside the encoder's own input."""
    for call in calls:
        target = call.target_tensor
        if target is None or not target.is_floating_point() or target.numel() < 2:
            continue
        first = model_inputs[0] if model_inputs else None
        for index, given in enumerate(model_inputs[1:], start=1):
            if not given.is_floating_point() or given.shape != target.shape or not torch.equal(given, target.to(given.device)):
                continue
            if first is not None and first.shape == given.shape and torch.equal(first.to(given.device), given):
                continue  # the same tensor handed twice: an autoencoder's input, not a second one
            return call.function, tuple(target.shape), index
    return None


@dataclass
class BoxesBeyondImage:
    function: str
    shape: tuple[int, ...]
    beyond: float  # share of the boxes that end past the image
    largest: float  # the largest corner, in the boxes' unit
    side: float  # the image side in that unit: 1 for normalised boxes, else the input's size in pixels
    image: tuple[int, int]
    points: bool = False  # (x, y) points (centres, keypoints) rather than (x1, y1, x2, y2) boxes


BOX_MARGIN, BOXES_BEYOND = 1.05, 0.1  # a corner 5% past the image; the share of boxes doing so


def boxes_beyond_image(calls: list[CriterionCall], model_inputs: list[torch.Tensor]) -> BoxesBeyondImage | None:
    """A regression target of (x1, y1, x2, y2) boxes (every x2 >= x1, y2 >= y1, none negative)
    for an image input, many of whose boxes end past the image: beyond 1 when most corners
    are normalised to [0, 1], beyond the input's width or height when they are in pixels.
    Boxes left in the original image's pixels after the image was resized do this."""
    image = next((t for t in model_inputs if t.dim() == 4 and t.is_floating_point() and min(t.shape[-2:]) >= 8), None)
    if image is None:
        return None
    height, width = int(image.shape[-2]), int(image.shape[-1])
    for call in calls:
        boxes = call.target_tensor
        if boxes is not None and boxes.dim() >= 2 and boxes.shape[-1] == 2 and boxes.is_floating_point() \
                and boxes.shape[0] == image.shape[0]:
            found = _points_beyond_image(call, boxes.detach().float().reshape(-1, 2), (height, width))
            if found is not None:
                return found
            continue
        if boxes is None or boxes.dim() < 2 or boxes.shape[-1] != 4 or not boxes.is_floating_point() \
                or boxes.shape[0] != image.shape[0]:
            continue
        boxes = boxes.detach().float().reshape(-1, 4)
        if len(boxes) < 8 or float(boxes.min()) < 0 or bool((boxes[:, 2] < boxes[:, 0]).any()) \
                or bool((boxes[:, 3] < boxes[:, 1]).any()):
            continue
        normalised = float(boxes[:, 2:].median()) <= 1.0
        x_side, y_side = (1.0, 1.0) if normalised else (float(width), float(height))
        beyond = (boxes[:, 2] > BOX_MARGIN * x_side) | (boxes[:, 3] > BOX_MARGIN * y_side)
        share = float(beyond.float().mean())
        if share >= BOXES_BEYOND:
            return BoxesBeyondImage(call.function, tuple(call.target_shape or boxes.shape), share,
                                    float(boxes[:, 2:].max()), 1.0 if normalised else float(max(width, height)),
                                    (height, width))
    return None


def _points_beyond_image(call: CriterionCall, points: torch.Tensor, image: tuple[int, int]) -> BoxesBeyondImage | None:
    """(x, y) point targets of an image model, normalised to [0, 1] (most of them are), many of
    which lie past 1: x divided by the height and y by the width (PIL's Image.size is (w, h),
    numpy's shape (h, w)) on images that are not square, or points in another image's units."""
    if len(points) < 8 or float(points.min()) < 0 or float(points.median()) > 1.0:
        return None
    beyond = (points > BOX_MARGIN).any(dim=1)
    share = float(beyond.float().mean())
    if share < BOXES_BEYOND:
        return None
    return BoxesBeyondImage(call.function, tuple(call.target_shape or points.shape), share, float(points.max()), 1.0,
                            image, points=True)


def target_column_reused(calls: list[CriterionCall], batch: Any) -> tuple[list[str], int, int, int] | None:
    """Two regression terms fitted to the same column of a (B, K) target tensor of the batch
    while another of its columns is the target of no term: (the terms, the column used twice,
    an unused column, K). A multi-task loss copy-pasted without changing the column."""
    targets = [call for call in calls if call.target_tensor is not None and call.target_tensor.dim() == 1]
    if len(targets) < 2:
        return None
    tables = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() == 2
              and leaf.is_floating_point() and 2 <= leaf.shape[1] <= 16 and leaf.shape[0] == len(targets[0].target_tensor)]
    for table in tables:
        columns = [table[:, k].to(targets[0].target_tensor.device) for k in range(table.shape[1])]
        used = [next((k for k, column in enumerate(columns) if torch.equal(call.target_tensor, column)), None)
                for call in targets]
        counts = {k: used.count(k) for k in set(used) if k is not None}
        twice = next((k for k, count in counts.items() if count >= 2), None)
        unused = [k for k in range(len(columns)) if k not in counts
                  and not any(torch.equal(columns[k], columns[j]) for j in counts)]
        if twice is not None and unused:
            return [call.function for call in targets if used[targets.index(call)] == twice], twice, unused[0], len(columns)
    return None


def attention_over_heads(queries: list[tuple[int, ...]],
                         model_inputs: list[tuple[int, ...]]) -> tuple[tuple[int, ...], int] | None:
    """A scaled_dot_product_attention query laid out (B, T, heads, d) where SDPA reads
    (B, heads, T, d): dim 1 is the model's sequence length and dim 2 is not, so attention
    runs across the heads of one position and no position sees another."""
    if not model_inputs or len(model_inputs[0]) < 2:
        return None
    batch, length = model_inputs[0][0], model_inputs[0][1]
    for shape in queries:
        if len(shape) == 4 and shape[0] == batch and shape[1] == length and shape[2] != length and shape[2] < length:
            return shape, length
    return None


def time_major_target(calls: list[CriterionCall], batch: Any, model_inputs: list[tuple[int, ...]],
                      batch_size: int | None) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """A class criterion's target that is a (T, B) batch tensor flattened as it is, while the
    model read batch-first (B, ...) inputs: the logits flatten in (sample, position) order,
    the targets in (position, sample) order."""
    if not batch_size or not model_inputs or model_inputs[0][0] != batch_size:
        return None
    batch_leaves = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor)]
    for call in calls:
        base = call.target_base
        if base is None or base.dim() != 2 or base.shape[1] != batch_size or base.shape[0] == batch_size:
            continue
        if any(base is leaf or (base.data_ptr() == leaf.data_ptr() and base.shape == leaf.shape) for leaf in batch_leaves):
            return call.function, tuple(base.shape), model_inputs[0]
    return None


def get_probe(ctx: PreflightContext) -> StepProbe:
    """The probe of this preflight run (computed on first use; needs the first batch)."""
    if ctx.artifacts.step_probe is None:
        ctx.artifacts.step_probe = run_probe(ctx, ctx.artifacts.first_batch)
    return ctx.artifacts.step_probe
