"""LoRA/PEFT wiring (O21): adapters asked for but absent (target names that match no layer),
adapters frozen, adapters beside a base that still trains, and a new head that stays random
or is not saved.

Adapters are recognised without peft (see ``finetune_checks.adapter_params``): parameters
named ``lora_*`` as PEFT and loralib name them, or the own parameters of a LoRA-named module.
Whether LoRA was meant at all: a PEFT model's ``peft_config``, a config key naming lora/peft
(``model.lora_rank=8``), or a LoRA-named module class. What PEFT's ``save_pretrained``
keeps follows peft's ``get_peft_model_state_dict``: ``lora_`` keys, ``modules_to_save``
copies, and biases unless the config's ``bias`` is ``"none"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, ListConfig
from torch import nn

from optimus_preflight.preflight.checks.finetune_checks import (
    ADAPTER,
    LORA_WORD,
    adapter_params,
    count,
    frozen_new_message,
    frozen_new_severity,
    lora_class,
    names_of,
    new_and_frozen,
    provenance,
    under,
)
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.distributed import unwrap

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

# Beside adapters, a trainable share of the base model above this is not a head and norms.
TRAINABLE_BASE = 0.5


def lora_requested(cfg: Any, model: nn.Module) -> str | None:
    """Why the run is meant to train LoRA adapters, if it is: a PEFT model's ``peft_config``,
    a truthy config key naming lora/peft, or a module class named after LoRA."""
    if getattr(model, "peft_config", None):
        return "the model has a peft_config"
    key = _truthy_lora_key(cfg, "")
    if key is not None:
        return f"the config sets {key}"
    for module in unwrap(model).modules():
        if lora_class(module):
            return f"the model holds {type(module).__name__} modules"
    return None


def _truthy_lora_key(node: Any, prefix: str) -> str | None:
    if not isinstance(node, DictConfig):
        return None
    for key in node:
        path = f"{prefix}{key}"
        if path.startswith(("preflight", "hydra")):
            continue
        try:
            value = node[key]
        except Exception:  # a missing or unresolvable value says nothing
            continue
        if LORA_WORD.search(str(key)) and value not in (None, False, 0, "", "none") and not (
                isinstance(value, (DictConfig, ListConfig)) and len(value) == 0):
            return f"{path}={value if not isinstance(value, DictConfig) else '{...}'}"
        found = _truthy_lora_key(value, path + ".")
        if found is not None:
            return found
    return None


# Names PEFT's wrappers add around a layer: the layer is known by the name above them.
WRAPPER_NAMES = {"base_layer", "original_module", "modules_to_save", "default"}


def linear_names(model: nn.Module, limit: int = 10) -> list[str]:
    """The distinct last names of the model's Linear-like layers: what target_modules may name
    (adapters themselves and PEFT's wrapper levels left out)."""
    names: list[str] = []
    for name, module in unwrap(model).named_modules():
        weight = getattr(module, "weight", None)
        linear_like = isinstance(module, nn.Linear) or (
            type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2)
        parts = name.split(".")
        if not linear_like or any(part.startswith("lora_") for part in parts):
            continue
        short = next((part for part in reversed(parts) if part not in WRAPPER_NAMES), "")
        if short and not short.isdigit() and short not in names:
            names.append(short)
    return names[:limit]


def wrapped_layers(adapters: Iterable[str]) -> set[str]:
    """The paths of the layers that carry adapters: ``a.q_proj`` for ``a.q_proj.lora_A.default.weight``
    (PEFT) and for ``a.q_proj.A`` (a parameter of the LoRA module itself)."""
    return {ADAPTER.split(name, 1)[0].rstrip(".") if ADAPTER.search(name) else name.rpartition(".")[0]
            for name in adapters}


def only_adapters_trainable(adapters: dict[str, nn.Parameter]) -> str:
    """Code that leaves exactly these adapters trainable, in the names this model uses."""
    if all(ADAPTER.search(name) for name in adapters):
        return "for name, p in model.named_parameters(): p.requires_grad = 'lora_' in name"
    short = sorted({name.rsplit(".", 1)[-1] for name in adapters})
    return (f"model.requires_grad_(False), then for name, p in model.named_parameters(): p.requires_grad = "
            f"name.rsplit('.', 1)[-1] in {short!r}")


def _peft_configs(model: nn.Module) -> list[Any]:
    configs = getattr(model, "peft_config", None)
    return list(configs.values()) if isinstance(configs, dict) else []


def saved_by_peft(name: str, configs: list[Any]) -> bool:
    """Whether PEFT's save_pretrained keeps this parameter: LoRA keys, modules_to_save copies,
    and biases when the config's bias is "all"/"lora_only" (peft's get_peft_model_state_dict)."""
    if ADAPTER.search(name) or ".modules_to_save." in name:
        return True
    return name.endswith("bias") and any(getattr(config, "bias", "none") != "none" for config in configs)


class AdapterCheck(Check):
    """O21: LoRA adapters asked for but absent, frozen, beside a trainable base; a new head
    that stays random or is not saved."""

    name = "model.adapters"
    stage = Stage.MODEL
    codes = ("O21",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        model = unwrap(ctx.model)
        named = dict(model.named_parameters())
        adapters = adapter_params(model)
        trainable = {n: p for n, p in named.items() if p.requires_grad}
        findings.data.update(adapter_tensors=len(adapters), adapter_values=count(adapters.values()),
                             trainable_values=count(trainable.values()), total_values=count(named.values()))
        requested = lora_requested(ctx.cfg, ctx.model)
        if not adapters:
            findings.data["summary"] = "no LoRA adapters"
            if requested:
                findings.error(
                    "O21",
                    f"LoRA was asked for ({requested}) but the model has no adapter parameter (none named lora_*): "
                    "the target module names matched no layer of this model, so only "
                    f"{count(trainable.values()):,} of {count(named.values()):,} values train "
                    f"({names_of(list(trainable)) or 'nothing'})",
                    "Name layers this model has in target_modules; its Linear layers are "
                    f"{', '.join(linear_names(model)) or '(none)'} (from [n for n, _ in model.named_modules()]); "
                    "PEFT also takes target_modules='all-linear'.",
                )
            return
        share = count(trainable.values()) / max(count(named.values()), 1)
        findings.data["summary"] = (f"{len(adapters)} adapter tensors; {count(trainable.values()):,} trainable "
                                    f"values ({share:.2%} of the model)")
        self._frozen_adapters(findings, adapters)
        self._trainable_base(findings, named, adapters)
        found = provenance(model)
        frozen = new_and_frozen(found, adapters)
        if frozen:
            findings.add(
                frozen_new_severity(model, frozen),
                "O21",
                frozen_new_message(frozen, found) + ": a new head frozen along with the base model",
                "Keep the new head trainable: with PEFT, list it in LoraConfig(modules_to_save=[...]) (or pass the "
                "task_type that adds it); by hand, set requires_grad=True on its parameters after freezing the base.",
            )
        self._saving(findings, model, trainable)

    @staticmethod
    def _frozen_adapters(findings: Findings, adapters: dict[str, nn.Parameter]) -> None:
        frozen = [name for name, p in adapters.items() if not p.requires_grad]
        if not frozen:
            return
        everything = len(frozen) == len(adapters)
        findings.add(
            "error" if everything else "warning",
            "O21",
            f"{'all ' if everything else ''}{len(frozen)} of the {len(adapters)} LoRA adapter tensors are frozen "
            f"(requires_grad=False) and will not train: {names_of(frozen)}",
            "Freeze the base model before injecting the adapters, not after (or leave only the adapters trainable: "
            f"{only_adapters_trainable(adapters)}; then re-enable the new head), then build the optimizer.",
        )

    @staticmethod
    def _trainable_base(findings: Findings, named: dict[str, nn.Parameter], adapters: dict[str, nn.Parameter]) -> None:
        layers = wrapped_layers(adapters)
        base = {n: p for n, p in named.items() if n not in adapters}
        in_wrapped = [n for n, p in base.items() if p.requires_grad and any(under(n, layer) for layer in layers)]
        trainable_base = count(p for p in base.values() if p.requires_grad)
        base_share = trainable_base / max(count(base.values()), 1)
        findings.data.update(trainable_base_values=trainable_base, wrapped_layers=len(layers))
        if not in_wrapped and base_share <= TRAINABLE_BASE:
            return  # a trainable head, norms or biases beside the adapters: intended
        what = (f"the base weights of {len(in_wrapped)} adapter-wrapped layer(s) ({names_of(in_wrapped)})"
                if in_wrapped else f"{base_share:.0%} of the base model's weights")
        findings.warning(
            "O21",
            f"The model has LoRA adapters, yet {what} train too: {trainable_base:,} base values get gradients and "
            "optimizer state, a full fine-tune's memory with adapters on top (if a full fine-tune is meant, the "
            "adapters are not needed)",
            f"Freeze the base before injecting the adapters, or after: {only_adapters_trainable(adapters)} (then "
            "re-enable the new head only); PEFT's get_peft_model does this.",
        )

    @staticmethod
    def _saving(findings: Findings, model: nn.Module, trainable: dict[str, nn.Parameter]) -> None:
        # By identity: wrappers (activation checkpointing, FSDP) rename keys in state_dict hooks.
        saved = {id(value) for value in model.state_dict(keep_vars=True).values()}
        unsaved = [name for name, p in trainable.items() if id(p) not in saved]
        if unsaved:
            findings.error(
                "O21",
                f"{len(unsaved)} trainable parameter(s) are not in model.state_dict(), so no checkpoint keeps what "
                f"they learn and a reload restores them random: {names_of(unsaved)}",
                "Do not filter the model's state_dict (a state-dict hook that keeps only adapters): save the "
                "adapters and every trained head.",
            )
        configs = _peft_configs(model)
        if not configs:
            return
        dropped = [name for name in trainable if not saved_by_peft(name, configs)]
        if dropped:
            findings.warning(
                "O21",
                f"{len(dropped)} trained parameter(s) are neither LoRA adapters nor in modules_to_save, so PEFT's "
                f"save_pretrained() leaves them out and a reload gets them back untrained: {names_of(dropped)}",
                "List their modules in LoraConfig(modules_to_save=[...]) (e.g. the classifier/score head and norm "
                "layers you train).",
            )
        targets = [t for config in configs for t in (getattr(config, "target_modules", None) or ())
                   if isinstance(getattr(config, "target_modules", None), (set, list, tuple))]
        module_names = [name for name, _ in model.named_modules()]
        unmatched = [t for t in targets if not any(n == t or n.endswith("." + t) for n in module_names)]
        if unmatched:
            findings.info(
                "O21",
                f"target_modules entries that match no module of this model: {names_of(unmatched)}",
                f"Its Linear layers are named {', '.join(linear_names(model)) or '(none)'}.",
            )
