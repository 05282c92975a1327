"""DP6: what a DataLoader worker started by ``spawn`` or ``forkserver`` receives must pickle.

Under those start methods (the default on macOS and Windows, on Linux from Python 3.14,
and what users pick to use CUDA in workers) each worker gets the dataset, collate_fn and
worker_init_fn by pickle: a lambda, a nested function or a class defined inside a
function cannot be pickled, so ``iter(loader)`` fails, while under ``fork`` the same
loader works. Checked by pickling those objects as ``Process.start`` would, without
starting a process. Tensors are not serialised (spawn shares them through shared
memory); everything else is counted into a capped sink, so a huge dataset costs at most
``PICKLE_CAP_BYTES`` and ``PICKLE_BUDGET_S``, and is itself reported: each worker start
unpickles a copy.
"""

from __future__ import annotations

import copyreg
import functools
import inspect
import itertools
import multiprocessing
import pickle
import sys
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIB = 1024**2
# A dataset that pickles to more than this is itself the finding (a copy per worker
# start under spawn); pickling stops there, or after the time budget.
PICKLE_CAP_BYTES = 64 * MIB
PICKLE_BUDGET_S = 3.0
SPAWNING = ("spawn", "forkserver")
# The culprit search opens at most this many attributes/items per object, this deep.
SEARCH_WIDTH = 64
SEARCH_DEPTH = 6


def start_method(loader: Any) -> str:
    """The start method the loader's workers get: its own ``multiprocessing_context``, else
    the process default (``get_start_method(allow_none=True)`` does not fix it; the first
    of ``get_all_start_methods()`` is the platform's default)."""
    context = getattr(loader, "multiprocessing_context", None)
    if context is not None:
        return context.get_start_method()
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


class PickleCapped(Exception):
    """The pickle grew past the cap or the time budget: the object is too big to judge."""


class _CountingSink:
    def __init__(self, cap_bytes: int, deadline: float):
        self.nbytes = 0
        self.cap_bytes = cap_bytes
        self.deadline = deadline

    def write(self, data: Any) -> int:
        self.nbytes += len(data)
        if self.nbytes > self.cap_bytes:
            raise PickleCapped(f"pickles to more than {self.cap_bytes / MIB:g} MiB")
        if time.perf_counter() > self.deadline:
            raise PickleCapped(f"takes more than {PICKLE_BUDGET_S:g} s to pickle")
        return len(data)


def _tensor_stand_in(shape: tuple, dtype: str) -> None:
    """What a tensor pickles to here: spawn passes tensors through shared memory, so their
    bytes are not part of what each worker unpickles."""


# multiprocessing's reducers (bound methods, partials, sockets), without torch's, which
# would move every tensor of the dataset into shared memory.
_REDUCERS = {kind: reducer for kind, reducer in ForkingPickler._extra_reducers.items()
             if not kind.__module__.startswith("torch")}


def main_is_importable() -> bool:
    """Whether a spawned worker can import ``__main__`` to find what was pickled from it
    (a script or ``python -m``: yes; a notebook, a REPL, stdin: no)."""
    main = sys.modules.get("__main__")
    if getattr(main, "__spec__", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    return bool(path) and Path(path).is_file()


class _WorkerPickler(pickle.Pickler):
    """Pickles like ``ForkingPickler`` would for ``Process.start``, minus tensor bytes."""

    def __init__(self, sink: _CountingSink, main_ok: bool):
        super().__init__(sink, protocol=pickle.HIGHEST_PROTOCOL)
        self.dispatch_table = {**copyreg.dispatch_table, **_REDUCERS}
        self.main_ok = main_ok
        self.from_main: list[str] = []
        self.tensor_bytes = 0

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.requires_grad and not obj.is_leaf:  # torch's reduce_tensor refuses it
                raise pickle.PicklingError("Cowardly refusing to serialize non-leaf tensor which requires_grad")
            self.tensor_bytes += obj.numel() * obj.element_size()
            return _tensor_stand_in, (tuple(obj.shape), str(obj.dtype))
        if isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)):
            return _tensor_stand_in, ((), "storage")
        if (not self.main_ok and isinstance(obj, (type, types.FunctionType))
                and getattr(obj, "__module__", None) == "__main__"):
            self.from_main.append(getattr(obj, "__qualname__", repr(obj)))
        return NotImplemented


@dataclass
class PickleResult:
    nbytes: int = 0  # what each worker unpickles (tensors excluded)
    tensor_bytes: int = 0
    error: str | None = None  # why it cannot be pickled
    capped: str | None = None  # why pickling stopped before the end
    from_main: list[str] = field(default_factory=list)


def pickle_for_worker(obj: Any, deadline: float, main_ok: bool, cap_bytes: int | None = None) -> PickleResult:
    """``obj`` pickled as a spawned worker's argument is, into a counting sink."""
    sink = _CountingSink(cap_bytes or PICKLE_CAP_BYTES, deadline)
    pickler = _WorkerPickler(sink, main_ok)
    result = PickleResult()
    try:
        pickler.dump(obj)
    except PickleCapped as capped:
        result.capped = str(capped)
    except RecursionError:
        result.error = "RecursionError: too deeply nested to pickle"
    except Exception as error:  # PicklingError, AttributeError ("Can't pickle local object"), TypeError
        result.error = f"{type(error).__name__}: {error}"
    result.nbytes, result.tensor_bytes, result.from_main = sink.nbytes, pickler.tensor_bytes, pickler.from_main
    return result


def _children(obj: Any) -> list[tuple[str, Any]]:
    """(path suffix, value) of what pickling ``obj`` pickles in turn, as far as it shows."""
    if isinstance(obj, (str, bytes, int, float, type, types.FunctionType, torch.Tensor)):
        return []
    if isinstance(obj, types.MethodType):
        return [(".__self__", obj.__self__), (".__func__", obj.__func__)]
    if isinstance(obj, functools.partial):
        return [(".func", obj.func), *((f".args[{i}]", a) for i, a in enumerate(obj.args)),
                *((f".keywords[{k!r}]", v) for k, v in obj.keywords.items())]
    if isinstance(obj, Mapping):
        return [(f"[{key!r}]", value) for key, value in itertools.islice(obj.items(), SEARCH_WIDTH)]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", value) for i, value in enumerate(itertools.islice(obj, SEARCH_WIDTH))]
    attributes = dict(itertools.islice(getattr(obj, "__dict__", {}).items(), SEARCH_WIDTH))
    for name in getattr(type(obj), "__slots__", ()):
        if isinstance(name, str) and hasattr(obj, name):
            attributes.setdefault(name, getattr(obj, name))
    return [(f".{name}", value) for name, value in attributes.items()]


def find_unpicklable(obj: Any, path: str, deadline: float, main_ok: bool) -> tuple[str, Any, str]:
    """The innermost part of ``obj`` that cannot be pickled: (its path, it, the error)."""
    error = pickle_for_worker(obj, deadline, main_ok).error or ""
    for _ in range(SEARCH_DEPTH):
        for suffix, child in _children(obj):
            if time.perf_counter() > deadline:
                return path, obj, error
            child_error = pickle_for_worker(child, deadline, main_ok).error
            if child_error:
                path, obj, error = path + suffix, child, child_error
                break
        else:
            break
    return path, obj, error


def describe(obj: Any) -> str:
    """What cannot be pickled, and where it is defined: "a lambda at data.py:12"."""
    target = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
    name = getattr(target, "__qualname__", type(target).__name__)
    try:
        where = f" at {Path(inspect.getsourcefile(target) or '?').name}:{inspect.getsourcelines(target)[1]}"
    except (OSError, TypeError):
        where = ""
    if name.endswith("<lambda>"):
        shown = "a lambda"
    else:
        kind = "function" if isinstance(target, types.FunctionType) else "class"
        shown = f"the {kind} {name}" + (", defined inside a function" if "<locals>" in name else "")
    shown += where
    return shown if target is obj else f"an instance of {shown}"


def worker_arguments(loader: Any) -> list[tuple[str, Any]]:
    """What DataLoader hands each worker Process (torch 2.13 ``_MultiProcessingDataLoaderIter``)."""
    parts = [("dataset", loader.dataset), ("collate_fn", loader.collate_fn)]
    if loader.worker_init_fn is not None:
        parts.append(("worker_init_fn", loader.worker_init_fn))
    return parts


@dataclass
class PartVerdict:
    """One worker argument (dataset, collate_fn, worker_init_fn) pickled as spawn would."""

    result: PickleResult
    culprit: str | None = None  # "dataset.transform (a lambda defined at data.py:12)"
    error: str | None = None


def pickle_worker_arguments(loader: Any) -> dict[str, PartVerdict]:
    """Each object a spawned worker receives, pickled; for one that fails, its innermost
    failing part. All of it within PICKLE_BUDGET_S (past it, a part counts as capped)."""
    deadline = time.perf_counter() + PICKLE_BUDGET_S
    main_ok = main_is_importable()
    verdicts = {}
    for part, obj in worker_arguments(loader):
        verdict = PartVerdict(pickle_for_worker(obj, deadline, main_ok))
        if verdict.result.error:
            path, culprit, error = find_unpicklable(obj, part, deadline, main_ok)
            verdict.culprit, verdict.error = f"{path} ({describe(culprit)})", error.splitlines()[0][:200]
        verdicts[part] = verdict
    return verdicts


MOVE_FIX = ("make everything a worker rebuilds importable: module-level `def`s instead of lambdas and nested "
            "functions (collate_fn, transforms, worker_init_fn), functools.partial(top_level_fn, ...) instead of a "
            "closure, classes defined at the top of a module rather than inside a function")
IMPORT_FIX = "Move them into a .py module next to your notebook and import them from there"
BULK_FIX = ("Keep bulk data out of the dataset object: open it lazily in the worker (a file, a np.memmap, Arrow) or "
            "hold it in torch tensors (shared with workers, not copied); set data.persistent_workers=true so workers "
            "start once, not every epoch.")
OWN_LOADER = "on the DataLoader your build_dataloaders() returns"


class WorkerPicklingCheck(Check):
    """DP6: the objects a spawned worker receives by pickle, pickled without starting one."""

    name = "data.worker_pickling"
    stage = Stage.DATA
    codes = ("DP6",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        workers = getattr(loader, "num_workers", 0)
        if not workers or not hasattr(loader, "collate_fn"):
            findings.data["summary"] = "not applicable (no worker processes)"
            return
        method = start_method(loader)
        # __reduce__ and __getstate__ are user code: under the data timeout.
        verdicts = DataGuard(ctx, self.name, findings).call(pickle_worker_arguments, loader,
                                                            what="pickling the dataset for a worker")
        findings.data.update(start_method=method, **{f"{part}_bytes": v.result.nbytes for part, v in verdicts.items()})
        findings.data["summary"] = f"{method} start method, " + ", ".join(
            f"{part} {'unpicklable' if v.error else f'{v.result.nbytes / MIB:.1f} MiB'}" for part, v in verdicts.items())
        spawns = method in SPAWNING
        report = findings.error if spawns else findings.info
        if spawns:
            consequence = f"the {method} start method this run uses pickles it to start each worker, so iter(loader) fails"
        else:
            consequence = ("this run forks its workers (a copy, no pickling), so it works here; under spawn or "
                           "forkserver (the default on macOS and Windows, on Linux from Python 3.14, and needed for "
                           "CUDA in workers) iter(loader) fails")
        # Under fork nothing fails today: the portability fix is the code change alone.
        stopgap = " Stopgap: data.num_workers=0 (no worker processes, slower)." if spawns else ""
        for part, verdict in verdicts.items():
            if verdict.error:
                fix = f"In your data code, {MOVE_FIX}.{stopgap}"
                message = f"{verdict.culprit} cannot be pickled ({verdict.error}): {consequence}"
            elif verdict.result.from_main:
                names = ", ".join(sorted(set(verdict.result.from_main))[:4])
                fix = f"{IMPORT_FIX}.{stopgap}"
                message = (f"{part} refers to {names}, defined in the __main__ of an interactive session (a notebook, a "
                           f"REPL), which a new worker process cannot import: {consequence}")
            else:
                if verdict.result.capped and spawns and part == "dataset":
                    findings.warning(
                        "DP6",
                        f"the dataset {verdict.result.capped} (its tensors aside): under {method} each of "
                        f"the {workers} workers unpickles its own copy at every start (every epoch unless "
                        "persistent_workers)",
                        BULK_FIX, "data.persistent_workers",
                        code_fix=BULK_FIX.replace("data.persistent_workers=true", f"persistent_workers=True {OWN_LOADER}"))
                continue
            report("DP6", message, fix, "data.num_workers" if spawns else None,
                   code_fix=fix.replace("data.num_workers=0", f"num_workers=0 {OWN_LOADER}"))
