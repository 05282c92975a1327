"""Sliding windows labelled by their index instead of their position (``data.window_labels``).

``WINDOW_LABEL_INDEX``: a dataset that cuts windows from one recording (item i starts at
``i * stride``) and keeps the per-sample labels beside the signal. ``labels[i]`` is the label of
sample i, not of window i: the windows get the labels of the recording's first
``len(dataset)`` samples, unrelated to their content.

Read from the dataset itself: consecutive items whose signal overlaps (item i + 1 is item i
moved by ``stride`` steps along its time axis) make it a window dataset; an integer array
attribute as long as the recording holds per-sample labels. When every item's label is
``labels[i]`` while the labels at the windows' own positions (start, centre, end) differ,
the windows are labelled by index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

PAIRS = 4  # consecutive items compared for the overlap
SAMPLED = 40  # items whose labels are compared with the label arrays
MIN_ITEMS = 12


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray) and value.dtype.kind in "iufb":
        return torch.from_numpy(np.asarray(value))
    return None


def window_stride(windows: list[torch.Tensor]) -> tuple[int, int] | None:
    """(time axis, stride) when each window is the previous one moved by ``stride`` steps along
    one axis (pure)."""
    first = windows[0]
    if any(window.shape != first.shape for window in windows):
        return None  # variable-length items (sequences) are no windows of one length
    for axis in {first.dim() - 1, 0}:
        length = first.shape[axis]
        for stride in range(1, length):
            keep = length - stride
            if all(torch.equal(a.narrow(axis, stride, keep), b.narrow(axis, 0, keep))
                   for a, b in zip(windows, windows[1:], strict=False)):
                return axis, stride
    return None


def label_arrays(dataset: Any, series_length: int) -> list[tuple[str, torch.Tensor]]:
    """Integer 1-D attributes of the dataset at least as long as the recording: per-sample labels."""
    found = []
    for name, value in vars(dataset).items():
        tensor = _as_tensor(value)
        if tensor is not None and tensor.dim() == 1 and len(tensor) >= series_length \
                and not tensor.is_floating_point():
            found.append((name, tensor))
    return found


def labelled_by_index(item_labels: dict[int, int], labels: torch.Tensor, stride: int, window: int) -> bool:
    """Every item i carries labels[i], and labels at the windows' positions would differ (pure)."""
    if not all(int(labels[i]) == label for i, label in item_labels.items()):
        return False
    for offset in (0, window // 2, window - 1):
        if all(i * stride + offset < len(labels) and int(labels[i * stride + offset]) == label
               for i, label in item_labels.items()):
            return False  # the positions give the same labels: nothing to tell apart
    return True


class WindowLabelsCheck(Check):
    """WINDOW_LABEL_INDEX: sliding windows labelled with labels[i] instead of their position's label."""

    name = "data.window_labels"
    stage = Stage.DATA
    codes = ("WINDOW_LABEL_INDEX",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        dataset = getattr(ctx.train_loader, "dataset", None)
        # An IterableDataset inherits a __getitem__ that only raises: no items to index.
        if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset) \
                or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__") or not hasattr(dataset, "__dict__"):
            findings.data["summary"] = "no map-style dataset"
            return
        guard = DataGuard(ctx, self.name, findings)
        size = guard.call(len, dataset, what="len(dataset)")
        if size < MIN_ITEMS:
            return
        items = [guard.call(dataset.__getitem__, i, what=f"dataset[{i}]") for i in range(PAIRS + 1)]
        if not all(isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], torch.Tensor)
                   and item[0].dim() in (1, 2) for item in items):
            findings.data["summary"] = "items are not (window, label) pairs"
            return
        found = window_stride([item[0] for item in items])
        if found is None:
            findings.data["summary"] = "items are not overlapping windows"
            return
        axis, stride = found
        window = items[0][0].shape[axis]
        arrays = label_arrays(dataset, (size - 1) * stride + window)
        if not arrays:
            return
        picks = sorted({int(i) for i in np.linspace(0, size - 1, SAMPLED)})
        item_labels = {}
        for i in picks:
            label = guard.call(dataset.__getitem__, i, what=f"dataset[{i}]")[1]
            if isinstance(label, torch.Tensor) and label.numel() == 1:
                label = label.item()
            if not isinstance(label, (int, np.integer)):
                return
            item_labels[i] = int(label)
        name = next((name for name, labels in arrays if labelled_by_index(item_labels, labels, stride, window)), None)
        findings.data["summary"] = f"windows of {window} steps, stride {stride}"
        if name is None:
            return
        findings.warning(
            "WINDOW_LABEL_INDEX",
            f"the training dataset cuts windows of {window} steps with stride {stride} from one recording (each item "
            f"is the previous one moved by {stride} steps), and every item's label is self.{name}[i], the label of "
            f"sample i, not of window i: window i starts at sample i * {stride}. The {size} windows get the labels of "
            f"the recording's first {size} samples, unrelated to their content",
            f"Label each window by its own position: self.{name}[i * {stride} + {window} // 2] (the centre; or a "
            "majority vote over the window's samples).",
            "data.train",
        )
