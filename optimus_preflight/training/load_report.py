"""What a model builder loaded: every ``nn.Module.load_state_dict`` call, recorded (O20).

On torch 2.13 ``load_state_dict(sd, strict=False)`` returns ``_IncompatibleKeys(missing_keys,
unexpected_keys)`` that most code never reads: a checkpoint saved from a DDP model (keys
``module.*``) loads *nothing* into a plain model and says so only there. It still raises on
a shape mismatch (``size mismatch for fc.weight``): ``strict`` relaxes which keys must be
present, never the shapes of those that are (torch/nn/modules/module.py, ``_load_from_state_dict``).

``recording_loads()`` wraps ``nn.Module.load_state_dict`` while a builder runs: each call's
keys, what it loaded (the parameter objects, so a head replaced after the load counts as
new) and where it was called from are kept in a registry keyed by the module (weakly, so
nothing is held alive), for the preflight checks to read with ``loads_into(model)``. A
shape mismatch gets a note on its exception saying why ``strict=False`` did not help and
what to drop. Hugging Face ``from_pretrained`` (transformers 5) loads through its own code,
not ``load_state_dict``: it logs its missing/unexpected keys itself and is not recorded.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import traceback
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from optimus_preflight.training.distributed import unwrap

_SHAPE = r"(torch\.Size\(\[[^\]]*\]\))"
_SIZE_MISMATCH = re.compile(rf"size mismatch for ([^:\s]+): copying a param with shape {_SHAPE} from checkpoint, "
                            rf"the shape in current model is {_SHAPE}")


@dataclass
class LoadRecord:
    """One ``load_state_dict`` call that returned: its keys relative to the module loaded into."""

    module_type: str
    strict: bool
    where: str  # the caller's file:line
    missing_keys: list[str]
    unexpected_keys: list[str]
    model_keys: list[str]  # the module's state_dict keys, in registration order
    numel: dict[str, int]  # elements per model key (to weigh what is missing)
    # A key of the given mapping whose value is itself a mapping holding model keys: a whole
    # training checkpoint ({"model": ..., "optimizer": ...}) passed instead of its weights.
    nested_key: str | None = None
    loaded: list[weakref.ref] = field(default_factory=list)  # the tensors that received values
    # Missing keys whose tensor was filled under another name (tied weights, e.g. lm_head/wte).
    tied_keys: list[str] = field(default_factory=list)

    def loaded_tensors(self) -> list[torch.Tensor]:
        return [tensor for ref in self.loaded if (tensor := ref()) is not None]


_registry: weakref.WeakKeyDictionary[nn.Module, list[LoadRecord]] = weakref.WeakKeyDictionary()
_lock = threading.RLock()
_depth = 0  # nested recording_loads() blocks share one patch
_calls = threading.local()  # load_state_dict calls in progress on this thread


@contextlib.contextmanager
def recording_loads() -> Iterator[list[LoadRecord]]:
    """Within the block, every ``nn.Module.load_state_dict`` that returns is recorded (the
    yielded list gets this block's records too). Re-entrant."""
    global _depth, _previous
    records: list[LoadRecord] = []
    with _lock:
        if _depth == 0:
            _previous = nn.Module.load_state_dict
            nn.Module.load_state_dict = _recorded(_previous)  # type: ignore[method-assign]
        _depth += 1
        _sinks.append(records)
    try:
        yield records
    finally:
        with _lock:
            _sinks.remove(records)
            _depth -= 1
            if _depth == 0:
                nn.Module.load_state_dict = _previous  # type: ignore[method-assign]


_previous: Any = None
_sinks: list[list[LoadRecord]] = []


def _recorded(original: Any) -> Any:
    @functools.wraps(original)
    def load_state_dict(module: nn.Module, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        outermost = not getattr(_calls, "depth", 0)
        _calls.depth = getattr(_calls, "depth", 0) + 1
        try:
            result = original(module, state_dict, strict=strict, assign=assign)
        except RuntimeError as error:
            if outermost:
                note = load_error_note(module, state_dict, strict, str(error))
                if note:
                    error.add_note(note)
            raise
        finally:
            _calls.depth -= 1
        # Only the outermost call: one a module's own load_state_dict makes is its detail.
        if outermost and hasattr(result, "missing_keys") and hasattr(result, "unexpected_keys"):
            _record(module, state_dict, strict, result)
        return result

    return load_state_dict


def _record(module: nn.Module, state_dict: Mapping[str, Any], strict: bool, result: Any) -> None:
    current = module.state_dict(keep_vars=True)
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    missing_set = set(missing)
    filled = [value for key, value in current.items()
              if key in state_dict and key not in missing_set and isinstance(value, torch.Tensor)]
    filled_ids = {id(value) for value in filled}
    record = LoadRecord(
        module_type=type(module).__name__,
        strict=strict,
        where=_caller(),
        missing_keys=missing,
        unexpected_keys=unexpected,
        model_keys=list(current),
        numel={key: value.numel() for key, value in current.items() if isinstance(value, torch.Tensor)},
        nested_key=_nested_key(state_dict, current, unexpected),
        loaded=[weakref.ref(value) for value in filled],
        tied_keys=[key for key in missing if id(current.get(key)) in filled_ids],
    )
    with _lock:
        _registry.setdefault(module, []).append(record)
        for sink in _sinks:
            sink.append(record)


def _nested_key(state_dict: Mapping[str, Any], current: Mapping[str, Any], unexpected: list[str]) -> str | None:
    for key in unexpected:
        value = state_dict.get(key)
        if isinstance(value, Mapping) and any(inner in current for inner in value):
            return key
    return None


def _caller() -> str:
    """The innermost frame outside torch and this module: the user's load call."""
    for frame in reversed(traceback.extract_stack()):
        if "site-packages/torch" not in frame.filename and not frame.filename.endswith("load_report.py"):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def loads_into(model: nn.Module) -> list[tuple[str, LoadRecord]]:
    """(module path in ``model``, record) for every recorded load into ``model`` or one of its
    submodules, in the order of the model's modules; "" is the model itself."""
    found = []
    with _lock:
        for path, module in unwrap(model).named_modules():
            found.extend((path, record) for record in _registry.get(module, ()))
    return found


# --------------------------------------------------------------------------- key analysis
EXPLAINED = 0.75


@dataclass
class PrefixMismatch:
    prefix: str
    in_checkpoint: bool  # True: the checkpoint's keys carry it; False: the model's do
    matched: int  # keys that would load with the prefix fixed


def prefix_mismatch(missing: Iterable[str], unexpected: Iterable[str]) -> PrefixMismatch | None:
    """The key prefix (``module.``, ``model.``, ``_orig_mod.``, ...) that, stripped from the
    checkpoint's keys or from the model's, turns unexpected keys into the missing ones."""
    missing, unexpected = set(missing), set(unexpected)
    best: PrefixMismatch | None = None
    for keys, others, in_checkpoint in ((unexpected, missing, True), (missing, unexpected, False)):
        for prefix in _prefixes(keys):
            matched = len({key[len(prefix):] for key in keys if key.startswith(prefix)} & others)
            if matched and (best is None or matched > best.matched):
                best = PrefixMismatch(prefix, in_checkpoint, matched)
    # A prefix explains the load only if it turns nearly every dropped checkpoint key into a
    # model key; a couple of coincidental names (``0.weight``) in another model's checkpoint do not.
    if best is None or best.matched < min(2, len(missing)) or best.matched < EXPLAINED * len(unexpected):
        return None
    return best


def _prefixes(keys: Iterable[str], depth: int = 3) -> set[str]:
    found = set()
    for key in keys:
        parts = key.split(".")
        found.update(".".join(parts[:n]) + "." for n in range(1, min(depth, len(parts) - 1) + 1))
    return found


def load_error_note(module: nn.Module, state_dict: Mapping[str, Any], strict: bool, text: str) -> str | None:
    """What the failed load's message does not say: why ``strict=False`` did not skip a
    shape mismatch and what to drop, or the key prefix behind missing/unexpected keys."""
    mismatched = _SIZE_MISMATCH.findall(text)
    if mismatched:
        keys = [key for key, _, _ in mismatched]
        shown = ", ".join(f"{key} ({old} in the checkpoint, {new} in the model)" for key, old, new in mismatched[:4])
        drop = "{" + ", ".join(repr(key) for key in keys[:4]) + (", ..." if len(keys) > 4 else "") + "}"
        why = ("strict=False tolerates missing and unexpected keys, never a key present in both with another shape"
               if not strict else "strict=False would not skip them either: it tolerates only missing and unexpected keys")
        return (f"O20: {len(keys)} tensor(s) have another shape in the checkpoint than in the model: {shown}; {why}. "
                f"If they belong to a replaced head, drop them before loading: state_dict = {{k: v for k, v in "
                f"state_dict.items() if k not in {drop}}}; then load with strict=False and check that the returned "
                "missing_keys are only the new head's (or give the new head another attribute name).")
    if "Missing key(s)" in text or "Unexpected key(s)" in text:
        expected = set(module.state_dict().keys())
        given = set(state_dict.keys())
        mismatch = prefix_mismatch(expected - given, given - expected)
        if mismatch is not None:
            return f"O20: {describe_prefix(mismatch)}. {prefix_fix(mismatch)}"
    return None


_PREFIX_SOURCES = {"module.": " (saved from a DDP/DataParallel-wrapped model)",
                   "_orig_mod.": " (saved from a torch.compile'd model)"}


def describe_prefix(mismatch: PrefixMismatch) -> str:
    prefix = mismatch.prefix
    if mismatch.in_checkpoint:
        return f"the checkpoint's keys start with {prefix!r}{_PREFIX_SOURCES.get(prefix, '')} and the model's do not"
    return f"the model's keys start with {prefix!r} and the checkpoint's do not"


def prefix_fix(mismatch: PrefixMismatch) -> str:
    prefix = mismatch.prefix
    if mismatch.in_checkpoint:
        return (f"Strip the prefix before loading: torch.nn.modules.utils.consume_prefix_in_state_dict_if_present("
                f"state_dict, {prefix!r}); or save the unwrapped model's state_dict in the first place "
                "(model.module.state_dict() under DDP).")
    return (f"Load into that submodule, model.{prefix.rstrip('.')}.load_state_dict(state_dict), or add the prefix "
            "to the checkpoint's keys.")
