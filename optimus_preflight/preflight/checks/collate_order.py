"""A collate function that reorders some of a batch's tensors and not the others, or that
numbers a column's values per batch (``data.collate_order``).

A collate that sorts the sequences by length for ``pack_padded_sequence`` and returns the
labels in the order the samples came in pairs every label with another sample's input.
Shapes, dtypes and ranges stay right; the model learns noise.

The test needs no knowledge of the collate: it collates the same samples twice, in their
order and reversed. Each of the batch's tensors then comes out in some order, and for a
collate that keeps samples together it is one order for all of them (reversed, or the same
sorted order twice). Tensors whose rows do not match between the two calls (random
masking, batch statistics) say nothing and are left out. An integer tensor whose values come
back relabelled one-to-one (each sample's code another, the same way for every sample of a
value) is a column coded per batch: ids in order of first appearance (DATA_COLLATE_RECODES).
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SAMPLES = 16
MIN_SAMPLES = 6


def row_matches(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor | None:
    """(N, N) bool: row i of ``second`` equals row j of ``first``; None when some row of
    ``second`` equals no row of ``first`` (the tensor is not a reordering)."""
    a, b = first.reshape(first.shape[0], -1), second.reshape(second.shape[0], -1)
    if a.is_floating_point():
        a, b = torch.nan_to_num(a.float()), torch.nan_to_num(b.float())
    equal = (b[:, None, :] == a[None, :, :]).all(dim=-1)
    return equal if bool(equal.any(dim=1).all()) else None


def is_offsets(tensor: Any, batch: Any) -> bool:
    """A 1-D integer tensor that starts at 0, never decreases, and points inside a longer 1-D
    tensor of the batch: the offsets of bags in a flat input (nn.EmbeddingBag, packed graphs),
    positions that depend on the other samples by definition, not per-sample values."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1 or tensor.numel() < 2 or tensor.is_floating_point() \
            or int(tensor[0]) != 0 or bool((tensor.diff() < 0).any()):
        return False
    last = int(tensor[-1])
    return any(isinstance(leaf, torch.Tensor) and leaf.dim() == 1 and leaf.numel() > max(last, tensor.numel())
               for leaf in leaves(batch) if leaf is not tensor)


def _comparable(first: Any, second: Any, size: int, skip: Collection[int]) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(leaf index, tensor, tensor) of the two batches' per-sample tensors, leaving out the leaves ``skip``."""
    return [(index, a, b) for index, (a, b) in enumerate(zip(leaves(first), leaves(second), strict=False))
            if index not in skip and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() >= 1
            and a.shape == b.shape and a.shape[0] == size and not is_offsets(a, first)]


def _is_permutation(matches: torch.Tensor) -> bool:
    return bool((matches.sum(dim=1) == 1).all()) and bool((matches.sum(dim=0) == 1).all())


def _order_with_source(first: Any, second: Any, size: int, skip: Collection[int]) -> tuple[int, torch.Tensor] | None:
    # An order is known from a tensor whose rows are all different: a permutation.
    for index, a, b in _comparable(first, second, size, skip):
        m = row_matches(a, b)
        if m is not None and _is_permutation(m):
            return index, m.float().argmax(dim=1)
    return None


def disagreeing(first: Any, second: Any, size: int, skip: Collection[int] = ()) -> tuple[int, int] | None:
    """Indices (in ``leaves`` order) of two tensors of the two collated batches that no
    single reordering of the samples explains, leaving out the leaves ``skip`` (pure)."""
    known = _order_with_source(first, second, size, skip)
    if known is None:
        return None
    anchor, order = known
    for index, a, b in _comparable(first, second, size, skip):
        m = row_matches(a, b)
        if m is not None and not bool(m[torch.arange(size), order].all()):
            return anchor, index
    return None


def sample_order(first: Any, second: Any, size: int, skip: Collection[int] = ()) -> torch.Tensor | None:
    """Where each row of the second batch sits in the first, read from a tensor whose rows are
    all different and come back reordered (pure); None when no tensor shows it."""
    known = _order_with_source(first, second, size, skip)
    return None if known is None else known[1]


def random_leaves(first: Any, redrawn: Any) -> set[int]:
    """Indices of the tensors that the same samples collated under another seed change: drawn
    at random by the collate_fn, they follow no sample order (pure)."""
    return {index for index, (a, b) in enumerate(zip(leaves(first), leaves(redrawn), strict=False))
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and (a.shape != b.shape or not torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))}


MIN_CODES = 3  # distinct values before a relabelling says more than a coin flip


def recoded(first: Any, second: Any, size: int) -> tuple[int, dict[int, int]] | None:
    """(leaf index, value map) of an integer tensor whose values the collate assigns per batch:
    with the same samples in another order (read from the other tensors, else taken to be the
    reversal) each sample's value is another one, by a one-to-one relabelling of the values,
    as codes numbered in order of first appearance are (pure)."""
    order = sample_order(first, second, size)
    if order is None:
        order = torch.arange(size - 1, -1, -1)
    for index, (a, b) in enumerate(zip(leaves(first), leaves(second), strict=False)):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.is_floating_point() \
                or a.dtype == torch.bool or a.dim() not in (1, 2) or a.shape != b.shape or a.shape[0] != size \
                or is_offsets(a, first):
            continue
        expected, got = a[order.to(a.device)].reshape(-1).tolist(), b.reshape(-1).tolist()
        if expected == got or len(set(expected)) < MIN_CODES:
            continue
        forward: dict[int, int] = {}
        backward: dict[int, int] = {}
        if all(forward.setdefault(x, y) == y and backward.setdefault(y, x) == x for x, y in zip(expected, got)):
            return index, forward
    return None


class OneHotReads(TorchFunctionMode):
    """Whether F.one_hot encodes ``wanted`` in the forward: codes read as categories, like an embedding's ids."""

    def __init__(self, wanted: torch.Tensor, seen: list[bool]) -> None:
        super().__init__()
        self.wanted, self.seen = wanted, seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "one_hot" and args and isinstance(args[0], torch.Tensor) \
                and args[0].numel() == self.wanted.numel() and torch.equal(args[0].reshape(-1).cpu(), self.wanted):
            self.seen.append(True)
        return func(*args, **kwargs)


def embedded(ctx: PreflightContext, batch: Any, codes: torch.Tensor) -> bool:
    """Whether ``codes`` reach an nn.Embedding or nn.EmbeddingBag of the model as its ids, or
    F.one_hot as categories (a conditional model's class input), in one eval-mode forward."""
    modules = [m for m in ctx.model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    wanted = codes.reshape(-1).cpu()
    seen: list[bool] = []

    def before(module: nn.Module, args: tuple) -> None:
        ids = args[0] if args else None
        if isinstance(ids, torch.Tensor) and ids.numel() == wanted.numel() and not ids.is_floating_point() \
                and torch.equal(ids.reshape(-1).cpu(), wanted):
            seen.append(True)

    handles = [m.register_forward_pre_hook(before) for m in modules]
    try:
        with OneHotReads(wanted, seen):
            eval_forward(ctx, batch)
    except Exception:
        return False
    finally:
        for handle in handles:
            handle.remove()
    return bool(seen)


def collate_seeded(collate: Any, samples: list[Any], seed: int = 0) -> Any:
    """``collate(samples)`` with every RNG seeded, and their states left as they were."""
    with torch.random.fork_rng(devices=[]):
        state, np_state = random.getstate(), np.random.get_state()
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        try:
            return collate(samples)
        finally:
            random.setstate(state)
            np.random.set_state(np_state)


def graph_rows(batch: Any) -> torch.Tensor | None:
    """(G, 3F + 2) per-graph rows of a collated graph batch: each graph's node features summed
    plain and weighted by the node's place in its graph, its node count and a sum over its
    edges of their ends' places, read through its node-to-graph vector (an (N,) non-decreasing
    integer tensor from 0 beside (N, F) node features); None for another batch. A graph batch
    has no per-sample tensor but its labels: these rows say which graph came where (pure)."""
    tensors = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided]
    features = [t for t in tensors if t.dim() == 2 and t.is_floating_point()]
    if not features:
        return None
    x = max(features, key=lambda t: t.shape[0])
    for vector in tensors:
        if vector.dim() != 1 or vector.shape[0] != x.shape[0] or vector.is_floating_point() \
                or vector.dtype == torch.bool or int(vector.min()) != 0 or bool((vector.diff() < 0).any()):
            continue
        graphs = int(vector.max()) + 1
        if graphs < MIN_SAMPLES or graphs * 2 > x.shape[0]:
            continue
        owner = vector.cpu()
        counts = torch.bincount(owner, minlength=graphs)
        first_node = counts.cumsum(0) - counts
        local = torch.arange(x.shape[0]) - first_node[owner] + 1  # a node's place in its graph, from 1
        values = x.detach().cpu().double()
        weight = local.double()[:, None]
        rows = torch.zeros(graphs, 3 * x.shape[1] + 2, dtype=torch.float64)
        # node features summed plain and by their place in the graph, so graphs of one composition differ
        rows[:, :3 * x.shape[1]].index_add_(0, owner, torch.cat([values, values * weight, values * weight ** 2], 1))
        rows[:, -2].index_add_(0, owner, torch.ones(x.shape[0], dtype=torch.float64))
        edges = next((t for t in tensors if t.dim() == 2 and t.shape[0] == 2 and not t.is_floating_point()
                      and t.dtype != torch.bool and t.numel() and int(t.max()) < x.shape[0]), None)
        if edges is not None:
            src, dst = edges[0].cpu(), edges[1].cpu()
            rows[:, -1].index_add_(0, owner[src], (local[src] * (local[dst] + 1)).double())
        return rows
    return None


def leaf_names(batch: Any) -> list[str]:
    names: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}[{key!r}]")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")
        else:
            names.append(path or "batch")

    walk(batch, "batch")
    return names


NOT_CUSTOM_COLLATE = "not applicable (default collate, or not a map-style DataLoader)"


def custom_collate(loader: Any) -> bool:
    """A map-style DataLoader with a collate_fn of its own: what the collate checks read."""
    return isinstance(loader, DataLoader) and loader.collate_fn is not default_collate and \
        is_map_style(loader.dataset)


class CollateOrderCheck(Check):
    """DATA_COLLATE_ORDER: a custom collate that puts a batch's tensors in different orders."""

    name = "data.collate_order"
    stage = Stage.DATA
    codes = ("DATA_COLLATE_ORDER", "DATA_COLLATE_RECODES")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        if not custom_collate(loader):
            findings.data["summary"] = NOT_CUSTOM_COLLATE
            return
        guard = DataGuard(ctx, self.name, findings)
        dataset = loader.dataset
        size = min(SAMPLES, guard.call(len, dataset, what="len(dataset)"))
        if size < MIN_SAMPLES:
            findings.data["summary"] = "too few samples"
            return
        with preserved_data_state(ctx):
            samples = [guard.call(dataset.__getitem__, i, what=f"dataset[{i}]") for i in range(size)]
            try:
                first = guard.call(collate_seeded, loader.collate_fn, samples, what="collate_fn(samples)")
                second = guard.call(collate_seeded, loader.collate_fn, samples[::-1], what="collate_fn(samples)")
                # Drawn anew by each call (a random mask made in the collate_fn): same samples, other seed.
                redrawn = guard.call(collate_seeded, loader.collate_fn, samples, 1, what="collate_fn(samples)")
            except Exception as error:  # the loader's own first batch worked: a collate of these samples may not
                findings.data["summary"] = f"collate_fn raised on {size} samples: {type(error).__name__}"
                return
        names = leaf_names(first)
        relabelled = recoded(first, second, size)
        skipped = random_leaves(first, redrawn)
        if relabelled is not None and relabelled[0] in skipped:
            relabelled = None
        if relabelled is not None and not embedded(ctx, first, list(leaves(first))[relabelled[0]]):
            # relabelled per batch but no embedding's ids (a few-shot episode's labels, numbered per
            # episode on purpose): not a reordering either, so it is left out of the order test
            skipped, relabelled = skipped | {relabelled[0]}, None
        if relabelled is not None:
            index, mapping = relabelled
            name = names[index] if index < len(names) else f"tensor {index}"
            moved = ", ".join(f"{old} -> {new}" for old, new in list(mapping.items())[:4] if old != new)
            findings.data["summary"] = f"{name} coded per batch"
            findings.error(
                "DATA_COLLATE_RECODES",
                f"the collate_fn gives the same samples other codes when they come in another order: with the same "
                f"{size} samples reversed, every value of {name} becomes another ({moved}, ...). The codes are "
                "assigned per batch (pd.factorize, a dict of first appearances, LabelEncoder().fit or np.unique run "
                "inside the collate_fn), so one category gets a different id in every batch and its embedding row "
                "(or one-hot column) means something else each step: nothing about the category can be learned",
                "Fit the category -> id mapping once, on the training split, before building the DataLoader (a dict, "
                "or LabelEncoder().fit(train_column)), and only look the ids up in the collate_fn or the Dataset; "
                "save the mapping with the model for validation and serving.",
                "data.train",
            )
            return
        found = disagreeing(first, second, size, skip=skipped)
        pooled = graph_rows(first), graph_rows(second)
        if found is None and pooled[0] is not None and pooled[1] is not None:
            # Graphs concatenated into one batch: their pooled rows stand in for a per-sample tensor.
            extra = len(names)
            found = disagreeing([*leaves(first), pooled[0]], [*leaves(second), pooled[1]], size, skip=skipped)
            names = [*names, "the graphs' node blocks (read through the batch vector)"]
            if found is not None and extra not in found:
                found = None
        findings.data["summary"] = "one order for every tensor" if found is None else "tensors in different orders"
        if found is None:
            return
        ordered, other = (names[i] if i < len(names) else f"tensor {i}" for i in found)
        findings.error(
            "DATA_COLLATE_ORDER",
            f"the collate_fn puts the batch's tensors in different sample orders: given the same {size} samples "
            f"reversed, {ordered} and {other} come out reordered in two different ways, so row i of one no longer "
            "belongs to the sample of row i of the other (e.g. inputs sorted by length for pack_padded_sequence "
            "while the labels keep the order the samples came in): every label is paired with another sample",
            "Reorder every tensor of the batch with the same permutation: sort the samples themselves "
            "(samples.sort(key=len, reverse=True)) before splitting them into inputs and labels, or index inputs, "
            "lengths and labels with one order = lengths.argsort(descending=True); or keep the order and use "
            "pack_padded_sequence(..., enforce_sorted=False).",
            "data.train",
        )
