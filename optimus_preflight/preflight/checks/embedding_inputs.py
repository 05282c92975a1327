"""What the model's embeddings read (``model.embedding_inputs``).

``EMBEDDING_ONE_TOKEN``: one token id is half or more of the non-padding tokens an
``nn.Embedding`` receives. No language (or code, or DNA) uses one token that often; an
encoder that maps most words to ``<unk>`` does: a vocabulary built from other text, a case
mismatch, a vocabulary keyed by ``(word, count)`` tuples. The inputs then differ only in
where the few known tokens fall.

``EMBEDDING_PADDING_IDX``: an ``nn.Embedding(padding_idx=p)`` where ``p`` is a real token;
an ``nn.EmbeddingBag(padding_idx=p)`` read as flat ids with offsets (nothing padded) that
receives ``p`` at all.

``FROZEN_ZERO_VECTORS``: a frozen ``nn.Embedding`` (``from_pretrained`` freezes by default)
whose all-zero rows, words missing from the pretrained vectors, are read by two or more ids
making up 1% or more of the batch's non-padding tokens: those words never get a vector.

``EMBEDDING_FIELDS_SHARE_IDS``: label-encoded categorical columns (each from 0) looked up in
one table sized as the sum of their cardinalities, without per-field offsets.

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
from optimus_preflight.training.batches import move_to_device, storages

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_INSIDE = 5
MAX_FIELDS = 64  # columns of categorical ids in one table; more is a sequence
MIN_FIELD_ROWS = 16  # samples before the columns' ranges say anything
MIN_TOKENS = 64
MIN_POSITIONS = 8  # a sequence; a few categorical columns may well be dominated by one value
ONE_TOKEN_SHARE = 0.5  # of the non-padding tokens; a space in character-level text is ~15%
INSIDE_SHARE = 0.01  # of the non-padding tokens
TYPICAL_SHARE = 0.5  # of a category's average count before a per-sample pad id counts as a category


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


def is_position_table(name: str) -> bool:
    """A module named as a positional embedding (pos, position, positional; wpe in GPT-2)."""
    last = name.rsplit(".", 1)[-1].lower()
    return last in ("wpe", "pe") or last.startswith("pos")


def shared_field_ids(ids: torch.Tensor, rows: int) -> tuple[int, int, int] | None:
    """(columns, ids used, table rows) when a (B, F) id tensor's table is sized as the sum of
    the F columns' cardinalities while every column is encoded from 0: the fields share ids.
    Token sequences do not match: a vocabulary is not the sum over positions."""
    if ids.dim() != 2 or not 2 <= ids.shape[1] <= MAX_FIELDS or ids.shape[0] < MIN_FIELD_ROWS or bool((ids < 0).any()):
        return None
    cardinalities = ids.max(dim=0).values + 1
    used = int(cardinalities.max())
    total = int(cardinalities.sum())
    if used * 2 > rows or not 0.75 * total <= rows <= 1.35 * total or bool((ids.min(dim=0).values > 0).any()):
        return None
    return ids.shape[1], used, rows


def lookups_share_ids(calls: list[tuple[int, int, int]], rows: int) -> tuple[list[int], int] | None:
    """(each lookup's largest id, table rows) when one table is read by two or more lookups of 64+
    ids that all start near 0 while the table is sized as the sum of their ranges (users and
    items in one table of n_users + n_items rows, the items' ids not offset by n_users) and its
    last rows are never read (pure)."""
    big = [(low, top) for count, low, top in calls if count >= MIN_LOOKUP_IDS]
    if len(big) < 2 or any(low > 0.05 * rows for low, _ in big):
        return None
    tops = sorted({top for _, top in big})
    if len(tops) < 2:
        return None
    total = sum(top + 1 for top in tops)
    if not 0.75 * total <= rows <= 1.35 * total or max(tops) + 1 > 0.9 * rows:
        return None
    return tops, rows


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


ZERO_VECTOR_SHARE = 0.01  # of the non-padding tokens read as all-zero frozen vectors ...
ZERO_VECTOR_IDS = 2  # ... by at least this many ids (one zero <unk> row is a common, deliberate choice)


def zero_vectors_read(module: nn.Embedding, ids: torch.Tensor) -> tuple[list[int], float] | None:
    """(ids, share of the non-padding tokens) a frozen Embedding reads as all-zero rows, the
    padding_idx and the batch's edge padding left out; None when there are too few."""
    if module.weight.requires_grad:
        return None
    with torch.no_grad():
        zero_rows = (module.weight.detach() == 0).all(dim=1)
    if not bool(zero_rows.any()):
        return None
    tokens = ids.reshape(-1)
    if ids.dim() == 2:
        profile, _ = edge_padding(ids, None)
        if profile is not None:
            tokens = tokens[tokens != profile.value]
    if module.padding_idx is not None:
        tokens = tokens[tokens != module.padding_idx % module.num_embeddings]
    tokens = tokens[(tokens >= 0) & (tokens < module.num_embeddings)]
    if tokens.numel() < MIN_TOKENS:
        return None
    hit = zero_rows.to(tokens.device)[tokens]
    used = sorted(int(i) for i in torch.unique(tokens[hit]).tolist())
    share = float(hit.float().mean())
    return (used, share) if len(used) >= ZERO_VECTOR_IDS and share >= ZERO_VECTOR_SHARE else None


MIN_BAGS = 4  # offsets of a batch this large before their layout is judged


def ids_crossed(id_shapes: dict[nn.Module, set[tuple[int, ...]]],
                outputs: list[tuple[int, ...]]) -> tuple[nn.Module, nn.Module, int] | None:
    """(the table read with (B, 1) ids, the one read with (B,) ids, B) when a forward's output
    is (B, B) (pure): per-sample ids of the two shapes give vectors that broadcast pairwise."""
    for column, shapes in id_shapes.items():
        for shape in shapes:
            if len(shape) != 2 or shape[1] != 1 or shape[0] < 2:
                continue
            rows = shape[0]
            flat = next((other for other, others in id_shapes.items() if other is not column and (rows,) in others), None)
            if flat is not None and any(out[:2] == (rows, rows) and len(out) == 2 for out in outputs):
                return column, flat, rows
    return None


MIN_LOOKUP_IDS = 64  # ids in a lookup before its largest one says where it stops
SHORT_REACH, FULL_REACH = 0.5, 0.8  # of the table's rows: one lookup stops below, another goes past


def short_lookup(calls: list[tuple[int, int, int]], rows: int) -> tuple[int, int] | None:
    """(largest id of the short lookup, largest of the full one) when one table is read twice in
    a step and one set of ids stops below half the table while another, from the same id space
    (it starts below where the short one ends), reaches most of it (pure). Fields given their
    own ranges of one table (ids offset per field) start where the previous field ends."""
    big = [call for call in calls if call[0] >= MIN_LOOKUP_IDS]
    short = [(low, top) for _, low, top in big if top < SHORT_REACH * rows]
    if not short:
        return None
    reach = max(top for _, top in short)
    full = [top for _, low, top in big if top >= FULL_REACH * rows and low < reach]
    return (reach, max(full)) if full else None


MIN_FOLDED_IDS, ROWS_PER_WIDTH = 64, 16  # ids read; a table this many times taller than wide


def folded_onto_width(calls: list[tuple[int, int, int]], module: nn.Module) -> int | None:
    """The width when every id a table reads (64 or more) stops exactly at its embedding width,
    reaching the last value below it, while the table has 16 times as many rows (pure)."""
    width, rows = getattr(module, "embedding_dim", 0), getattr(module, "num_embeddings", 0)
    ids = sum(count for count, _, _ in calls)
    if not calls or ids < MIN_FOLDED_IDS or rows < ROWS_PER_WIDTH * width or width < 2:
        return None
    low, top = min(call[1] for call in calls), max(call[2] for call in calls)
    return width if low >= 0 and top == width - 1 else None


class EmbeddingInputsCheck(Check):
    """EMBEDDING_ONE_TOKEN: one id is most of the tokens; EMBEDDING_PADDING_IDX: an Embedding's
    padding_idx occurs inside the sequences."""

    name = "model.embedding_inputs"
    stage = Stage.STEP
    codes = ("EMBEDDING_IDS_BROADCAST", "EMBEDDING_LOOKUP_RANGE", "EMBEDDING_ONE_TOKEN", "EMBEDDING_PADDING_IDX", "EMBEDDING_FIELDS_SHARE_IDS", "POSITION_EMBEDDING_TOKEN_IDS",
             "EMBEDDINGBAG_OFFSETS", "FROZEN_ZERO_VECTORS")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        embeddings = {m: name for name, m in ctx.model.named_modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))}
        if not embeddings:
            findings.data["summary"] = "no Embedding"
            return
        seen: dict[nn.Module, tuple[int, int] | None] = {}
        fields: dict[nn.Module, tuple[int, int, int] | None] = {}
        positions: dict[nn.Module, bool] = {}  # a position table fed ids that differ between samples
        dominant: dict[nn.Module, tuple[int, float, int] | None] = {}
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        batch_storage = storages(batch)

        flat_bags: set[nn.Module] = set()  # EmbeddingBags read as flat ids and offsets
        per_sample: set[nn.Module] = set()  # Embeddings read with one id per sample (a categorical column)
        top_row_used: dict[nn.Module, bool] = {}  # ... whose ids reach the table's last row (no spare row)
        one_token_bags: dict[nn.Module, tuple[int, int]] = {}  # (bags, tokens) of offsets = arange(bags)

        frozen_zero: dict[nn.Module, tuple[list[int], float]] = {}  # ids read as all-zero frozen vectors

        lookups: dict[nn.Module, list[tuple[int, int, int]]] = {}  # (ids, smallest, largest) per call
        id_shapes: dict[nn.Module, set[tuple[int, ...]]] = {}  # the shapes each table's ids came in

        def on_input(module: nn.Module, args: tuple) -> None:
            ids = args[0] if args else None
            offsets = args[1] if len(args) > 1 else None
            if isinstance(ids, torch.Tensor) and not ids.is_floating_point() and ids.numel():
                lookups.setdefault(module, []).append((ids.numel(), int(ids.min()), int(ids.max())))
                id_shapes.setdefault(module, set()).add(tuple(ids.shape))
            if isinstance(module, nn.Embedding) and module not in frozen_zero and isinstance(ids, torch.Tensor) \
                    and not ids.is_floating_point() and ids.numel() >= MIN_TOKENS:
                found = zero_vectors_read(module, ids.detach())
                if found is not None:
                    frozen_zero[module] = found
            if isinstance(module, nn.EmbeddingBag) and isinstance(ids, torch.Tensor) and ids.dim() == 1 \
                    and isinstance(offsets, torch.Tensor) and offsets.dim() == 1 and offsets.numel() >= MIN_BAGS:
                bags = offsets.numel()
                # Offsets are where each bag starts in the flat ids: arange(B) gives every bag one token and
                # the last bag all the rest (the bag sizes were never summed).
                if ids.numel() >= 2 * bags and torch.equal(offsets.detach().cpu(), torch.arange(bags)):
                    one_token_bags[module] = (bags, ids.numel())
            if module in seen or not isinstance(ids, torch.Tensor) or ids.is_floating_point() or not ids.numel():
                return
            ids = ids.detach()
            if module not in fields:
                fields[module] = shared_field_ids(ids, module.num_embeddings)
            if module not in positions and is_position_table(embeddings[module]):
                # Per-sample positions exist (left padding: attention_mask.cumsum(-1) - 1; RoBERTa's offset
                # of padding_idx + 1) but stay within the sequence length: token ids need not.
                positions[module] = (ids.dim() == 2 and ids.shape[0] > 1 and bool((ids != ids[:1]).any())
                                     and int(ids.max()) > ids.shape[1] + 2)
            if isinstance(module, nn.EmbeddingBag) and module.padding_idx is not None and ids.dim() == 1:
                # Flat ids cut into bags by offsets hold no padding at all: every pad id is a token.
                pad = module.padding_idx % module.num_embeddings
                seen[module] = (int((ids == pad).sum()), ids.numel())
                flat_bags.add(module)
                return
            if not isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
                seen[module] = None
                return
            if isinstance(module, nn.Embedding) and module.padding_idx is not None and ids.dim() == 1:
                # One id per sample is a categorical column: nothing is padded. The pad id is a real
                # category when it is about as common as the others (an id kept for 'missing' is
                # usually rarer).
                pad = module.padding_idx % module.num_embeddings
                count = int((ids == pad).sum())
                typical = ids.numel() / max(int(torch.unique(ids).numel()), 1)
                seen[module] = (count, ids.numel()) if count >= TYPICAL_SHARE * typical else None
                top_row_used[module] = int(ids.max()) == module.num_embeddings - 1
                per_sample.add(module)
                return
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

        outputs: list[tuple[int, ...]] = []  # of the whole model's forwards

        def on_output(module: nn.Module, args: tuple, output: object) -> None:
            if isinstance(output, torch.Tensor):
                outputs.append(tuple(output.shape))

        handles = [module.register_forward_pre_hook(on_input) for module in embeddings]
        handles.append(ctx.model.register_forward_hook(on_output))
        try:
            eval_forward(ctx, batch)
        except Exception:
            findings.data["summary"] = "the forward could not be observed"
            return
        finally:
            for handle in handles:
                handle.remove()
        findings.data["summary"] = f"{len(seen)} Embedding input(s) observed"
        crossed = ids_crossed(id_shapes, outputs)
        if crossed is not None:
            column, flat, rows = crossed
            findings.error(
                "EMBEDDING_IDS_BROADCAST",
                f"the model's output is ({rows}, {rows}), one score per pair of samples: its embeddings read ids of shape "
                f"({rows}, 1) ('{embeddings[column]}') beside ids of shape ({rows},) ('{embeddings[flat]}'), so their "
                f"vectors come out ({rows}, 1, D) and ({rows}, D) and broadcast against each other: every sample's "
                f"'{embeddings[column]}' is scored with every other sample's '{embeddings[flat]}', and the loss averages "
                "over all the pairs instead of the batch's own. A Dataset that returns one-element tensors "
                "(torch.tensor([user_id])) collates them to (B, 1)",
                "Return scalar ids from the Dataset (torch.tensor(user_id), or int), or squeeze the ids before the "
                "lookup (ids.squeeze(-1)), so both lookups give (B, D) and the score is (B,).",
            )
        for module, calls in lookups.items():
            joint = lookups_share_ids(calls, module.num_embeddings)
            if joint is not None and fields.get(module) is None:
                tops, rows = joint
                findings.warning(
                    "EMBEDDING_FIELDS_SHARE_IDS",
                    f"'{embeddings[module]}' has {rows} rows, about the sum of the ranges of the {len(tops)} id sets "
                    f"it is looked up with in one step ({', '.join(f'0..{top}' for top in tops)}), and every set starts "
                    f"at 0: one table for two kinds of ids (users and items in nn.Embedding(n_users + n_items, d)) "
                    f"whose second kind was not offset, so item i trains user i's row and rows {max(tops) + 1}.."
                    f"{rows - 1} are never read",
                    "Offset the second kind of id by the first one's count before the lookup: table(item_ids + "
                    "n_users) (or give each kind its own nn.Embedding).",
                )
                continue
            short = short_lookup(calls, module.num_embeddings)
            constant = next((top for count, low, top in calls if count >= MIN_LOOKUP_IDS and low == top), None)
            spread = max((top for count, low, top in calls if count >= MIN_LOOKUP_IDS and low != top), default=None)
            if constant is not None and spread is not None and spread >= FULL_REACH * module.num_embeddings:
                findings.warning(
                    "EMBEDDING_LOOKUP_RANGE",
                    f"the embedding '{embeddings[module]}' ({module.num_embeddings} rows) is looked up twice in one step: "
                    f"one set of ids reaches row {spread}, the other is row {constant} every time. A sampler that "
                    "returns the same value on every call does this: a generator re-seeded inside __getitem__ "
                    "(torch.Generator().manual_seed(0) or random.seed(s) per sample) draws the same 'random' negative "
                    "for every triple, so one row is pushed down and the rest of the catalogue is never a negative",
                    "Seed the sampler once, not per call: keep one torch.Generator (or the global RNG, which the "
                    "DataLoader seeds per worker) across calls and draw from it in __getitem__ or the collate_fn.",
                )
            elif short is not None:
                reach, full = short
                findings.warning(
                    "EMBEDDING_LOOKUP_RANGE",
                    f"the embedding '{embeddings[module]}' ({module.num_embeddings} rows) is looked up twice in one step: "
                    f"one set of ids reaches row {full}, another never goes past row {reach}. Ids drawn from the "
                    "wrong range do this: negative items sampled with randint(0, n_users) instead of randint(0, n_items), so the rows "
                    "past it are never trained as negatives and the ranking learns only part of the catalogue",
                    f"Draw the ids from the table's own range: torch.randint(0, {module.num_embeddings}, ...) "
                    "(n_items for items), and check which count each sampler uses.",
                )
            reach = folded_onto_width(calls, module)
            if reach is not None:
                findings.warning(
                    "EMBEDDING_LOOKUP_RANGE",
                    f"the embedding '{embeddings[module]}' has {module.num_embeddings} rows of width "
                    f"{module.embedding_dim}, and every id it reads lies in [0, {reach}): exactly its width. Ids "
                    f"reduced modulo the embedding dimension (hash(x) % emb.embedding_dim, or % dim where % "
                    f"num_buckets was meant) fold every category onto {module.embedding_dim} rows: most categories "
                    f"share a vector and {module.num_embeddings - reach} rows are never trained",
                    f"Reduce hashed ids modulo the table's row count: hash(x) % {module.num_embeddings} "
                    "(emb.num_embeddings), not the embedding width.",
                )
        for module, (zero_ids, share) in frozen_zero.items():
            shown = ", ".join(str(i) for i in zero_ids[:6]) + (" ..." if len(zero_ids) > 6 else "")
            findings.warning(
                "FROZEN_ZERO_VECTORS",
                f"the frozen embedding '{embeddings[module]}' (requires_grad=False: nn.Embedding.from_pretrained "
                f"freezes by default) maps {len(zero_ids)} token id(s) the batch uses ({shown}; {share:.0%} of its "
                "non-padding tokens) to all-zero vectors: words missing from the pretrained vectors (out of "
                "vocabulary, their rows left at zero) read as nothing and, frozen, never learn a vector, so whatever "
                "they say about the label is lost",
                "Let the table train (nn.Embedding.from_pretrained(matrix, freeze=False)), or give the missing words "
                "random rows (matrix[oov] = torch.randn(len(oov), dim) * matrix.std()) before loading it; keep zero "
                "only for the padding_idx.",
            )
        for module, (bags, tokens) in one_token_bags.items():
            findings.error(
                "EMBEDDINGBAG_OFFSETS",
                f"the EmbeddingBag '{embeddings[module]}' gets offsets 0, 1, ..., {bags - 1} for {tokens} flat ids: "
                "offsets are where each bag STARTS in the flat input, so bags 0 to "
                f"{bags - 2} hold one token each (the first token of the batch, then the next...) and the last bag "
                f"holds the other {tokens - bags + 1}: no sample is encoded from its own tokens",
                "Build the offsets from the bag lengths: offsets = torch.cat([torch.zeros(1, dtype=torch.long), "
                "lengths.cumsum(0)[:-1]]) (or pass a padded (B, T) input with padding_idx, and no offsets).",
            )
            break
        for module, token_ids in positions.items():
            if token_ids:
                findings.warning(
                    "POSITION_EMBEDDING_TOKEN_IDS",
                    f"the position embedding '{embeddings[module]}' receives ids that differ between the samples of "
                    "the first batch at the same position: it is looked up with the token ids (self.pos(x)), not "
                    "with the positions, so it is a second token embedding and the model has no notion of order",
                    "Look positions up by index: self.pos(torch.arange(x.shape[1], device=x.device)) (broadcast over "
                    "the batch), or position_ids = torch.arange(T).expand(B, T).",
                )
                break
        for module, shared in fields.items():
            if shared is not None:
                columns, used, rows = shared
                findings.warning(
                    "EMBEDDING_FIELDS_SHARE_IDS",
                    f"'{embeddings[module]}' has {rows} rows, the sum of its {columns} input columns' cardinalities, "
                    f"but the ids it reads in the first batch stay below {used}: every column is encoded from 0, "
                    "so id 3 of one column and id 3 of another read the same row, the table cannot tell which "
                    f"field a category came from, and rows {used}..{rows - 1} are never used. Label-encoded "
                    "categorical fields looked up in one table need per-field offsets",
                    "Add each field's offset before the lookup: offsets = torch.tensor([0, *cards[:-1]]).cumsum(0), "
                    "then table(ids + offsets) (or one embedding per field).",
                )
                break
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
                if module in per_sample:
                    self._report_category(embeddings[module], module, inside, tokens, findings,
                                          top_row_used.get(module, False))
                else:
                    self._report(embeddings[module], module, inside, tokens, findings, module in flat_bags)
                return

    @staticmethod
    def _report_category(name: str, module: nn.Module, count: int, rows: int, findings: Findings,
                         top_row: bool) -> None:
        pad = module.padding_idx % module.num_embeddings
        spare = (f", and the ids reach the table's last row ({module.num_embeddings - 1}), so no row was kept spare "
                 "for padding" if top_row else ", as often as a typical category")
        findings.warning(
            "EMBEDDING_PADDING_IDX",
            f"'{name}' is nn.Embedding({module.num_embeddings}, padding_idx={module.padding_idx}) but reads one id per "
            f"sample, a categorical column with nothing to pad, and id {pad} is one of its categories: {count} of the "
            f"first batch's {rows} samples have it{spare}. padding_idx keeps that category's vector at zero with no "
            "gradient, so the model reads it as nothing and cannot learn it (LabelEncoder, pd.factorize and "
            ".cat.codes number categories from 0)",
            f"Drop padding_idx (nothing is padded in one id per sample); if id {pad} must mean 'missing', shift the "
            f"codes by one (codes + 1) and size the table {module.num_embeddings + 1}.",
        )

    @staticmethod
    def _report(name: str, module: nn.Module, inside: int, tokens: int, findings: Findings, flat: bool = False) -> None:
        where = (f"occurs {inside} times among the first batch's flat ids ({inside / max(tokens, 1):.1%} of them), "
                 "which offsets cut into bags, so nothing is padded" if flat else
                 f"occurs {inside} times inside the first batch's sequences ({inside / max(tokens, 1):.1%} of their "
                 "tokens), not only in the padding at their ends")
        findings.warning(
            "EMBEDDING_PADDING_IDX",
            f"'{name}' is nn.{type(module).__name__}(padding_idx={module.padding_idx}), but id {module.padding_idx} "
            f"{where}: it is a real word or token (a vocabulary numbered from 0, such as enumerate(counts.most_common())"
            ", gives its commonest word id 0), and padding_idx keeps its vector at zero with no gradient"
            + (" and drops it from every bag" if isinstance(module, nn.EmbeddingBag) else "")
            + ", so the model reads it as nothing",
            "Set padding_idx to the id the collate pads with (tokenizer.pad_token_id; pad_sequence's "
            "padding_value), or leave it out if nothing is padded.",
        )
