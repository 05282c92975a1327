"""Label leakage through the objective: setups where the answer reaches the model, so
training looks perfect (``step.target_leak``).

It runs ``compute_loss`` on the first samples of the first batch, without gradients, in
eval mode, and compares the targets that reach the cross-entropy with the token ids that
reach the model's embedding. Targets equal to the input token at the same position mean
the model is taught to copy its input (an LM whose targets were never shifted): error.
Targets equal to the *next* input token mean a next-token objective, which a causal model
must not be able to read ahead for: a second forward with the tokens from the middle of
the sequence on replaced must leave the logits before it unchanged; if they move,
attention sees the future (a missing causal mask): error. Hugging Face ``*ForCausalLM``
models take ``labels=input_ids`` and shift inside, which the comparison sees as the
next-token objective it is; a masked LM (BERT) compares neither way and is left alone.
Targets equal to the input token *two* positions later mean labels shifted twice (by
hand, then again inside a Hugging Face causal LM): the model is taught to skip a token
(``LM_SHIFT_TWICE``). When the training targets are the next tokens, the validation loader's
first batch is read the same way: targets equal to its inputs (or two positions on) mean the
validation pairs are built unlike the training ones (``VAL_TARGETS_NOT_SHIFTED``).

Every call of an embedding is compared, not only its first: an encoder-decoder that embeds
the source and then the decoder's input with one shared table shows a teacher-forced
decoder fed the targets themselves (never shifted right) only in the second call.
"""


from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.data_access.samples import split_batch
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import batch_size_of, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

CRITERIA = ("cross_entropy", "nll_loss")
MIN_COMPARED = 16  # target positions needed to call an objective
MATCH = 0.99  # share of targets that must equal the input token (aligned or next)
MISMATCH = 0.9  # ... while the other alignment must stay below this
# Logits before the perturbed position may move by this fraction of the change at it;
# a causal model leaves them bitwise equal, an unmasked one moves them by ~1e-3..1e-1.
FUTURE_RATIO = 1e-4
PROBE_SAMPLES = 4
VAL_READ_BUDGET_S = 5.0


@dataclass
class Objective:
    aligned: float  # share of targets equal to the input token at their own position
    shifted: float  # share equal to the input token one position later
    compared: int
    skipped: float = 0.0  # share equal to the input token two positions later

    @property
    def kind(self) -> str:
        if self.compared < MIN_COMPARED:
            return "unknown"
        if self.aligned >= MATCH and self.shifted < MISMATCH:
            return "copy"
        if self.shifted >= MATCH and self.aligned < MISMATCH:
            return "next_token"
        if self.skipped >= MATCH and self.shifted < MISMATCH and self.aligned < MISMATCH:
            return "shifted_twice"
        return "other"


def target_grid(ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
    """The criterion's targets as a (B, T') grid of positions of ``ids`` (B, T): T' = T
    (flattened per position, as Hugging Face pads the shifted labels) or T - 1 (the
    last position dropped)."""
    if target.is_floating_point() or target.dim() == 0:
        return None
    batch, length = ids.shape
    if target.numel() == batch * length:
        return target.reshape(batch, length)
    if target.numel() == batch * (length - 1):
        return target.reshape(batch, length - 1)
    return None


def objective_of(ids: torch.Tensor, target: torch.Tensor, ignore_index: int | None) -> Objective | None:
    """How the targets line up with the input ids (pure)."""
    grid = target_grid(ids, target)
    if grid is None:
        return None
    ids = ids.to(grid.device)
    width = grid.shape[1]
    valid = grid != ignore_index if ignore_index is not None else torch.ones_like(grid, dtype=torch.bool)
    aligned = (grid == ids[:, :width]) & valid
    # Target at position t against the input at t + 1 (the last target of a full-width grid has none).
    reach = min(width, ids.shape[1] - 1)
    # A row's last target before its ignored padding (the EOS) meets a padded input next: a
    # decoder input padded with the pad id, not with the target it would be shifted from.
    after = valid.flip(1).long().cumsum(1).flip(1)  # valid targets at or after each position
    last = (valid & (after == 1))[:, :reach]
    last &= ~valid[:, -1:]  # only where ignored padding follows: a full row's end has no next input anyway
    counted = valid[:, :reach] & ~last
    shifted = (grid[:, :reach] == ids[:, 1 : reach + 1]) & counted
    compared = int(valid.sum())
    if compared == 0 or int(counted.sum()) == 0:
        return Objective(0.0, 0.0, 0)
    skip_reach = min(width, ids.shape[1] - 2)
    skipped = 0.0
    if skip_reach > 0 and int(valid[:, :skip_reach].sum()) > 0:
        hits = (grid[:, :skip_reach] == ids[:, 2 : skip_reach + 2]) & valid[:, :skip_reach]
        skipped = float(hits.sum()) / int(valid[:, :skip_reach].sum())
    return Objective(float(aligned.sum()) / compared, float(shifted.sum()) / int(counted.sum()), compared,
                     skipped)


@dataclass
class CriterionSeen:
    logits: torch.Tensor
    target: torch.Tensor
    ignore_index: int | None


class _FirstCriterion(TorchFunctionMode):
    """Keeps the input and target of the first cross_entropy / nll_loss call (references)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: CriterionSeen | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.seen is None and getattr(func, "__name__", "") in CRITERIA:
            inputs = args[0] if args else kwargs.get("input")
            target = args[1] if len(args) > 1 else kwargs.get("target")
            ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
            if isinstance(inputs, torch.Tensor) and isinstance(target, torch.Tensor):
                self.seen = CriterionSeen(inputs, target, ignore)
        return func(*args, **kwargs)


@dataclass
class TokenInput:
    module: nn.Embedding
    name: str
    ids: torch.Tensor  # (B, T)
    call: int = 0  # which call of ``module`` in the forward received them


@dataclass
class LossForward:
    inputs: list[TokenInput] = field(default_factory=list)
    criterion: CriterionSeen | None = None


# Calls of one embedding recorded: the source and the decoder input of a shared table, and a few
# more; a decoder stepping token by token calls it with (B, 1) ids, which are not recorded anyway.
CALLS_PER_EMBEDDING = 4


def loss_forward(ctx: PreflightContext, batch: Any,
                 replace: tuple[TokenInput, torch.Tensor] | None = None) -> LossForward | None:
    """``compute_loss`` on ``batch`` in eval mode without gradients, recording what each
    nn.Embedding's calls receive (token ids of shape (B, T)) and the first criterion
    call; ``replace`` swaps the ids of one recorded call for others. None when the loss
    raises (step.first_step reports it)."""
    model = ctx.model
    names = {module: name for name, module in model.named_modules() if isinstance(module, nn.Embedding)}
    seen = LossForward()
    calls: dict[nn.Module, int] = {}

    def on_embedding(module: nn.Module, args: tuple) -> tuple | None:
        call = calls.get(module, 0)
        if call >= CALLS_PER_EMBEDDING or not args or not isinstance(args[0], torch.Tensor):
            return None
        calls[module] = call + 1
        ids = args[0]
        if ids.dim() == 2 and ids.shape[1] > 1 and not ids.is_floating_point():
            seen.inputs.append(TokenInput(module, names[module], ids, call))  # type: ignore[arg-type]
            if replace is not None and replace[0].module is module and replace[0].call == call \
                    and replace[1].shape == ids.shape:
                return (replace[1].to(ids.device), *args[1:])
        return None

    handles = [module.register_forward_pre_hook(on_embedding) for module in names]
    capture = _FirstCriterion()
    try:
        with preserved_training_state(ctx), torch.no_grad():
            model.eval()  # no dropout: two forwards differ only where their inputs do
            with ctx.training.plan.autocast(), capture:
                ctx.compute_loss(model, move_to_device(batch, ctx.device))
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    seen.criterion = capture.seen
    return seen


def probe_rows(batch: Any) -> Any:
    """The first ``PROBE_SAMPLES`` samples of a batch: plenty of target positions, and the
    two forwards cost a fraction of a step."""
    size = batch_size_of(batch)
    if size <= PROBE_SAMPLES:
        return batch
    try:
        return split_batch(batch, math.ceil(size / PROBE_SAMPLES))[0]
    except (ValueError, TypeError, IndexError):  # a batch the splitter cannot cut: use all of it
        return batch


def position_logits(logits: torch.Tensor, grid: torch.Tensor, positions: list[int]) -> torch.Tensor | None:
    """The criterion input's class scores at target positions ``positions``: shape
    (B, len(positions), C), from (B*T', C) or (B, C, T') logits."""
    batch, width = grid.shape
    if logits.dim() == 2 and logits.shape[0] == batch * width:
        return logits.reshape(batch, width, -1)[:, positions].float().clone()
    if logits.dim() == 3 and logits.shape[0] == batch and logits.shape[2] == width:
        return logits[:, :, positions].transpose(1, 2).float().clone()
    return None


def probe_start(grid: torch.Tensor, ignore_index: int | None) -> tuple[int, torch.Tensor] | None:
    """(the first input position to perturb, the rows whose target just before it counts):
    the middle of the positions whose preceding target is trained on, so that a prefix
    the loss ignores (a prompt, a prefix-LM's bidirectional part) is not probed."""
    valid = grid != ignore_index if ignore_index is not None else torch.ones_like(grid, dtype=torch.bool)
    starts = [p for p in range(1, grid.shape[1]) if bool(valid[:, p - 1].any())]
    if not starts:
        return None
    start = starts[len(starts) // 2]
    return start, valid[:, start - 1].cpu()


def future_influence(first: torch.Tensor, second: torch.Tensor, rows: torch.Tensor) -> tuple[float, float]:
    """(change just before the perturbed position over ``rows``, change at it), from
    (B, 2, C) logits."""
    delta = (first - second).abs()
    return float(delta[rows, 0].max()), float(delta[:, 1].max())


def perturbed(ids: torch.Tensor, start: int, vocabulary: int) -> torch.Tensor:
    """``ids`` with every token from ``start`` on replaced by another valid id."""
    changed = ids.clone()
    changed[:, start:] = (changed[:, start:] + 1) % max(vocabulary, 2)
    return changed


class TargetLeakCheck(Check):
    """Targets the model can read from its input: LM targets never shifted (a copy
    task), or a next-token objective under attention that sees later tokens."""

    name = "step.target_leak"
    stage = Stage.STEP
    codes = ("LEAK_FUTURE", "LEAK_TARGETS", "LM_SHIFT_TWICE", "VAL_TARGETS_NOT_SHIFTED")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if not any(isinstance(module, nn.Embedding) for module in ctx.model.modules()):
            findings.data["summary"] = "no token embedding in the model"
            return
        batch = probe_rows(ctx.artifacts.first_batch)
        seen = loss_forward(ctx, batch)
        criterion = seen.criterion if seen is not None else None
        if criterion is None:
            findings.data["summary"] = "no cross_entropy/nll_loss on token ids seen"
            return
        for token_input in seen.inputs:
            objective = objective_of(token_input.ids, criterion.target, criterion.ignore_index)
            if objective is None or objective.kind in ("unknown", "other"):
                continue
            findings.data.update(embedding=token_input.name, embedding_call=token_input.call, objective=objective.kind,
                                 aligned=round(objective.aligned, 4), shifted=round(objective.shifted, 4),
                                 targets_compared=objective.compared)
            if objective.kind == "copy":
                findings.data["summary"] = "targets equal the input tokens at their own positions"
                self._report_copy(objective, findings, decoder=token_input is not seen.inputs[0])
                return
            if objective.kind == "shifted_twice":
                findings.data["summary"] = "targets equal the input tokens two positions later"
                self._report_shifted_twice(ctx.model, objective, findings)
                return
            grid = target_grid(token_input.ids, criterion.target)
            probe = probe_start(grid, criterion.ignore_index) if grid is not None else None
            first = position_logits(criterion.logits, grid, [probe[0] - 1, probe[0]]) if probe else None
            # The decoder's input also given to the encoder (model(tgt_in, tgt_in) for model(src, tgt_in)).
            fed_twice = any(other is not token_input and other.call > token_input.call
                            and other.ids.shape == token_input.ids.shape and torch.equal(other.ids, token_input.ids)
                            for other in seen.inputs)
            seen = criterion = None  # the first forward's full logits are no longer needed
            findings.data["summary"] = "next-token objective; causality not probed"
            if first is not None:
                self._probe_future(ctx, batch, token_input, grid, probe, first, findings, fed_twice)
            if not findings.issues:
                self._val_objective(ctx, findings)
            return
        findings.data["summary"] = "targets are neither the inputs nor the next inputs (not a plain LM objective)"

    @staticmethod
    def _report_copy(objective: Objective, findings: Findings, decoder: bool) -> None:
        if decoder:
            # An earlier embedding call read other tokens (the source): this one is a decoder's input.
            findings.error(
                "LEAK_TARGETS",
                f"{objective.aligned:.0%} of the {objective.compared} targets that reach the loss equal the token the "
                "decoder is given at the same position: teacher forcing feeds the decoder the targets themselves, not "
                "shifted right, so at each position it reads the answer it must predict, the loss falls to ~0 within "
                "a few steps, and generation (which has no target to read) fails",
                "Feed the decoder the targets shifted right by one: decoder_input = cat([start_token, tgt[:, :-1]], "
                "dim=1) against targets tgt (or tgt[:, :-1] in, tgt[:, 1:] out). Hugging Face seq2seq models build "
                "decoder_input_ids from labels themselves: pass labels only, not decoder_input_ids=labels.",
            )
            return
        fix = ("Shift the targets by one token: inputs = ids[:, :-1], targets = ids[:, 1:] (or compare logits[:, :-1] "
               "with ids[:, 1:] in the loss). A Hugging Face *ForCausalLM model shifts labels itself: pass it "
               "labels=input_ids. For masked-LM training, mask the inputs (e.g. DataCollatorForLanguageModeling) "
               "and set the labels of unmasked tokens to -100. If reproducing the input is the goal (an "
               "autoencoder), disable the issue LEAK_TARGETS (preflight.disable, or run_preflight(disable=...)).")
        findings.error(
            "LEAK_TARGETS",
            f"{objective.aligned:.0%} of the {objective.compared} targets that reach the loss equal the input token at "
            "the same position: the model is taught to copy the token it is given, so the loss falls to ~0 within a "
            "few steps and the model learns nothing it can use to predict",
            fix,
        )

    @staticmethod
    def _report_shifted_twice(model: nn.Module, objective: Objective, findings: Findings) -> None:
        hf_causal = type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
        where = ("this Hugging Face model shifts `labels` by one inside its forward, so labels shifted by hand "
                 "are shifted twice" if hf_causal else "the targets were shifted once too often")
        fix = ("Pass the unshifted ids as labels (labels=input_ids, padding set to -100): the model shifts them "
               "itself." if hf_causal else
               "Shift once: inputs = ids[:, :-1], targets = ids[:, 1:], compared position by position with the "
               "logits; a Hugging Face *ForCausalLM model shifts `labels` itself, so pass it labels=input_ids.")
        findings.error(
            "LM_SHIFT_TWICE",
            f"{objective.skipped:.0%} of the {objective.compared} targets that reach the loss equal the input token "
            f"two positions later: {where}, and the model learns to predict the token after next, which it "
            "can never use to generate",
            fix,
        )

    def _val_objective(self, ctx: PreflightContext, findings: Findings) -> None:
        """VAL_TARGETS_NOT_SHIFTED: training targets are the next tokens, the validation loader's
        the tokens themselves (its Dataset or collate builds them another way)."""
        if ctx.val_loader is None:
            return
        parts = read_samples(ctx, self.name, findings, ctx.val_loader, f"a validation batch for {self.name}",
                             lambda batch: [batch], 1, VAL_READ_BUDGET_S)
        seen = loss_forward(ctx, probe_rows(parts[0][0])) if parts else None
        criterion = seen.criterion if seen is not None else None
        if criterion is None:
            return
        for token_input in seen.inputs:
            objective = objective_of(token_input.ids, criterion.target, criterion.ignore_index)
            if objective is None or objective.kind in ("unknown", "other", "next_token"):
                continue
            what = ("the input token at the same position" if objective.kind == "copy"
                    else "the input token two positions later")
            share = objective.aligned if objective.kind == "copy" else objective.skipped
            findings.warning(
                "VAL_TARGETS_NOT_SHIFTED",
                f"the training targets are the next input tokens, but {share:.0%} of the {objective.compared} "
                f"validation targets that reach the loss equal {what}: the validation Dataset (or its collate) builds "
                "inputs and targets another way than the training one, so the validation loss scores another task "
                "and says nothing about the model being trained",
                "Build the validation pairs as the training ones are: inputs = ids[:-1], targets = ids[1:] (one "
                "Dataset class or collate_fn for both splits).",
                "data.val",
            )
            return

    @staticmethod
    def _probe_future(ctx: PreflightContext, batch: Any, token_input: TokenInput, grid: torch.Tensor,
                      probe: tuple[int, torch.Tensor], first: torch.Tensor, findings: Findings,
                      fed_twice: bool = False) -> None:
        """A second forward with the tokens from the middle on replaced: the logits just
        before them must not move."""
        start, rows = probe
        replaced = perturbed(token_input.ids.detach(), start, token_input.module.num_embeddings)
        again = loss_forward(ctx, batch, replace=(token_input, replaced))
        second = None
        if again is not None and again.criterion is not None:
            second = position_logits(again.criterion.logits, grid, [start - 1, start])
        if second is None or first.shape != second.shape:
            return
        before, at = future_influence(first, second, rows)
        findings.data.update(perturbed_from=start, change_before=before, change_at=at)
        if at == 0:
            findings.data["summary"] = "next-token objective; the probe did not reach the logits"
            return
        findings.data["summary"] = (f"next-token objective; logits before position {start} moved {before:.3g} when the "
                                    f"tokens from it on changed (at it: {at:.3g})")
        if before > FUTURE_RATIO * at:
            decoders = [name for name, module in ctx.model.named_modules()
                        if isinstance(module, (nn.Transformer, nn.TransformerDecoder, nn.TransformerDecoderLayer))]
            torch_decoder = (f" {type(dict(ctx.model.named_modules())[decoders[0]]).__name__} '{decoders[0]}' attends "
                             "to every position unless it is given a causal mask: its tgt_mask was left out (or "
                             "tgt_is_causal set without a mask)" if decoders else "")
            torch_fix = ("Pass the causal mask to the decoder: tgt_mask=nn.Transformer.generate_square_subsequent_mask("
                         "T, device=x.device) (and tgt_is_causal=True). " if decoders else "")
            if fed_twice:
                # The tokens perturbed are the first of two calls with the same ids: the encoder's.
                torch_decoder = (" The same target tokens reach the model twice: the encoder is given the decoder's "
                                 "input (model(tgt_in, tgt_in) where model(src, tgt_in) was meant), and the encoder "
                                 "sees every position, so the decoder reads each answer from the memory")
                torch_fix = "Give the encoder the source sequence: model(src, tgt_in), the decoder alone the targets. "
            findings.error(
                "LEAK_FUTURE",
                f"the targets are the next input tokens, but changing the tokens from position {start} on changes the "
                f"logits at position {start - 1} (by {before:.3g}; {at:.3g} at position {start}): each position "
                "attends to later tokens, so each target is visible in the input and the loss collapses while the "
                f"model learns nothing usable for generation.{torch_decoder}",
                f"{torch_fix}Make the attention causal: scaled_dot_product_attention(q, k, v, is_causal=True), or "
                "mask scores with torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1) filled with -inf; "
                "a Hugging Face model must be a decoder (is_decoder=True, a *ForCausalLM class).",
            )
