"""Checkpoint cost: save/load throughput vs a plain sequential write/read of the same
bytes in the same directory, and the time from SIGTERM to process exit.

    python benchmarks/checkpoint_io.py [--params 50_000_000] [--rounds 3]

Save = torch.save through the hashing writer + fsync + manifest + rename + pointer.
Load = manifest verification (SHA-256 re-read) + torch.load(weights_only=True).
Each round measures the plain write and the checkpoint back to back, so the ratio is
taken under the same disk conditions. Last line: ``checkpoint_save_ratio=<median>``.
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

from optimus_preflight.checkpoint.store import STATE_FILE, CheckpointStore

REPO = Path(__file__).resolve().parents[1]


def training_like_state(params: int) -> dict:
    """Weights plus AdamW's two moments: what a checkpoint of an fp32 model holds."""
    chunk = 1_000_000
    weights = {f"layer{i}.weight": torch.randn(chunk) for i in range(params // chunk)}
    moments = {i: {"step": torch.tensor(10.0), "exp_avg": torch.randn(chunk), "exp_avg_sq": torch.rand(chunk)} for i in range(len(weights))}
    return {"model": weights, "optimizer": {"state": moments, "param_groups": [{"lr": 1e-3, "params": list(range(len(weights)))}]}}


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
    state = training_like_state(params)
    store = CheckpointStore(directory / "checkpoints", keep_last=1)
    results: dict[str, list[float]] = {"save_s": [], "plain_write_s": [], "load_s": [], "plain_read_s": [], "bytes": []}
    for step in range(1, rounds + 1):
        started = time.perf_counter()
        path = store.save(state, step)
        results["save_s"].append(time.perf_counter() - started)
        size = (path / STATE_FILE).stat().st_size
        results["bytes"].append(size)
        payload = os.urandom(1024) * (size // 1024)
        results["plain_write_s"].append(plain_write(directory / "plain.bin", payload))
        started = time.perf_counter()
        store.load(path)
        results["load_s"].append(time.perf_counter() - started)
        results["plain_read_s"].append(plain_read(directory / "plain.bin"))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=50_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
        directory = Path(tmp)
        io = measure_io(args.params, args.rounds, directory)
        exits = sigterm_to_exit(args.rounds, directory)
    size_mb = statistics.median(io["bytes"]) / 1e6
    rows = [
        ("checkpoint size (MB)", size_mb),
        ("save throughput (MB/s)", size_mb / statistics.median(io["save_s"])),
        ("plain write throughput (MB/s)", size_mb / statistics.median(io["plain_write_s"])),
        ("load throughput (MB/s)", size_mb / statistics.median(io["load_s"])),
        ("plain read throughput (MB/s)", size_mb / statistics.median(io["plain_read_s"])),
        ("SIGTERM to exit, default recipe (s)", statistics.median(exits)),
    ]
    save_ratio = statistics.median(s / p for s, p in zip(io["save_s"], io["plain_write_s"]))
    load_ratio = statistics.median(s / p for s, p in zip(io["load_s"], io["plain_read_s"]))
    for name, value in rows:
        print(f"{name:40s} {value:10.2f}")
    print(f"{'save time / plain write time':40s} {save_ratio:10.2f}   (per round: {[round(s / p, 2) for s, p in zip(io['save_s'], io['plain_write_s'])]})")
    print(f"{'load time / plain read time':40s} {load_ratio:10.2f}")
    print(f"{'SIGTERM to exit per round (s)':40s} {[round(t, 2) for t in exits]}")
    print(f"checkpoint_save_ratio={save_ratio:.3f}")


if __name__ == "__main__":
    main()
