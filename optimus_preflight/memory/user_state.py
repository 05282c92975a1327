"""Leave the user's objects as the fake trace found them.

The estimate runs the user's own code (the loss function, the model and optimizer
builders, the model's forward) under ``FakeTensorMode``. Whatever that code stores
outside the trace's own model and optimizer outlives the trace: a loss that keeps a
running value (``self.smoothed = loss``), a module-level cache a forward fills, a
learnable loss weight whose ``.grad`` the fake backward set. The real training step
then reads a FAKE tensor and fails (``DataDependentOutputException`` on ``.item()``),
the estimate's fault, not the user's. And under ``allow_non_fake_inputs`` an in-place op
whose operands are all real runs for real (a call counter ``self.calls += 1`` kept in a
tensor).

So before the trace, ``UserState(*callables)`` records the state those callables
can reach, by reference, not by copy: objects' attribute namespaces (a model's modules
included), closure cells, the lists, dicts and sets they hold, the attributes of the
user's classes and the globals their methods name (a model built inside the trace runs
its class's code), plus each real tensor's gradient, its version counter and, for small
ones that are not learnable, a copy of the values. After the trace (``restore()``, in a
``finally``), every slot is put back as it was, by identity: the trace is a simulation,
and nothing it did to the user's objects may survive it. A fake tensor that still gets
through is recognised by ``raised_by_fake_tensor`` when the real step fails on it.

Bounded: containers over ``CONTAINER_ITEMS`` (data, not state) are neither recorded nor
entered, objects are entered to ``DEPTH`` steps from a callable (a model's modules all
count as one), at most ``MAX_OBJECTS`` objects are recorded, and values are copied for
tensors of at most ``CLONE_NUMEL`` elements, ``CLONE_BUDGET`` in all.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import traceback
from typing import Any

import torch
from torch import nn
from torch._subclasses import FakeTensor
from torch.optim import Optimizer

DEPTH = 4
MAX_OBJECTS = 50_000
CONTAINER_ITEMS = 1000
CLONE_NUMEL = 1 << 16
CLONE_BUDGET = 1 << 22

# Libraries whose objects and functions hold no user state the trace could change (and
# whose internals, caches included, are theirs to manage): not entered.
_LIBRARIES = frozenset({
    "torch", "numpy", "omegaconf", "hydra", "logging", "threading", "multiprocessing", "concurrent", "asyncio",
    "queue", "socket", "subprocess", "io", "_io", "builtins", "typing", "abc", "enum", "weakref", "pathlib",
    "psutil", "contextlib", "inspect", "copy", "random", "_thread", "selectors", "signal",
})
_TORCH_STATE = (nn.Module, Optimizer, torch.optim.lr_scheduler.LRScheduler)
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, slice, torch.device, torch.dtype)
_EMPTY = object()  # an empty closure cell, or a key a dict did not have


def _library(value: Any) -> bool:
    """Whether ``value`` (an object, a function or a class) is a library's."""
    routine = inspect.isroutine(value) or isinstance(value, type)
    module = getattr(value, "__module__", None) if routine else type(value).__module__
    return isinstance(module, str) and module.split(".", 1)[0] in _LIBRARIES


def _ours(value: Any) -> bool:
    return str(getattr(value, "__module__", "")).startswith("optimus_preflight.")


class UserState:
    """What the callables can reach, recorded now; ``restore()`` puts it back."""

    def __init__(self, *roots: Any) -> None:
        self._dicts: list[tuple[dict, dict]] = []
        self._globals: list[tuple[dict, dict]] = []  # only the names code reads: a module's namespace is not ours
        self._lists: list[tuple[list, list]] = []
        self._deques: list[tuple[collections.deque, list]] = []
        self._sets: list[tuple[set, set]] = []
        self._cells: list[tuple[Any, Any]] = []
        self._classes: list[tuple[type, dict]] = []  # a class's own attributes (not its dunders)
        self._tensors: list[tuple[torch.Tensor, int | None, Any, torch.Tensor | None]] = []
        self._seen: set[int] = set()
        self._held: list[Any] = []  # keeps every visited object alive, so an id stays unique
        self._cloned = 0
        for root in roots:
            # Best effort: a user object that refuses to be walked ends this root's walk;
            # what was recorded before it is restored all the same.
            with contextlib.suppress(Exception):
                self._visit(root, DEPTH)

    # -- recording ---------------------------------------------------------------

    def _first_visit(self, value: Any) -> bool:
        if id(value) in self._seen or len(self._seen) >= MAX_OBJECTS:
            return False
        self._seen.add(id(value))
        self._held.append(value)
        return True

    def _visit(self, value: Any, depth: int) -> None:
        if isinstance(value, _ATOMS) or inspect.ismodule(value):
            return
        if isinstance(value, type):
            self._visit_class(value, depth)
            return
        if inspect.isfunction(value):
            self._visit_function(value, depth)
            return
        if isinstance(value, torch.Tensor):
            if self._first_visit(value):
                self._record_tensor(value)
            return
        if not self._first_visit(value):
            return
        if isinstance(value, nn.Module):
            depth = max(depth, 1)  # its parameters, buffers and plain attributes, however far it was found
            for module in value.modules():  # a model's modules, all at the depth of the model
                if module is value or self._first_visit(module):
                    self._record_namespace(module, depth)
                    self._dicts.append((module._modules, dict(module._modules)))
                    self._visit_class(type(module), depth - 1)
            return
        if depth < 0:
            return
        if isinstance(value, dict):
            if len(value) <= CONTAINER_ITEMS:
                # The stored values, not what a subclass's __getitem__ makes of them (transformers'
                # ACT2FN builds a new module per lookup: restoring those would replace its classes).
                stored = dict(dict.items(value))
                self._dicts.append((value, stored))
                self._visit_items(stored.values(), depth - 1)
        elif isinstance(value, list):
            if len(value) <= CONTAINER_ITEMS:
                self._lists.append((value, list(value)))
                self._visit_items(value, depth - 1)
        elif isinstance(value, collections.deque):
            if len(value) <= CONTAINER_ITEMS:
                self._deques.append((value, list(value)))
                self._visit_items(value, depth - 1)
        elif isinstance(value, set):
            if len(value) <= CONTAINER_ITEMS:
                self._sets.append((value, set(value)))
                self._visit_items(value, depth - 1)
        elif isinstance(value, (tuple, frozenset)):
            if len(value) <= CONTAINER_ITEMS:
                self._visit_items(value, depth - 1)
        elif isinstance(value, functools.partial):
            self._visit(value.func, depth - 1)
            self._visit_items(value.args, depth - 1)
            self._visit(value.keywords, depth - 1)
        elif inspect.ismethod(value):
            self._visit(value.__self__, depth)  # the instance's state is the method's own
            self._visit_function(value.__func__, depth)
        elif isinstance(value, _TORCH_STATE) or not _library(value):
            self._record_namespace(value, depth)
            self._visit_class(type(value), depth - 1)  # a loss object's own code

    def _visit_items(self, items: Any, depth: int) -> None:
        for item in items:
            self._visit(item, depth)

    def _record_namespace(self, value: Any, depth: int) -> None:
        try:
            namespace = object.__getattribute__(value, "__dict__")
        except Exception:  # noqa: BLE001 - no namespace (slots), or a proxy's own rules
            return
        if not isinstance(namespace, dict) or len(namespace) > CONTAINER_ITEMS:
            return
        self._dicts.append((namespace, dict(namespace)))
        self._seen.add(id(namespace))
        # The dicts a module keeps its parameters, buffers and hooks in are recorded as its
        # state; its submodules are visited by the caller.
        for key, item in namespace.items():
            if key == "_modules":
                continue
            self._visit(item, depth - 1)

    def _visit_class(self, cls: type, depth: int) -> None:
        """A user class's own code and class attributes (a cache kept on the class, the
        globals its methods name: a model built inside the trace runs this code)."""
        for klass in cls.__mro__:
            if klass is object or _library(klass) or _ours(klass) or depth < 0 or not self._first_visit(klass):
                continue
            attributes = {name: value for name, value in vars(klass).items()
                          if not (name.startswith("__") and name.endswith("__"))}
            self._classes.append((klass, attributes))
            for value in attributes.values():
                function = getattr(value, "__func__", value)  # staticmethod, classmethod
                if inspect.isfunction(function):
                    self._visit_function(function, depth - 1)
                elif isinstance(value, property):
                    for accessor in (value.fget, value.fset):
                        self._visit_function(accessor, depth - 1)
                else:
                    self._visit(value, depth - 1)
            init = vars(klass).get("__init__")
            self._visit_function(init, depth - 1)
            call = vars(klass).get("__call__")
            self._visit_function(call, depth - 1)

    def _visit_function(self, function: Any, depth: int) -> None:
        if depth < 0 or not inspect.isfunction(function) or _library(function) or not self._first_visit(function):
            return
        for cell in function.__closure__ or ():
            if id(cell) in self._seen:
                continue
            self._first_visit(cell)
            try:
                contents = cell.cell_contents
            except ValueError:  # not yet bound
                contents = _EMPTY
            self._cells.append((cell, contents))
            if contents is not _EMPTY:
                self._visit(contents, depth - 1)
        self._visit_items(function.__defaults__ or (), depth - 1)
        self._visit(function.__kwdefaults__, depth - 1)
        if _ours(function):  # the preflight's own wrappers: their closures hold the user's objects, their globals not
            return
        scope = function.__globals__
        # A name not bound yet is recorded too: a ``global`` the trace creates is removed.
        named = {name: scope.get(name, _EMPTY) for name in function.__code__.co_names}
        if named:
            self._globals.append((scope, named))
            self._visit_items((value for value in named.values() if value is not _EMPTY), depth - 1)

    def _record_tensor(self, tensor: torch.Tensor) -> None:
        if isinstance(tensor, FakeTensor):
            return
        try:
            version = tensor._version
        except RuntimeError:  # an inference tensor has no version counter
            version = None
        clone = None
        if (version is not None and not tensor.requires_grad and tensor.device.type != "meta"
                and tensor.numel() <= CLONE_NUMEL and self._cloned + tensor.numel() <= CLONE_BUDGET):
            with contextlib.suppress(RuntimeError):
                clone = tensor.detach().clone()
                self._cloned += tensor.numel()
        learnable = tensor.is_leaf and tensor.requires_grad
        self._tensors.append((tensor, version, tensor.grad if learnable else None, clone))

    # -- restoring ---------------------------------------------------------------

    def restore(self) -> None:
        """Put every recorded slot back; one that refuses (a class or container with rules
        of its own) does not keep the others from being restored."""
        slots = [
            *((_restore_dict, namespace, before, True) for namespace, before in self._dicts),
            *((_restore_dict, scope, before, False) for scope, before in self._globals),
            *((_restore_class, cls, before) for cls, before in self._classes),
            *((_restore_list, items, before) for items, before in self._lists),
            *((_restore_deque, items, before) for items, before in self._deques),
            *((_restore_set, items, before) for items, before in self._sets),
            *((_restore_cell, cell, before) for cell, before in self._cells),
            *((_restore_tensor, *record) for record in self._tensors),
        ]
        for restore, *arguments in slots:
            with contextlib.suppress(Exception):
                restore(*arguments)
        self._held.clear()


def _restore_class(cls: type, before: dict) -> None:
    now = {name for name in vars(cls) if not (name.startswith("__") and name.endswith("__"))}
    for name in now - before.keys():
        delattr(cls, name)
    for name, value in before.items():
        if vars(cls).get(name, _EMPTY) is not value:
            setattr(cls, name, value)


def _changed(items: Any, before: list) -> bool:
    return len(items) != len(before) or any(a is not b for a, b in zip(items, before, strict=False))


def _restore_list(items: list, before: list) -> None:
    if _changed(items, before):
        items[:] = before


def _restore_deque(items: collections.deque, before: list) -> None:
    if _changed(items, before):
        items.clear()
        items.extend(before)


def _restore_set(items: set, before: set) -> None:
    if items != before:
        items.clear()
        items.update(before)


def _restore_cell(cell: Any, before: Any) -> None:
    try:
        now = cell.cell_contents
    except ValueError:
        now = _EMPTY
    if now is before:
        return
    if before is _EMPTY:
        del cell.cell_contents
    else:
        cell.cell_contents = before


def _restore_tensor(tensor: torch.Tensor, version: int | None, grad: Any, clone: torch.Tensor | None) -> None:
    if tensor.is_leaf and tensor.requires_grad and tensor.grad is not grad:
        try:
            tensor.grad = grad
        except (RuntimeError, TypeError):  # the user's code changed the tensor itself
            tensor.grad = None
    if version is not None and clone is not None and tensor._version != version:
        with torch.no_grad():
            tensor.copy_(clone)


def _restore_dict(mapping: dict, before: dict, every_key: bool) -> None:
    """``before``'s values back by identity; with ``every_key`` keys it lacked are removed
    too (``before`` is then all of the dict, else only the names recorded)."""
    if every_key:
        for key in [key for key in mapping if key not in before]:
            del mapping[key]
    for key, value in before.items():
        if value is _EMPTY:
            mapping.pop(key, None)
        elif dict.get(mapping, key, _EMPTY) is not value:
            mapping[key] = value


@contextlib.contextmanager
def quiet_fake_tensor_log() -> Any:
    """Keep torch's fake-tensor logger from printing a traceback at ERROR level for an op the
    trace cannot run on fake tensors (a user's tensor stored on ``self`` and fed back in): the
    estimate catches that failure and says so in its own words. Nor let torch warn about the
    data pointer of a fake tensor when a model's constructor deep-copies a layer built inside
    the trace (``nn.Transformer`` clones its layers): a warning about the estimate's own fake
    tensors, which a user reads as a bug in their code."""
    import logging
    import warnings

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor", category=UserWarning)
            yield
    finally:
        logger.setLevel(level)


_FAKE_SOURCES = ("torch/_subclasses/fake_tensor.py", "torch/_subclasses/fake_impls.py", "torch/_subclasses/fake_utils.py")
# Frames of a compilation in progress (torch.compile, export); torch/_dynamo/eval_frame.py is
# not one: every dispatch of a fake tensor passes through its ``disable`` wrapper.
_COMPILERS = ("torch/_dynamo/convert_frame.py", "torch/_dynamo/symbolic_convert.py", "torch/_inductor/",
              "torch/_functorch/_aot_autograd/", "torch/_functorch/aot_autograd.py", "torch/_export/", "torch/export/")


def raised_by_fake_tensor(error: BaseException) -> bool:
    """Whether ``error``, raised by real training code, came from a fake tensor (an
    exception of ``torch._subclasses.fake_tensor``, or one raised inside its code): one
    that outlived a fake trace (the estimate's, not the user's doing). Not while
    ``torch.compile`` traces: the compiler runs the user's code on fake tensors of its own."""
    fake = False
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        files = [frame.filename.replace("\\", "/") for frame in traceback.extract_tb(current.__traceback__)]
        if any(compiler in name for name in files for compiler in _COMPILERS):
            return False
        fake = fake or type(current).__module__.startswith("torch._subclasses.fake_tensor") or any(
            name.endswith(source) for name in files for source in _FAKE_SOURCES)
        current = current.__cause__ or current.__context__
    return fake
