"""A pairwise ranking loss that ranks each pair's second item above its first (``step.ranking_order``).

``MarginRankingLoss(x1, x2, y)`` wants ``x1`` above ``x2`` where ``y = 1`` and below where
``y = -1``. Pair datasets list the preferred item first: ``(positive, negative)``,
``(chosen, rejected)``, ``(relevant, irrelevant)``. Scores passed in the other order with
``y = 1`` (``criterion(s_neg, s_pos, ones)``) train every irrelevant item above its relevant
partner, and the loss falls as the ranking gets worse.

Read from the step: the batch's first two float tensors of one shape are the pair; each of
the loss's two score arguments is traced to the one whose change moves it (eval mode, the
random generator reseeded). Where the target ranks the score of the second tensor first,
the pair is reversed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import seeded_eval_forward
from optimus_preflight.preflight.analyses.score_pairs import score_pair
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SEED = 20241128
REVERSED_SHARE = 0.9  # of the rows on which the loss pushes each score the wrong way


class RankingCall(TorchFunctionMode):
    """The first margin_ranking_loss's (x1, x2, target)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "margin_ranking_loss" and self.seen is None:
            values = list(args) + [kwargs.get(key) for key in ("input1", "input2", "target")[len(args):]]
            if all(isinstance(value, torch.Tensor) for value in values[:3]):
                self.seen = tuple(value.detach().float().clone() for value in values[:3])  # type: ignore[assignment]
        return func(*args, **kwargs)


def pair_leaves(batch: Any) -> tuple[int, int] | None:
    """Positions of the batch's first two float tensors of one shape (a tuple batch)."""
    if not isinstance(batch, (list, tuple)):
        return None
    floats = [k for k, leaf in enumerate(batch) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
              and leaf.dim() >= 2]
    for a in floats:
        for b in floats:
            if b > a and batch[a].shape == batch[b].shape:
                return a, b
    return None


class RankingOrderCheck(Check):
    """RANKING_PAIR_REVERSED: the ranking target puts each pair's second item first."""

    name = "step.ranking_order"
    stage = Stage.STEP
    codes = ("RANKING_PAIR_REVERSED",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        pair = pair_leaves(batch)
        if pair is None:
            self._scored_by_hand(ctx, batch, findings)
            return
        base = self._call(ctx, batch)
        if base is None:
            self._scored_by_hand(ctx, batch, findings)
            return
        x1, x2, target = base
        sign = torch.sign(target)
        if not bool((sign == sign.reshape(-1)[0]).all()) or float(sign.reshape(-1)[0]) == 0:
            findings.data["summary"] = "the ranking targets vary: the order is the labels' business"
            return
        first = list(batch)
        first[pair[0]] = first[pair[0]] + 0.5 * first[pair[0]].std().clamp_min(1e-3)
        moved = self._call(ctx, type(batch)(first) if isinstance(batch, tuple) else first)
        if moved is None or moved[0].shape != x1.shape:
            return
        scale = max(float(x1.abs().max()), float(x2.abs().max()), 1e-6)
        first_moves_x1 = float((moved[0] - x1).abs().max()) > 1e-4 * scale
        first_moves_x2 = float((moved[1] - x2).abs().max()) > 1e-4 * scale
        if first_moves_x1 == first_moves_x2:
            findings.data["summary"] = "the pair's scores cannot be told apart"
            return
        ranked_first = "x1" if float(sign.reshape(-1)[0]) > 0 else "x2"
        first_is_x1 = first_moves_x1
        findings.data["summary"] = (f"batch[{pair[0]}] scores as {'x1' if first_is_x1 else 'x2'}, target "
                                    f"{int(sign.reshape(-1)[0])}")
        if (ranked_first == "x1") == first_is_x1:
            return
        findings.warning(
            "RANKING_PAIR_REVERSED",
            f"the pairwise ranking is reversed, the ranking loss ranks each pair's second item above its first: margin_ranking_loss gets the "
            f"score of batch[{pair[1]}] as {ranked_first}, the input its target "
            f"({int(sign.reshape(-1)[0]):+d} for every pair) wants ranked higher, and the score of batch[{pair[0]}] "
            "as the other. Pair datasets list the preferred item first ((positive, negative), (chosen, rejected)), so "
            "with MarginRankingLoss(s_neg, s_pos, ones) the arguments are swapped and every irrelevant item is trained "
            "above its relevant partner",
            "Pass the preferred item's score first with target 1: MarginRankingLoss(margin)(s_pos, s_neg, "
            "torch.ones_like(s_pos)), or keep the order and use target -1.",
        )

    @staticmethod
    def _scored_by_hand(ctx: PreflightContext, batch: Any, findings: Findings) -> None:
        """A pairwise loss written by hand (BPR, a reward model's -logsigmoid(r_chosen - r_rejected))
        over two per-sample scores the model gives the pair's two items."""
        found = score_pair(ctx, batch)
        if found is None:
            findings.data["summary"] = "no margin_ranking_loss and no pair of per-sample scores in the step"
            return
        findings.data["summary"] = (f"the loss lowers the score of batch[{found.first}] on {found.pushes_first_down:.0%} "
                                    f"of the rows, raises batch[{found.second}]'s on {found.pushes_second_up:.0%}")
        if min(found.pushes_first_down, found.pushes_second_up) < REVERSED_SHARE:
            return
        findings.warning(
            "RANKING_PAIR_REVERSED",
            f"the pairwise ranking is reversed, the loss ranks each pair's second item above its first: its "
            f"gradient lowers the score the model gives batch[{found.first}] on {found.pushes_first_down:.0%} of the first batch's rows and raises "
            f"the score of batch[{found.second}] on {found.pushes_second_up:.0%}, so training moves every listed-first "
            "item below its partner. Pair datasets list the preferred item first ((user, positive, negative), "
            "(chosen, rejected)); a BPR loss written as -logsigmoid(s_neg - s_pos), or the two scores passed in the "
            "other order, trains every irrelevant item above its relevant partner while the loss falls",
            "Score the preferred item first: loss = -F.logsigmoid(s_pos - s_neg).mean() (for a reward model, "
            "-logsigmoid(r_chosen - r_rejected)); if the dataset lists the negative first, swap the two there.",
        )

    @staticmethod
    def _call(ctx: PreflightContext, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        watch = RankingCall()
        try:
            with watch:
                seeded_eval_forward(ctx, batch, SEED)
        except Exception:
            return None
        return watch.seen
