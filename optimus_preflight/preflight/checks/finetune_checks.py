"""Fine-tuning wiring: what the builder loaded (O20) and one LR for a pretrained backbone and
a new head (O19); the LoRA checks (O21, ``adapter_checks``) share the helpers here.

What was loaded comes from ``training.load_report``: every ``nn.Module.load_state_dict``
call made while the model was built (``recording_loads`` around ``build_model``), with the
parameter objects it filled. A parameter of a loaded module that did not receive
checkpoint values (a key the checkpoint lacked, or a head put in after the load) is *new*:
it starts from its random initialisation. A model built without such a call (from
scratch, or by Hugging Face ``from_pretrained``, which does not go through
``load_state_dict``) gives these checks nothing to say about O19/O20.

Adapters are recognised by name, as PEFT and loralib name them (``lora_A``, ``lora_B``,
``lora_embedding_A``, ``lora_magnitude_vector``), or as the own parameters (other than
``weight``/``bias``) of a module whose class is named after LoRA (a hand-written
``LoRALinear`` with ``A``/``B``): peft is not needed.

Issue codes: O20 keys a load dropped or skipped (and new layers left frozen), O19 one LR for
loaded and new weights (advice).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.distributed import unwrap
from optimus_preflight.training.load_report import (
    LoadRecord,
    describe_prefix,
    loads_into,
    prefix_fix,
    prefix_mismatch,
)

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ADAPTER = re.compile(r"(?:^|\.)lora_")
# lora/peft as a word of a snake_case key or a CamelCase class name: lora_rank, use_lora,
# LoRALinear, MyLoraLayer, PeftModel; not "colorado" or "explorable".
LORA_WORD = re.compile(r"(?<![a-z])(?i:lora|peft)|Lo[rR][aA]|Peft|PEFT")
# A load that misses more than this share of the module's elements did not load the model.
MOSTLY_MISSING = 0.5
# Missing keys at the end of the module (in registration order) up to this share are a new head.
HEAD_SHARE = 0.25


def names_of(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def under(name: str, path: str) -> bool:
    return not path or name == path or name.startswith(path + ".")


def count(params: Iterable[torch.Tensor]) -> int:
    return sum(p.numel() for p in params)


# ------------------------------------------------------------------------- provenance
@dataclass
class Provenance:
    """Which parameters of the model the recorded loads filled, and which of the loaded
    modules' parameters they did not (new: they start from their initialisation)."""

    loads: list[tuple[str, LoadRecord]]
    loaded: dict[str, nn.Parameter] = field(default_factory=dict)
    # Not filled by any load: under a loaded module (``new``), or anywhere in the model
    # (``unloaded``, which also holds a head a loaded backbone was wrapped with).
    new: dict[str, nn.Parameter] = field(default_factory=dict)
    unloaded: dict[str, nn.Parameter] = field(default_factory=dict)


def provenance(model: nn.Module) -> Provenance:
    model = unwrap(model)
    loads = loads_into(model)
    result = Provenance(loads)
    if not loads:
        return result
    filled = [tensor for _, record in loads for tensor in record.loaded_tensors()]  # alive while ids compare
    filled_ids = {id(tensor) for tensor in filled}
    for name, param in model.named_parameters():
        if id(param) in filled_ids:
            result.loaded[name] = param
            continue
        result.unloaded[name] = param
        if any(under(name, path) for path, _ in loads):
            result.new[name] = param
    return result


def lora_class(module: nn.Module) -> bool:
    return LORA_WORD.search(type(module).__name__) is not None


def adapter_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """Adapter parameters by name: ``lora_*`` ones, and a LoRA-named module's own extras."""
    model = unwrap(model)
    found = {name: p for name, p in model.named_parameters() if ADAPTER.search(name)}
    ids = {id(p) for p in found.values()}
    for path, module in model.named_modules():
        if not lora_class(module):
            continue
        for name, p in module.named_parameters(recurse=False):
            if name not in ("weight", "bias") and id(p) not in ids:
                found[f"{path}.{name}" if path else name] = p
                ids.add(id(p))
    return found


def new_and_frozen(found: Provenance, adapters: dict[str, nn.Parameter]) -> list[str]:
    """New parameters (not from the checkpoint) that are frozen: they stay random all run
    (frozen adapters are reported as such)."""
    return [name for name, p in found.new.items() if not p.requires_grad and name not in adapters]


LEARNED_LAYERS = (nn.Linear, nn.modules.conv._ConvNd, nn.Embedding)


def frozen_new_severity(model: nn.Module, frozen: list[str]) -> str:
    """An error when a frozen new tensor is a Linear/Conv/Embedding weight (a layer that exists
    to be trained: a head); a warning for other tensors (a fixed table someone made a Parameter)."""
    owner = {f"{path}.{name}" if path else name: module for path, module in unwrap(model).named_modules()
             for name, _ in module.named_parameters(recurse=False)}
    return "error" if any(isinstance(owner.get(name), LEARNED_LAYERS) for name in frozen) else "warning"


def frozen_new_message(frozen: list[str], found: Provenance) -> str:
    return (f"{len(frozen)} parameter(s) that the checkpoint did not provide are frozen (requires_grad=False), so they "
            f"keep their random initialisation for the whole run: {names_of(frozen)} "
            f"({count(found.new[name] for name in frozen):,} values)")


# ----------------------------------------------------------------------------- O20
def _where(path: str, record: LoadRecord) -> str:
    into = f"model.{path}" if path else "the model"
    mode = "strict=False" if not record.strict else "strict=True"
    return f"load_state_dict({mode}) into {into} ({record.module_type}) at {record.where}"


def is_new_head(record: LoadRecord, missing: list[str]) -> bool:
    """Missing keys that are the module's last ones (a head is registered last) and a small
    share of it: a new head on a loaded backbone, not a backbone block the checkpoint lacks."""
    if not missing or len(missing) > len(record.model_keys):
        return False
    total = sum(record.numel.values()) or 1
    share = sum(record.numel.get(key, 0) for key in missing) / total
    return set(record.model_keys[-len(missing):]) == set(missing) and share <= HEAD_SHARE


def replaced_head_keys(record: LoadRecord) -> bool:
    """Unexpected keys all under top-level names the module does not have: the old head of a
    head given another attribute name (the fix O20's catalog entry recommends)."""
    tops = {key.split(".", 1)[0] for key in record.model_keys}
    return bool(record.unexpected_keys) and all(key.split(".", 1)[0] not in tops for key in record.unexpected_keys)


def judge_load(findings: Findings, path: str, record: LoadRecord) -> None:
    at = _where(path, record)
    total_keys = len(record.model_keys)
    if record.nested_key is not None:
        findings.error(
            "O20",
            f"{at} was given a whole checkpoint: the weights are under its key {record.nested_key!r}, so none of the "
            f"model's {total_keys} tensors were loaded (strict=False turned that into a returned list nobody read)",
            f"Load the weights inside it: model.load_state_dict(checkpoint[{record.nested_key!r}]).",
        )
        return
    missing = [key for key in record.missing_keys if key not in record.tied_keys]
    mismatch = prefix_mismatch(missing, record.unexpected_keys)
    if mismatch is not None:
        findings.error(
            "O20",
            f"{at} loaded {total_keys - len(missing)} of {total_keys} tensors: {describe_prefix(mismatch)}, so "
            f"{mismatch.matched} weight(s) it holds (e.g. {record.unexpected_keys[0]!r}) were dropped and the "
            "model's stay at their random initialisation; strict=False hid it",
            prefix_fix(mismatch),
        )
        return
    total = sum(record.numel.values()) or 1
    missing_share = sum(record.numel.get(key, 0) for key in missing) / total
    head = is_new_head(record, missing)
    if missing and missing_share > MOSTLY_MISSING:
        findings.error(
            "O20",
            f"{at} left {missing_share:.0%} of the module's weights at their random initialisation: {len(missing)} of "
            f"{total_keys} keys are not in the checkpoint ({names_of(missing)}); "
            f"{len(record.unexpected_keys)} checkpoint key(s) matched nothing ({names_of(record.unexpected_keys)})",
            "Load a checkpoint of this architecture, or map its keys to the model's: compare "
            "set(model.state_dict()) with set(state_dict) and rename before loading; then load with strict=True.",
        )
        return
    if missing and not head:
        findings.warning(
            "O20",
            f"{at}: {len(missing)} key(s) of the model are not in the checkpoint and keep their random "
            f"initialisation ({missing_share:.1%} of its weights), and they are not a new head at its end: "
            f"{names_of(missing)}",
            "If these layers are new on purpose, nothing to do (train them; see O19). Otherwise the checkpoint comes "
            "from another version of the architecture: rename its keys to the model's before loading.",
        )
    if record.unexpected_keys and not (head and replaced_head_keys(record)):
        findings.warning(
            "O20",
            f"{at}: {len(record.unexpected_keys)} checkpoint tensor(s) matched no key of the model and were dropped: "
            f"{names_of(record.unexpected_keys)}",
            "If they are a replaced head's, drop them from the state_dict before loading; otherwise the model lacks "
            "layers the checkpoint has (another architecture or config): rename or add them, then load with "
            "strict=True.",
        )
    if head:
        findings.info(
            "O20",
            f"{at} loaded {total_keys - len(missing)} of {total_keys} tensors; new (not in the checkpoint, starting "
            f"from their initialisation): {names_of(missing)}"
            + (f"; dropped from the checkpoint: {names_of(record.unexpected_keys)}" if record.unexpected_keys else ""),
        )


class LoadedWeightsCheck(Check):
    """O20: what each load_state_dict call of build_model skipped (missing/unexpected keys)."""

    name = "model.loaded_weights"
    stage = Stage.MODEL
    codes = ("O20",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        found = provenance(ctx.model)
        findings.data.update(loads=len(found.loads), loaded_tensors=len(found.loaded), new_tensors=len(found.new))
        if not found.loads:
            findings.data["summary"] = "no load_state_dict call while the model was built"
            return
        findings.data["summary"] = (f"{len(found.loads)} load(s): {len(found.loaded)} tensors from checkpoints, "
                                    f"{len(found.new)} new")
        for path, record in found.loads:
            judge_load(findings, path, record)
        frozen = new_and_frozen(found, {})
        if frozen and not adapter_params(ctx.model):  # with adapters, model.adapters reports it (O21)
            findings.add(
                frozen_new_severity(ctx.model, frozen),
                "O20",
                frozen_new_message(frozen, found),
                "Freeze only what the checkpoint provided: set requires_grad=True on the new layers after freezing "
                "the backbone (e.g. for p in model.fc.parameters(): p.requires_grad = True), then build the "
                "optimizer from the trainable parameters.",
            )


# ----------------------------------------------------------------------------- O19
def initial_lr(group: dict[str, Any]) -> float:
    """The group's base LR (schedulers keep it in ``initial_lr`` and scale ``lr``)."""
    return float(group.get("initial_lr", group.get("lr", 0.0)))


class FinetuneLRCheck(Check):
    """O19: the loaded backbone and the new head train at one learning rate (advice)."""

    name = "model.finetune_lr"
    stage = Stage.MODEL
    codes = ("O19",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        found = provenance(ctx.model)
        lr_of = {id(p): initial_lr(group) for group in ctx.optimizer.param_groups for p in group["params"]}
        backbone = {n: p for n, p in found.loaded.items() if p.requires_grad and id(p) in lr_of}
        adapters = adapter_params(ctx.model)
        head = {n: p for n, p in found.unloaded.items() if p.requires_grad and id(p) in lr_of and n not in adapters}
        findings.data.update(loaded_trainable=count(backbone.values()), new_trainable=count(head.values()))
        if not backbone or not head:
            findings.data["summary"] = "not a fine-tune of loaded weights with a new head"
            return
        backbone_lrs = {lr_of[id(p)] for p in backbone.values()}
        head_lrs = {lr_of[id(p)] for p in head.values()}
        findings.data.update(backbone_lrs=sorted(backbone_lrs), head_lrs=sorted(head_lrs))
        findings.data["summary"] = (f"backbone LR {', '.join(f'{lr:g}' for lr in sorted(backbone_lrs))}, "
                                    f"new head LR {', '.join(f'{lr:g}' for lr in sorted(head_lrs))}")
        # Only a backbone at least the head's size is a pretrained backbone worth protecting.
        if len(backbone_lrs) != 1 or backbone_lrs != head_lrs or count(backbone.values()) < count(head.values()):
            return
        (lr,) = backbone_lrs
        findings.info(
            "O19",
            f"The loaded (pretrained) weights ({count(backbone.values()):,} values) and the new, randomly initialised "
            f"layers {names_of(list(head))} ({count(head.values()):,} values) train at one learning rate, {lr:g}: "
            "the new layers' large early gradients reach the pretrained ones at that LR and can overwrite what they "
            "learned (catastrophic forgetting), while an LR low enough for them is slow for the new layers",
            "Give the pretrained backbone a lower LR than the new head (discriminative fine-tuning), e.g. "
            "torch.optim.AdamW([{'params': head_params, 'lr': lr}, {'params': backbone_params, 'lr': lr / 10}]); or "
            "train the head alone first (backbone requires_grad=False), then unfreeze it under an LR warmup.",
            code_fix="In your build_optimizer, put the new head's and the backbone's parameters in separate param "
                     "groups, the backbone's with a lower lr (e.g. a tenth).",
        )
