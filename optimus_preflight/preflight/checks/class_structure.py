"""Whether an embedding loss prefers the classes gathered or scattered (``step.class_structure``).

Contrastive, triplet and supervised-contrastive losses read the batch's class labels to
decide which samples to pull together. Written with the other convention (Hadsell's
``(1 - y) * d**2 + y * relu(m - d)**2`` where ``y = 1`` marks the similar pairs), with a
triplet's positive and negative swapped, or with pair labels inverted when they are built
from the classes, the loss pushes each class apart and pulls the classes together, and its
value still falls.

Measured, not read from the code: in eval mode, each call of the model is given back one
point per class for its rows (every sample of a class on the same random unit vector, at the
outputs' own norm, classes apart), and the loss is computed; then the same points are given
to random groups of samples (the batch's labels shuffled across samples). A loss that uses
the classes is lower with the classes gathered. When it is higher in every one of a few
draws, by a clear margin, it pulls the wrong way. Each output row is traced to its sample by
matching the model's input rows with the batch's (two views stored in the batch, rows picked
or permuted by the loss); a model fed inputs made in the loss is left alone, and so is a
classifier (its criterion's target is the labels themselves).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward, loss_value, model_outputs
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import batch_size_of, leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

DRAWS = 3
MARGIN = 0.1  # the gathered classes' loss above the scattered ones' by this share, in every draw
SEED = 20241129


def class_labels(batch: Any, rows: int) -> torch.Tensor | None:
    """The batch's integer (B,) class labels with repeated classes (same-class pairs to gather)."""
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() == 1 and leaf.shape[0] == rows \
                and not leaf.is_floating_point() and leaf.dtype != torch.bool:
            values, counts = torch.unique(leaf, return_counts=True)
            if 2 <= values.numel() <= rows // 2 and int(counts.max()) >= 2:
                return leaf
    return None


class RowIndex:
    """Which batch sample each row of a model input is, by exact match with a float batch leaf."""

    def __init__(self, batch: Any, rows: int) -> None:
        self.keys: dict[bytes, int] = {}
        for leaf in leaves(batch):
            if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided and leaf.is_floating_point() \
                    and leaf.dim() >= 2 and leaf.shape[0] == rows:
                flat = leaf.detach().reshape(rows, -1).float().cpu().numpy()
                for index in range(rows):
                    self.keys.setdefault(flat[index].tobytes(), index)

    def samples(self, inputs: torch.Tensor) -> torch.Tensor | None:
        if inputs.layout != torch.strided:
            return None
        flat = inputs.detach().reshape(inputs.shape[0], -1).float().cpu().numpy()
        found = [self.keys.get(flat[row].tobytes()) for row in range(flat.shape[0])]
        return None if any(index is None for index in found) else torch.tensor(found)


class ClassifierWatch(TorchFunctionMode):
    """Whether a class criterion is given the batch's labels as its target."""

    def __init__(self, labels: torch.Tensor) -> None:
        super().__init__()
        self.labels = labels
        self.classifier = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (F.cross_entropy, F.nll_loss, F.multi_margin_loss) and len(args) >= 2 \
                and isinstance(args[1], torch.Tensor) and args[1].shape == self.labels.shape \
                and torch.equal(args[1].detach().cpu(), self.labels.detach().cpu()):
            self.classifier = True
        return func(*args, **kwargs)


def loss_with_points(ctx: PreflightContext, batch: Any, index: RowIndex, row_labels: torch.Tensor,
                     points: torch.Tensor) -> float | None:
    """The loss with each model call's (N, D) output replaced by the point of its rows' labels."""
    traced = [True]

    def replace(module: torch.nn.Module, args: tuple, output: Any) -> Any:
        inputs = next((arg for arg in args if isinstance(arg, torch.Tensor) and arg.is_floating_point()
                       and arg.layout == torch.strided), None)
        if not isinstance(output, torch.Tensor) or output.dim() != 2 or inputs is None or inputs.shape[0] != output.shape[0] \
                or output.shape[1] != points.shape[1]:
            traced[0] = False
            return output
        samples = index.samples(inputs)
        if samples is None:
            traced[0] = False
            return output
        scale = output.detach().float().norm(dim=1).mean().clamp_min(1e-6)
        chosen = points[row_labels[samples]].to(output.device, output.dtype) * scale.to(output.dtype)
        return chosen

    handle = ctx.model.register_forward_hook(replace)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)  # a loss that draws pairs or negatives draws the same ones each time
            value = loss_value(eval_forward(ctx, batch))
    except Exception:
        return None
    finally:
        handle.remove()
    return value if traced[0] else None


class ClassStructureCheck(Check):
    """LOSS_SEPARATES_CLASSES: the loss is lower with each class scattered than gathered."""

    name = "step.class_structure"
    stage = Stage.STEP
    codes = ("LOSS_SEPARATES_CLASSES",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        rows = batch_size_of(batch)
        labels = class_labels(batch, rows) if rows else None
        if labels is None:
            findings.data["summary"] = "no class labels with repeated classes"
            return
        watch = ClassifierWatch(labels)
        try:
            with watch:
                output = eval_forward(ctx, batch)
        except Exception:
            findings.data["summary"] = "the step could not be observed"
            return
        if watch.classifier or loss_value(output) is None:
            findings.data["summary"] = "a classifier: its criterion's target is the labels"
            return
        outputs = model_outputs(ctx, batch)
        probe_output = int(outputs[0].shape[1]) if outputs and outputs[0].dim() == 2 and outputs[0].is_floating_point() \
            and outputs[0].shape[1] >= 2 else None
        if probe_output is None:
            findings.data["summary"] = "the model's output is no (N, D) embedding"
            return
        index = RowIndex(batch, rows)
        _, coded = torch.unique(labels.cpu(), return_inverse=True)
        classes = int(coded.max()) + 1
        gathered, scattered = [], []
        for draw in range(DRAWS):
            generator = torch.Generator().manual_seed(SEED + draw)
            points = F.normalize(torch.randn(classes, probe_output, generator=generator), dim=1)
            shuffled = coded[torch.randperm(rows, generator=generator)]
            together = loss_with_points(ctx, batch, index, coded, points)
            apart = loss_with_points(ctx, batch, index, shuffled, points)
            if together is None or apart is None:
                findings.data["summary"] = "the model's output rows could not be traced to the batch's samples"
                return
            gathered.append(together)
            scattered.append(apart)
        findings.data.update(gathered=gathered, scattered=scattered)
        findings.data["summary"] = (f"loss {sum(gathered) / DRAWS:.4g} with the classes gathered, "
                                    f"{sum(scattered) / DRAWS:.4g} with random groups")
        if not all(g > s + MARGIN * abs(s) + 1e-6 for g, s in zip(gathered, scattered)):
            return
        findings.warning(
            "LOSS_SEPARATES_CLASSES",
            f"the loss prefers each class scattered: with the model's outputs replaced by one point per class (the "
            f"samples of a class on one point, the {classes} classes apart) it is {sum(gathered) / DRAWS:.4g}, and "
            f"with the same points given to random groups of samples it is {sum(scattered) / DRAWS:.4g}, lower, in "
            f"each of {DRAWS} draws: the loss pushes the samples of a class apart and pulls different classes "
            "together. A contrastive loss written with the other label convention ((1 - y) * d**2 + y * relu(m - "
            "d)**2 while y = 1 marks the same-class pairs, or the pair labels inverted), or a triplet whose positive "
            "and negative are swapped, does this",
            "Match the loss to the labels: with y = 1 for same-class pairs, y * d**2 + (1 - y) * relu(margin - d)**2 "
            "(Hadsell's paper uses y = 0 for similar pairs); a triplet term is relu(d(anchor, positive) - "
            "d(anchor, negative) + margin).",
        )
