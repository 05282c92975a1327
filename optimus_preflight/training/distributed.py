"""torchrun support: where this process sits, the process group, DDP wrapping, reductions.

A single process is rank 0 of 1, and every helper here is then a no-op, so the rest of
the code calls them unconditionally. Under torchrun every wait for the other ranks is
bounded by ``trainer.dist_timeout_s`` and ends with a message naming the ranks that did
not answer (see optimus_preflight.training.peers).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from optimus_preflight.training.peers import Peers, PeersUnresponsive, is_collective_timeout

# The toolkit's own waits and its watchdog report a silent rank at trainer.dist_timeout_s;
# the process group's timeout (torch's error, which names no rank) is only a backstop.
BACKSTOP_S = 30.0

_peers: Peers | None = None


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_environment(cls) -> DistEnv:
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        )


def init_process_group(env: DistEnv, timeout_s: float) -> None:
    """gloo on CPU, nccl on GPUs; torchrun's environment supplies the rendezvous.
    ``timeout_s``: trainer.dist_timeout_s, how long a rank waits for its peers."""
    global _peers
    if not env.is_distributed or torch_dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    torch_dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s + BACKSTOP_S))
    _peers = Peers(torch_dist.distributed_c10d._get_default_store(), env.rank, env.world_size, timeout_s)
    _peers.start_heartbeat()


def peers() -> Peers | None:
    """The other ranks as seen through the rendezvous store; None outside torchrun."""
    global _peers
    if _peers is None and is_active():
        # A process group the toolkit did not create: torch's own timeout bounds it.
        _peers = Peers(
            torch_dist.distributed_c10d._get_default_store(),
            torch_dist.get_rank(),
            torch_dist.get_world_size(),
            torch_dist.default_pg_timeout.total_seconds(),
        )
        _peers.start_heartbeat()
    return _peers


def leave_together(bound_s: float) -> None:
    """Under torchrun the first rank to exit makes torchrun SIGTERM the others, which can
    kill a rank still finishing a clean stop (writing its summary). Two rounds: every
    rank waits for the others to finish their work (within ``bound_s``; still
    interruptible), ignores stop signals from then on, and then waits until every rank
    ignores them, so no rank exits while another could still be killed. Ignored, not
    blocked: a blocked signal is still delivered to any other thread (gloo's, the
    heartbeat's), and with no handler left that ends the process."""
    group = peers()
    if group is None:
        return
    bound = lambda: (bound_s, "checkpoint.stop_timeout_s")  # noqa: E731
    try:
        group.gather(0, during="the end of the run", bound=bound)
        ignore_stop_signals()
        group.gather(0, during="the end of the run", bound=bound)
    except PeersUnresponsive:
        return  # a peer is gone: nothing to wait for


def ignore_stop_signals() -> None:
    """From here on SIGTERM, SIGINT and SIGUSR1 change nothing, on every thread."""
    for name in ("SIGTERM", "SIGINT", "SIGUSR1"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def destroy_process_group() -> None:
    global _peers
    if _peers is not None:
        _peers.stop()
        _peers = None
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def _unresponsive(during: str, ranks: list[int] | None = None) -> PeersUnresponsive:
    """torch's timeout of a collective, as one message naming the silent ranks."""
    group = peers()
    limit = group.timeout_s + BACKSTOP_S if group else 0.0
    silent = ranks if ranks is not None else (group.silent_ranks() if group else [])
    return PeersUnresponsive(silent, waited_s=limit, limit_s=limit, key="trainer.dist_timeout_s", during=during)


def is_active() -> bool:
    return torch_dist.is_available() and torch_dist.is_initialized() and torch_dist.get_world_size() > 1


def broadcast_object(value, src: int = 0):
    """Rank ``src``'s value on every rank (e.g. the run dir every rank must share)."""
    if not is_active():
        return value
    holder = [value]
    try:
        torch_dist.broadcast_object_list(holder, src=src)
    except RuntimeError as error:
        if not is_collective_timeout(error):
            raise
        raise _unresponsive(f"a broadcast from rank {src}", None if torch_dist.get_rank() == src else [src]) from None
    return holder[0]


def union_of_names(names: list[str]) -> list[str]:
    """The sorted union of every rank's names: ranks that logged different metrics (or
    evaluated no batch) still reduce the same tensors in the same order."""
    if not is_active():
        return sorted(names)
    gathered: list[Any] = [None] * torch_dist.get_world_size()
    try:
        torch_dist.all_gather_object(gathered, sorted(names))
    except RuntimeError as error:
        if not is_collective_timeout(error):
            raise
        raise _unresponsive("gathering the metric names") from None
    return sorted({name for rank_names in gathered for name in rank_names})


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch_dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(value: torch.Tensor | int | float) -> torch.Tensor:
    """Sum over ranks; returns a tensor on the device the backend reduces on."""
    tensor = torch.as_tensor(value, dtype=torch.float64 if not isinstance(value, torch.Tensor) else None)
    if not is_active():
        return tensor
    device = _collective_device()
    reduced = tensor.detach().to(device, copy=True)
    try:
        torch_dist.all_reduce(reduced, op=torch_dist.ReduceOp.SUM)
    except RuntimeError as error:
        if not is_collective_timeout(error):
            raise
        raise _unresponsive("an all-reduce") from None
    return reduced


# Wrappers whose ``.module`` (or a compiled module's ``._orig_mod``) is the user's model.
# Matched by class name: torch.compile's class lives in torch._dynamo, a second of import.
_WRAPPERS = {"DistributedDataParallel": "module", "DataParallel": "module", "FullyShardedDataParallel": "module",
             "OptimizedModule": "_orig_mod"}


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP, DataParallel, FSDP and torch.compile wrappers: the
    one whose parameter names and state_dict keys are the model's own. Only those
    wrappers are opened, so a model with a submodule named ``module`` stays whole."""
    while (attribute := _WRAPPERS.get(type(model).__name__)) and isinstance(getattr(model, attribute, None), nn.Module):
        model = getattr(model, attribute)
    return model


def wrap_model(model: nn.Module, device: torch.device, find_unused_parameters: bool = False) -> nn.Module:
    """DDP under torchrun; the plain module otherwise."""
    if not is_active():
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=find_unused_parameters)
