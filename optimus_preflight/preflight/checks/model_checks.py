"""Model and optimizer wiring: what the optimizer updates, modes, weight decay, eps."""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from optimus_preflight.config.lenient import as_float
from optimus_preflight.preflight.analyses.probe import mode_sensitive_modules
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.distributed import unwrap
from optimus_preflight.training.learnable import loss_tensors, unregistered_tensors

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

HALF = (torch.float16, torch.bfloat16)
NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm)


def _whole_modules(missing: list[str], every: list[str]) -> list[str]:
    """The modules (name prefixes) all of whose parameters are among ``missing``, outermost first."""
    gone = set(missing)
    found: list[str] = []
    for name in missing:
        parts = name.split(".")[:-1]
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            if all(n in gone for n in every if n.startswith(prefix + ".")):
                if prefix not in found and not any(prefix.startswith(f + ".") for f in found):
                    found.append(prefix)
                break
    return found


def _names(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


# Group keys torch's schedulers and SWA, and common libraries (layer-wise decay, named
# groups), add on purpose: read by someone other than the optimizer's step.
GROUP_KEYS_ON_PURPOSE = frozenset({
    "params", "initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum", "swa_lr", "name", "names",
    "param_names", "lr_scale", "layer_id",
})
# Another optimizer's (or framework's) name for a key torch's optimizers read, in order of
# preference: the first one the optimizer's defaults hold is meant.
KEY_ALIASES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr",), "learningrate": ("lr",), "lr_rate": ("lr",), "base_lr": ("lr",),
    "wd": ("weight_decay",), "weight_decay_rate": ("weight_decay",), "l2": ("weight_decay",),
    "l2_reg": ("weight_decay",), "decay_rate": ("weight_decay",),
    "epsilon": ("eps",), "adam_epsilon": ("eps",), "adam_eps": ("eps",),
    "beta1": ("betas", "momentum"), "beta_1": ("betas", "momentum"), "adam_beta1": ("betas",),
    "beta2": ("betas",), "beta_2": ("betas",), "adam_beta2": ("betas",), "beta": ("betas", "momentum"),
    "momentum": ("betas",),  # Adam's momentum is betas[0]
    "betas": ("momentum",),  # SGD's is momentum
}
SECOND_BETA = {"beta2", "beta_2", "adam_beta2"}
LAYER_DECAY_MAX = 0.3  # per-group LR ratio at or below this, three groups or more: a decay given as the share lost
CLOSE_MATCH = 0.8  # difflib ratio: 'weight_decy', 'momentun', 'damping' (0.88); 'lr_mult' and 'decay_mult' stay out


def misnamed_group_keys(group: dict[str, Any], defaults: dict[str, Any]) -> dict[str, str]:
    """{key the group holds: the key the optimizer reads that it misnames}, for keys
    outside the optimizer's defaults that alias or misspell one of them."""
    found = {}
    for key in group:
        if not isinstance(key, str) or key in defaults or key in GROUP_KEYS_ON_PURPOSE:
            continue
        real = next((alias for alias in KEY_ALIASES.get(key.lower(), ()) if alias in defaults), None)
        if real is None:
            close = difflib.get_close_matches(key.lower(), [name for name in defaults if isinstance(name, str)],
                                              n=1, cutoff=CLOSE_MATCH)
            real = close[0] if close else None
        if real is not None:
            found[key] = real
    return found


def _meant(group: dict[str, Any], misnamed: dict[str, str]) -> dict[str, Any]:
    """The real keys with the values the misnamed ones meant (beta1/beta2 folded into betas)."""
    meant: dict[str, Any] = {}
    for key, real in misnamed.items():
        value = group[key]
        current = meant.get(real, group.get(real))
        if real == "betas" and not isinstance(value, (tuple, list)) and isinstance(current, (tuple, list)):
            pair = list(current)
            pair[1 if key.lower() in SECOND_BETA else 0] = value
            value = tuple(pair)
        elif real == "momentum" and isinstance(value, (tuple, list)) and value:
            value = value[0]
        meant[real] = value
    return meant


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)



def sinusoidal_table(weight: torch.Tensor) -> bool:
    """Whether an embedding holds fixed sin/cos position encodings (Whisper's and Marian's
    embed_positions, frozen by the model itself): each row's column pairs, halves or
    interleaved, lie on the unit circle."""
    if weight.dim() != 2 or weight.shape[1] % 2 or weight.shape[0] < 2:
        return False
    table = weight.detach().float()
    half = table.shape[1] // 2
    for first, second in ((table[:, :half], table[:, half:]), (table[:, 0::2], table[:, 1::2])):
        if float((first.square() + second.square() - 1).abs().max()) < 1e-3:
            return True
    return False


def frozen_by_shared_name(frozen_in: list[str], frozen_out: list[str]) -> tuple[str, str, str] | None:
    """(name part, the parent meant, the parent caught) where every frozen parameter the optimizer
    holds has a module name part (``encoder``) that frozen parameters it leaves out have too, under
    another parent: ``teacher.encoder`` left out, ``student.encoder`` handed to the optimizer, a
    freeze by ``'encoder' in name`` that caught both (pure)."""
    def parts(name: str) -> list[str]:
        return [part for part in name.split(".")[:-1] if not part.isdigit()]

    if not frozen_in or not frozen_out:
        return None
    common = set(parts(frozen_in[0])).intersection(*(parts(name) for name in frozen_in[1:]))
    for part in sorted(common):
        caught = frozen_in[0].split(".")[0]
        if caught == part or not all(name.split(".")[0] == caught for name in frozen_in):
            continue
        meant = next((name.split(".")[0] for name in frozen_out if part in parts(name)
                      and name.split(".")[0] not in (caught, part)), None)
        if meant is not None:
            return part, meant, caught
    return None

class OptimizerParamsCheck(Check):
    """O2 trainable params not in the optimizer; O17 frozen params in it; a param in two
    groups; group keys the optimizer never reads (misnamed); SGD's dampening."""

    name = "model.optimizer_params"
    stage = Stage.MODEL
    codes = ("O2", "O17", "OPT_DUPLICATE_PARAM", "OPTIM_GROUP_UNKNOWN_KEY", "SGD_DAMPENING", "LR_LAYER_DECAY", "RPROP_MINIBATCH",
             "EMPTY_PARAM_GROUP")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        names = {param: name for name, param in ctx.model.named_parameters()}
        # Learnable tensors outside model.parameters() that the optimizer rightly holds (a
        # loss module's weights) or that model.unregistered_tensors reports: not copies.
        loose = {id(tensor) for _, tensor in [*unregistered_tensors(ctx.model), *loss_tensors(ctx.compute_loss, ctx.model)]}
        in_optimizer: dict[torch.Tensor, int] = {}
        repeated: list[str] = []
        foreign = 0
        for group in ctx.optimizer.param_groups:
            for param in group["params"]:
                if param in in_optimizer:
                    repeated.append(names.get(param, "<not a model parameter>"))
                in_optimizer[param] = in_optimizer.get(param, 0) + 1
                foreign += param not in names and id(param) not in loose
        missing = [name for param, name in names.items() if param.requires_grad and param not in in_optimizer]
        frozen = [name for param, name in names.items() if not param.requires_grad and param in in_optimizer]
        findings.data.update(model_params=len(names), optimizer_params=len(in_optimizer), missing=len(missing),
                             frozen_in_optimizer=len(frozen), foreign=foreign)
        findings.data["summary"] = f"{len(in_optimizer)} tensors in {len(ctx.optimizer.param_groups)} group(s)"
        if missing:
            modules = _whole_modules(missing, list(names.values()))
            whole = f" (all of {', '.join(repr(m) for m in modules[:3])})" if modules else ""
            groups = len(ctx.optimizer.param_groups)
            held = [name for param, name in names.items() if param in in_optimizer]
            copy = ""
            replaced = bool(modules) and bool(held) and foreign == len(missing)
            if replaced:
                shown = ", ".join(repr(m) for m in modules[:3])
                copy = (f" {shown} was replaced after the optimizer was built (model.{modules[0]} = nn.Linear(...) "
                        "for a new output size, after torch.optim.Adam(model.parameters())): the optimizer still "
                        f"holds the {foreign} tensor(s) of the old module, which are no longer in the model, and "
                        "updates them, while the new one keeps its random initial weights for the whole run.")
            elif held and len(frozen) == len(held):
                copies = _whole_modules(frozen, list(names.values()))
                shown = f"all of {', '.join(repr(m) for m in copies[:3])}" if copies else _names(frozen, 3)
                example = (f"torch.optim.Adam(model.{copies[0]}.parameters()) where model.{modules[0]}.parameters() "
                           "was meant" if copies and modules else
                           "torch.optim.Adam(model.ema.parameters()) where model.net.parameters() was meant")
                copy = (f" The optimizer holds only frozen parameters ({shown}): it was built over a frozen copy of the "
                        "network (a target network, an EMA / moving-average shadow, a teacher) instead of the network "
                        f"that trains, e.g. {example}.")
            elif held and modules and (built_from := _whole_modules(held, list(names.values()))) \
                    and all(any(name.startswith(module + ".") for module in built_from) for name in held):
                # Exactly some submodules' parameters are held: the optimizer was built from them.
                source = " + ".join(f"list(model.{module}.parameters())" for module in built_from[:2])
                copy = (f" The optimizer holds exactly the parameters of {', '.join(repr(m) for m in built_from[:3])}: "
                        f"it was built from {source if len(built_from) > 1 else f'model.{built_from[0]}.parameters()'} "
                        f"where model.parameters() was meant, so {', '.join(repr(m) for m in modules[:3])} keep(s) "
                        "its random initial weights for the whole run (only one tower or half of the network "
                        "trains).")
            findings.error(
                "O2",
                f"{_names(missing)}{whole}: {len(missing)} trainable parameter(s) not in the optimizer, never updated."
                f"{copy} The optimizer was built before these were added or replaced (a new head attached after the "
                "optimizer), or from a parameter list that leaves them out (a param group built for them and never "
                f"appended to the list of {groups} group(s) passed, a name filter that misses them, a slice of the "
                "parameters)",
                "Build the optimizer after the model is complete (after adding heads, after .to(device)) from "
                "[p for p in model.parameters() if p.requires_grad]; with param groups, check that every group "
                "you build is in the list passed to the optimizer.",
                "optimizer",
            )
        replaced_module = bool(missing) and bool(_whole_modules(missing, list(names.values()))) \
            and foreign == len(missing) and len(in_optimizer) > foreign
        if foreign and not replaced_module:
            trainable = [name for param, name in names.items() if param.requires_grad]
            none_held = bool(trainable) and len(missing) == len(trainable)
            findings.error(
                "O2",
                (f"none of the model's {len(trainable)} trainable parameters are in the optimizer, which holds "
                 f"{foreign} tensor(s) of another model object: an earlier instance. The model was created again "
                 "after the optimizer was built on the old one (a notebook cell re-run, a model rebuilt or reloaded), "
                 "so every step updates the discarded copy and this model never changes"
                 if none_held else
                 f"the optimizer holds {foreign} tensor(s) that are not parameters of the model: it updates copies "
                 "(an optimizer built before the model was replaced or re-created)"),
                "Build the optimizer from the final model's parameters.",
                "optimizer",
            )
        aliases: dict[int, list[str]] = {}
        for name, param in ctx.model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(name)
        tied = [f"{name} (= {', '.join(other for other in aliases[id(param)] if other != name)})"
                for param, name in names.items() if not param.requires_grad and param in in_optimizer
                and len(aliases.get(id(param), [])) > 1]
        if tied:
            findings.warning(
                "O17",
                f"{len(frozen)} frozen parameter(s) (requires_grad=False) are in the optimizer, and {_names(tied, 3)} "
                "is one tensor under several names (tied weights): freezing it under one name froze it under all. "
                "Freezing a transformer whose embedding is tied to the LM head (tie_word_embeddings) freezes the "
                "head the optimizer was given, so that head never trains",
                "Keep the tied tensor trainable (freeze the other modules one by one, skipping the shared weight), "
                "or untie it first (model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone()), "
                "config.tie_word_embeddings=False) before freezing.",
                "optimizer",
            )
        elif frozen:
            # torch's optimizers skip a parameter whose .grad is None, and a frozen one never gets a
            # gradient: harmless unless it still holds one from before it was frozen (zero_grad with
            # set_to_none=False keeps zeros there), which weight decay and momentum keep acting on.
            holding = [name for param, name in names.items() if not param.requires_grad and param in in_optimizer
                       and param.grad is not None]
            # A frozen embedding table handed to the optimizer was meant to train: the user's optimizer
            # lists it. nn.Embedding.from_pretrained freezes by default (freeze=True).
            tables = [name for name, module in ctx.model.named_modules()
                      if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and not module.weight.requires_grad
                      and module.weight in in_optimizer and not sinusoidal_table(module.weight)]
            left_out = [name for param, name in names.items() if not param.requires_grad and param not in in_optimizer]
            shared = frozen_by_shared_name(frozen, left_out)
            if shared is not None and not holding:
                part, meant, caught = shared
                findings.warning(
                    "O17",
                    f"{len(frozen)} frozen parameter(s) ({_names(frozen, 3)}) are in the optimizer, so they were meant "
                    f"to train, and never will; they share the name part '{part}' with frozen parameters the optimizer "
                    f"leaves out ({_names([n for n in left_out if part in n.split('.')], 2)}): a freeze by name match "
                    f"(if '{part}' in name: p.requires_grad = False) meant for {meant}.{part} also froze "
                    f"{caught}.{part}, so only the rest of {caught} trains, on top of fixed random features",
                    f"Freeze by module, not by a substring: model.{meant}.requires_grad_(False) (or "
                    f"name.startswith('{meant}.')), and keep {caught}.{part} trainable.",
                    "optimizer",
                )
            elif tables and not holding:
                findings.warning(
                    "O17",
                    f"the embedding table(s) {_names(tables, 3)} are frozen (requires_grad=False) but handed to the "
                    "optimizer, so they were meant to train, and never will: nn.Embedding.from_pretrained(vectors) "
                    "freezes by default (freeze=True)",
                    "Pass freeze=False to fine-tune the vectors: nn.Embedding.from_pretrained(vectors, freeze=False); "
                    "to keep them fixed, leave them out of the optimizer.",
                    "optimizer",
                )
            elif holding:
                findings.warning(
                    "O17",
                    f"{len(frozen)} frozen parameter(s) (requires_grad=False) are in the optimizer and "
                    f"{_names(holding)} still hold a .grad from before they were frozen: weight decay and momentum "
                    "keep moving them at every step although they are meant to stay fixed",
                    "Build the optimizer from [p for p in model.parameters() if p.requires_grad] (or rebuild it "
                    "after freezing), and set p.grad = None when freezing.",
                    "optimizer",
                )
            else:
                findings.info(
                    "O17",
                    f"{len(frozen)} frozen parameter(s) (requires_grad=False) are in the optimizer: {_names(frozen)}. "
                    "Harmless while they hold no gradient (the optimizer skips them); they still take room in its "
                    "state_dict",
                    "Build the optimizer from [p for p in model.parameters() if p.requires_grad], or rebuild it after "
                    "freezing.",
                    "optimizer",
                )
        if repeated:
            findings.error(
                "OPT_DUPLICATE_PARAM",
                f"{len(repeated)} parameter(s) appear in more than one param group and are updated twice per step: "
                f"{_names(repeated)}",
                "Give each parameter to exactly one param group.",
                "optimizer",
            )
        self._empty_groups(ctx, findings, names)
        self._misnamed_keys(ctx.optimizer, findings)
        self._sgd_dampening(ctx.optimizer, findings)
        self._layer_decay(ctx.optimizer, findings, names)
        self._full_batch_method(ctx, findings)

    @staticmethod
    def _empty_groups(ctx: PreflightContext, findings: Findings, names: dict) -> None:
        """A param group that holds no parameter beside groups that do: the rule that picked its
        parameters (a name filter) matched none, so they train with another group's settings."""
        groups = ctx.optimizer.param_groups
        empty = [i for i, group in enumerate(groups) if not group["params"]]
        if not empty or len(empty) == len(groups):
            return
        group_of = {id(param): i for i, group in enumerate(groups) for param in group["params"]}
        # The layer a fine-tune's special group is usually for: the output head, the last Linear.
        head = next(((name, module) for name, module in reversed(list(ctx.model.named_modules()))
                     if isinstance(module, nn.Linear) and id(module.weight) in group_of), None)
        index = empty[0]
        lr = groups[index].get("lr")
        landed = ""
        if head is not None:
            where = group_of[id(head[1].weight)]
            landed = (f" The output layer '{head[0]}' is in group {where} (lr={_fmt(groups[where].get('lr'))})"
                      + (f": the head meant for the lr={_fmt(lr)} group trains at the backbone's learning rate"
                         if isinstance(lr, float) and isinstance(groups[where].get("lr"), float)
                         and groups[where]["lr"] < lr else "") + ".")
        findings.warning(
            "EMPTY_PARAM_GROUP",
            f"param group {index} of {len(groups)} (lr={_fmt(lr)}) is an empty group: it holds no parameter, so the "
            "rule that built it matched nothing (a name filter such as 'classifier' in n for a head this model "
            f"names otherwise), and the parameters meant for it are trained with another group's settings.{landed}",
            "Select the group's parameters by this model's own names or by module (print [n for n, _ in "
            "model.named_parameters()] first; e.g. model.head.parameters() for the head, the rest for the "
            "backbone), and check that every group is non-empty: [len(g['params']) for g in optimizer.param_groups].",
            "optimizer",
        )

    @staticmethod
    def _misnamed_keys(optimizer: Any, findings: Findings) -> None:
        """A param group key the optimizer never reads that names one it does:
        {'params': head, 'learning_rate': 0.05} trains the head at the default lr."""
        defaults = getattr(optimizer, "defaults", None)
        if not isinstance(defaults, dict) or not defaults:
            return
        reported: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for index, group in enumerate(optimizer.param_groups):
            misnamed = misnamed_group_keys(group, defaults)
            if misnamed:
                reported.setdefault(tuple(sorted(misnamed.items())), []).append(index)
        optimizer_name = f"torch.optim.{type(optimizer).__name__}" if type(optimizer).__module__.startswith(
            "torch.optim") else type(optimizer).__name__
        for pairs, indices in reported.items():
            group = optimizer.param_groups[indices[0]]
            misnamed = dict(pairs)
            reals = sorted(set(misnamed.values()))
            meant = _meant(group, misnamed)
            which = (f"parameter group {indices[0]}" if len(indices) == 1 else
                     f"parameter groups {', '.join(str(i) for i in indices[:8])}"
                     + (f" and {len(indices) - 8} more" if len(indices) > 8 else ""))
            sets = ", ".join(f"'{key}': {_fmt(group[key])}" for key in misnamed)
            in_effect = ", ".join(
                f"{real}={_fmt(group.get(real))} (group[{real!r}]"
                + (", the optimizer's default)" if group.get(real) == defaults.get(real) else ")")
                for real in reals)
            findings.data.setdefault("misnamed_group_keys", {}).update(misnamed)
            findings.warning(
                "OPTIM_GROUP_UNKNOWN_KEY",
                f"{which} of {optimizer_name} set{'s' if len(indices) == 1 else ''} {sets}: "
                f"{'a key' if len(misnamed) == 1 else 'keys'} {type(optimizer).__name__} never reads (it reads "
                f"{', '.join(repr(real) for real in reals)}), so the group runs at {in_effect} instead",
                "Name the key the optimizer reads in the group dict: {'params': ..., "
                + ", ".join(f"'{real}': {_fmt(value)}" for real, value in meant.items()) + "}.",
            )

    @staticmethod
    def _full_batch_method(ctx: PreflightContext, findings: Findings) -> None:
        """RPROP_MINIBATCH: Rprop adapts each weight's step by whether consecutive gradients agree in
        sign, which assumes the full-batch gradient; mini-batch noise flips the signs."""
        if not isinstance(ctx.optimizer, torch.optim.Rprop):
            return
        try:
            batches = len(ctx.train_loader)
        except TypeError:
            batches = None
        if batches is not None and batches <= 1:
            return
        size = getattr(ctx.train_loader, "batch_size", None)
        findings.warning(
            "RPROP_MINIBATCH",
            f"torch.optim.Rprop trains on mini-batches ({batches or 'many'} per epoch"
            f"{f' of {size}' if size else ''}): Rprop is a full-batch method that grows or halves each weight's step "
            "by whether two consecutive gradients agree in sign, and mini-batch noise flips the signs all the time, so "
            "the steps shrink towards their minimum and training stalls (MATLAB's trainrp feeds it the whole dataset)",
            "Use a mini-batch optimizer (torch.optim.Adam / AdamW, or SGD with momentum), or give Rprop the whole "
            "training set as one batch.",
            "optimizer",
        )

    @staticmethod
    def _layer_decay(optimizer: Any, findings: Findings, names: dict) -> None:
        """LR_LAYER_DECAY: three or more groups whose learning rates fall geometrically by a factor
        of LAYER_DECAY_MAX or less per group: a layer-wise decay given as the share lost per layer."""
        groups = [group for group in getattr(optimizer, "param_groups", []) if as_float(group.get("lr"))]
        rates = sorted({float(as_float(group["lr"])) for group in groups}, reverse=True)
        if len(rates) < 3:
            return
        ratios = [low / high for high, low in zip(rates, rates[1:])]
        if max(ratios) > LAYER_DECAY_MAX or max(ratios) > 1.5 * min(ratios):
            return
        factor = sum(ratios) / len(ratios)
        lowest = [names.get(param, "?") for group in groups if float(as_float(group["lr"])) == rates[-1]
                  for param in group.get("params", [])]
        shown = ", ".join(f"{rate:.0e}" for rate in rates)
        findings.warning(
            "LR_LAYER_DECAY",
            f"the optimizer's parameter groups have learning rates falling by a factor of about {factor:.2g} per group "
            f"({shown}): the lowest ({_names(lowest, 3)}) trains at {rates[-1] / rates[0]:.0e} of the highest and "
            "barely moves. A layer-wise learning-rate decay configured as the share lost per layer (layer_decay=0.1 "
            "for 'decay 10% per layer') instead of the multiplier kept per layer (0.9; usual values 0.65-0.95) does this",
            "Give the decay as the multiplier each layer keeps: lr * layer_decay ** depth with layer_decay=0.9 (or "
            "0.75 for deep pretrained models).",
            "optimizer",
        )

    @staticmethod
    def _sgd_dampening(optimizer: Any, findings: Findings) -> None:
        """SGD's dampening scales the gradient into the momentum buffer by (1 - dampening):
        with momentum 0.9 and dampening 0.9 the buffer settles at the gradient, not 10x it."""
        if not isinstance(optimizer, torch.optim.SGD):
            return
        damped = [(index, group) for index, group in enumerate(optimizer.param_groups)
                  if float(group.get("momentum") or 0) > 0 and float(group.get("dampening") or 0) > 0]
        if not damped:
            return
        group = damped[0][1]
        momentum, dampening = float(group["momentum"]), float(group["dampening"])
        which = "" if len(optimizer.param_groups) == 1 else (
            f" (parameter group{'s' if len(damped) > 1 else ''} {', '.join(str(i) for i, _ in damped)})")
        if dampening < 1:
            shrink = 1 / (1 - dampening)
            effect = (f"adds only (1 - dampening) = {1 - dampening:g} of each gradient to the momentum buffer: after "
                      f"the first step (which takes the whole gradient) the updates are {shrink:.3g}x smaller than "
                      f"SGD with momentum as it is usually tuned, as if lr were lr x {1 - dampening:g}")
            averaged = f" If the averaged form (dampening=momentum) is meant, raise lr {shrink:.3g}x to keep the step size."
        else:
            effect = (f"adds (1 - dampening) = {1 - dampening:g} of each gradient to the momentum buffer: after the "
                      "first step no gradient (or the gradient reversed) reaches the updates")
            averaged = ""
        findings.data.update(sgd_dampening=dampening, sgd_momentum=momentum)
        findings.warning(
            "SGD_DAMPENING",
            f"torch.optim.SGD{which} with momentum={momentum:g} and dampening={dampening:g} {effect}",
            f"Leave dampening at its default 0: torch.optim.SGD(params, lr=..., momentum={momentum:g})." + averaged,
        )


def in_frozen_part(model: nn.Module, name: str) -> bool:
    """Whether the module ``name`` sits in a part of the model whose parameters are all frozen
    (the nearest enclosing module that holds any): a distillation teacher or a frozen backbone
    kept in eval mode on purpose, where dropout must stay off."""
    parts = name.split(".")
    modules = dict(model.named_modules())
    for depth in range(len(parts) - 1, 0, -1):
        owner = modules.get(".".join(parts[:depth]))
        params = list(owner.parameters()) if owner is not None else []
        if params:
            return not any(param.requires_grad for param in params)
    return False


def _signature(module: nn.Module) -> tuple:
    return tuple((name, tuple(param.shape)) for name, param in module.named_parameters())


def trained_twin(model: nn.Module, name: str) -> str | None:
    """The trained module that a frozen module enclosing ``name`` copies, shape for shape (its
    momentum / EMA twin), or None (pure on the model)."""
    modules = dict(model.named_modules())
    parts = name.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:depth])
        signature = _signature(modules[prefix])
        if not signature:
            continue
        for other, module in modules.items():
            if not other or other == prefix or other.startswith(prefix + ".") or prefix.startswith(other + "."):
                continue
            params = list(module.parameters())
            if params and all(p.requires_grad for p in params) and _signature(module) == signature:
                return other
    return None


class ModesCheck(Check):
    """O5 modules that stay in eval mode while training; O18 frozen BatchNorm in train mode.

    Looks at the modes *after* ``model.train()``, which the training loop calls: a
    frozen BatchNorm put in eval at build time is flipped back to train by it.
    """

    name = "model.modes"
    stage = Stage.MODEL
    codes = ("O5", "O18")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        model = ctx.model
        saved = [(module, module.training) for module in model.modules()]
        # The modes the caller left: a plain loop that evaluated (or loaded a model that
        # comes in eval mode) and never called model.train() trains in them.
        called_in_eval = [f"{name} ({type(module).__name__})" for module, name in mode_sensitive_modules(model).items()
                          if not module.training]
        was_eval = not model.training
        try:
            model.train()
            stuck = [
                name or type(module).__name__
                for name, module in model.named_modules()
                if not module.training
                and (
                    (isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0
                     and not in_frozen_part(model, name))
                    or (isinstance(module, _BatchNorm) and any(p.requires_grad for p in module.parameters(recurse=False)))
                )
            ]
            drifting = [
                name
                for name, module in model.named_modules()
                if isinstance(module, _BatchNorm)
                and module.training
                and module.track_running_stats
                and module.affine
                and not any(p.requires_grad for p in module.parameters(recurse=False))
            ]
            # A frozen copy of a trained part (a momentum encoder, BYOL's target network) follows it
            # by EMA and normalises with batch statistics on purpose (MoCo, BYOL): not drift.
            drifting = [name for name in drifting if not trained_twin(model, name)]
            top_in_eval = not model.training
        finally:
            for module, training in saved:
                module.training = training
        findings.data.update(modules_stuck_in_eval=len(stuck), frozen_batchnorm_in_train=len(drifting),
                             model_in_eval_when_called=was_eval)
        findings.data["summary"] = ("model in eval mode when called; " if was_eval else "") + (
            f"after model.train(): {len(stuck)} module(s) stuck in eval, {len(drifting)} frozen BatchNorm(s) in train")
        if was_eval and called_in_eval and not ctx.loop_sets_train_mode and not (top_in_eval or stuck):
            # Hugging Face's from_pretrained returns the model in eval mode by design, and
            # loops written for it call model.train() themselves: there it is only a note.
            loaded = bool(getattr(getattr(unwrap(ctx.model), "config", None), "_name_or_path", ""))
            findings.add(
                "info" if loaded else "warning",
                "O5",
                f"the model was in eval mode when the preflight was called ({len(called_in_eval)} dropout/BatchNorm "
                f"module(s) in eval: {_names(called_in_eval)}"
                + ("; from_pretrained returns it so" if loaded else "")
                + "): a loop that does not call model.train() before its "
                "first step trains with dropout off and BatchNorm normalising by running statistics it never updates",
                "Call model.train() before your training loop, and again after every evaluation pass (model.eval()). "
                "If your loop already calls model.train() itself, pass run_preflight(loop_calls_train=True).",
            )
        if top_in_eval or stuck:
            what = "the model itself" if top_in_eval else f"{len(stuck)} module(s): {_names(stuck)}"
            findings.warning(
                "O5",
                f"model.train() leaves {what} in eval mode: dropout stays off and BatchNorm uses running "
                "statistics during training",
                "Do not override train() to force eval mode on trainable layers; call model.train() before training.",
            )
        if drifting:
            findings.warning(
                "O18",
                f"{len(drifting)} frozen BatchNorm layer(s) run in train mode: their running mean/var drift with "
                f"every batch although the layer is frozen: {_names(drifting)}",
                "Override the model's train() to call .eval() on frozen BatchNorm layers after super().train(mode), "
                "or build them with track_running_stats=False.",
            )


def is_bias_or_norm(module_by_param: dict[nn.Parameter, nn.Module], name: str, param: nn.Parameter) -> bool:
    return param.dim() < 2 or name.endswith("bias") or isinstance(module_by_param.get(param), NORM_TYPES)


# Optimizers that add weight_decay * w to the gradient before their per-parameter scaling.
COUPLED_DECAY = (torch.optim.Adam, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax)
MIN_TABLE_ROWS = 100
TYPICAL_SAMPLE = 65536


class WeightDecayCheck(Check):
    """O6: Adam's coupled weight decay; decay applied to biases and normalisation weights."""

    name = "model.weight_decay"
    stage = Stage.MODEL
    codes = ("O6",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        optimizer = ctx.optimizer
        decays = sorted({float(group.get("weight_decay", 0.0)) for group in optimizer.param_groups})
        findings.data["weight_decays"] = decays
        if type(optimizer) is torch.optim.Adam and any(decays):
            # A note: Adam with a small coupled decay is the canonical recipe of many papers (GCN's
            # 5e-4); a decay large enough to swamp the gradient is step.update's UPDATE_WEIGHT_DECAY.
            findings.info(
                "O6",
                f"torch.optim.Adam with weight_decay={max(decays):g} adds the decay to the gradient, where Adam's "
                "scaling cancels most of it: it is not the decoupled weight decay AdamW applies",
                "Use torch.optim.AdamW (optimizer=adamw).",
                "optimizer._target_",
                code_fix="In your build_optimizer, construct torch.optim.AdamW instead of torch.optim.Adam "
                         "(same arguments; its weight decay is decoupled).",
            )
        model = unwrap(ctx.model)
        owner = {param: module for module in model.modules() for param in module.parameters(recurse=False)}
        names = {param: name for name, param in ctx.model.named_parameters()}
        if type(optimizer) in COUPLED_DECAY:
            self._decayed_tables(optimizer, owner, names, findings)
        decayed_params = [
            param
            for group in optimizer.param_groups
            if group.get("weight_decay", 0.0) > 0
            for param in group["params"]
            if param in names and is_bias_or_norm(owner, names[param], param)
        ]
        decayed = [names[param] for param in decayed_params]
        findings.data["decayed_bias_or_norm"] = len(decayed)
        findings.data["summary"] = (f"{type(optimizer).__name__}, weight decay {', '.join(f'{d:g}' for d in decays)}; "
                                    f"{len(decayed)} bias/norm tensor(s) decayed")
        if decayed:
            # A note, never a warning: decaying biases and norm gains is what a plain
            # AdamW(model.parameters()) or SGD(weight_decay=...) does, and such models train
            # (the gradient holds the gains up; GPT-2/BERT recipes and torchvision's ResNets
            # long did it); excluding them is a refinement, not the fix of a defect.
            norms = any(isinstance(owner.get(param), NORM_TYPES) for param in decayed_params)
            severity = "info"
            what = (f"bias/normalisation parameter(s) ({_names(decayed)}): the decay pulls norm gains towards 0, "
                    "which the usual recipes avoid") if norms else (
                    f"bias(es) ({_names(decayed)}), which have no capacity to overfit: the decay only pulls them "
                    "towards 0")
            findings.add(
                severity,
                "O6",
                f"weight decay applies to {len(decayed)} {what}",
                "Set optimizer.decay_bias_and_norm=false (the default), which puts 1-D parameters in a group with "
                "weight_decay=0.",
                "optimizer.decay_bias_and_norm",
                code_fix="In your build_optimizer, give biases and norm weights their own group with weight_decay=0: "
                         "pass optimus_preflight.training.optim.weight_decay_groups(model, weight_decay, "
                         "decay_bias_and_norm=False) as the optimizer's params.",
            )

    @staticmethod
    def _decayed_tables(optimizer: Any, owner: dict, names: dict, findings: Findings) -> None:
        """Embedding tables under a coupled decay: a row absent from a batch gets the decay term alone
        as its gradient, which Adam's scaling turns into a full learning-rate step towards 0."""
        for group in optimizer.param_groups:
            decay, lr = float(group.get("weight_decay", 0.0)), float(group.get("lr", 0.0))
            tables = [param for param in group["params"] if decay > 0 and lr > 0 and param in names
                      and isinstance(owner.get(param), (nn.Embedding, nn.EmbeddingBag))
                      and not getattr(owner[param], "sparse", False) and param.shape[0] >= MIN_TABLE_ROWS]
            if not tables:
                continue
            table = tables[0].detach()
            # a sample of the first table: a vocabulary's table can be hundreds of millions of values
            typical = (float(table.reshape(-1)[:TYPICAL_SAMPLE].abs().median())
                       if type(table).__name__ != "DTensor" else float("nan"))
            findings.warning(
                "O6",
                f"{type(optimizer).__name__} with weight_decay={decay:g} decays the embedding table(s) "
                f"{_names([names[p] for p in tables], 3)} by adding {decay:g} * w to their gradient: a row that is "
                "not in the batch (a rare category, id or word) gets that term alone, and Adam's per-parameter "
                f"scaling turns it into a full step of about lr = {lr:g} towards 0 at every step, so a typical row "
                + (f"(|w| about {typical:.2g}) is erased in some {max(1, round(typical / lr))} steps"
                   if math.isfinite(typical) else "is erased within some hundreds of steps")
                + " in which its id does not occur: the rare categories lose what they learnt",
                "Use decoupled decay (torch.optim.AdamW) and leave embedding tables out of it: a param group "
                "{'params': embedding_params, 'weight_decay': 0.0} beside the decayed dense weights.",
                "optimizer._target_",
            )
            return


def half_state_blowup(optimizer: torch.optim.Optimizer, group: dict[str, Any], dtype: torch.dtype, device: torch.device) -> bool:
    """Step the optimizer's class with this group's settings on a small tensor of the
    state's dtype, with zero, tiny and normal gradients: True if it produces inf/NaN."""
    probe = torch.ones(4, dtype=dtype, device=device, requires_grad=True)
    settings = {key: value for key, value in group.items() if key != "params"}
    try:
        trial = type(optimizer)([{"params": [probe], **settings}])
    except Exception:
        return False
    for _ in range(2):
        probe.grad = torch.tensor([0.0, 1e-6, 1e-3, 1.0], dtype=dtype, device=device)
        trial.step()
    return not bool(torch.isfinite(probe.detach()).all())



class OptimizerEpsCheck(Check):
    """O10: eps too small for a half-precision optimizer state (verified by a trial step)."""

    name = "model.optimizer_eps"
    stage = Stage.MODEL
    codes = ("O10",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        optimizer = ctx.optimizer
        seen: set[str] = set()
        for group in optimizer.param_groups:
            # Adam-like optimizers keep their moments in the parameter's dtype.
            kinds: dict[torch.dtype, torch.device] = {}
            for param in group["params"]:
                state = optimizer.state.get(param) or {}
                dtypes = {v.dtype for v in state.values() if isinstance(v, torch.Tensor) and v.numel() > 1}
                for dtype in dtypes or {param.dtype}:
                    kinds.setdefault(dtype, param.device)
            seen.update(str(dtype).replace("torch.", "") for dtype in kinds)
            for dtype, device in kinds.items():
                if dtype in HALF and half_state_blowup(optimizer, group, dtype, device):
                    findings.error(
                        "O10",
                        f"{type(optimizer).__name__} with eps={group.get('eps')} on "
                        f"{str(dtype).replace('torch.', '')} optimizer state turns zero or tiny gradients into "
                        "inf/NaN updates (a trial step did): eps rounds to 0 in this precision",
                        "Keep parameters (and so the optimizer state) in fp32 and use trainer.precision for mixed "
                        "precision, or raise optimizer.eps (1e-7 for fp16, 1e-6 for bf16).",
                        "optimizer.eps",
                    )
        findings.data["state_dtypes"] = sorted(seen)
        findings.data["summary"] = f"optimizer state in {', '.join(sorted(seen))}"
