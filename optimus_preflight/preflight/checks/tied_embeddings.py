"""Hugging Face models whose config ties weights that the built model holds apart
(``model.tied_embeddings``).

With ``config.tie_word_embeddings`` (GPT-2, BERT's MLM head, the original T5) the output
projection *is* the input embedding: one tensor, trained by both ends. The model ties
them when it is built and when ``from_pretrained`` loads it; code that runs afterwards
and replaces a module or a parameter (a new ``lm_head``, ``to_empty()`` after a meta-device
build, ``weight = nn.Parameter(w.clone())``) leaves two tensors. Training then updates
them separately, the pretrained head is gone or random, and ``save_pretrained`` writes
one of the two: reloading (which ties again, as the config says) silently discards the
other. The pairs are the model's own (``get_expanded_tied_weights_keys``, transformers
5), or output/input embeddings (older transformers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def _weight(module: Any) -> torch.Tensor | None:
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    if a.is_meta or b.is_meta or a.shape != b.shape:
        return False
    return a.data_ptr() == b.data_ptr() and a.device == b.device


def declared_ties(model: Any) -> list[tuple[str, str]] | None:
    """``(target, source)`` parameter names the model's config says are one tensor; None
    for a model that does not declare ties this way."""
    expand = getattr(model, "get_expanded_tied_weights_keys", None)
    if callable(expand):
        try:
            return list(expand(all_submodels=True).items())
        except Exception:
            return None
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return []
    try:
        output, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    except Exception:
        return None
    if _weight(output) is None or _weight(embedding) is None:
        return []
    names = {id(module): name for name, module in model.named_modules()}
    if id(output) not in names or id(embedding) not in names:
        return []
    return [(f"{names[id(output)]}.weight", f"{names[id(embedding)]}.weight")]


def _tensor(model: nn.Module, name: str) -> torch.Tensor | None:
    module_name, _, attribute = name.rpartition(".")
    try:
        module = model.get_submodule(module_name) if module_name else model
    except AttributeError:
        return None
    value = getattr(module, attribute, None)
    return value if isinstance(value, torch.Tensor) else None


def untied_pairs(model: nn.Module) -> list[tuple[str, str, bool]]:
    """``(target, source, equal values)`` for each declared tie the built model breaks,
    over the outermost Hugging Face models inside ``model``."""
    broken: list[tuple[str, str, bool]] = []
    covered: set[int] = set()
    for prefix, module in model.named_modules():
        if id(module) in covered or not hasattr(getattr(module, "config", None), "to_dict"):
            continue
        ties = declared_ties(module)
        if ties is None:
            continue
        covered.update(id(inner) for inner in module.modules())
        for target, source in ties:
            a, b = _tensor(module, target), _tensor(module, source)
            if a is None or b is None or _same(a, b):
                continue
            equal = not (a.is_meta or b.is_meta) and a.shape == b.shape and bool(torch.equal(a.detach(), b.detach().to(a.device)))
            where = f"{prefix}." if prefix else ""
            broken.append((where + target, where + source, equal))
    return broken


TRAINED_SHARE = 0.5  # of the other parameters: a full fine-tune, not adapters around a frozen model


def frozen_ties(model: nn.Module) -> list[tuple[str, str]]:
    """(embedding, output layer) pairs that share one frozen weight while most of the rest of
    the model trains: freezing the input embedding froze the tied output projection too. A
    frozen model with a few adapters (LoRA, prompt tuning) freezes both on purpose."""
    users: dict[int, list[tuple[str, nn.Module]]] = {}
    for name, module in model.named_modules():
        weight = _weight(module)
        if isinstance(module, (nn.Embedding, nn.Linear)) and isinstance(weight, nn.Parameter):
            users.setdefault(id(weight), []).append((name, module))
    pairs = []
    for entries in users.values():
        embeddings = [name for name, module in entries if isinstance(module, nn.Embedding)]
        outputs = [name for name, module in entries if isinstance(module, nn.Linear)]
        weight = _weight(entries[0][1])
        if embeddings and outputs and weight is not None and not weight.requires_grad:
            pairs.append((embeddings[0], outputs[0], weight))
    if not pairs:
        return []
    tied = {id(weight) for _, _, weight in pairs}
    others = [p for p in model.parameters() if id(p) not in tied]
    total = sum(p.numel() for p in others)
    trained = sum(p.numel() for p in others if p.requires_grad)
    if not total or trained < TRAINED_SHARE * total:
        return []
    # Other weight matrices frozen too: a deliberate partial freeze (a frozen base under adapters of
    # any rank, a frozen backbone), where the tied pair is frozen with the rest on purpose.
    if any(p.dim() >= 2 and not p.requires_grad for p in others):
        return []
    return [(embedding, output) for embedding, output, _ in pairs]


class TiedEmbeddingsCheck(Check):
    """Weights the model's config ties (``tie_word_embeddings``) held as separate tensors."""

    name = "model.tied_embeddings"
    stage = Stage.MODEL
    codes = ("TIED_WEIGHTS_BROKEN", "TIED_WEIGHTS_FROZEN")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        for embedding, output in frozen_ties(ctx.model)[:1]:
            findings.warning(
                "TIED_WEIGHTS_FROZEN",
                f"'{embedding}' and '{output}' share one weight (tied embeddings), and it is frozen "
                f"(requires_grad=False) while the rest of the model trains: freezing the input embedding froze the "
                f"output projection too, so the scores over the vocabulary keep their initial (or pretrained) values, "
                f"rows added for new tokens (resize_token_embeddings) stay random, and the model can only move its "
                f"hidden states to fit a fixed head",
                f"Leave the tied weight trainable; to keep only the input side fixed, untie first "
                f"(tie_word_embeddings=False in the config, or {output}.weight = nn.Parameter({embedding}.weight"
                ".detach().clone())) and freeze the embedding alone; build the optimizer after the change.",
            )
        broken = untied_pairs(ctx.model)
        findings.data["untied"] = len(broken)
        findings.data["summary"] = f"{len(broken)} declared weight tie(s) broken"
        if not broken:
            return
        pairs = "; ".join(f"{target} is not {source}" + (" (equal values, separate tensors)" if equal else
                                                         " (different values)")
                          for target, source, equal in broken[:3])
        findings.warning(
            "TIED_WEIGHTS_BROKEN",
            f"the model's config ties weights (tie_word_embeddings=True) that the built model holds as separate "
            f"tensors: {pairs}. They train apart, and save_pretrained() writes only one of them: from_pretrained() "
            "ties them again on load and discards the other",
            "Call model.tie_weights() after the last change to the model's modules (a replaced head, to_empty(), "
            "a load) and build the optimizer after it, from model.parameters(); or, if the head is meant to be "
            "separate, build the model with tie_word_embeddings=False in its config.",
        )
