"""An argument of the model's forward that never reaches anything (``step.forward_arguments``).

``FORWARD_INPUT_IGNORED``: ``model(x, t)`` where forward accepts ``t`` and never uses it, a
diffusion denoiser blind to its timestep, a conditional model blind to its class, a
two-input network whose second input is dropped (``torch.cat([a, a])`` where ``[a, b]`` is
meant, a branch that reads the wrong variable). Nothing fails: the model learns the best
prediction without that input, and the loss falls to a floor nobody can tell apart from
the task's difficulty.

Read from the first call of the model during ``compute_loss`` on the first batch: its
arguments are kept, then the model is called again on them with one tensor argument at a
time rolled along its batch axis (each sample gets another sample's value). An argument is
ignored when that leaves the model's output unchanged, and every layer call whose output
it does change lies outside the autograd graph of the model's output (computed and
dropped; a shared embedding's call on that argument counts apart from its other calls),
while rolling another argument does change the output. The calls run under one reseeded
RNG each (dropout and sampling repeat themselves), in eval mode and, for an argument that
eval mode ignores, again in training mode: a decoder that reads its targets only for
teacher forcing, or a margin head that reads the labels only in training, uses them there.
A conditioning path initialised to zero (DiT's adaLN-Zero), or an embedding table of equal
rows that reads the argument itself (a per-series bias from zeros), leaves the output
unchanged at step 0 but lies in its graph (its weights get gradients), and stays quiet.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.checks.sample_mixing import batch_axis
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import leaves
from optimus_preflight.training.learnable import graph_nodes

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

CHANGED = 1e-5  # of a tensor's largest magnitude: a change above float noise
_SAMPLED = 64  # strided entries kept per layer output, beside its sum and sum of squares


def _fingerprint(value: Any) -> list[torch.Tensor]:
    """A cheap summary of every floating tensor in ``value`` (layers can be large)."""
    out = []
    for leaf in leaves(value):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel():
            flat = leaf.detach().float().reshape(-1)
            step = max(1, flat.numel() // _SAMPLED)
            out.append(torch.cat([flat.sum()[None], flat.square().sum()[None], flat[::step][:_SAMPLED]]).cpu())
    return out


def _differs(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    if len(first) != len(second):
        return True
    for a, b in zip(first, second, strict=True):
        if a.shape != b.shape:
            return True
        if not bool(torch.isfinite(a).all()) or not bool(torch.isfinite(b).all()):
            continue
        scale = float(torch.maximum(a.abs().max(), b.abs().max()))
        if scale > 0 and float((a - b).abs().max()) > CHANGED * scale:
            return True
    return False


def _first_call(ctx: PreflightContext) -> tuple[tuple, dict] | None:
    """The arguments of the model's first call in an eval-mode ``compute_loss``."""
    seen: list[tuple[tuple, dict]] = []

    def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not seen:
            seen.append((args, dict(kwargs)))

    handle = ctx.model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            eval_forward(ctx, ctx.artifacts.first_batch)
    except Exception:
        return None
    finally:
        handle.remove()
    return seen[0] if seen else None


Layers = dict[str, list[list[torch.Tensor]]]  # per layer, the fingerprint of each of its calls
Call = tuple[str, int]  # (layer name, which of its calls in one forward)
_GRAPH_NODES = 200_000


def _forward(ctx: PreflightContext, args: tuple, kwargs: dict, train: bool, grad: bool,
             on_layer: Any) -> Any:
    """The model's output for one call under a reseeded RNG, ``on_layer(name, output)`` called
    for every layer call; the training state restored after. Raises what the model raises."""
    handles = [module.register_forward_hook(lambda _, __, output, name=name: on_layer(name, output))
               for name, module in ctx.model.named_modules() if name]
    try:
        with preserved_training_state(ctx), torch.set_grad_enabled(grad), torch.random.fork_rng(devices=[]):
            ctx.model.train(train)
            torch.manual_seed(0)
            with ctx.training.plan.autocast():
                return ctx.model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()


def _call(ctx: PreflightContext, args: tuple, kwargs: dict, train: bool) -> tuple[list, Layers] | None:
    """(the output's fingerprint, each layer call's output fingerprint) of one seeded call."""
    layers: Layers = {}
    try:
        output = _forward(ctx, args, kwargs, train, False,
                          lambda name, out: layers.setdefault(name, []).append(_fingerprint(out)))
    except Exception:
        return None
    return _fingerprint(output), layers


def _changed_calls(first: Layers, second: Layers) -> list[Call]:
    changed = []
    for name, calls in first.items():
        others = second.get(name, [])
        changed += [(name, index) for index, call in enumerate(calls)
                    if index >= len(others) or _differs(call, others[index])]
    return changed


def _connected_calls(ctx: PreflightContext, args: tuple, kwargs: dict, train: bool) -> set[Call] | None:
    """The layer calls whose output lies in the autograd graph of the model's output: what
    can reach the loss. A conditioning path multiplied by zero-initialised weights is in it;
    a branch computed and dropped is not."""
    made: dict[Call, Any] = {}
    counts: dict[str, int] = {}

    def record(name: str, output: Any) -> None:
        index = counts[name] = counts.get(name, -1) + 1
        node = next((leaf.grad_fn for leaf in leaves(output)
                     if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None), None)
        if node is not None:
            made[(name, index)] = node

    try:
        output = _forward(ctx, args, kwargs, train, True, record)
    except Exception:
        return None
    roots = [leaf.grad_fn for leaf in leaves(output) if isinstance(leaf, torch.Tensor)]
    seen = {id(node) for node in graph_nodes(roots, _GRAPH_NODES)}
    return {call for call, node in made.items() if id(node) in seen}


def _trainable_readers(ctx: PreflightContext, args: tuple, kwargs: dict, value: torch.Tensor) -> set[Call]:
    """The calls of layers with trainable weights of their own that take ``value`` itself as
    an input (an ``nn.Embedding`` of the ids): a table initialised to equal rows (zeros,
    ``from_pretrained`` with ``freeze=False``) gives every sample the same output at step 0,
    yet its rows get gradients and part from the first step."""
    counts: dict[str, int] = {}
    found: set[Call] = set()

    def reader(name: str):
        def hook(_module: nn.Module, inputs: tuple, kw: dict) -> None:
            index = counts[name] = counts.get(name, -1) + 1
            if any(item is value for item in (*inputs, *kw.values())):
                found.add((name, index))
        return hook

    handles = [module.register_forward_pre_hook(reader(name), with_kwargs=True)
               for name, module in ctx.model.named_modules()
               if name and any(p.requires_grad for p in module.parameters(recurse=False))]
    try:
        _forward(ctx, args, kwargs, False, False, lambda name, out: None)
    except Exception:
        return set()
    finally:
        for handle in handles:
            handle.remove()
    return found


def _rolled(tensor: torch.Tensor, samples: int) -> torch.Tensor | None:
    """``tensor`` with each sample given the next sample's value; None when it has no axis
    of the samples (a graph's (2, E) edge list, where a roll would swap the edges' ends) or
    the samples agree."""
    axis = batch_axis(tensor, samples) if samples >= 2 else None
    if axis is None:
        return None
    rolled = tensor.roll(1, dims=axis)
    return None if torch.equal(rolled, tensor) else rolled


# Targets handed to a model that computes its own loss: the loss reads them, not the features.
TARGET_NAMES = {"labels", "label", "targets", "target", "y"}


def _named_arguments(model: nn.Module, args: tuple, kwargs: dict) -> list[tuple[str, Any, Any]]:
    """(name, positional index or kwarg key, value) of every tensor argument but targets."""
    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        names = []
    out = []
    for index, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            name = names[index] if index < len(names) and names[index] not in ("args", "kwargs") else f"#{index}"
            out.append((name, index, value))
    out.extend((key, key, value) for key, value in kwargs.items() if isinstance(value, torch.Tensor))
    return [argument for argument in out if argument[0] not in TARGET_NAMES]


def _with(args: tuple, kwargs: dict, where: Any, value: torch.Tensor) -> tuple[tuple, dict]:
    if isinstance(where, int):
        return args[:where] + (value,) + args[where + 1:], kwargs
    return args, {**kwargs, where: value}


def _describe(tensor: torch.Tensor) -> str:
    kind = "ids" if not tensor.is_floating_point() else "values"
    return f"a {tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')} tensor of {kind}"


def graph_assignment(value: torch.Tensor, nodes: int) -> bool:
    """A collated graph batch's node-to-graph vector: one sorted graph id per node row, from 0,
    for at least two graphs (pure)."""
    if value.dim() != 1 or value.is_floating_point() or value.dtype == torch.bool or value.shape[0] != nodes:
        return False
    if nodes < 2 or int(value[0]) != 0:
        return False
    steps = value[1:] - value[:-1]
    return bool(((steps == 0) | (steps == 1)).all()) and int(value[-1]) >= 1


def _mask_like(value: torch.Tensor) -> bool:
    """A 0/1 (or boolean) tensor of at least two dimensions with both values: a padding or
    attention mask."""
    if value.dim() < 2 or not (value.dtype == torch.bool or bool(((value == 0) | (value == 1)).all())):
        return False
    kept = value != 0
    return bool(kept.any()) and not bool(kept.all())


def _padding_swapped(other: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """``other`` with new content where ``masked`` (a (B, T) selection) is True: ids drawn from
    the ids the batch holds, values moved by their spread."""
    generator = torch.Generator().manual_seed(0)
    where = masked.reshape(*masked.shape, *([1] * (other.dim() - masked.dim()))).expand_as(other).to(other.device)
    if other.is_floating_point():
        noise = torch.randn(other.shape, generator=generator).to(other.device, other.dtype)
        return torch.where(where, other + noise * other.float().std().clamp_min(1.0).to(other.dtype), other)
    pool = other.reshape(-1)
    picks = pool[torch.randint(0, pool.numel(), other.shape, generator=generator).to(pool.device)]
    return torch.where(where, picks, other)


def mask_redundant(ctx: PreflightContext, args: tuple, kwargs: dict, arguments: list[tuple[str, Any, Any]],
                   mask: torch.Tensor) -> bool:
    """Whether an ignored padding mask has nothing to hide: new content under its zeros, in every
    argument laid out like it, leaves the output at its kept positions (or the whole output, when
    it has no position axis) unchanged. A causal model fed right-padded rows never lets the
    padding reach a real position, so a forward that drops ``attention_mask`` loses nothing."""
    masked = (mask == 0).cpu()
    moved_args, moved_kwargs, swapped = args, kwargs, False
    for _, where, value in arguments:
        if value is mask or value.dim() < mask.dim() or tuple(value.shape[:mask.dim()]) != tuple(mask.shape):
            continue
        moved_args, moved_kwargs = _with(moved_args, moved_kwargs, where, _padding_swapped(value, masked))
        swapped = True
    if not swapped:
        return False
    try:
        before = _forward(ctx, args, kwargs, False, False, lambda name, out: None)
        after = _forward(ctx, moved_args, moved_kwargs, False, False, lambda name, out: None)
    except Exception:
        return False
    kept = (mask != 0)

    def at_kept(output: Any) -> list[torch.Tensor]:
        out = []
        for leaf in leaves(output):
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                aligned = leaf.dim() >= kept.dim() and tuple(leaf.shape[:kept.dim()]) == tuple(kept.shape)
                out.append(leaf.detach()[kept.to(leaf.device)].float().cpu() if aligned else leaf.detach().float().cpu())
        return out

    return not _differs(at_kept(before), at_kept(after))


class ForwardArgumentsCheck(Check):
    """FORWARD_INPUT_IGNORED: a tensor argument of the model's forward changes nothing."""

    name = "step.forward_arguments"
    stage = Stage.STEP
    codes = ("FORWARD_INPUT_IGNORED", "INPUT_IGNORED_IN_TRAINING")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "every argument of the model's forward reaches its output"
        call = _first_call(ctx)
        if call is None:
            findings.data["summary"] = "the model's first call was not seen"
            return
        args, kwargs = call
        arguments = _named_arguments(ctx.model, args, kwargs)
        if len(arguments) < 2:
            findings.data["summary"] = "the model takes one tensor argument (step.input_dependence judges it)"
            return
        samples = int(arguments[0][2].shape[0]) if arguments[0][2].dim() else 0
        baseline, again = _call(ctx, args, kwargs, train=False), _call(ctx, args, kwargs, train=False)
        if baseline is None or again is None or not baseline[0] or _differs(baseline[0], again[0]):
            findings.data["summary"] = "the model's output is not repeatable under a reseeded RNG"
            return
        connected = _connected_calls(ctx, args, kwargs, train=False)
        if connected is None:
            return
        used, ignored = [], []
        for name, where, value in arguments:
            rolled = _rolled(value, samples)
            if rolled is None:
                continue  # the same for every sample (an all-ones mask): nothing to read
            moved = _call(ctx, *_with(args, kwargs, where, rolled), train=False)
            if moved is None:
                continue
            reached = _changed_calls(baseline[1], moved[1])
            if _differs(baseline[0], moved[0]):
                used.append(name)
            elif not connected.intersection(reached) and not connected.intersection(
                    _trainable_readers(ctx, args, kwargs, value)):
                ignored.append((name, where, value, rolled, reached))
        findings.data.update(arguments=[name for name, _, _ in arguments], used=used,
                             ignored_in_eval={name: sorted({layer for layer, _ in reached})
                                              for name, *_, reached in ignored})
        if len(used) >= 2 and not ignored:
            self._ignored_in_training(ctx, args, kwargs, arguments, used, samples, findings)
        if not used or not ignored:
            return
        train_baseline = _call(ctx, args, kwargs, train=True)
        train_connected = _connected_calls(ctx, args, kwargs, train=True)
        if train_baseline is None or train_connected is None:
            return
        for name, where, value, rolled, reached in ignored:
            moved = _call(ctx, *_with(args, kwargs, where, rolled), train=True)
            if moved is None or _differs(train_baseline[0], moved[0]) \
                    or train_connected.intersection(_changed_calls(train_baseline[1], moved[1])):
                continue
            if _mask_like(value):
                if mask_redundant(ctx, args, kwargs, arguments, value):
                    continue  # right padding under a causal model: the mask would hide nothing
                findings.warning(
                    "FORWARD_INPUT_IGNORED",
                    f"the model's forward never uses its argument '{name}', a padding mask ({_describe(value)}, "
                    f"0 on {float((value == 0).float().mean()):.0%} of its positions): other content under its zeros "
                    "changes the outputs at the real positions, so the padding is attended to and each sample's "
                    "result depends on how much padding its batch gave it (a mask accepted and never passed on to "
                    "the attention layers)",
                    f"Pass '{name}' to the attention: nn.TransformerEncoder(..., src_key_padding_mask={name} == 0), "
                    f"nn.MultiheadAttention(..., key_padding_mask={name} == 0), or scores.masked_fill({name}[:, None, "
                    "None, :] == 0, float('-inf')) before the softmax; pool over the real positions only.",
                    "model",
                )
                continue
            findings.data["summary"] = f"'{name}' never reaches the output"
            touched = list(dict.fromkeys(layer for layer, _ in reached))
            # Outermost first: 'encoder', not its sublayers in the order their hooks fired.
            layers = sorted((layer for layer in touched if not any(layer.startswith(outer + ".") for outer in touched)),
                            key=touched.index)
            shown = ", ".join(repr(layer) for layer in layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
            where_lost = (f"it reaches {shown}, whose result is computed and dropped: it is not in the autograd graph "
                          "of the output" if layers else "no layer's output changes either")
            rows = [v for _, _, v in arguments if v is not value and v.dim() >= 2]
            if rows and graph_assignment(value, int(rows[0].shape[0])):
                graphs = int(value.max()) + 1
                findings.warning(
                    "FORWARD_INPUT_IGNORED",
                    f"the model's forward never uses its argument '{name}', the node-to-graph assignment of a batch "
                    f"of {graphs} graphs ({_describe(value)}, sorted graph ids, one per node row): changing it leaves "
                    f"the output unchanged. The read-out then pools over every node of the batch at once (h.mean(0), "
                    f"h.sum(0), expanded to the graphs), so every graph of a batch gets the same prediction",
                    f"Pool per graph with '{name}': torch_geometric.nn.global_mean_pool(h, {name}), or "
                    f"torch.zeros(num_graphs, h.shape[1]).index_add_(0, {name}, h) divided by each graph's node count "
                    f"(torch.bincount({name})[:, None]) (scatter-mean).",
                    "model",
                )
                continue
            findings.warning(
                "FORWARD_INPUT_IGNORED",
                f"the model's forward never uses its argument '{name}' ({_describe(value)} that differs between "
                f"samples): giving each sample another sample's '{name}' leaves the output unchanged, in eval and "
                f"training mode, while changing '{used[0]}' does; {where_lost}. The model cannot condition on "
                f"it: forward accepts '{name}' and drops it (a timestep or class label never embedded, a second "
                "input whose branch reads the first input again, torch.cat([a, a]) where [a, b] is meant, a "
                "decoder's cross-attention given its own states instead of the encoder's memory), so it learns the "
                "best prediction without that input",
                f"Use '{name}' in forward: embed it and add or concatenate it to the features "
                f"(h = h + self.embed({name}), torch.cat([a, {name}], dim=-1)), pass the encoder's output as "
                "the decoder's memory, and check that each branch reads its own input variable.",
                "model",
            )

    @staticmethod
    def _ignored_in_training(ctx: PreflightContext, args: tuple, kwargs: dict,
                             arguments: list[tuple[str, Any, Any]], used: list[str], samples: int,
                             findings: Findings) -> None:
        """INPUT_IGNORED_IN_TRAINING: an argument evaluation reads that the training forward does
        not: a decoder run free in training (fed its own argmax, teacher_forcing_ratio=0 where 1
        was meant) while evaluation teacher-forces it, or an ``if self.training`` branch that drops
        the input. Training then never conditions on what the score is measured with."""
        baseline, again = _call(ctx, args, kwargs, train=True), _call(ctx, args, kwargs, train=True)
        if baseline is None or again is None or _differs(baseline[0], again[0]):
            return
        for name, where, value in arguments:
            if name not in used:
                continue
            rolled = _rolled(value, samples)
            moved = _call(ctx, *_with(args, kwargs, where, rolled), train=True) if rolled is not None else None
            if moved is None or _differs(baseline[0], moved[0]):
                continue
            findings.data["summary"] = f"'{name}' is read in eval mode only"
            findings.warning(
                "INPUT_IGNORED_IN_TRAINING",
                f"the model reads its argument '{name}' ({_describe(value)}) in eval mode, but in training mode "
                f"giving each sample another sample's '{name}' leaves the output unchanged: the training forward "
                "runs without it, a decoder fed its own argmax predictions (teacher_forcing_ratio = 0 where 1.0 was "
                "meant, a free-running loop) while evaluation teacher-forces it, or an `if self.training` branch "
                "that drops the input. Training then never conditions on what evaluation is scored with, and early "
                "steps train on the model's own garbage",
                f"Use '{name}' in training too: teacher-force the decoder (decoder(embed({name})) with the gold "
                "previous tokens); for scheduled sampling start at teacher_forcing_ratio=1.0 and lower it slowly.",
                "model",
            )
            return
