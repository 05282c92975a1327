"""DP7: a map-style dataset's ``__len__`` against what its ``__getitem__`` serves.

``__len__`` promises indices ``0..len-1`` and the samplers draw exactly those.
``dataset[len-1]`` must work (else every epoch crashes there); ``dataset[len]`` should
raise. A full sample at ``len`` means either that the index wraps around (``idx % n``:
a ``__len__`` larger than the data is then served silently as repeated samples) or that
``__len__`` under-reports (the samples past it are never drawn). Left alone: a dataset
that accepts any index without wrapping (procedural data), and one whose
``dataset[len]`` is a short slice (windows over a token tensor). The samples are read
in this process, under the data guard.
"""

from __future__ import annotations

import ast
import inspect
import operator
import os
import textwrap
from typing import TYPE_CHECKING, Any

from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler

from optimus_preflight.preflight.checks.batch_checks import is_map_style, sampler_chain
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.data_access.samples import leaf_shapes, sample_digest
from optimus_preflight.preflight.framework import Check, Findings, SkipCheck, Stage, StopCheck
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.loaders import ResumableSampler

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

# Samplers that draw exactly range(len(dataset)): for any other, len is not the contract.
INDEX_SAMPLERS = (SequentialSampler, RandomSampler, DistributedSampler, ResumableSampler)
FAR_INDEX = 2**31 - 1


def _guarded_read(guard: DataGuard, dataset: Any, index: int) -> tuple[Any, BaseException | None]:
    """``dataset[index]`` under the guard: (sample, None) or (None, the error it raised)."""
    try:
        return guard.call(operator.getitem, dataset, index, what=f"dataset[{index}]"), None
    except (SkipCheck, StopCheck):
        raise
    except Exception as error:
        return None, error


def index_modulo(dataset: Any) -> str | None:
    """Where ``__getitem__`` takes its index modulo something (``idx % n``), if it does."""
    method = getattr(type(dataset), "__getitem__", None)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        where = f"{os.path.basename(inspect.getsourcefile(method) or '?')}:{inspect.getsourcelines(method)[1]}"
    except (OSError, TypeError, SyntaxError):
        return None
    function = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if function is None or len(function.args.args) < 2:
        return None
    index = function.args.args[1].arg

    def wraps(node: ast.AST) -> bool:
        return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Name) \
            and node.left.id == index

    # Only a modulo that picks the item counts (self.items[idx % n], i = idx % n, idx %= n),
    # not one that decides something else (if idx % 2: flip).
    for node in ast.walk(function):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mod) and isinstance(node.target, ast.Name) \
                and node.target.id == index:
            return f"`{ast.unparse(node)}` in __getitem__ ({where})"
        found = [part for part in ast.walk(node.slice) if wraps(part)] if isinstance(node, ast.Subscript) else \
            [node.value] if isinstance(node, ast.Assign) and wraps(node.value) else []
        if found:
            return f"`{ast.unparse(found[0])}` in __getitem__ ({where})"
    return None


def _is_full(sample: Any, like: Any) -> bool:
    """A sample shaped like a real one: a slice past the end of a tensor is shorter or empty."""
    shapes = leaf_shapes(sample)
    return shapes == leaf_shapes(like) and not any(0 in shape for shape in shapes)


FEW_LOST = 0.01  # of the promised samples: an under-count this small loses nothing that matters
SEARCH_READS = 40


def last_full_index(guard: DataGuard, dataset: Any, like: Any, served: int, refused: int) -> int:
    """The last index from ``served`` (full sample) below ``refused`` (none) that still serves
    a full sample, doubling the distance past ``served`` and then bisecting: a dataset's full
    samples end at one index, usually close by."""
    def full(index: int) -> bool:
        sample, _ = _guarded_read(guard, dataset, index)
        return sample is not None and _is_full(sample, like)

    reads, step = 0, 1
    while reads < SEARCH_READS and served + step < refused:
        reads += 1
        if not full(served + step):
            refused = served + step
            break
        served, step = served + step, 2 * step
    while reads < SEARCH_READS and refused - served > 1:
        reads += 1
        middle = (served + refused) // 2
        served, refused = (middle, refused) if full(middle) else (served, middle)
    return served


LENGTH_FIX = ("Compute __len__ and __getitem__ from the same collection (build the list of kept items once in "
              "__init__ and index through it); let an index past the end raise IndexError instead of wrapping it "
              "(no `idx % n`).")


class DatasetLengthCheck(Check):
    """DP7: ``dataset[len-1]`` must work and ``dataset[len]`` must not serve a sample."""

    name = "data.dataset_length"
    stage = Stage.DATA
    codes = ("DP7",)
    requires = ("data.first_batch",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        dataset = getattr(loader, "dataset", None)
        if not is_map_style(dataset) or not isinstance(sampler_chain(loader)[-1], INDEX_SAMPLERS):
            findings.data["summary"] = "not applicable (iterable data or a custom sampler)"
            return
        guard = DataGuard(ctx, self.name, findings)
        size = guard.call(len, dataset, what="len(dataset)")
        if size < 1:
            return
        with preserved_data_state(ctx):  # a sample's augmentation draws from the RNGs
            last, last_error = _guarded_read(guard, dataset, size - 1)
            beyond, _ = _guarded_read(guard, dataset, size) if last_error is None else (None, None)
            served = beyond is not None and _is_full(beyond, last)
            first = _guarded_read(guard, dataset, 0)[0] if beyond is not None else None
            modulo = index_modulo(dataset) if beyond is not None else None
            # dataset[len] is dataset[0] again, in data whose samples differ (not constant dummy data).
            wraps_to_first = first is not None and sample_digest(first) == sample_digest(beyond) != sample_digest(last)
            far_index = max(FAR_INDEX, 2 * size)
            far, _ = _guarded_read(guard, dataset, far_index) if served else (None, None)
            any_index = far is not None and _is_full(far, last)  # wraps, or generates any index
        findings.data.update(length=size, serves_index_len=served, wraps_to_first=wraps_to_first)
        findings.data["summary"] = f"len {size}: dataset[{size - 1}] " + ("fails" if last_error else "works") + \
            f", dataset[{size}] " + ("serves a sample" if served else "refused")
        if last_error is not None:
            mismatch = isinstance(last_error, (IndexError, KeyError))
            fix = LENGTH_FIX if mismatch else f"Fix __getitem__ for index {size - 1}: call dataset[{size - 1}] for the traceback."
            findings.error(
                "DP7",
                f"len(dataset) is {size} but dataset[{size - 1}], the last index it promises, raises "
                f"{type(last_error).__name__}: {str(last_error)[:160]}. The sampler draws index {size - 1} in every "
                "epoch, so the run crashes there (at a random step when shuffled)",
                fix, None, code_fix=fix)
        elif wraps_to_first or (any_index and modulo):
            how = "; ".join(filter(None, [modulo, f"dataset[{size}] equals dataset[0]" if wraps_to_first else None]))
            findings.warning(
                "DP7",
                f"dataset[{size}] (one past len(dataset)) returns a sample instead of raising IndexError: the index "
                f"wraps around ({how}), so a __len__ larger than the data would serve repeated samples silently "
                "instead of failing",
                LENGTH_FIX, None, code_fix=LENGTH_FIX)
        elif served and not any_index:
            with preserved_data_state(ctx):
                end = last_full_index(guard, dataset, last, size, far_index)
            lost = end - size + 1
            if lost <= max(1, FEW_LOST * size):  # the classic sliding-window count without its + 1
                findings.info(
                    "DP7",
                    f"len(dataset) is {size} but dataset[{size}] also returns a full sample (the last full one is "
                    f"dataset[{end}]): __len__ under-reports by {lost}, so {lost} of {size + lost} samples are never "
                    "drawn. Harmless for learning; usually a sliding-window count written (n - window) // stride",
                    "Count every full window: __len__ = (n - window) // stride + 1.")
            else:
                findings.warning(
                    "DP7",
                    f"len(dataset) is {size} but dataset[{size}] returns a full sample while dataset[{far_index}] does "
                    f"not: __len__ under-reports, and the samples from index {size} on (up to about {end}) are never "
                    "drawn",
                    LENGTH_FIX, None, code_fix=LENGTH_FIX)
