"""Checkpoints of earlier versions of this project, read into the state a save takes.

The one converter path: ``CheckpointStore.load`` hands whatever ``state.pt`` held to
``convert``, which returns the full state (model and optimizer as their ``state_dict()``)
that ``apply_state`` loads, as it loads any checkpoint's. Nothing of these formats is
written any more.

- format_version 2 and earlier: the whole state in ``state.pt`` (``torch.save``), loaded
  as it is with ``weights_only=True``.
- format_version 3: ``state.pt`` is the index of raw tensor files ``tensors.bin`` or
  ``tensors-<n>.bin`` (each storage's bytes in native byte order at a multiple of 64
  bytes), of the form::

    {MARKER: 1, "byteorder": "little", "files": [{"name": "tensors.bin", "bytes": int}, ...],
     "storages": [{"file": int, "offset": int, "nbytes": int, "device": "cpu" | "meta"}, ...],
     "tensors":  [{"storage": int, "dtype": "bfloat16", "shape": [..], "stride": [..],
                   "offset": int, "requires_grad": bool, "parameter": bool}, ...],
     "state": <the state, each tensor replaced by a meta-device tensor of its shape>}

  The index is checked in full before any tensor is built (file names of one fixed
  pattern, dtypes from a fixed table, every storage inside its file and apart from the
  others, every view inside its storage, placeholders matching entries one for one);
  tensor bytes are memory-mapped copy-on-write and only ever read as numbers.
"""

from __future__ import annotations

import mmap
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from optimus_preflight.checkpoint.dcp_io import map_tensors

MARKER = "optimus_preflight.tensor_file"
_FILE_NAME = re.compile(r"tensors(-[0-9]{1,3})?\.bin")
ALIGN = 64
_MAX_DIMS = 64
_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64", "int32",
                "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
                "float8_e4m3fnuz", "float8_e5m2fnuz")
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)}


class TensorFileError(ValueError):
    """``state.pt``/``tensors.bin`` do not form a valid checkpoint; the message says how."""


def is_tensor_file_name(name: str) -> bool:
    return _FILE_NAME.fullmatch(name) is not None


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


def convert(directory: Path, loaded: Any) -> Any:
    """What ``state.pt`` of an earlier format held (``loaded``) as the full state:
    a format 3 index joined with its tensor files, a format 2 state as it is."""
    return join_state(directory, loaded) if is_index(loaded) else loaded
