"""Tables the model looks rows up in but never trains (``model.buffer_lookups``).

``BUFFER_LOOKED_UP_BY_IDS``: a floating-point buffer of two or more dims whose rows the
forward gathers with ids taken from the batch (``self.table[ids]``, ``F.embedding(ids,
self.table)``, ``index_select``). That is the use of an embedding table (item factors,
class or user vectors), but ``register_buffer`` makes it state, not a parameter: it is in
``state_dict()`` and follows ``.to(device)`` (why it gets chosen), yet it gets no gradient,
is in no optimizer and keeps its initial rows for the whole run.

Buffers the model indexes with what it computes itself (positions from ``arange``, a
codebook's nearest entries, relative-position buckets) are left alone: only ids that are
a view of one of the batch's own tensors count. So are rows handed straight to a layer
that learns (fixed state features under an MLP, ``self.net(self.feats[state])``): there
the table is the input, not the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device, storages

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8  # fewer rows is a small constant table (a few class prototypes fixed on purpose)
LOOKUPS = (torch.Tensor.__getitem__, torch.index_select, torch.Tensor.index_select, F.embedding, torch.embedding)


def table_and_ids(func: Any, args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """(the tensor rows are gathered from, the ids) of one row lookup; (None, None) otherwise."""
    if func is F.embedding or func is torch.embedding:
        ids, table = (args + (None, None))[:2] if func is F.embedding else (args[1], args[0])
        return kwargs.get("weight", table), kwargs.get("input", ids)
    if func in (torch.index_select, torch.Tensor.index_select):
        if len(args) >= 3 and args[1] == 0:
            return args[0], args[2]
        return None, None
    if len(args) < 2:
        return None, None
    index = args[1][0] if isinstance(args[1], tuple) and args[1] else args[1]
    return args[0], index


class LookupWatch(TorchFunctionMode):
    """Records the buffers (by identity) whose rows are gathered with ids from the batch."""

    def __init__(self, buffers: dict[int, str], batch_storage: set[int]) -> None:
        super().__init__()
        self.buffers = buffers
        self.batch_storage = batch_storage
        self.found: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # name: (table shape, ids shape)
        self.rows: dict[int, str] = {}  # storage of the gathered rows -> the buffer's name
        self.fed_to_layer: set[str] = set()  # buffers whose gathered rows a learning layer received

    def learning_layer_input(self, module: torch.nn.Module, args: tuple) -> None:
        """Forward pre-hook of the modules that own trainable parameters."""
        for value in args:
            if isinstance(value, torch.Tensor) and (name := self.rows.get(value.untyped_storage().data_ptr())):
                self.fed_to_layer.add(name)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in LOOKUPS:
            table, ids = table_and_ids(func, args, kwargs)
            name = self.buffers.get(id(table)) if isinstance(table, torch.Tensor) else None
            if (name is not None and name not in self.found and isinstance(ids, torch.Tensor)
                    and not ids.is_floating_point() and ids.dtype != torch.bool and ids.numel() > 1
                    and ids.untyped_storage().data_ptr() in self.batch_storage):
                self.found[name] = (tuple(table.shape), tuple(ids.shape))
                result = func(*args, **kwargs)
                if isinstance(result, torch.Tensor):
                    self.rows[result.untyped_storage().data_ptr()] = name
                return result
        return func(*args, **kwargs)


def trainable_tables(model: torch.nn.Module) -> dict[int, str]:
    """id -> name of the model's floating-point buffers shaped like a table of rows."""
    return {id(buffer): name for name, buffer in model.named_buffers()
            if buffer.is_floating_point() and buffer.dim() >= 2 and buffer.shape[0] >= MIN_ROWS}


class BufferLookupsCheck(Check):
    """BUFFER_LOOKED_UP_BY_IDS: a buffer used as an embedding table, never trained."""

    name = "model.buffer_lookups"
    stage = Stage.STEP
    codes = ("BUFFER_LOOKED_UP_BY_IDS",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        buffers = trainable_tables(ctx.model)
        if not buffers:
            findings.data["summary"] = "no buffer shaped like a table"
            return
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        storage = storages(batch)
        watch = LookupWatch(buffers, storage)
        learning = [module for module in ctx.model.modules()
                    if any(param.requires_grad for param in module.parameters(recurse=False))]
        handles = [module.register_forward_pre_hook(watch.learning_layer_input) for module in learning]
        try:
            with watch:
                eval_forward(ctx, batch)
        except Exception:
            findings.data["summary"] = "the forward could not be observed"
            return
        finally:
            for handle in handles:
                handle.remove()
        tables = {name: shapes for name, shapes in watch.found.items() if name not in watch.fed_to_layer}
        findings.data["summary"] = (f"{len(buffers)} table-shaped buffer(s), {len(watch.found)} looked up by the batch's "
                                    f"ids, {len(watch.found) - len(tables)} of them as features of a learning layer")
        for name, (table, ids) in list(tables.items())[:1]:
            findings.warning(
                "BUFFER_LOOKED_UP_BY_IDS",
                f"the forward gathers rows of '{name}', a {tuple(table)} buffer, with ids from the batch (shape "
                f"{tuple(ids)}), as an embedding table is used; but a buffer (register_buffer) is not a parameter: it "
                "gets no gradient, is in no optimizer and keeps its initial values for the whole run, so that side "
                "of the model never learns",
                f"Make it a parameter: self.{name.rsplit('.', 1)[-1]} = nn.Parameter(values) (or an nn.Embedding), "
                "which still follows .to(device) and is saved in the state_dict. A frozen pretrained table is "
                "nn.Embedding.from_pretrained(values, freeze=True).",
            )
