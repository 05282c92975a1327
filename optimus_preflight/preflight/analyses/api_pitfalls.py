"""Torch calls whose defaults do something other than what the line reads as (pure recording).

Watched during the first step's ``compute_loss`` (the model's forward included), by the loss
spy:

- ``x.T`` on a 1-D tensor returns it unchanged (torch only warns): ``labels == labels.T``
  then compares elementwise and is all True, where a (B, B) same-label mask was meant.
- ``torch.meshgrid(xs, ys)`` without ``indexing`` is ``indexing='ij'``: the first grid varies
  along the rows, while NumPy's ``np.meshgrid`` (``'xy'``) gives the x grid varying along
  the columns; code ported from NumPy swaps x and y.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_findings import Finding


TRANSPOSE = torch._C.TensorBase.__dict__.get("T")  # the .T property's descriptor: its __get__ reaches the mode


@dataclass
class Pitfalls:
    transposed_1d: list[tuple[int, ...]] = field(default_factory=list)  # shapes of 1-D tensors given .T
    meshgrid_default: list[tuple[int, ...]] = field(default_factory=list)  # sizes of meshgrids without indexing


class PitfallWatch:
    """Fed every torch function call the loss spy sees (``LossSpy.__torch_function__``)."""

    def __init__(self) -> None:
        self.found = Pitfalls()

    def observe(self, func: Any, args: tuple, kwargs: dict) -> None:
        if getattr(func, "__self__", None) is TRANSPOSE:
            tensor = args[0] if args else None
            if isinstance(tensor, torch.Tensor) and tensor.dim() == 1 and len(self.found.transposed_1d) < 4:
                self.found.transposed_1d.append(tuple(tensor.shape))
        elif func is torch.meshgrid and kwargs.get("indexing") is None and len(self.found.meshgrid_default) < 4:
            tensors = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
            self.found.meshgrid_default.append(tuple(t.numel() for t in tensors if isinstance(t, torch.Tensor)))


def pitfall_findings(found: Pitfalls) -> list[Finding]:
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    findings = []
    if found.transposed_1d:
        findings.append(Finding(
            "TRANSPOSE_1D", "error",
            f"the step transposes a 1-D tensor with .T (shape {found.transposed_1d[0]}), which returns it unchanged: "
            "labels == labels.T then compares each label with itself, all True, so a same-label (B, B) mask built "
            "that way broadcast against (B, B) scores marks every pair as positive",
            "Build pairwise masks from explicit axes: labels[:, None] == labels[None, :] (or labels.unsqueeze(1) == "
            "labels.unsqueeze(0)); .T only transposes 2-D tensors.",
        ))
    if found.meshgrid_default:
        sizes = " x ".join(str(size) for size in found.meshgrid_default[0])
        findings.append(Finding(
            "MESHGRID_INDEXING", "warning",
            f"torch.meshgrid is called without indexing= (grids of {sizes}): torch's default is indexing='ij', where "
            "the first grid varies along the rows, while NumPy's np.meshgrid(xs, ys) is 'xy', where the x grid "
            "varies along the columns. Code written in NumPy's order gets x and y swapped: coordinates read from "
            "such grids (a soft-argmax, a coordinate embedding) come out transposed",
            "Pass the indexing explicitly: torch.meshgrid(xs, ys, indexing='xy') for x along the columns (NumPy's "
            "order), or indexing='ij' with (ys, xs) for row-major grids.",
        ))
    return findings
