"""Samples that reach a linear layer as all-zero vectors (``step.zero_features``).

A classifier head that reads a padded position gets zeros for every sample shorter than
the longest of its batch: ``pad_packed_sequence`` fills padded steps with 0, and
``out[:, -1]`` is such a step for most samples. Nothing errors and the loss falls a little
(the long samples train); the short ones are classified from nothing.

One eval-mode forward on the first batch (``eval_forward``) with hooks on every
``nn.Linear`` that receives one row per sample (a ``(B, D)`` input): a share of rows that
are exactly zero, neither none nor all of them, is the finding. All rows zero is a model
that ignores its input (``step.input_dependence``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import batch_size_of

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SAMPLES = 8
MIN_FEATURES = 4
ZERO_SHARE = 0.1  # of the samples, for the zero rows to be more than one odd sample


def zero_rows(tensor: torch.Tensor) -> int:
    return int((tensor.detach() == 0).all(dim=1).sum())


class ZeroFeaturesCheck(Check):
    """ZERO_FEATURES: some samples reach a linear layer as all-zero vectors."""

    name = "step.zero_features"
    stage = Stage.STEP
    codes = ("ZERO_FEATURES",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        size = batch_size_of(batch)
        if not size or size < MIN_SAMPLES:
            findings.data["summary"] = "batch too small to judge"
            return
        seen: list[tuple[str, int]] = []
        names = {module: name for name, module in ctx.model.named_modules()}

        def watch(module: nn.Module, args: Any, output: Any) -> None:
            first = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if first is not None and first.dim() == 2 and first.shape[0] == size and first.shape[1] >= MIN_FEATURES \
                    and first.is_floating_point():
                seen.append((names[module], zero_rows(first)))

        padded: list[tuple[str, int, int]] = []  # (embedding, padding_idx, samples with it) of one id per sample

        def watch_ids(module: nn.Module, args: Any, output: Any) -> None:
            ids = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if ids is not None and ids.dim() == 1 and ids.shape[0] == size and module.padding_idx is not None:
                pad = module.padding_idx % module.num_embeddings
                padded.append((names[module], pad, int((ids == pad).sum())))

        handles = [module.register_forward_hook(watch) for module in names if isinstance(module, nn.Linear)]
        handles += [module.register_forward_hook(watch_ids) for module in names if isinstance(module, nn.Embedding)]
        try:
            eval_forward(ctx, batch)
        except Exception:
            findings.data["summary"] = "the eval-mode forward raised"
            return
        finally:
            for handle in handles:
                handle.remove()
        worst = max(seen, key=lambda item: item[1], default=None)
        findings.data["summary"] = ("no linear layer reads one row per sample" if worst is None else
                                    f"at most {worst[1]} of {size} samples reach a linear layer as zeros")
        if worst is None or not ZERO_SHARE * size <= worst[1] < size:
            return
        layer, zeros = worst
        if get_probe(ctx).propagation_without_self is not None:
            findings.warning(
                "ZERO_FEATURES",
                f"{zeros} of the {size} nodes of the first batch reach Linear '{layer}' as an all-zero vector (eval "
                "mode): the layer sees nothing of them, so they are all given the same output. The model propagates "
                "over edges without self-loops (step.graph_propagation), so a node with no edge (a new item, an "
                "isolated paper) receives nothing at all, not even its own features",
                "Add self-loops before propagating (A + I, or the edge list extended with (i, i) for every node), so "
                "every node keeps its own features; or keep a separate root term per layer.",
            )
            return
        source = next(((name, pad) for name, pad, count in padded if count == zeros), None)
        if source is not None:
            name, pad = source
            findings.warning(
                "ZERO_FEATURES",
                f"{zeros} of the {size} samples of the first batch reach Linear '{layer}' as an all-zero vector (eval "
                f"mode), exactly the samples whose id for Embedding '{name}' is its padding_idx {pad}: padding_idx "
                "keeps that row at zero with no gradient, so every sample of that category gets the same output. One "
                "id per sample pads nothing; the id is a real category (codes numbered from 0)",
                f"Drop padding_idx from '{name}', or shift the codes by one (codes + 1, a table one row larger) if id "
                f"{pad} must mean 'missing'.",
            )
            return
        findings.warning(
            "ZERO_FEATURES",
            f"{zeros} of the {size} samples of the first batch reach Linear '{layer}' as an all-zero vector (eval "
            "mode): the layer sees nothing of them, so they are all given the same output. Usually the read-out "
            "of a padded position: pad_packed_sequence fills the steps after each sequence's length with zeros, and "
            "out[:, -1] is such a step for every sequence shorter than the longest of its batch; else every unit "
            "before the layer is dead (ReLU) for those samples",
            "Read the last valid step: h_n[-1] of the packed RNN (its final state per sequence), or "
            "out[torch.arange(B), lengths - 1]; for a bidirectional RNN, concatenate h_n[-2] and h_n[-1].",
        )
