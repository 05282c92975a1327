"""The tensors of every checkpoint, written and read with ``torch.distributed.checkpoint``.

A state (nested dicts, lists, tuples) is taken apart: its dense tensors go to DCP's files
(``__0_0.distcp`` and the ``.metadata`` index; one process, no process group), the rest
goes to ``state.pt`` as an index::

    {MARKER: 1, "keys": [<per meta tensor of "state", in walk order: its DCP key, or None
                          for a meta tensor of the state itself>],
     "state": <the state, each tensor DCP holds replaced by a meta tensor of its shape>}

Keys are the tensor's path in the state joined with dots (``model.0.weight``,
``optimizer.state.3.exp_avg``), so ``model.*`` reads the same in this layout and in an
FSDP run's (sharded.py), which ``optimus-export`` relies on.

Why loading is safe: DCP itself unpickles ``.metadata`` with plain ``pickle`` and reads
non-tensor entries with ``torch.load(weights_only=False)``; here the index is unpickled
with an allow-list of DCP's own metadata classes (``SafeReader``), every file it names
must be a plain name inside the checkpoint, and non-tensor entries are read with
``weights_only=True`` (``SafeLoadPlanner``). Tensor bytes are read by DCP with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import io
import os
import pathlib
import pickle
import warnings
from typing import Any, Callable, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.serialization import get_crc32_options, set_crc32_options

MARKER = "optimus_preflight.dcp"
METADATA_FILE = ".metadata"

# One process writing or reading alone is what no_dist asks for; DCP still warns, also
# from the thread dcp.async_save writes on (a catch_warnings block would not reach it).
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized", category=UserWarning)


class DcpFormatError(ValueError):
    """The DCP files and the index in ``state.pt`` do not form a checkpoint; the message says how."""


def map_tensors(obj: Any, on_tensor: Callable[[torch.Tensor], Any], on_leaf: Callable[[Any], Any] = lambda leaf: leaf,
                path: tuple[str, ...] = (), with_path: bool = False) -> Any:
    """``obj`` rebuilt with each tensor replaced by ``on_tensor(tensor)`` (or
    ``on_tensor(tensor, path)`` when ``with_path``) and each other leaf by ``on_leaf``.
    Walks dicts, OrderedDicts (keeping a state_dict's ``_metadata``), lists and tuples
    of exactly those types, in order; dict keys and anything else are leaves."""
    if isinstance(obj, torch.Tensor):
        return on_tensor(obj, path) if with_path else on_tensor(obj)
    kind = type(obj)
    walk = lambda value, key: map_tensors(value, on_tensor, on_leaf, (*path, str(key)), with_path)  # noqa: E731
    if kind is dict:
        return {key: walk(value, key) for key, value in obj.items()}
    if kind is collections.OrderedDict:
        rebuilt = collections.OrderedDict((key, walk(value, key)) for key, value in obj.items())
        metadata = getattr(obj, "_metadata", None)
        if metadata is not None:
            rebuilt._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
        return rebuilt
    if kind is list:
        return [walk(value, index) for index, value in enumerate(obj)]
    if kind is tuple:
        return tuple(walk(value, index) for index, value in enumerate(obj))
    return on_leaf(obj)


def in_dcp(tensor: torch.Tensor) -> bool:
    """Whether DCP holds this tensor exactly; others (sparse, quantized, subclasses,
    meta) stay in ``state.pt``, which torch.save writes as they are."""
    return (type(tensor) in (torch.Tensor, nn.Parameter) and tensor.layout == torch.strided and not tensor.is_quantized
            and not tensor.is_nested and tensor.device.type != "meta" and not tensor.is_conj() and not tensor.is_neg())


def split_state(state: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(the index for ``state.pt``, the tensors for DCP by key). No bytes are copied."""
    tensors: dict[str, torch.Tensor] = {}
    keys: list[str | None] = []

    def place(tensor: torch.Tensor, path: tuple[str, ...]) -> torch.Tensor:
        if tensor.device.type == "meta":
            keys.append(None)
            return tensor
        if not in_dcp(tensor):
            return tensor
        key = ".".join(path) or "tensor"
        if key in tensors:  # a dict key with a dot in it can meet a nested path
            key = f"{key}#{len(keys)}"
        tensors[key] = tensor.detach()
        keys.append(key)
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")

    skeleton = map_tensors(state, place, with_path=True)
    return {MARKER: 1, "keys": keys, "state": skeleton}, tensors


def is_index(obj: Any) -> bool:
    return isinstance(obj, dict) and MARKER in obj


@contextlib.contextmanager
def without_zip_crc32() -> Iterator[None]:
    """DCP writes each tensor as a torch.save record; the manifest's SHA-256 already covers
    every byte, and the per-record CRC32 costs about a fifth of the write
    (benchmarks/checkpoint_io.py). A process-wide torch setting, put back after."""
    previous = get_crc32_options()
    set_crc32_options(False)
    try:
        yield
    finally:
        set_crc32_options(previous)


@contextlib.contextmanager
def plain_errors() -> Iterator[None]:
    """DCP reports any rank's failure as a CheckpointException, a BaseException that
    ``except Exception`` and ``except OSError`` pass by: re-raise the first rank's own
    error (a full disk stays an OSError, which the store turns into one message)."""
    try:
        yield
    except CheckpointException as wrapped:
        failures = list(wrapped.failures.values())
        cause = failures[0][0] if failures and isinstance(failures[0], tuple) else None
        if isinstance(cause, Exception):
            raise cause from None
        raise RuntimeError(str(wrapped).strip().splitlines()[-1]) from None


def writer(directory: os.PathLike | str) -> dcp.FileSystemWriter:
    return dcp.FileSystemWriter(str(directory), sync_files=True)


def save_tensors(directory: os.PathLike | str, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` with ``dcp.save`` in this process alone (no collective, also
    under torchrun, where only rank 0 writes an unsharded checkpoint); files fsynced."""
    try:
        with without_zip_crc32(), plain_errors():
            dcp.save(tensors, storage_writer=writer(directory), no_dist=True)
    except RuntimeError as error:
        # DCP writes its records with torch.save, whose zip writer reports a short write
        # on a full disk as "unexpected pos ..." (a RuntimeError): ask the disk itself.
        cause = storage_refusal(directory)
        if cause is not None:
            raise cause from error
        raise


PROBE_BYTES = 64 * 1024


def storage_refusal(directory: os.PathLike | str) -> OSError | None:
    """The OSError the disk gives for a small fsynced write in ``directory`` (full, read-only,
    over quota), or None when it takes one."""
    probe = os.path.join(os.fspath(directory), f".space-probe-{os.getpid()}")
    try:
        with open(probe, "wb") as handle:
            handle.write(b"\0" * PROBE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return error
    finally:
        with contextlib.suppress(OSError):
            os.remove(probe)
    return None


# --------------------------------------------------------------------- reading
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "ChunkStorageMetadata", "MetadataIndex", "StorageMeta",
                                              "TensorProperties", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` holds only its own dataclasses, sizes, dtypes and paths."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        raise DcpFormatError(f"its {METADATA_FILE} names {module}.{name}, which a DCP index never holds")


class SafeReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose index is unpickled through an allow-list and may name
    only files inside the checkpoint directory."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = pathlib.Path(self.path) / METADATA_FILE
        try:
            with open(path, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
        except DcpFormatError:
            raise
        except Exception as error:  # truncated, not a pickle, a class of the wrong shape
            raise DcpFormatError(f"{path} is not a DCP index ({type(error).__name__}: {str(error)[:200]})") from None
        if not isinstance(metadata, Metadata):
            raise DcpFormatError(f"{path} is not a DCP index (it holds a {type(metadata).__name__})")
        for info in (metadata.storage_data or {}).values():
            name = str(getattr(info, "relative_path", ""))
            if not name or pathlib.PurePath(name).name != name:
                raise DcpFormatError(f"{path} names a file outside its directory: {name!r}")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        if metadata.planner_data is None:
            metadata.planner_data = {}
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor entries (an FSDP optimizer's param_groups) read as plain data only."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        self.state_dict[read_item.dest_index.fqn] = torch.load(value, weights_only=True)


def load_into(state: dict[str, Any], directory: os.PathLike | str, *, no_dist: bool = True) -> None:
    """``dcp.load`` into ``state`` in place, through ``SafeReader`` and ``SafeLoadPlanner``.
    ``no_dist=False``: collective (every rank of an FSDP run reads its slices)."""
    with plain_errors():
        dcp.load(state, storage_reader=SafeReader(str(directory)), planner=SafeLoadPlanner(), no_dist=no_dist)


def read_tensors(directory: os.PathLike | str, keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a DCP checkpoint (all, or those of ``keys``) as plain CPU tensors,
    in one process; their shapes and dtypes come from the index."""
    if keys is not None and not keys:
        return {}
    metadata = SafeReader(str(directory)).read_metadata()
    entries = metadata.state_dict_metadata
    wanted = list(entries) if keys is None else keys
    state: dict[str, torch.Tensor] = {}
    for key in wanted:
        entry = entries.get(key)
        if not isinstance(entry, TensorStorageMetadata):
            raise DcpFormatError(f"its {METADATA_FILE} has no tensor {key!r}")
        state[key] = torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
    if state:
        load_into(state, directory)
    return state


def join_state(directory: os.PathLike | str, index: dict[str, Any]) -> Any:
    """The state ``split_state`` took apart, its tensors read back from DCP's files."""
    if index.get(MARKER) != 1:
        raise DcpFormatError(f"its index is of version {index.get(MARKER)!r}; this version reads 1")
    keys = index.get("keys")
    if type(keys) is not list or not all(key is None or isinstance(key, str) for key in keys):
        raise DcpFormatError("its index has no list of tensor keys")
    tensors = read_tensors(directory, [key for key in keys if key is not None])
    position = iter(keys)

    def fill(placeholder: torch.Tensor) -> torch.Tensor:
        if placeholder.device.type != "meta":
            return placeholder  # a tensor DCP does not hold (sparse...), saved in state.pt
        key = next(position, False)
        if key is False:
            raise DcpFormatError(f"its state holds more tensors than the {len(keys)} of its index")
        if key is None:
            return placeholder  # a meta tensor of the state itself
        tensor = tensors[key]
        if placeholder.dtype != tensor.dtype or placeholder.shape != tensor.shape:
            raise DcpFormatError(f"tensor {key!r} of its state ({placeholder.dtype}, {tuple(placeholder.shape)}) does "
                                 f"not match DCP's ({tensor.dtype}, {tuple(tensor.shape)})")
        return tensor

    try:
        state = map_tensors(index.get("state"), fill)
    except RecursionError:
        raise DcpFormatError("its state is nested too deeply") from None
    if next(position, False) is not False:
        raise DcpFormatError(f"its index lists {len(keys)} tensors, more than its state holds")
    return state
