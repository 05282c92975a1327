"""Checkpoint cost: save/load throughput vs a plain sequential write/read of the same
bytes in the same directory, the training-blocked time of an async save vs a synchronous
one, and the time from SIGTERM to process exit.

    python benchmarks/checkpoint_io.py [--params 50_000_000] [--rounds 3] [--no-sigterm] [--dir DIR]

``--dir``: where to write (default: a temporary directory under benchmarks/, on the
repository's disk); e.g. ``--dir /dev/shm`` takes the disk out and shows the CPU cost.

The state is a real one: an MLP of ``--params`` fp32 parameters after one AdamW step
(weights + two moments: ~12 bytes per parameter, ~600 MB by default), taken by the same
``RunCheckpointer.save`` a training run calls.

Each round, back to back in the same directory (so ratios compare like with like):
  plain write   one fsync'd write of a bytes object of the checkpoint's size, to a new file
  save          a synchronous save: tensors.bin + state.pt (tensor_file.py), SHA-256,
                fsync, manifest, rename, pointer, retention (keep_last=1; the older
                checkpoint it drops is deleted on a thread, kept out of the timings);
                the training thread waits for all of it
  torch.save    the format before it (format_version 2: one torch.save'd state.pt
                through the hashing writer, fsynced), for comparison
  async save    checkpoint.async_save=true: the training-blocked part (host copy) and
                the background write, which the round waits for before going on
  load          manifest verification (SHA-256 re-read) + load, vs a plain read
A first async save before the rounds allocates the host copy; it is reported apart.

The last lines are the figures as ``name=value`` pairs (median, then ``_min``/``_max``
over the rounds), for benchmarks/run_all.py:
  async_blocked_ratio=...        async save's training-blocked time / sync save time (goal <= 0.1)
  save_vs_plain_write_ratio=...  save throughput / plain write throughput (goal >= 0.5)
  checkpoint_save_throughput_ratio=<median>  the same, alone on the last line
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.checkpoint.checkpoint_state import Restorable, build_state
from optimus_preflight.checkpoint.checkpointer import RunCheckpointer
from optimus_preflight.checkpoint.store import _save_hashed, read_manifest
from optimus_preflight.training import rng
from optimus_preflight.training.distributed import DistEnv
from optimus_preflight.training.run_state import RunState
from optimus_preflight.training.stream import BatchStream

REPO = Path(__file__).resolve().parents[1]
WIDTH = 1000


def training_parts(params: int) -> Restorable:
    """An MLP of ~``params`` parameters after one AdamW step: weights, both moments."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(max(1, params // (WIDTH * WIDTH + WIDTH)))))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, WIDTH)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    return Restorable(model, optimizer, None, torch.amp.GradScaler("cpu", enabled=False), RunState(), BatchStream(loader, 1))


def checkpointer(run_dir: Path, parts: Restorable, *, async_save: bool) -> RunCheckpointer:
    made = RunCheckpointer(run_dir, every_n_steps=1, keep_last=1, extra_signal=None, dist=DistEnv(), config={},
                           stop_timeout_s=60.0, async_save=async_save)
    made.start(parts)
    return made


def timed_save(made: RunCheckpointer, step: int) -> tuple[Path, float]:
    made.parts.run_state.step = step
    made.mark_boundary()
    made.due(step)
    started = time.perf_counter()
    path = made.save()
    return path, time.perf_counter() - started


def plain_write(path: Path, payload: bytes) -> float:
    started = time.perf_counter()
    with open(path, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    return time.perf_counter() - started


def plain_read(path: Path) -> float:
    started = time.perf_counter()
    with open(path, "rb") as handle:
        while handle.read(1 << 22):
            pass
    return time.perf_counter() - started


def measure_io(params: int, rounds: int, directory: Path) -> dict[str, list[float]]:
    parts = training_parts(params)
    sync = checkpointer(directory / "sync", parts, async_save=False)
    background = checkpointer(directory / "async", parts, async_save=True)
    results: dict[str, list[float]] = {key: [] for key in ("bytes", "plain_write_s", "save_s", "legacy_s", "async_blocked_s",
                                                            "async_write_s", "load_s", "plain_read_s", "first_async_blocked_s")}
    try:
        _, blocked = timed_save(background, 1)  # allocates the host copy
        background.finish_background()
        results["first_async_blocked_s"].append(blocked)
        payload = b""
        for step in range(2, rounds + 2):
            path, save_s = timed_save(sync, step)
            sync.store.wait_for_deletions()  # retention's deletion runs on a thread: keep it out of the next timing
            size = sum(entry["bytes"] for entry in read_manifest(path)["files"].values())
            if len(payload) != size // 1024 * 1024:
                payload = os.urandom(1024) * (size // 1024)
            results["bytes"].append(size)
            results["save_s"].append(save_s)
            results["plain_write_s"].append(plain_write(directory / "plain.bin", payload))
            legacy = build_state(parts, rng_state=rng.capture(), config={})
            started = time.perf_counter()
            _save_hashed(legacy, directory / "legacy.pt")
            results["legacy_s"].append(time.perf_counter() - started)
            (directory / "legacy.pt").unlink()
            del legacy
            _, blocked = timed_save(background, step)
            results["async_blocked_s"].append(blocked)
            job = background.background.in_flight
            background.finish_background()
            background.store.wait_for_deletions()
            results["async_write_s"].append(job.write_s)
            started = time.perf_counter()
            sync.store.load(path)
            results["load_s"].append(time.perf_counter() - started)
            results["plain_read_s"].append(plain_read(directory / "plain.bin"))
            (directory / "plain.bin").unlink()  # the next plain write starts a new file, as a save does
    finally:
        sync.close()
        background.close()
    return results


def sigterm_to_exit(rounds: int, directory: Path) -> list[float]:
    """Start the default recipe, wait until it trains, SIGTERM it, time until it exits."""
    times = []
    for index in range(rounds):
        run_dir = directory / f"run{index}"
        command = [sys.executable, "-m", "optimus_preflight.cli", f"hydra.run.dir={run_dir}", "logging.progress=none", "logging.every_n_steps=1", "preflight.enabled=false"]
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
            time.sleep(0.05)
        time.sleep(1.0)
        started = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
        times.append(time.perf_counter() - started)
        assert code == 143, f"expected exit 143 after SIGTERM, got {code}"
    return times


def spread(values: list[float]) -> str:
    return f"{min(values):10.3f} {statistics.median(values):10.3f} {max(values):10.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=50_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-sigterm", action="store_true", help="skip the SIGTERM-to-exit runs of the default recipe")
    parser.add_argument("--dir", type=Path, default=REPO / "benchmarks", help="where to write (default: benchmarks/)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        io = measure_io(args.params, args.rounds, directory)
        exits = [] if args.no_sigterm else sigterm_to_exit(args.rounds, directory)
    mb = [size / 1e6 for size in io["bytes"]]
    per_round = lambda key: [size / seconds for size, seconds in zip(mb, io[key])]  # noqa: E731
    save_ratio = [plain / save for plain, save in zip(io["plain_write_s"], io["save_s"])]
    legacy_ratio = [plain / legacy for plain, legacy in zip(io["plain_write_s"], io["legacy_s"])]
    blocked_ratio = [blocked / save for blocked, save in zip(io["async_blocked_s"], io["save_s"])]
    load_ratio = [load / read for load, read in zip(io["load_s"], io["plain_read_s"])]
    print(f"checkpoint of {statistics.median(mb):.1f} MB (an MLP's weights + AdamW moments), {args.rounds} rounds, in {args.dir}")
    print(f"{'':46s} {'min':>10s} {'median':>10s} {'max':>10s}")
    rows = [
        ("plain write throughput (MB/s)", per_round("plain_write_s")),
        ("save throughput (MB/s)", per_round("save_s")),
        ("torch.save format (v2) throughput (MB/s)", per_round("legacy_s")),
        ("save throughput / plain write (goal >= 0.5)", save_ratio),
        ("torch.save (v2) throughput / plain write", legacy_ratio),
        ("sync save: training blocked (s)", io["save_s"]),
        ("async save: training blocked (s)", io["async_blocked_s"]),
        ("async save: background write (s)", io["async_write_s"]),
        ("async blocked / sync blocked (goal <= 0.1)", blocked_ratio),
        ("load throughput (MB/s)", per_round("load_s")),
        ("plain read throughput (MB/s)", per_round("plain_read_s")),
        ("load time / plain read time", load_ratio),
    ]
    if exits:
        rows.append(("SIGTERM to exit, default recipe (s)", exits))
    for name, values in rows:
        print(f"{name:46s} {spread(values)}")
    print(f"{'first async save, allocating its host copy':46s} {io['first_async_blocked_s'][0]:10.3f} s blocked")
    print(f"per round: save/plain {[round(r, 2) for r in save_ratio]}, async/sync blocked {[round(r, 3) for r in blocked_ratio]}")
    for name, values in (("async_blocked_ratio", blocked_ratio), ("save_vs_plain_write_ratio", save_ratio)):
        print(f"{name}={statistics.median(values):.3f} {name}_min={min(values):.3f} {name}_max={max(values):.3f}")
    print(f"checkpoint_save_throughput_ratio={statistics.median(save_ratio):.3f}")  # the one-figure headline


if __name__ == "__main__":
    main()
