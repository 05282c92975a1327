"""Module structure that silently shrinks or freezes the model (``model.structure``).

- ``MODULE_REPEATED``: an ``nn.ModuleList``/``nn.Sequential`` that holds one module object
  several times: ``nn.ModuleList([block] * 6)`` or a list built by appending one instance
  in a loop. Its "6 layers" share one set of weights, so the model is a sixth of its
  declared size. Sharing on purpose (ALBERT) calls one module in a loop; it does not list
  it six times.
- ``FROZEN_AT_INIT``: frozen ``nn.Linear``/``nn.Conv*`` layers whose weights are exactly what
  PyTorch's default init draws (uniform within 1/sqrt(fan_in), a flat histogram): a
  backbone frozen for a linear probe or a fine-tune into which nothing was loaded
  (``load_state_dict(strict=False)`` matching no key, a ``module.`` prefix). Trained weights
  leave that box and lose the flat histogram within the first steps.
  Two such layers at least (one small stem loaded from weights that were themselves a fresh
  init looks the same); a frozen layer also held under another name (a teacher kept as
  ``[self.encoder]`` where ``copy.deepcopy`` was meant) is named as that alias.
- ``FROZEN_AT_ZERO``: a frozen parameter of two or more dims that holds only zeros (a learned
  position table left ``requires_grad=False``): it contributes nothing for the whole run.
- ``INIT_ALL_POSITIVE``: trainable Linear/Conv weights all in [0, 1) with U(0, 1)'s spread:
  ``nn.init.uniform_(w)`` without bounds.
- ``BN_MOMENTUM``: a BatchNorm whose ``momentum`` is 0 (its running statistics never move
  from their init, so evaluation normalises by mean 0 and variance 1), or 0.9 and above
  (Keras' convention, where momentum weighs the old statistics; in torch it weighs the new
  batch, so the running statistics are those of the last batch or two).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from optimus_preflight.preflight.analyses.init_state import MIN_INIT_VALUES, UNIFORM_STD, at_default_init
from optimus_preflight.preflight.analyses.meshgrid_source import (
    SwappedGrids,
    grid_orientation,
    swapped_grids,
    user_code,
)
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.sharding import held_whole

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

KERAS_MOMENTUM = 0.9
UNIFORM_01_STD = 12 ** -0.5  # std of U(0, 1)
MIN_ZERO_VALUES = 16  # a frozen all-zero tensor at least this large is a table, not a scalar gate


def at_default_normal(weight: torch.Tensor) -> bool:
    """``weight`` looks drawn by nn.Embedding's default init, N(0, 1) (pure)."""
    if weight.numel() < MIN_INIT_VALUES:
        return False
    values = weight.detach().float()
    return abs(float(values.mean())) < 0.1 and abs(float(values.std()) - 1.0) < 0.05 and float(values.abs().max()) < 7


def at_default_uniform(weights: list[torch.Tensor], bound: float) -> bool:
    """The tensors look drawn by a recurrent layer's default init, U(-bound, bound) (pure)."""
    values = torch.cat([w.detach().float().reshape(-1) for w in weights])
    if values.numel() < MIN_INIT_VALUES or float(values.abs().max()) > bound * (1 + 1e-5):
        return False
    return abs(float(values.std()) / bound - UNIFORM_STD) < 0.05 * UNIFORM_STD


def at_normal_init(module: nn.Module, std: float) -> bool:
    """A layer as Hugging Face's _init_weights leaves it: weight ~ N(0, initializer_range),
    bias all zeros (pure)."""
    weight, bias = module.weight, getattr(module, "bias", None)
    if weight.numel() < MIN_INIT_VALUES or std <= 0:
        return False
    values = weight.detach().float()
    return (abs(float(values.std()) / std - 1) < 0.1 and abs(float(values.mean())) < 0.1 * std
            and (bias is None or not bool(bias.detach().any())))


def copy_of_trained(model: nn.Module, weight: torch.Tensor) -> bool:
    """A frozen copy of a part that trains (an EMA / mean-teacher shadow made by deepcopy) starts
    equal to it, at the init the trained part starts from too: no random features (pure)."""
    return any(p.requires_grad and p.shape == weight.shape and torch.equal(p.detach(), weight.detach())
               for p in model.parameters())


def frozen_at_init(model: nn.Module, min_layers: int = 2, hf_init: bool = False) -> tuple[list[str], int]:
    """Names of frozen Linear/Conv/Embedding/RNN layers still at the default init (PyTorch's, and
    with ``hf_init`` Hugging Face's normal init for a model with a config), and the values they
    hold; none when fewer than ``min_layers`` are. A Hugging Face model built from a config with a
    frozen encoder is a common toy: its init is read only where every weight matrix is frozen."""
    names, values, tables = [], 0, 0
    hf_std = getattr(getattr(model, "config", None), "initializer_range", None) if hf_init else None
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            weights = [module.weight]
            fresh = not module.weight.requires_grad and (
                at_default_init(module.weight)
                or (isinstance(hf_std, float) and isinstance(module, nn.Linear) and at_normal_init(module, hf_std)))
        elif isinstance(module, nn.Embedding):
            weights = [module.weight]
            fresh = not module.weight.requires_grad and module.padding_idx is None and at_default_normal(module.weight)
        elif isinstance(module, nn.RNNBase):
            weights = list(module.parameters(recurse=False))
            fresh = bool(weights) and not any(p.requires_grad for p in weights) \
                and at_default_uniform(weights, module.hidden_size ** -0.5)
        else:
            continue
        if fresh and not copy_of_trained(model, weights[0]):
            names.append(name or type(module).__name__)
            values += sum(p.numel() for p in weights)
            tables += isinstance(module, nn.Embedding)
    if tables == len(names) or len(names) < min_layers:
        # An N(0, 1) table alone proves nothing: vectors loaded with from_pretrained(freeze=True) may
        # be drawn that way too. Beside a frozen layer still at its init, it is part of the same story.
        # Nor does one small frozen layer: a stem loaded from weights that were themselves a fresh
        # init looks the same; a backbone nothing was loaded into has several.
        return [], 0
    return names, values


def frozen_random_head(model: nn.Module) -> str | None:
    """The name of the model's output layer (its last registered Linear) when it is frozen at
    PyTorch's default init while other parameters train (pure)."""
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        return None
    name, head = linears[-1]
    if head.weight.requires_grad or not at_default_init(head.weight) or copy_of_trained(model, head.weight):
        return None
    others = [p for p in model.parameters() if p.requires_grad and p is not head.weight and p is not head.bias]
    return name if others else None


def aliases(model: nn.Module, names: list[str]) -> list[tuple[str, str]]:
    """(name, other name) for each of ``names`` that the model also holds under another
    attribute (``teacher = model.encoder``, where ``copy.deepcopy`` was meant)."""
    seen: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        seen.setdefault(id(module), []).append(name)
        # Held outside the registered children too: a teacher kept in a plain list or attribute.
        for attribute, value in vars(module).items():
            held = [(f"{attribute}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, (list, tuple)) \
                else [(attribute, value)] if isinstance(value, nn.Module) and not attribute.startswith("_") else []
            for label, other in held:
                if isinstance(other, nn.Module) and id(other) != id(module):
                    seen.setdefault(id(other), []).append(f"{name}.{label}" if name else label)
    modules = dict(model.named_modules())
    found = []
    for name in names:
        parts = name.split(".")
        # The layer itself or a module that holds it (the whole encoder aliased).
        for prefix in (".".join(parts[:end]) for end in range(len(parts), 0, -1)):
            module = modules.get(prefix)
            if module is not None and len(seen.get(id(module), [])) > 1:
                found.append((prefix, next(other for other in seen[id(module)] if other != prefix)))
                break
    return found


def repeated_children(model: nn.Module) -> list[tuple[str, str, int]]:
    """(container name, child class, times listed) for containers listing one object twice or more."""
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module._modules.values())
        counts: dict[int, int] = {}
        for child in children:
            if child is not None and any(True for _ in child.parameters()):
                counts[id(child)] = counts.get(id(child), 0) + 1
        for child in children:
            if child is not None and counts.get(id(child), 0) > 1:
                found.append((name or type(module).__name__, type(child).__name__, counts[id(child)]))
                break
    return found


def requires_grad_attributes(model: nn.Module) -> list[tuple[str, bool, int]]:
    """(module name, the value set, its parameters that disagree) for modules given a plain
    ``requires_grad`` attribute (``layer.requires_grad = True``): nn.Module has none, so the
    assignment only adds an attribute and no parameter changes (pure)."""
    found = []
    for name, module in model.named_modules():
        value = vars(module).get("requires_grad")
        if not isinstance(value, bool):
            continue
        disagree = sum(1 for p in module.parameters() if p.requires_grad != value)
        if disagree:
            found.append((name or "the model", value, disagree))
    return found



def frozen_adapter_pair(model: nn.Module) -> tuple[str, str] | None:
    """(random-init weight, all-zero weight) of two frozen matrices under one parent module whose
    shapes chain (down: (r, d_in), up: (d_out, r)): a LoRA pair whose B starts at zero, frozen."""
    by_parent: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, p in model.named_parameters():
        if p.dim() == 2 and not p.requires_grad and held_whole(p):
            parent = name.rsplit(".", 2)[0] if name.count(".") >= 2 else ""
            by_parent.setdefault(parent, []).append((name, p))
    for members in by_parent.values():
        zeros = [(n, p) for n, p in members if not bool(p.detach().any())]
        random = [(n, p) for n, p in members if bool(p.detach().any())]
        for zero_name, zero in zeros:
            for random_name, other in random:
                if zero.shape[1] == other.shape[0] and zero.shape[1] < min(zero.shape[0], other.shape[1]):
                    return random_name, zero_name
    return None

class ModuleStructureCheck(Check):
    """MODULE_REPEATED: one module object listed several times; BN_MOMENTUM: Keras-style or zero
    momentum; FROZEN_AT_INIT: frozen layers nothing was loaded into."""

    name = "model.structure"
    stage = Stage.MODEL
    codes = ("MODULE_REPEATED", "BN_MOMENTUM", "FROZEN_AT_INIT", "ACTIVATION_LINEAR", "ONLY_BIASES_TRAIN",
             "FROZEN_AT_ZERO", "INIT_ALL_POSITIVE", "REQUIRES_GRAD_ON_MODULE", "MESHGRID_NAMES_SWAPPED",
             "SIZE_ATTRIBUTE_CHANGED")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        self._resized_by_attribute(ctx, findings)
        self._swapped_grids(ctx, findings)
        self._initial_values(ctx, findings)
        self._requires_grad_attribute(ctx, findings)
        matrices = [p for p in ctx.model.parameters() if p.dim() >= 2]
        named = list(ctx.model.named_parameters())
        trainable = [name for name, p in named if p.requires_grad]
        only_biases = bool(matrices) and not any(p.requires_grad for p in matrices) and bool(trainable)
        # Every weight frozen: one layer at its init already tells the story.
        at_init, values = frozen_at_init(ctx.model, min_layers=1 if only_biases else 2, hf_init=only_biases)
        if at_init and only_biases:
            if trainable == [named[-1][0]]:
                cause = (f"Only the very last parameter, {trainable[0]}, trains: list(model.parameters())[:-1] (or a "
                         "slice of named_parameters()) meant as 'everything but the head' also froze the head's "
                         "weight, since parameters() ends with the head's weight and then its bias")
                fix = ("Freeze by module, not by a slice of the parameter list: for p in model.backbone.parameters(): "
                       "p.requires_grad_(False), leaving the head's weight and bias trainable.")
            elif (pair := frozen_adapter_pair(ctx.model)) is not None:
                cause = (f"Frozen low-rank adapters are among them: '{pair[1]}' holds only zeros beside '{pair[0]}' at "
                         "its random init under one parent, LoRA's up and down projections (B starts at zero), so the "
                         "adapters stay frozen and only the norm and bias parameters train: the filter that picks the "
                         "trainable parameters by name ('lora' in n) matched none of these adapters")
                fix = ("Select the adapters by their own names or type (for n, p in model.named_parameters(): "
                       "p.requires_grad = any(k in n for k in ('down', 'up')), or isinstance(module, LoRALinear)), and "
                       "print [n for n, p in model.named_parameters() if p.requires_grad] after freezing.")
            else:
                head = next((n for n, m in reversed(list(ctx.model.named_modules())) if isinstance(m, nn.Linear)), None)
                named_head = (f" The output layer '{head}' is frozen too: a freeze that keeps parameters by name "
                              "('head' in n, 'fc' in n, 'norm' in n) misses a head this model names otherwise "
                              "(Hugging Face's ViT and BERT call it 'classifier', timm 'head', torchvision 'fc'). "
                              if head else " ")
                cause = (named_head.lstrip() + "A helper that picks modules with hasattr(m, 'weight') (every Conv and "
                         "Linear has one) where isinstance(m, nn.BatchNorm2d) was meant does this too")
                fix = ("Select what trains by this model's own names or types (print [n for n, _ in "
                       "model.named_parameters()] first; e.g. model.classifier for a Hugging Face head), and print "
                       "[n for n, p in model.named_parameters() if p.requires_grad] after freezing.")
            findings.warning(
                "ONLY_BIASES_TRAIN",
                f"every weight matrix of the model ({len(matrices)} conv/linear/embedding weights) is frozen "
                "(requires_grad=False) and only biases and normalisation parameters train, while frozen layers "
                f"({', '.join(at_init[:4])}) are still at their random init: a freeze meant for a few layers "
                f"caught them all. {cause}",
                fix,
            )
        elif at_init and (shared := aliases(ctx.model, at_init)):
            name, other = shared[0]
            findings.warning(
                "FROZEN_AT_INIT",
                f"{len(at_init)} frozen layer(s) ({', '.join(at_init[:4])}; {values:,} weights) are still at PyTorch's "
                f"random init, and '{name}' is the same module object as '{other}': an alias (teacher = "
                "model.encoder) where a copy was meant, so freezing one froze the other; the two share the same "
                "parameters, and the part that should train never does",
                f"Make the second one a copy: self.{other.split('.')[0]} = copy.deepcopy(...) of the module, then "
                "freeze the copy (requires_grad_(False)) and update it by EMA if it is a mean teacher.",
            )
        elif not at_init and (head := frozen_random_head(ctx.model)) is not None:
            trains = [name for name, p in named if p.requires_grad]
            findings.warning(
                "FROZEN_AT_INIT",
                f"the output layer '{head}' is frozen (requires_grad=False) and holds exactly what PyTorch's default "
                f"init draws: a random head that never trains, while {len(trains)} other parameter tensor(s) do "
                f"({', '.join(trains[:3])}{' ...' if len(trains) > 3 else ''}). The model's predictions stay a fixed "
                "random projection of what the trained part learns. Usually a freeze by name that keeps another "
                "model's head name ('fc' in n, the ResNet recipe, on a model whose head is 'classifier' or 'head'), "
                "which also leaves layers trainable that merely contain the substring",
                f"Unfreeze the head by module: model.{head}.requires_grad_(True) (and select the layers to train by "
                "this model's own names: print [n for n, _ in model.named_parameters()]), then build the optimizer.",
            )
        elif at_init:
            # A note: a whole frozen network at its init is a failed load in a real run, and exactly what
            # a frozen backbone or teacher built from a config for a test or a random-feature baseline is.
            shown = ", ".join(at_init[:4]) + (" ..." if len(at_init) > 4 else "")
            findings.info(
                "FROZEN_AT_INIT",
                f"{len(at_init)} frozen layer(s) ({shown}; {values:,} weights) hold exactly what PyTorch's default "
                "init draws (uniform within 1/sqrt(fan_in); N(0, 1) for an Embedding): nothing was loaded into them, "
                "so the frozen part computes random features. If pretrained weights were meant: usually a "
                "load_state_dict(..., strict=False) whose keys matched nothing (a 'module.' prefix from DataParallel, "
                "another model's names), or a freeze flag that is set when it should not be (argparse type=bool reads "
                "--freeze False as True: bool('False') is True)",
                "Load with strict=True to see the missing and unexpected keys (strip a 'module.' prefix: "
                "{k.removeprefix('module.'): v for k, v in state.items()}), or unfreeze the layers if they are "
                "meant to train from scratch.",
            )
        if not matrices and trainable:
            self._weights_as_buffers(ctx, findings)
        linear = [name for name, m in ctx.model.named_modules()
                  if isinstance(m, nn.LeakyReLU) and float(m.negative_slope) == 1.0]
        if linear:
            shown = ", ".join(linear[:4]) + (" ..." if len(linear) > 4 else "")
            findings.warning(
                "ACTIVATION_LINEAR",
                f"{len(linear)} LeakyReLU layer(s) ({shown}) have negative_slope=1.0: they pass every value "
                "unchanged, so the layers around them compose into one linear map and the network cannot fit "
                "anything non-linear. nn.LeakyReLU(True) does this: its first argument is negative_slope (True "
                "is 1), not inplace as in nn.ReLU(True)",
                "Name the arguments: nn.LeakyReLU(negative_slope=0.01, inplace=True) (or nn.LeakyReLU(0.2)).",
            )
        repeated = repeated_children(ctx.model)
        for container, kind, times in repeated[:1]:
            findings.warning(
                "MODULE_REPEATED",
                f"'{container}' lists one {kind} object {times} times ([layer] * n, or one instance appended in a "
                f"loop): the {times} entries share a single set of weights, so the model trains one {kind} where "
                f"it declares {times}",
                f"Build a new module per entry: nn.ModuleList([{kind}(...) for _ in range(n)]) (or copy.deepcopy "
                "of a template per entry). To share weights on purpose, keep one module and call it in a loop.",
            )
        norms = [(name, m.momentum) for name, m in ctx.model.named_modules()
                 if isinstance(m, _BatchNorm) and m.track_running_stats and m.momentum is not None
                 and (m.momentum == 0 or m.momentum >= KERAS_MOMENTUM)]
        findings.data["summary"] = f"{len(repeated)} container(s) repeating a module, {len(norms)} BatchNorm momentum issue(s)"
        if norms:
            name, momentum = norms[0]
            effect = ("its running statistics never move from mean 0 and variance 1, so evaluation normalises "
                      "every feature wrongly" if momentum == 0 else
                      "torch's momentum is the weight of the NEW batch (Keras' is the weight of the old statistics), "
                      "so the running statistics are those of the last batch or two and evaluation is noisy")
            findings.warning(
                "BN_MOMENTUM",
                f"{len(norms)} BatchNorm layer(s) have momentum={momentum:g} (first: '{name}'): {effect}",
                "Use torch's default momentum=0.1 (Keras' momentum=0.99 is torch's momentum=0.01), or momentum=None "
                "for a cumulative average.",
            )

    @staticmethod
    def _weights_as_buffers(ctx: PreflightContext, findings: Findings) -> None:
        """A model whose parameters are all vectors (biases, norms) while its matrices are
        floating buffers: register_buffer (chosen so .to() moves them) keeps them out of
        parameters(), so no optimizer ever updates them."""
        buffers = [(name, b) for name, b in ctx.model.named_buffers() if b.is_floating_point() and b.dim() >= 2]
        trained = sum(p.numel() for p in ctx.model.parameters() if p.requires_grad)
        held = sum(b.numel() for _, b in buffers)
        if not buffers or held < trained:
            return
        shown = ", ".join(f"{name} {tuple(b.shape)}" for name, b in buffers[:4]) + (" ..." if len(buffers) > 4 else "")
        findings.warning(
            "ONLY_BIASES_TRAIN",
            f"the model has no weight matrix among its parameters: its {len(buffers)} matrix-shaped tensor(s) "
            f"({shown}; {held:,} values) are buffers, registered with register_buffer, so parameters() and the "
            f"optimizer never see them and only {trained:,} bias/scale values train. register_buffer is for state "
            "that must not train (running statistics, fixed tables); a weight kept there to move with .to() or "
            "to be saved stays at its init",
            "Make the weights parameters: self.weight = nn.Parameter(torch.randn(...) * scale) (parameters also "
            "move with .to() and are saved in the state_dict), then rebuild the optimizer on model.parameters().",
        )

    @staticmethod
    def _requires_grad_attribute(ctx: PreflightContext, findings: Findings) -> None:
        found = requires_grad_attributes(ctx.model)
        if not found:
            return
        names = ", ".join(f"'{name}'" for name, _, _ in found[:4]) + (" ..." if len(found) > 4 else "")
        value = found[0][1]
        frozen = sum(count for _, _, count in found)
        effect = ("they stay frozen and never train" if value else "they keep training though meant to be frozen")
        findings.warning(
            "REQUIRES_GRAD_ON_MODULE",
            f"module(s) {names} were given requires_grad = {value} as a plain attribute, but nn.Module has no such "
            f"flag: the assignment only adds an attribute, and {frozen} of their parameters still have requires_grad="
            f"{not value}, so {effect}. Unfreezing the top layers with layer.requires_grad = True does this",
            f"Set the flag on the parameters: module.requires_grad_({value}) (or for p in module.parameters(): "
            f"p.requires_grad = {value}), and build the optimizer from the parameters that train after that.",
            "model",
        )

    @staticmethod
    def _resized_by_attribute(ctx: PreflightContext, findings: Findings) -> None:
        found = size_attributes_changed(ctx.model)
        if not found:
            return
        name, attribute, said, actual, layer = found[0]
        findings.warning(
            "SIZE_ATTRIBUTE_CHANGED",
            f"{name}.{attribute} is {said} but the layer's weight has {actual} there: the attribute was assigned "
            f"after the layer was built ({name}.{attribute} = {said}), which changes the number only; the weight "
            f"keeps its shape, so the layer still computes {actual} {'outputs' if attribute.startswith('out') else 'values'}"
            + (f" (a head re-targeted to {said} classes still emits {actual} logits, and the classes it no longer "
               "has keep competing for the argmax)" if attribute == "out_features" else "")
            + (f" ({len(found)} layers)" if len(found) > 1 else ""),
            f"Replace the layer instead of editing its attribute: model.{name} = {layer}, before the optimizer is "
            "built on the model's parameters.",
        )

    @staticmethod
    def _swapped_grids(ctx: PreflightContext, findings: Findings) -> None:
        found = [grids for obj in user_code(ctx.model, ctx.compute_loss) for grids in swapped_grids(obj)
                 if _grids_built_so(ctx.model, obj, grids)]
        if not found:
            return
        first = found[0]
        rows, columns = ("x", "y") if first.indexing == "ij" else ("y", "x")
        findings.warning(
            "MESHGRID_NAMES_SWAPPED",
            f"{first.where} builds coordinate grids with '{first.line}': with indexing='{first.indexing}'"
            + (" (torch.meshgrid's default)" if "indexing" not in first.line else "")
            + f" the first grid varies along the {'rows' if first.indexing == 'ij' else 'columns'}, so the grid named "
            f"{rows} holds {'row' if first.indexing == 'ij' else 'column'} coordinates and the one named {columns} "
            f"{'column' if first.indexing == 'ij' else 'row'} ones: x and y are swapped wherever they are used (a "
            "soft-argmax returns (row, column) for (x, y) targets, a coordinate channel is transposed). NumPy's "
            "np.meshgrid defaults to 'xy'; torch.meshgrid to 'ij'"
            + (f" ({len(found)} such lines)" if len(found) > 1 else ""),
            "Unpack in the order the indexing gives: yy, xx = torch.meshgrid(ys, xs, indexing='ij'), or "
            "xx, yy = torch.meshgrid(xs, ys, indexing='xy') as np.meshgrid does.",
        )

    @staticmethod
    def _initial_values(ctx: PreflightContext, findings: Findings) -> None:
        frozen_zero = [name for name, p in ctx.model.named_parameters()
                       if not p.requires_grad and p.is_floating_point() and p.dim() >= 2 and p.numel() >= MIN_ZERO_VALUES
                       and not bool(p.detach().any())]
        if frozen_zero:
            findings.warning(
                "FROZEN_AT_ZERO",
                f"{len(frozen_zero)} frozen parameter(s) ({', '.join(frozen_zero[:4])}) hold only zeros and have "
                "requires_grad=False: they add or multiply nothing, now and for the whole run. A learned position "
                "table created as nn.Parameter(torch.zeros(...), requires_grad=False), the flag kept from the fixed "
                "sinusoidal table it replaced, leaves the model with no position information (self-attention is then "
                "permutation-invariant)",
                "Let it train (requires_grad=True, and put it in the optimizer), or fill it with the fixed values it "
                "is meant to hold (a sinusoidal table, register_buffer) before freezing it.",
            )
        positive = [name for name, module in ctx.model.named_modules()
                    if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) and module.weight.requires_grad
                    and module.weight.numel() >= MIN_INIT_VALUES and _all_positive_init(module.weight)]
        if positive:
            findings.warning(
                "INIT_ALL_POSITIVE",
                f"{len(positive)} layer(s) ({', '.join(positive[:4])}) start with every weight positive, spread over "
                "[0, 1): nn.init.uniform_(w) without bounds draws from U(0, 1) (a=0, b=1 are its defaults), not a "
                "small symmetric range. Every unit of a layer then computes nearly the same large positive sum, the "
                "activations grow layer by layer and the units stay alike",
                "Give the range (nn.init.uniform_(w, -bound, bound) with bound = 1 / sqrt(fan_in)), or use the "
                "layer's default init (kaiming_uniform_) or nn.init.xavier_uniform_.",
            )


SIZE_ATTRIBUTES = ((nn.Linear, "out_features", 0), (nn.Linear, "in_features", 1),
                   ((nn.Conv1d, nn.Conv2d, nn.Conv3d), "out_channels", 0), (nn.Embedding, "num_embeddings", 0))


def size_attributes_changed(model: nn.Module) -> list[tuple[str, str, int, int, str]]:
    """(layer name, attribute, its value, the weight's size there, the layer to build instead) for
    Linear/Conv/Embedding layers whose size attribute disagrees with their weight: the attribute
    was assigned after construction (``fc.out_features = 4``), which resizes nothing (pure)."""
    found = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        # Packed quantised weights (bitsandbytes' 4-bit Linear) have their own shape on purpose.
        if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or not weight.is_floating_point():
            continue
        for kind, attribute, axis in SIZE_ATTRIBUTES:
            said = getattr(module, attribute, None)
            actual = int(weight.shape[axis])
            if not isinstance(module, kind) or not isinstance(said, int) or said == actual:
                continue
            if isinstance(module, nn.Linear):
                out_size = said if attribute == "out_features" else int(weight.shape[0])
                in_size = said if attribute == "in_features" else int(weight.shape[1])
                layer = f"nn.Linear({in_size}, {out_size})"
            elif isinstance(module, nn.Embedding):
                layer = f"nn.Embedding({said}, {int(weight.shape[1])})"
            else:
                layer = f"nn.{type(module).__name__}({module.in_channels}, {said}, {module.kernel_size})"
            found.append((name or type(module).__name__, attribute, said, actual, layer))
    return found


def _grids_built_so(model: nn.Module, owner: object, grids: SwappedGrids) -> bool:
    """Whether the swapped line is what built the model's grids: the x grid kept on a module of
    that class lies along the rows (under 'ij'), or, where it was not kept, the line is not one
    branch of an if whose other branch may build them right."""
    kept = [getattr(module, grids.x_name, None) for module in model.modules() if type(module) is owner]
    orientations = {grid_orientation(tensor) for tensor in kept} - {None}
    if orientations:
        return orientations == {"rows" if grids.indexing == "ij" else "columns"}
    return not grids.conditional


def _all_positive_init(weight: torch.Tensor) -> bool:
    """Every value in [0, 1) and spread like U(0, 1): far beyond any default init's 1/sqrt(fan_in)."""
    values = weight.detach().float()
    return float(values.min()) >= 0 and float(values.max()) < 1 and abs(float(values.std()) - UNIFORM_01_STD) < 0.05
