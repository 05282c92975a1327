"""A fake process group of N ranks for the FSDP2 trace, without touching a real one.

FSDP2 needs a default process group of the world size it shards over. The trace uses
torch's fake backend (``FakeStore`` + ``backend="fake"``: collectives that move no data)
as the default group of the process it runs in:

- when this process has no process group (a laptop, ``preflight.only=true``, the API), in
  this process: the fake group is created for the trace and destroyed after it
  (milliseconds);
- when it has one (the preflight under torchrun, a notebook after ``init_process_group``),
  in a forked child: the child hides the inherited real group (never using or destroying
  it) and creates its fake one, so the parent's group, its rank and its peers are not
  disturbed. Fork, not spawn: the callables (a recipe's bound ``build_model``) need not be
  picklable and nothing is imported again; only the result comes back. Cost: the fork
  (tens of milliseconds) plus the trace.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")

# Inherited real process groups a forked child must keep referenced (destroying one
# would act on threads and sockets that belong to the parent).
_INHERITED: list[Any] = []
CHILD_TIMEOUT_S = 600.0


class IsolationError(RuntimeError):
    """The trace could not run beside the process's real process group."""


def has_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """The default process group is a fake one of ``world_size`` ranks (this one rank 0)
    inside the block. The process must have no process group of its own."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers backend "fake"

    if has_process_group():
        raise IsolationError("a process group is already initialized here; use run_isolated")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_isolated(function: Callable[[], T], *, timeout_s: float = CHILD_TIMEOUT_S) -> tuple[T, str]:
    """``(function(), where)``: called here when no process group exists, else in a forked
    child whose inherited group is hidden. ``where`` says which ("in-process"/"forked child")."""
    if not has_process_group():
        return function(), "in-process"
    if "fork" not in multiprocessing.get_all_start_methods():
        raise IsolationError(
            "a process group is initialized in this process and this platform cannot fork: "
            "the fake-process-group trace would replace it"
        )
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(function, send), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            raise IsolationError(f"the forked trace gave no answer in {timeout_s:.0f} s")
        status, payload = receive.recv()
    except EOFError as error:
        raise IsolationError(f"the forked trace died (exit code {child.exitcode})") from error
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if status == "error":
        raise IsolationError(f"the forked trace failed: {payload}")
    return payload, "forked child"


def _child_main(function: Callable[[], Any], send: Any) -> None:
    try:
        torch.set_num_threads(1)  # the parent's OpenMP pool does not survive a fork
        _hide_inherited_group()
        send.send(("ok", function()))
    except BaseException as error:  # noqa: B036 - everything must reach the parent
        lines = traceback.format_exception_only(type(error), error)
        send.send(("error", "".join(lines).strip()))
    finally:
        send.close()
        os._exit(0)  # skip the inherited groups' destructors and atexit handlers


def _hide_inherited_group() -> None:
    from torch.distributed import distributed_c10d as c10d

    _INHERITED.append(c10d._world.default_pg)
    c10d._world.default_pg = None
