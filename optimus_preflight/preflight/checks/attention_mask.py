"""Attention masks that hide the tokens and show the padding (``step.attention_mask``).

Two conventions meet here and are easy to swap: Hugging Face's ``attention_mask`` is 1 on
the tokens to attend to, torch's ``key_padding_mask`` / ``src_key_padding_mask`` is True
on the positions to *ignore*. Written the other way round, the model attends to the
padding alone (or to nothing, giving NaN), and nothing raises.

The padding is read from the token ids themselves (``analyses.padding.edge_padding``: one
id filling runs at the rows' ends), so the check needs no knowledge of the tokenizer:
- a Hugging Face style batch whose ``attention_mask`` is 1 exactly on the padding;
- a ``key_padding_mask`` that an ``nn.MultiheadAttention``/``nn.Transformer*`` module
  receives during one eval-mode forward that is True on the tokens and False on the
  padding (seen through forward pre-hooks);
- a Hugging Face model called with padded ``input_ids`` and no ``attention_mask``
  (``ATTENTION_MASK_MISSING``): it attends to the padding, so each sample's representation
  depends on how much padding its batch needed. A causal model with right padding is left
  alone: its real tokens never see the padding that follows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.analyses.padding import edge_padding
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

AGREE = 0.95  # of the positions: the mask is the padding (or its complement) this often
CAUSAL_MODEL_TYPES = ("gpt2", "gpt_neo", "gptj", "gpt_neox", "llama", "mistral", "opt", "bloom", "qwen2", "phi", "gemma",
                      "falcon", "codegen")
MASK_KWARGS = ("key_padding_mask", "src_key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask")
ATTENTION_MODULES = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder,
                     nn.TransformerDecoderLayer, nn.TransformerDecoder, nn.Transformer)


def padding_of(ids: torch.Tensor) -> torch.Tensor | None:
    """The padding positions of a (B, T) tensor of token ids, when it has padding. A 0/1
    tensor is a mask, not ids: its long runs of 1 at the start would pass for left padding."""
    if ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool or ids.shape[1] < 4:
        return None
    if bool(((ids == 0) | (ids == 1)).all()):
        return None
    _, mask = edge_padding(ids, None)
    return mask if mask is not None and bool(mask.any()) and not bool(mask.all()) else None


def zero_frame_padding(frames: torch.Tensor) -> torch.Tensor | None:
    """The padding of a (B, T, F) float tensor of frames or features: the all-zero frames,
    where they form a run at the end (or the start) of every sample that has them."""
    if frames.dim() != 3 or not frames.is_floating_point() or frames.shape[1] < 4:
        return None
    pad = (frames == 0).all(dim=-1)
    if not bool(pad.any()) or bool(pad.all()):
        return None
    positions = torch.arange(pad.shape[1], device=pad.device)
    counts = pad.sum(dim=1, keepdim=True)
    at_end, at_start = positions >= pad.shape[1] - counts, positions < counts
    return pad if bool((pad == at_end).all()) or bool((pad == at_start).all()) else None


def aligned(mask: torch.Tensor, pad: torch.Tensor) -> list[torch.Tensor]:
    """``mask`` cut to ``pad``'s positions: the same length, or one or two extra positions
    (a [CLS] or register token) at the start or the end."""
    extra = mask.shape[1] - pad.shape[1]
    if mask.shape[0] != pad.shape[0] or extra not in (0, 1, 2):
        return []
    return [mask] if extra == 0 else [mask[:, extra:], mask[:, :-extra]]


def matches(mask: torch.Tensor, target: torch.Tensor) -> bool:
    return mask.shape == target.shape and float((mask.bool() == target).float().mean()) >= AGREE


def inverted_hf_mask(batch: Any) -> tuple[str, str] | None:
    """(ids key, mask key) of a mapping batch whose attention mask is 1 on the padding."""
    if not isinstance(batch, Mapping):
        return None
    for ids_key in ("input_ids", "decoder_input_ids"):
        mask_key = "attention_mask" if ids_key == "input_ids" else "decoder_attention_mask"
        ids, mask = batch.get(ids_key), batch.get(mask_key)
        if not (isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor)) or mask.shape != ids.shape:
            continue
        pad = padding_of(ids)
        if pad is not None and bool(((mask == 0) | (mask == 1)).all()) and matches(mask, pad):
            return ids_key, mask_key
    return None


def hf_models(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost Hugging Face models in ``model`` (the model itself when it is one)."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        config = getattr(module, "config", None)
        if config is None or not hasattr(config, "pad_token_id") or not hasattr(module, "get_input_embeddings"):
            continue
        if not any(name == outer or name.startswith(outer + ".") or not outer for outer, _ in found):
            found.append((name, module))
    return found


class AttentionMaskCheck(Check):
    """ATTENTION_MASK_INVERTED: an attention mask that selects the padding instead of the tokens."""

    name = "step.attention_mask"
    stage = Stage.STEP
    codes = ("ATTENTION_MASK_INVERTED", "ATTENTION_MASK_MISSING")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        hf = inverted_hf_mask(batch)
        if hf is not None:
            findings.error(
                "ATTENTION_MASK_INVERTED",
                f"the batch's {hf[1]!r} is 1 exactly on the padding of {hf[0]!r} and 0 on the tokens: Hugging Face "
                "attends where the mask is 1, so the model reads the padding and ignores the text (torch's "
                "key_padding_mask convention, True = ignore, is the opposite)",
                "Build it as (input_ids != tokenizer.pad_token_id).long(): 1 on the tokens, 0 on the padding (the "
                "tokenizer's own attention_mask already is).",
            )
            return
        if self._missing_hf_mask(ctx, findings):
            return
        pads = [pad for leaf in leaves(batch) if isinstance(leaf, torch.Tensor)
                and (pad := padding_of(leaf) if not leaf.is_floating_point() else zero_frame_padding(leaf)) is not None]
        modules = [m for m in ctx.model.modules() if isinstance(m, ATTENTION_MODULES)]
        if not pads or not modules:
            findings.data["summary"] = "no padded ids, or no torch attention module"
            return
        seen = self._key_padding_masks(ctx, modules)
        findings.data["summary"] = f"{len(seen)} key padding mask(s) observed"
        for name, mask in seen:
            if any(matches(part, ~pad) for pad in pads for part in aligned(mask, pad)):
                findings.error(
                    "ATTENTION_MASK_INVERTED",
                    f"the {name} an attention module receives is inverted: True on the real tokens and False on the "
                    "padding, while torch ignores the positions where a key padding mask is True, so the model "
                    "attends to the padding alone (Hugging Face's attention_mask, 1 = attend, is the opposite "
                    "convention: a mask built as ids != pad_id, or passed on from a tokenizer, reads backwards here)",
                    f"Pass {name}=(ids == pad_id): True on the padding, or {name}=~attention_mask.bool() when you "
                    "start from a Hugging Face attention_mask.",
                )
                return

    @staticmethod
    def _missing_hf_mask(ctx: PreflightContext, findings: Findings) -> bool:
        """ATTENTION_MASK_MISSING / ATTENTION_MASK_INVERTED: a Hugging Face model (the model or one
        inside it) whose forward is given padded input_ids and no attention_mask, or a mask that
        is 1 exactly on the padding (read from the call itself: a loss function or a wrapper's
        forward may build the mask)."""
        models = hf_models(ctx.model)
        if not models:
            return False
        calls: list[tuple[nn.Module, Any, Any]] = []

        def on_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not any(seen is module for seen, _, _ in calls):
                ids = kwargs.get("input_ids", args[0] if args else None)
                calls.append((module, ids, kwargs.get("attention_mask", args[1] if len(args) > 1 else None)))

        handles = [model.register_forward_pre_hook(on_call, with_kwargs=True) for _, model in models]
        try:
            eval_forward(ctx, ctx.artifacts.first_batch)
        except Exception:
            return False
        finally:
            for handle in handles:
                handle.remove()
        for model, ids, mask in calls:
            if not isinstance(ids, torch.Tensor) or (pad := padding_of(ids)) is None:
                continue
            if isinstance(mask, torch.Tensor):
                if mask.shape == ids.shape and bool(((mask == 0) | (mask == 1)).all()) and matches(mask.cpu(), pad.cpu()):
                    findings.error(
                        "ATTENTION_MASK_INVERTED",
                        f"the attention_mask the {type(model).__name__} is called with is 1 exactly on the padding of its "
                        "input_ids and 0 on the tokens: Hugging Face attends where the mask is 1, so the model reads the "
                        "padding and ignores the text (torch's key_padding_mask convention, True = ignore, is the "
                        "opposite: a mask inverted with 1 - mask or ~mask for it was passed on)",
                        "Pass the tokenizer's mask as it is: 1 on the tokens, 0 on the padding ((input_ids != "
                        "tokenizer.pad_token_id).long()); invert it only for torch's key_padding_mask.",
                    )
                    return True
                continue
            if mask is not None:
                continue
            config = model.config
            profile, _ = edge_padding(ids, None)
            causal = bool(getattr(config, "is_decoder", False)) or type(model).__name__.endswith(
                ("ForCausalLM", "LMHeadModel")) or getattr(config, "model_type", "") in CAUSAL_MODEL_TYPES
            if causal and profile is not None and profile.side == "end":
                continue
            share = float(pad.float().mean())
            findings.warning(
                "ATTENTION_MASK_MISSING",
                f"the {type(model).__name__} is called with padded input_ids ({share:.0%} of the positions are padding "
                f"id {profile.value if profile else '?'}) and no attention_mask: it attends to the padding as if it "
                "were text, so each sample's representation depends on how much padding its batch needed, and the "
                "model learns around the padding instead of ignoring it (Hugging Face only logs a one-time warning)",
                "Pass the tokenizer's attention_mask along with input_ids (model(input_ids=..., attention_mask=...); "
                "keep it in the batch: tokenizer(..., padding=True) returns it, and DataCollatorWithPadding pads it), "
                "or build it as (input_ids != tokenizer.pad_token_id).long().",
            )
            return True
        return False

    @staticmethod
    def _key_padding_masks(ctx: PreflightContext, modules: list[nn.Module]) -> list[tuple[str, torch.Tensor]]:
        seen: list[tuple[str, torch.Tensor]] = []

        def on_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
            for key in MASK_KWARGS:
                value = kwargs.get(key)
                if isinstance(value, torch.Tensor) and value.dim() == 2:
                    # on the host: the padding it is compared with comes from the batch, which stays on the CPU
                    seen.append((key, (value.detach().bool() if value.dtype == torch.bool else value.detach() != 0).cpu()))

        handles = [m.register_forward_pre_hook(on_call, with_kwargs=True) for m in modules]
        try:
            eval_forward(ctx, ctx.artifacts.first_batch)
        except Exception:
            return seen
        finally:
            for handle in handles:
                handle.remove()
        return seen
