"""The model and optimizer of an FSDP2 run, saved and loaded with torch.distributed.checkpoint.

Every rank writes its own shard in parallel (``__<rank>_0.distcp``) and rank 0 writes
the ``.metadata`` index: no rank gathers the whole model. The shards sit in the step
directory beside ``state.pt`` (everything else, as in any checkpoint) and are covered by
the same manifest. DCP reshards on load, so a checkpoint of N ranks loads into M ranks,
or into one unsharded process. Reading goes through dcp_io's allow-listed index reader
and a planner that reads the optimizer's param_groups with ``weights_only=True``: no
pickled code runs (DCP's own reader would unpickle both freely).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.optim import Optimizer

from optimus_preflight.checkpoint.dcp_io import METADATA_FILE, SafeReader, load_into, plain_errors


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / METADATA_FILE).is_file()


def sharded_state(model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter name; under FSDP2 their tensors are
    this rank's shards (DTensors)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def save_sharded(model: nn.Module, optimizer: Optimizer, directory: Path) -> None:
    """Collective: every rank calls it with the same ``directory``."""
    with plain_errors():  # the caller's ``except Exception`` sees any rank's failure
        dcp.save(sharded_state(model, optimizer), checkpoint_id=str(directory))


def saved_tensor_shapes(path: Path, prefix: str = "model.") -> dict[str, tuple[int, ...]]:
    """Names and global shapes of the tensors under ``prefix`` in a DCP checkpoint, read
    from its metadata index alone."""
    metadata = SafeReader(str(path)).read_metadata()
    shapes: dict[str, tuple[int, ...]] = {}
    for key, entry in metadata.state_dict_metadata.items():
        if key.startswith(prefix) and hasattr(entry, "size"):
            shapes[key[len(prefix):]] = tuple(entry.size)
    return shapes


def load_sharded(model: nn.Module, optimizer: Optimizer | None, path: Path) -> None:
    """Load a DCP checkpoint into the live (sharded or plain) model and optimizer:
    every rank reads the slices its shards need. Collective under torchrun."""
    model_state, optimizer_state = get_state_dict(model, optimizer) if optimizer is not None else (
        get_state_dict(model, [])[0], None)
    state: dict[str, Any] = {"model": model_state}
    if optimizer_state is not None:
        state["optimizer"] = optimizer_state
    # Collective under torchrun; one unsharded process reads alone (a resume at world size 1).
    load_into(state, path, no_dist=not torch.distributed.is_initialized())
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(model, state["model"])
        return
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_full_into_sharded(model: nn.Module, optimizer: Optimizer, model_state: dict[str, torch.Tensor],
                           optimizer_state: dict[str, Any]) -> None:
    """A single-file checkpoint (one process or DDP) into an FSDP2 model: each rank keeps
    its slice of the full tensors. torch's optimizer state is keyed by position; DCP's
    helpers expect parameter names, so positions are mapped through the param groups."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    names = {id(param): name for name, param in model.named_parameters()}
    ordered = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    by_name = {
        "state": {ordered[index]: value for index, value in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [ordered[index] for index in group["params"]]} for group in optimizer_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=options)


def full_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The whole model of a checkpoint's DCP files (an FSDP run's shards, or any other
    run's: both key the model ``model.<name>``) as plain CPU tensors, in one process
    without a process group (for export and inspection)."""
    from optimus_preflight.checkpoint.dcp_io import read_tensors

    keys = list(saved_tensor_shapes(path, prefix="model."))
    return {key: tensor for key, tensor in zip(keys, read_tensors(path, [f"model.{key}" for key in keys]).values())}
