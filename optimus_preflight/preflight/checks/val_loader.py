"""An empty validation loader: every evaluation reads nothing, so the run trains with
``val loss n/a``, and a best checkpoint or early stopping on a ``val_*`` metric never acts."""

from __future__ import annotations

from typing import Any

from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.preserve import preserved_data_state

DATA_VAL_EMPTY = "DATA_VAL_EMPTY"


def length_of(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset without __len__
        return None


class ValidationLoaderCheck(Check):
    """The validation loader yields at least one batch."""

    name = "data.val_loader"
    stage = Stage.DATA
    codes = (DATA_VAL_EMPTY,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.val_loader
        if loader is None:
            findings.data["summary"] = "no validation loader"
            return
        batches = length_of(loader)
        if batches is None:  # read it: the only way to know an iterable is empty
            guard = DataGuard(ctx, self.name, findings)
            with preserved_data_state(ctx), guard.batches(loader, "the validation loader") as read:
                batches = int(next(read, None) is not None)
        if batches:
            findings.data["summary"] = f"{batches} batch(es)" if length_of(loader) is not None else "yields batches"
            return
        dataset = getattr(loader, "dataset", None)
        size = length_of(dataset) if dataset is not None else None
        why = (f"its dataset holds {size} sample(s) and drop_last=True with batch_size {loader.batch_size}"
               if size and getattr(loader, "drop_last", False) else "its dataset is empty" if size == 0 else "it yields nothing")
        findings.warning(
            DATA_VAL_EMPTY,
            f"the validation loader yields no batches ({why}): every evaluation will report no val_loss, and a "
            "checkpoint.monitor or early stopping on a val_* metric never acts",
            "Give the validation split samples (e.g. a larger data.train.val_fraction), or drop_last=False for it.",
            "data.val",
            code_fix="Return a validation DataLoader with at least one batch from your build_dataloaders(), or None for no validation.",
        )
