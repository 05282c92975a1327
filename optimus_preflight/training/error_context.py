"""Where a bug in the user's code happened, as the last line after its traceback.

A bug keeps its traceback (exit 1), but a long one through torch's DataLoader or the
loop does not say at a glance which sample or which method failed. ``bug_location``
reads the traceback's frames: a failed sample (``dataset[7] (MyDataset.__getitem__)``,
read in this process or, named by a note the worker added, in a DataLoader worker), or
the recipe method it came from (``MyRecipe.build_model``).

In a worker the frames are gone by the time torch re-raises the error in the main
process (only their text travels), so ``name_failing_samples`` runs in each worker
(from the loader's ``worker_init_fn``) and notes the failing index on the exception
before torch formats it.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import Any

from torch.utils.data._utils import fetch as torch_fetch

# The methods of a recipe a user overrides: the builders and the two steps.
RECIPE_METHODS = ("build_model", "build_optimizer", "build_scheduler", "build_dataloaders", "build_test_dataloader",
                  "compute_loss", "validation_step")
NOTE_PREFIX = "failing sample: "
_FETCH_FILE = str(Path(torch_fetch.__file__))
_NOTE = re.compile(rf"^{re.escape(NOTE_PREFIX)}(.+)$", re.MULTILINE)
_WORKER = re.compile(r"^Caught (\w+) in DataLoader worker process (\d+)")
_MISSING = object()


def _qualname(code: CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def failing_sample(tb: TracebackType | None) -> str | None:
    """'dataset[7] (MyDataset.__getitem__)' when the traceback passes through torch's
    fetch of a batch: the index it was reading and the function that raised; None otherwise."""
    frames: list[FrameType] = [frame for frame, _ in traceback.walk_tb(tb)]
    fetching = [i for i, frame in enumerate(frames) if frame.f_code.co_filename == _FETCH_FILE]
    if not fetching:
        return None
    last = fetching[-1]
    called = _qualname(frames[last + 1].f_code) if last + 1 < len(frames) else None
    fetcher = next((frames[i].f_locals["self"] for i in reversed(fetching) if "self" in frames[i].f_locals), None)
    dataset = type(getattr(fetcher, "dataset", None)).__qualname__
    index = frames[last].f_locals.get("idx", _MISSING)
    if index is _MISSING and called is not None and called.endswith(("__getitem__", "__getitems__")):
        index = frames[last].f_locals.get("possibly_batched_index", _MISSING)
    if index is not _MISSING:
        return f"dataset[{_short(index)}] ({called or dataset + '.__getitem__'})"
    return f"{called} (reading a batch of {dataset})" if called else None


def name_failing_samples() -> None:
    """In a DataLoader worker: an error while fetching a batch gets a note naming the
    sample, which travels in the text torch re-raises in the main process."""
    for fetcher in (torch_fetch._MapDatasetFetcher, torch_fetch._IterableDatasetFetcher):
        original = fetcher.fetch
        if getattr(original, "names_failing_samples", False):
            continue

        def fetch(self: Any, possibly_batched_index: Any, _original: Any = original) -> Any:
            try:
                return _original(self, possibly_batched_index)
            except StopIteration:
                raise
            except Exception as error:
                where = failing_sample(error.__traceback__)
                if where is not None and hasattr(error, "add_note"):
                    error.add_note(NOTE_PREFIX + where)
                raise

        fetch.names_failing_samples = True  # type: ignore[attr-defined]
        fetcher.fetch = fetch


def _which_data(frames: list[FrameType]) -> str:
    names = {(Path(frame.f_code.co_filename).name, frame.f_code.co_name) for frame in frames}
    if ("stream.py", "_fetch") in names:
        return "the training data"
    if ("evaluation.py", "evaluate_metrics") in names:
        return "the evaluation data"
    return "the data"


def _dataset_of(frames: list[FrameType]) -> str | None:
    for frame in reversed(frames):
        dataset = getattr(frame.f_locals.get("self"), "_dataset", None)
        if dataset is not None:
            return type(dataset).__qualname__
    return None


def _exception_line(error: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(error), error)).strip().splitlines()[-1]


def _worker_error(error: BaseException, frames: list[FrameType]) -> str | None:
    text = str(error)
    worker = _WORKER.match(text)
    if worker is None:
        return None
    kind = worker.group(1)
    lines = [line for line in text.splitlines() if line.startswith((f"{kind}:", kind)) and not line.startswith("Caught")]
    raised = lines[-1] if lines else kind
    note = _NOTE.search(text)
    what = note.group(1) if note else (_dataset_of(frames) or "the dataset")
    return f"error in {_which_data(frames)}: {what}, in DataLoader worker {worker.group(2)}, raised {raised}"


def bug_location(error: BaseException, recipe_class: type | None = None) -> str | None:
    """One line naming where in the user's code ``error`` happened; None when it is not
    in a sample or a recipe method (then the traceback says it all)."""
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)]
    in_worker = _worker_error(error, frames)
    if in_worker is not None:
        return in_worker
    sample = failing_sample(error.__traceback__)
    if sample is not None:
        return f"error in {_which_data(frames)}: {sample} raised {_exception_line(error)}"
    for frame in reversed(frames):
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name in RECIPE_METHODS and (recipe_class is None or isinstance(owner, recipe_class)):
            return f"error in {type(owner).__qualname__}.{frame.f_code.co_name}: {_exception_line(error)}"
    return None
