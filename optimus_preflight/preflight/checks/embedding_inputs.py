"""What the model's embeddings read (``model.embedding_inputs``).

``EMBEDDING_ONE_TOKEN``: one token id is half or more of the non-padding tokens an
``nn.Embedding`` receives. No language (or code, or DNA) uses one token that often; an
encoder that maps most words to ``<unk>`` does: a vocabulary built from other text, a case
mismatch, a vocabulary keyed by ``(word, count)`` tuples. The inputs then differ only in
where the few known tokens fall.

``EMBEDDING_PADDING_IDX``: an ``nn.Embedding(padding_idx=p)`` where ``p`` is a real token.

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

from typing import TYPE_CHECKING

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.analyses.padding import edge_padding
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_INSIDE = 5
MIN_TOKENS = 64
MIN_POSITIONS = 8  # a sequence; a few categorical columns may well be dominated by one value
ONE_TOKEN_SHARE = 0.5  # of the non-padding tokens; a space in character-level text is ~15%
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


def dominant_token(ids: torch.Tensor) -> tuple[int, float, int] | None:
    """(id, its share of the non-padding tokens, tokens counted) of the commonest id of a
    (rows, positions) id tensor, the padding runs at the rows' ends left out."""
    rows = ids.reshape(-1, ids.shape[-1]) if ids.dim() >= 2 else ids.reshape(1, -1)
    _, pad = edge_padding(rows, None)
    kept = rows[~pad] if pad is not None else rows.reshape(-1)
    if kept.numel() < MIN_TOKENS:
        return None
    values, counts = torch.unique(kept, return_counts=True)
    if values.numel() < 3:  # a two-token vocabulary (a binary sequence) is no text
        return None
    top = int(counts.argmax())
    return int(values[top]), float(counts[top]) / kept.numel(), kept.numel()


class EmbeddingInputsCheck(Check):
    """EMBEDDING_ONE_TOKEN: one id is most of the tokens; EMBEDDING_PADDING_IDX: an Embedding's
    padding_idx occurs inside the sequences."""

    name = "model.embedding_inputs"
    stage = Stage.STEP
    codes = ("EMBEDDING_ONE_TOKEN", "EMBEDDING_PADDING_IDX")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        embeddings = {m: name for name, m in ctx.model.named_modules() if isinstance(m, nn.Embedding)}
        if not embeddings:
            findings.data["summary"] = "no Embedding"
            return
        seen: dict[nn.Module, tuple[int, int] | None] = {}
        dominant: dict[nn.Module, tuple[int, float, int] | None] = {}
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        batch_storage = {leaf.untyped_storage().data_ptr() for leaf in leaves(batch) if isinstance(leaf, torch.Tensor)}

        def on_input(module: nn.Module, args: tuple) -> None:
            ids = args[0] if args else None
            if module in seen or not isinstance(ids, torch.Tensor) or ids.is_floating_point() or not ids.numel():
                return
            ids = ids.detach()
            if module.padding_idx is not None:
                pad = module.padding_idx % module.num_embeddings
                # A time-major (T, B) batch pads along dim 0: read both axes, the padding's is its edge.
                found = [inside_occurrences(ids, pad)]
                if ids.dim() == 2:
                    found.append(inside_occurrences(ids.t(), pad))
                seen[module] = min(found)
            else:
                seen[module] = None
            # Token ids come from the batch (a view of one of its tensors); an embedding of relative
            # positions or buckets (T5's attention bias) reads ids the model computes itself.
            from_batch = ids.untyped_storage().data_ptr() in batch_storage
            dominant[module] = (dominant_token(ids) if from_batch and ids.dim() >= 2 and ids.shape[-1] >= MIN_POSITIONS
                                else None)

        handles = [module.register_forward_pre_hook(on_input) for module in embeddings]
        try:
            eval_forward(ctx, batch)
        except Exception:
            findings.data["summary"] = "the forward could not be observed"
            return
        finally:
            for handle in handles:
                handle.remove()
        findings.data["summary"] = f"{len(seen)} Embedding input(s) observed"
        for module, top in dominant.items():
            if top is not None and top[1] >= ONE_TOKEN_SHARE:
                token, share, count = top
                findings.warning(
                    "EMBEDDING_ONE_TOKEN",
                    f"one token id ({token}) is {share:.0%} of the {count} non-padding tokens that "
                    f"'{embeddings[module]}' reads in the first batch: no text uses one token that often, an encoder "
                    "that maps most words to the unknown token does (a vocabulary built from other text, a case "
                    "mismatch, a vocabulary keyed by (word, count) tuples from Counter.most_common). The inputs "
                    "then differ only in where the few known words fall",
                    "Encode a few samples by hand and look at the ids: build the vocabulary from the training text "
                    "with the same normalisation (lower-casing) as the encoder, keyed by the word itself "
                    "({w: i for i, (w, _) in enumerate(counts.most_common(n))}).",
                )
                break
        for module, occurrences in seen.items():
            if occurrences is None:
                continue
            inside, tokens = occurrences
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
