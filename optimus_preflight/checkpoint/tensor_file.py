"""The checkpoint format of ``format_version`` 3: the structure in ``state.pt``, the tensor
bytes in ``tensors.bin`` (or, for a large state, ``tensors-0.bin``, ``tensors-1.bin``...).

``torch.save`` writes every tensor as a record of a zip archive through Python file calls,
and the manifest's SHA-256 then ran over the same bytes on the same thread. This format
writes each tensor storage's bytes once, straight from its memory, into flat files, and
hashes them on a second thread while they are written. SHA-256 runs at about 1 GB/s per
core, slower than a fast disk or the page cache, so a state of more than ``FILE_BYTES``
is spread over up to ``MAX_FILES`` files (one per core), written and hashed in parallel.

Tensor files: the raw bytes of storages, in native byte order, each starting at a
multiple of ``ALIGN`` bytes (zeros between).

``state.pt`` (``torch.save``, loaded with ``torch.load(weights_only=True)``)::

    {MARKER: 1, "byteorder": "little", "files": [{"name": "tensors.bin", "bytes": int}, ...],
     "storages": [{"file": int, "offset": int, "nbytes": int, "device": "cpu" | "meta"}, ...],
     "tensors":  [{"storage": int, "dtype": "bfloat16", "shape": [..], "stride": [..],
                   "offset": int, "requires_grad": bool, "parameter": bool}, ...],
     "state": <the state, each tensor replaced by a meta-device tensor of its shape>}

Placeholders and ``tensors`` entries pair up in walk order (``map_tensors``: dicts,
OrderedDicts with their ``_metadata``, lists and tuples, in order). Views of one storage
(tied weights, slices, transposes) stay views of one storage after loading.

Why it is safe to load: ``state.pt`` holds only what ``weights_only=True`` admits (plain
containers, numbers, strings, meta tensors), so no pickled code runs; the index is then
checked in full before any tensor is built (file names of one fixed pattern, dtypes from a
fixed table, every storage inside its file and apart from the others, every view inside
its storage, the placeholders matching the entries one for one); the bytes of the tensor
files are only ever read as numbers. Anything else is ``TensorFileError``.
"""

from __future__ import annotations

import collections
import copy
import ctypes
import hashlib
import mmap
import os
import re
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

TENSORS_FILE = "tensors.bin"  # the name when the tensors fit one file
_FILE_NAME = re.compile(r"tensors(-[0-9]{1,3})?\.bin")
MARKER = "optimus_preflight.tensor_file"
ALIGN = 64
CHUNK = 8 << 20  # bytes per write and hash call
FILE_BYTES = 64 << 20  # a state spreads over one more file per this many bytes...
MAX_FILES = 4  # ... up to this many, and no more than there are cores
_MAX_DIMS = 64

_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64", "int32",
                "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
                "float8_e4m3fnuz", "float8_e5m2fnuz")
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class Unsupported(Exception):
    """The state holds a tensor this format does not store (sparse, quantized, a subclass...)."""


class TensorFileError(ValueError):
    """``state.pt``/``tensors.bin`` do not form a valid checkpoint; the message says how."""


def map_tensors(obj: Any, on_tensor: Callable[[torch.Tensor], Any], on_leaf: Callable[[Any], Any] = lambda leaf: leaf) -> Any:
    """``obj`` rebuilt with each tensor replaced by ``on_tensor(tensor)`` and each other
    leaf by ``on_leaf(leaf)``. Walks dicts, OrderedDicts (keeping a state_dict's
    ``_metadata``), lists and tuples of exactly those types, in order; dict keys and
    anything else are leaves."""
    if isinstance(obj, torch.Tensor):
        return on_tensor(obj)
    kind = type(obj)
    if kind is dict:
        return {key: map_tensors(value, on_tensor, on_leaf) for key, value in obj.items()}
    if kind is collections.OrderedDict:
        rebuilt = collections.OrderedDict((key, map_tensors(value, on_tensor, on_leaf)) for key, value in obj.items())
        metadata = getattr(obj, "_metadata", None)
        if metadata is not None:
            rebuilt._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
        return rebuilt
    if kind is list:
        return [map_tensors(value, on_tensor, on_leaf) for value in obj]
    if kind is tuple:
        return tuple(map_tensors(value, on_tensor, on_leaf) for value in obj)
    return on_leaf(obj)


def unsupported_reason(tensor: torch.Tensor) -> str | None:
    """Why this format cannot hold ``tensor`` exactly, or None when it can."""
    if type(tensor) not in (torch.Tensor, nn.Parameter):
        return f"a tensor subclass ({type(tensor).__name__})"
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
        return f"a {tensor.layout} tensor"
    if tensor.dtype not in _NAMES:
        return f"a {tensor.dtype} tensor"
    if tensor.is_conj() or tensor.is_neg() or any(name is not None for name in getattr(tensor, "names", None) or ()):
        return "a tensor with a conjugate/negative bit or named dimensions"
    return None


def is_tensor_file_name(name: str) -> bool:
    return _FILE_NAME.fullmatch(name) is not None


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def storage_key(tensor: torch.Tensor) -> int:
    """The identity of a tensor's storage (torch.save's own): views share it."""
    return tensor.untyped_storage()._cdata


def bytes_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of ``storage``'s bytes (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass
class Split:
    """A state taken apart for writing: ``index`` goes to ``state.pt`` (via torch.save),
    ``sources[i]`` are the bytes of storage ``i`` (uint8 tensors, on any device)."""

    index: dict[str, Any]
    sources: list[torch.Tensor | None]


def _file_count(total: int) -> int:
    return max(1, min(MAX_FILES, _cores(), -(-total // FILE_BYTES)))


def split_state(state: Any, files: int | None = None) -> Split:
    """Plan the tensor files of ``state`` (``files`` of them; by default one per
    ``FILE_BYTES``, at most one per core and ``MAX_FILES``): no bytes are copied.
    Raises Unsupported."""
    storages: list[dict[str, Any]] = []
    sources: list[torch.Tensor | None] = []
    ids: dict[int, int] = {}
    entries: list[dict[str, Any]] = []

    def place(tensor: torch.Tensor) -> torch.Tensor:
        reason = unsupported_reason(tensor)
        if reason is not None:
            raise Unsupported(reason)
        meta = tensor.device.type == "meta"
        key = storage_key(tensor)
        if key not in ids:
            storage = tensor.untyped_storage()
            nbytes = 0 if meta else storage.nbytes()
            ids[key] = len(storages)
            storages.append({"file": 0, "offset": 0, "nbytes": nbytes, "device": "meta" if meta else "cpu"})
            sources.append(None if meta or not nbytes else bytes_view(storage))
        entries.append({
            "storage": ids[key], "dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape), "stride": list(tensor.stride()),
            "offset": tensor.storage_offset(), "requires_grad": tensor.requires_grad,
            "parameter": isinstance(tensor, nn.Parameter),
        })
        return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")

    skeleton = map_tensors(state, place)
    # Storages in order, cut into files of about equal size.
    total = sum(storage["nbytes"] for storage in storages)
    count = files or _file_count(total)
    ends = [0] * count
    done = 0
    for storage in storages:
        if not storage["nbytes"]:
            continue
        file = min(count - 1, done * count // total)
        storage["file"], storage["offset"] = file, -(-ends[file] // ALIGN) * ALIGN
        ends[file] = storage["offset"] + storage["nbytes"]
        done += storage["nbytes"]
    names = [TENSORS_FILE] if count == 1 else [f"tensors-{i}.bin" for i in range(count)]
    index = {MARKER: 1, "byteorder": sys.byteorder, "files": [{"name": name, "bytes": end} for name, end in zip(names, ends)],
             "storages": storages, "tensors": entries, "state": skeleton}
    return Split(index, sources)


def _memory(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU uint8 tensor, without a copy (the caller keeps
    ``tensor`` alive while the view is in use)."""
    if not tensor.numel():
        return memoryview(b"")
    return memoryview((ctypes.c_char * tensor.numel()).from_address(tensor.data_ptr())).cast("B")


def _write_all(handle: Any, data: memoryview) -> None:
    while data:
        written = handle.write(data)
        data = data[written:]


def write_tensors(directory: Path, split: Split) -> dict[str, dict[str, Any]]:
    """Write the tensor files into ``directory``, each on a thread of its own, fsynced;
    returns their manifest entries."""
    files = split.index["files"]
    plans: list[list[tuple[int, torch.Tensor]]] = [[] for _ in files]
    for entry, source in zip(split.index["storages"], split.sources):
        if source is not None:
            plans[entry["file"]].append((entry["offset"], source))
    jobs = [(directory / file["name"], plan, file["bytes"]) for file, plan in zip(files, plans)]
    if len(jobs) == 1:
        entries = [_write_file(*jobs[0])]
    else:
        with ThreadPoolExecutor(len(jobs), thread_name_prefix="checkpoint-write") as pool:
            entries = list(pool.map(lambda job: _write_file(*job), jobs))
    return {file["name"]: entry for file, entry in zip(files, entries)}


def _write_file(path: Path, plan: list[tuple[int, torch.Tensor]], planned: int) -> dict[str, Any]:
    """Write one tensor file and fsync it; returns its manifest entry. SHA-256 runs on a
    second thread, chunk by chunk in file order, while the next chunk is written."""
    digest = hashlib.sha256()
    size = 0
    # (hash call, the tensor its bytes live in): a chunk's memory stays alive until hashed.
    pending: deque[tuple[Future, torch.Tensor | bytes]] = deque()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-sha256") as hasher, open(path, "wb", buffering=0) as handle:
        def emit(data: memoryview, owner: torch.Tensor | bytes) -> None:
            nonlocal size
            pending.append((hasher.submit(digest.update, data), owner))
            _write_all(handle, data)
            size += len(data)
            while len(pending) > 4 or (pending and pending[0][0].done()):
                pending.popleft()[0].result()

        try:
            for offset, source in plan:
                if offset > size:
                    padding = bytes(offset - size)
                    emit(memoryview(padding), padding)
                for start in range(0, source.numel(), CHUNK):
                    piece = source[start:start + CHUNK]
                    if piece.device.type != "cpu":
                        piece = piece.cpu()
                    emit(_memory(piece), piece)
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            while pending:  # never leave the hasher reading memory that is about to go
                future, _ = pending.popleft()
                future.exception()
    if size != planned:
        raise RuntimeError(f"wrote {size} bytes into {path.name}, planned {planned}")
    return {"bytes": size, "sha256": digest.hexdigest()}


def is_index(obj: Any) -> bool:
    return isinstance(obj, dict) and MARKER in obj


def _int(value: Any, what: str, minimum: int = 0) -> int:
    if type(value) is not int or value < minimum:
        raise TensorFileError(f"{what} is {value!r}, not an integer >= {minimum}")
    return value


def _checked_files(directory: Path, index: dict[str, Any]) -> list[tuple[Path, int]]:
    """The tensor files the index names, each of the one name pattern (so never outside
    ``directory``), there, and of the size the index says."""
    files = index.get("files")
    if type(files) is not list or len(files) > 1000:
        raise TensorFileError("its index has no list of tensor files")
    checked = []
    for i, entry in enumerate(files):
        name = entry.get("name") if type(entry) is dict else None
        if not isinstance(name, str) or not is_tensor_file_name(name) or any(name == seen.name for seen, _ in checked):
            raise TensorFileError(f"tensor file {i} of its index is named {name!r}, not tensors.bin or tensors-<n>.bin")
        path = directory / name
        size = _int(entry.get("bytes"), f"the size of {name}")
        try:
            actual = path.stat().st_size
        except OSError as error:
            raise TensorFileError(f"{path} cannot be read ({error.strerror or error})") from None
        if actual != size:
            raise TensorFileError(f"{path} has {actual} bytes, its index says {size}")
        checked.append((path, size))
    return checked


def _checked_storages(index: dict[str, Any], files: list[tuple[Path, int]]) -> list[tuple[int, int, int, str]]:
    storages = index.get("storages")
    if type(storages) is not list:
        raise TensorFileError("its index has no list of storages")
    checked = []
    for i, entry in enumerate(storages):
        if type(entry) is not dict:
            raise TensorFileError(f"storage {i} of its index is not a table")
        file = _int(entry.get("file"), f"storage {i}'s file")
        offset, nbytes = _int(entry.get("offset"), f"storage {i}'s offset"), _int(entry.get("nbytes"), f"storage {i}'s size")
        device = entry.get("device")
        if device not in ("cpu", "meta") or (device == "meta" and nbytes):
            raise TensorFileError(f"storage {i} has device {device!r}")
        if nbytes and file >= len(files):
            raise TensorFileError(f"storage {i} is in tensor file {file}; the index names {len(files)}")
        if nbytes and (offset % ALIGN or offset + nbytes > files[file][1]):
            raise TensorFileError(f"storage {i} ({nbytes} bytes at {offset}) lies outside {files[file][0].name} "
                                  f"({files[file][1]} bytes) or off its {ALIGN}-byte grid")
        checked.append((file, offset, nbytes, device))
    spans = sorted((file, offset, offset + nbytes) for file, offset, nbytes, _ in checked if nbytes)
    for (file, _, end), (next_file, start, _) in zip(spans, spans[1:]):
        if file == next_file and start < end:
            raise TensorFileError("two storages of its index overlap")
    return checked


def _checked_tensor(i: int, entry: Any, storages: list[tuple[int, int, int, str]]) -> tuple[int, torch.dtype, list[int], list[int], int, bool, bool]:
    if type(entry) is not dict:
        raise TensorFileError(f"tensor {i} of its index is not a table")
    storage = _int(entry.get("storage"), f"tensor {i}'s storage")
    if storage >= len(storages):
        raise TensorFileError(f"tensor {i} names storage {storage}; the index has {len(storages)}")
    dtype = DTYPES.get(entry.get("dtype")) if isinstance(entry.get("dtype"), str) else None
    if dtype is None:
        raise TensorFileError(f"tensor {i} has dtype {entry.get('dtype')!r}, not one of {sorted(DTYPES)}")
    shape, stride = entry.get("shape"), entry.get("stride")
    if type(shape) is not list or type(stride) is not list or len(shape) != len(stride) or len(shape) > _MAX_DIMS:
        raise TensorFileError(f"tensor {i} has shape {shape!r} and stride {stride!r}")
    shape = [_int(v, f"tensor {i}'s shape") for v in shape]
    stride = [_int(v, f"tensor {i}'s stride") for v in stride]
    offset = _int(entry.get("offset"), f"tensor {i}'s storage offset")
    flags = entry.get("requires_grad"), entry.get("parameter")
    if any(type(flag) is not bool for flag in flags):
        raise TensorFileError(f"tensor {i} has requires_grad/parameter flags {flags!r}")
    if flags[0] and not (dtype.is_floating_point or dtype.is_complex):
        raise TensorFileError(f"tensor {i} is a {dtype} tensor that requires grad")
    _, _, nbytes, device = storages[storage]
    numel = 1
    for size in shape:
        numel *= size
    if device != "meta":
        last = offset + sum((size - 1) * step for size, step in zip(shape, stride)) if numel else offset - 1
        if (last + 1) * dtype.itemsize > nbytes:
            raise TensorFileError(f"tensor {i} (shape {shape}, stride {stride}, offset {offset}, {dtype}) reaches past "
                                  f"the {nbytes} bytes of its storage")
    return storage, dtype, shape, stride, offset, flags[0], flags[1]


def join_state(directory: Path, index: dict[str, Any]) -> Any:
    """The state ``split_state`` took apart, its tensors memory-mapped (copy-on-write)
    from the tensor files in ``directory``. Raises TensorFileError for anything out of
    place."""
    if index.get(MARKER) != 1:
        raise TensorFileError(f"its index is of version {index.get(MARKER)!r}; this version reads 1")
    if index.get("byteorder") != sys.byteorder:
        raise TensorFileError(f"it was written in {index.get('byteorder')!r} byte order; this machine is {sys.byteorder}")
    files = _checked_files(directory, index)
    storages = _checked_storages(index, files)
    entries = index.get("tensors")
    if type(entries) is not list:
        raise TensorFileError("its index has no list of tensors")
    checked = [_checked_tensor(i, entry, storages) for i, entry in enumerate(entries)]

    mapped: list[mmap.mmap | None] = []
    for path, size in files:
        if not size:
            mapped.append(None)
            continue
        with open(path, "rb") as handle:
            mapped.append(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY))
    memory: list[torch.UntypedStorage] = []
    for file, offset, nbytes, _ in storages:
        if nbytes:
            memory.append(torch.frombuffer(mapped[file], dtype=torch.uint8, count=nbytes, offset=offset).untyped_storage())
        else:
            memory.append(torch.UntypedStorage(0))

    tensors = []
    for storage, dtype, shape, stride, offset, requires_grad, parameter in checked:
        if storages[storage][3] == "meta":
            tensor = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        else:
            tensor = torch.empty(0, dtype=dtype).set_(memory[storage], offset, shape, stride)
        if parameter:
            tensor = nn.Parameter(tensor, requires_grad=requires_grad)
        elif requires_grad:
            tensor.requires_grad_(True)
        tensors.append(tensor)

    position = iter(range(len(tensors)))

    def fill(placeholder: torch.Tensor) -> torch.Tensor:
        i = next(position, None)
        if i is None:
            raise TensorFileError(f"its state holds more tensors than the {len(tensors)} of its index")
        tensor = tensors[i]
        if placeholder.device.type != "meta" or placeholder.dtype != tensor.dtype or placeholder.shape != tensor.shape:
            raise TensorFileError(f"tensor {i} of its state ({placeholder.dtype}, {tuple(placeholder.shape)}, "
                                  f"{placeholder.device}) does not match its index entry")
        return tensor

    try:
        state = map_tensors(index.get("state"), fill)
    except RecursionError:
        raise TensorFileError("its state is nested too deeply") from None
    if next(position, None) is not None:
        raise TensorFileError(f"its index lists {len(tensors)} tensors, more than its state holds")
    return state
