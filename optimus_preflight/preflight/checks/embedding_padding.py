"""An ``nn.Embedding(padding_idx=p)`` where ``p`` is a real token (``model.embedding_padding``).

``padding_idx`` pins that row of the table at zero and gives it no gradient: right for the
pad id, which only fills the ends of short sequences. When ``p`` is a token that occurs
inside the sequences (the vocabulary's ``<unk>`` or a frequent word, a pad id of 1 from
fairseq next to a tokenizer that pads with 0), that token reads as nothing and never
learns a vector.

Read from what each such Embedding receives in one eval-mode forward on the first batch:
occurrences of ``p`` inside the sequences, in the middle half of the positions, not in the
runs at their ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_INSIDE = 5
INSIDE_SHARE = 0.01  # of the non-padding tokens


def inside_occurrences(ids: torch.Tensor, value: int) -> tuple[int, int]:
    """(occurrences of ``value`` between other tokens of their row and within the middle half
    of the positions, tokens that are not ``value``) of a (rows, positions) id tensor.
    Padding sits in runs at the ends; padding with holes still sits near them, while a
    real token occurs anywhere."""
    rows = ids.reshape(-1, ids.shape[-1]) if ids.dim() >= 2 else ids.reshape(1, -1)
    hit = rows == value
    other = ~hit
    before = other.int().cummax(dim=1).values.bool()
    after = other.flip(1).int().cummax(dim=1).values.flip(1).bool()
    length = rows.shape[1]
    middle = torch.zeros(length, dtype=torch.bool, device=rows.device)
    middle[length // 4: length - length // 4] = True
    inside = hit & before & after & middle
    return int(inside.sum()), int(other.sum())


class EmbeddingPaddingCheck(Check):
    """EMBEDDING_PADDING_IDX: an Embedding's padding_idx occurs inside the sequences."""

    name = "model.embedding_padding"
    stage = Stage.STEP
    codes = ("EMBEDDING_PADDING_IDX",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        embeddings = {m: name for name, m in ctx.model.named_modules()
                      if isinstance(m, nn.Embedding) and m.padding_idx is not None}
        if not embeddings:
            findings.data["summary"] = "no Embedding with a padding_idx"
            return
        seen: dict[nn.Module, tuple[int, int]] = {}

        def on_input(module: nn.Module, args: tuple) -> None:
            ids = args[0] if args else None
            if module not in seen and isinstance(ids, torch.Tensor) and not ids.is_floating_point() and ids.numel():
                seen[module] = inside_occurrences(ids.detach(), module.padding_idx % module.num_embeddings)

        handles = [module.register_forward_pre_hook(on_input) for module in embeddings]
        try:
            with preserved_training_state(ctx), torch.no_grad():
                ctx.model.eval()
                ctx.compute_loss(ctx.model, move_to_device(ctx.artifacts.first_batch, ctx.device))
        except Exception:
            findings.data["summary"] = "the forward could not be observed"
            return
        finally:
            for handle in handles:
                handle.remove()
        findings.data["summary"] = f"{len(seen)} Embedding(s) with a padding_idx observed"
        for module, (inside, tokens) in seen.items():
            if inside >= MIN_INSIDE and inside >= INSIDE_SHARE * tokens:
                self._report(embeddings[module], module, inside, tokens, findings)
                return

    @staticmethod
    def _report(name: str, module: nn.Embedding, inside: int, tokens: int, findings: Findings) -> None:
        findings.warning(
            "EMBEDDING_PADDING_IDX",
            f"'{name}' is nn.Embedding(padding_idx={module.padding_idx}), but id {module.padding_idx} occurs "
            f"{inside} times inside the first batch's sequences ({inside / max(tokens, 1):.1%} of their tokens), not "
            "only in the padding at their ends: it is a real token, and padding_idx keeps its vector at zero with no "
            "gradient, so the model reads it as nothing",
            "Set padding_idx to the id the collate pads with (tokenizer.pad_token_id; pad_sequence's "
            "padding_value), or leave it out if nothing is padded.",
        )
