"""Checkpoint write paths side by side: a plain write, ``torch.save``, the custom tensor
format of format_version 3 (while the code for it exists), ``torch.distributed.checkpoint``
(``dcp.save`` and ``dcp.async_save``, one process, no process group) and the toolkit's own
save (``CheckpointStore.save``: DCP + SHA-256 manifest + fsync + rename + retention).

    python benchmarks/checkpoint_io.py [--sizes-mb 10,200] [--rounds 3] [--dir DIR]

The state: an MLP's fp32 weights after one AdamW step with both moments (~12 bytes per
parameter), sized to each ``--sizes-mb``. Each round writes every format back to back in
the same directory, so each ratio compares like with like on a noisy machine; the figures
are medians over the rounds, with min and max. Every write ends with its files fsynced.

Issue 27's rule: DCP replaces the custom format unless ``dcp.save`` runs below 0.5 of a
plain write's throughput. The last lines are ``name=value`` pairs for benchmarks/run_all.py
(at the largest size): ``save_vs_plain_write_ratio`` (the toolkit's save / plain write,
goal >= 0.5), ``async_blocked_ratio`` (async save's training-blocked time / sync save time,
goal <= 0.1), ``checkpoint_save_throughput_ratio`` (the first, alone).

Measured on the 2-core development VM shared with other jobs (torch 2.13 CPU, ext4),
2026-11-26, 7 rounds, median MB/s (ratio to the plain write); the plain write itself
ranged 350-2250 MB/s between rounds, so only same-round ratios mean much:

  before the change (custom format still present)   9.5 MB          198.6 MB
    plain write                                      1310 (1.00)     1747 (1.00)
    torch.save                                        897 (0.68)     1290 (0.66)
    custom tensor format (v3, no hashing)             474 (0.39)      781 (0.47)
    dcp.save                                          514 (0.40)      606 (0.43)
    dcp.save, zip CRC32 off                           584 (0.43)      853 (0.46)
  after (DCP everywhere; a busier machine)
    dcp.save, zip CRC32 off                           263 (0.29)      439 (0.96)
    CheckpointStore.save (DCP + SHA-256 + rename)      95 (0.11)      248 (0.58)
    async blocked / sync save: HostStager             0.036           0.127
                               DCP's DefaultStager    1.132           3.760

DCP was below 0.5 of the plain write, and so was the custom format; of the two, DCP with
the zip CRC32 off was the faster at both sizes, so it is the one kept (issue 27).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp

from optimus_preflight.checkpoint.files import fsync_dir
from optimus_preflight.checkpoint.store import CheckpointStore

REPO = Path(__file__).resolve().parents[1]
WIDTH = 512


def adam_state(megabytes: float) -> dict[str, Any]:
    """A model + AdamW state of about ``megabytes`` MB (weights and both moments)."""
    torch.manual_seed(0)
    layers = max(1, round(megabytes * 1e6 / 12 / (WIDTH * WIDTH + WIDTH)))
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, WIDTH)).square().mean().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}


def tensor_bytes(state: Any) -> int:
    total = 0

    def walk(obj: Any) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            total += obj.nbytes
        elif isinstance(obj, dict):
            for value in obj.values():
                walk(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                walk(value)

    walk(state)
    return total


def plain_write(target: Path, payload: bytes) -> None:
    target.mkdir()
    with open(target / "plain.bin", "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def torch_save(target: Path, state: Any) -> None:
    target.mkdir()
    with open(target / "state.pt", "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())


def custom_format() -> Callable[[Path, Any], None] | None:
    """format_version 3's writer (tensors.bin + state.pt), if this checkout still has it."""
    try:
        from optimus_preflight.checkpoint.tensor_file import split_state, write_tensors  # type: ignore[attr-defined]
    except ImportError:
        return None

    def write(target: Path, state: Any) -> None:
        target.mkdir()
        split = split_state(state)
        write_tensors(target, split)
        torch_save_index = target / "state.pt"
        with open(torch_save_index, "wb") as handle:
            torch.save(split.index, handle)
            handle.flush()
            os.fsync(handle.fileno())

    return write


def dcp_save(target: Path, state: Any) -> None:
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(target), sync_files=True), no_dist=True)
    fsync_dir(target)


def dcp_save_without_crc32(target: Path, state: Any) -> None:
    """DCP writes each tensor as a torch.save record; a SHA-256 manifest makes the zip
    CRC32 redundant, and torch lets it be turned off (process-wide)."""
    from torch.serialization import get_crc32_options, set_crc32_options

    previous = get_crc32_options()
    set_crc32_options(False)
    try:
        dcp_save(target, state)
    finally:
        set_crc32_options(previous)


class AsyncDcp:
    """``dcp.async_save`` with one stager kept across saves (its host buffers are reused,
    as a training run reuses them): DCP's DefaultStager, or the toolkit's HostStager."""

    def __init__(self, own: bool) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        from optimus_preflight.checkpoint.async_writer import HostStager

        self.stager = HostStager() if own else DefaultStager(StagingOptions(False, False, False, False))
        self.blocked_s: list[float] = []

    def __call__(self, target: Path, state: Any) -> None:
        started = time.perf_counter()
        future = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(str(target), sync_files=True),
                                async_stager=self.stager, no_dist=True)
        self.blocked_s.append(time.perf_counter() - started)
        future.result()
        fsync_dir(target)


def flat(state: Any) -> dict[str, torch.Tensor]:
    """The tensors of ``state`` by key, as the toolkit hands them to DCP (dcp_io.split_state)."""
    from optimus_preflight.checkpoint.dcp_io import split_state

    return split_state(state)[1]


def store_save(directory: Path) -> Callable[[Path, Any], None]:
    store = CheckpointStore(directory / "store", keep_last=1, run_id="bench")
    steps = iter(range(1, 1 << 30))

    def write(target: Path, state: Any) -> None:
        store.save(state, next(steps))
        store.wait_for_deletions()  # retention's deletion runs on a thread: keep it out of the next timing

    return write


def measure(megabytes: float, rounds: int, directory: Path) -> dict[str, list[float]]:
    state = adam_state(megabytes)
    size = tensor_bytes(state)
    payload = os.urandom(1 << 20) * max(1, size >> 20)
    default_stager, host_stager = AsyncDcp(own=False), AsyncDcp(own=True)
    flat_state = flat(state)
    writers: dict[str, Callable[[Path, Any], None]] = {"plain write": lambda target, _: plain_write(target, payload),
                                                        "torch.save": torch_save}
    custom = custom_format()
    if custom is not None:
        writers["custom tensor format (v3)"] = custom
    writers.update({"dcp.save": dcp_save, "dcp.save, zip CRC32 off": dcp_save_without_crc32,
                    "dcp.async_save, DefaultStager": lambda target, _: default_stager(target, flat_state),
                    "dcp.async_save, HostStager": lambda target, _: host_stager(target, flat_state),
                    "CheckpointStore.save (DCP+manifest)": store_save(directory)})
    times: dict[str, list[float]] = {name: [] for name in writers}
    for stager in (default_stager, host_stager):  # the first staging allocates the host buffers: not a round
        stager(directory / "warm", flat_state)
        shutil.rmtree(directory / "warm")
        stager.blocked_s.clear()
    for index in range(rounds):
        for name, write in writers.items():
            target = directory / f"round{index}-{len(times[name])}-{name.split()[0]}-{len(name)}"
            started = time.perf_counter()
            write(target, state)
            times[name].append(time.perf_counter() - started)
            shutil.rmtree(target, ignore_errors=True)
    times["async blocked, DefaultStager"] = default_stager.blocked_s
    times["async blocked, HostStager"] = host_stager.blocked_s
    times["bytes"] = [float(size)] * rounds
    default_stager.stager.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="10,200", help="checkpoint sizes (MB of params + AdamW state), comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=REPO / "benchmarks", help="where to write (default: benchmarks/)")
    args = parser.parse_args()
    sizes = [float(size) for size in args.sizes_mb.split(",")]
    last: dict[str, list[float]] = {}
    for megabytes in sizes:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            times = measure(megabytes, args.rounds, Path(tmp))
        size_mb = times.pop("bytes")[0] / 1e6
        blocked = {name: times.pop(f"async blocked, {name}") for name in ("DefaultStager", "HostStager")}
        plain = times["plain write"]
        print(f"\n{size_mb:.1f} MB of tensors, {args.rounds} rounds, in {args.dir}")
        print(f"{'':38s} {'MB/s min':>9s} {'median':>9s} {'max':>9s}   {'/ plain (median, per round)':s}")
        for name, seconds in times.items():
            speeds = [size_mb / value for value in seconds]
            ratios = [p / value for p, value in zip(plain, seconds)]
            print(f"{name:38s} {min(speeds):9.0f} {statistics.median(speeds):9.0f} {max(speeds):9.0f}   "
                  f"{statistics.median(ratios):.2f} {[round(r, 2) for r in ratios]}")
        sync = times["CheckpointStore.save (DCP+manifest)"]
        for name, values in blocked.items():
            print(f"{'async blocked (s), ' + name:38s} {min(values):9.3f} {statistics.median(values):9.3f} "
                  f"{max(values):9.3f}   / CheckpointStore.save {statistics.median([b / s for b, s in zip(values, sync)]):.3f}")
        last = {"plain": plain, "sync": sync, "blocked": blocked["HostStager"], "dcp": times["dcp.save, zip CRC32 off"]}
    save_ratio = [p / s for p, s in zip(last["plain"], last["sync"])]
    dcp_ratio = [p / s for p, s in zip(last["plain"], last["dcp"])]
    blocked_ratio = [b / s for b, s in zip(last["blocked"], last["sync"])]
    for name, values in (("dcp_vs_plain_write_ratio", dcp_ratio), ("async_blocked_ratio", blocked_ratio),
                         ("save_vs_plain_write_ratio", save_ratio)):
        print(f"{name}={statistics.median(values):.3f} {name}_min={min(values):.3f} {name}_max={max(values):.3f}")
    print(f"checkpoint_save_throughput_ratio={statistics.median(save_ratio):.3f}")  # the one-figure headline


if __name__ == "__main__":
    main()
