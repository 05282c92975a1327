"""Run several training loops in one process in lockstep, to compare their step times
on a shared machine.

Each loop runs on its own thread (or one on the main thread) and calls
``lockstep.handoff(name)`` from an ``optimizer.step()`` pre-hook: it records the time
since it last got the turn, passes the turn to the next loop in the ring and waits for
its own. Only one loop works at a time, so a stall of the machine (another process
taking the cores) costs whichever loop holds the turn for a step or so, and over a run
every loop meets the same conditions; comparing whole runs one after another on a busy
2-core machine gave ratios that swung by 2x between rounds.

A loop's segments: the first runs from ``begin`` to its first step (setup), each next
one is one step period (from one ``optimizer.step()`` call to the next: all the
per-step work, whatever the loop does between steps), the last runs from its last step
to ``finish`` (end-of-run work).

Checked on Lightning against itself (two copies of the same run, each on a worker
thread, paired step ratio as ``paired_ratio`` computes it): 0.966, 0.982 and 0.996 over
three rounds on the shared 2-core machine, so a round's ratio is good to about +-3%.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable


class Lockstep:
    def __init__(self, names: list[str] | tuple[str, ...], first: str):
        self.names = list(names)
        self.turn = {name: threading.Semaphore(0) for name in self.names}
        self.turn[first].release()
        self.done = dict.fromkeys(self.names, False)
        self.segments: dict[str, list[float]] = {name: [] for name in self.names}
        self.resumed: dict[str, float] = {}

    def _next(self, name: str) -> str | None:
        index = self.names.index(name)
        for offset in range(1, len(self.names)):
            candidate = self.names[(index + offset) % len(self.names)]
            if not self.done[candidate]:
                return candidate
        return None

    def begin(self, name: str) -> None:
        self.turn[name].acquire()
        self.resumed[name] = time.perf_counter()

    def handoff(self, name: str) -> None:
        """From a loop's optimizer-step pre-hook (only the loop holding the turn runs)."""
        self.segments[name].append(time.perf_counter() - self.resumed[name])
        following = self._next(name)
        if following is not None:
            self.turn[following].release()
            self.turn[name].acquire()
        self.resumed[name] = time.perf_counter()

    def finish(self, name: str) -> None:
        if name in self.resumed:
            self.segments[name].append(time.perf_counter() - self.resumed[name])
        self.done[name] = True
        following = self._next(name)
        if following is not None:
            self.turn[following].release()

    def paired_ratio(self, name: str, other: str, steps: int, skip: int) -> float:
        """The median, over steps k after ``skip``, of ``name``'s k-th step period over
        ``other``'s: the two periods ran back to back, so each pair met about the same
        machine conditions, and a stall that hit one of them only moves one pair."""
        ours, theirs = self.segments[name][1 + skip : steps], self.segments[other][1 + skip : steps]
        return statistics.median(a / b for a, b in zip(ours, theirs))

    def figures(self, name: str, steps: int, skip: int) -> dict[str, float]:
        """``step_s``: the median step period after the first ``skip`` steps; ``run_s``:
        the loop's whole time, its waits for the others left out; ``start_s`` (to the
        first step), ``steps_s`` (first step to last) and ``end_s`` (after the last step)."""
        segments = self.segments[name]
        if len(segments) != steps + 1:
            raise RuntimeError(f"{name}: expected {steps} optimizer steps, saw {len(segments) - 1}")
        return {"step_s": statistics.median(segments[1 + skip : steps]), "run_s": sum(segments),
                "start_s": segments[0], "steps_s": sum(segments[1:steps]), "end_s": segments[-1]}


def run_threads(lockstep: Lockstep, bodies: dict[str, Callable[[], Any]], main: str | None = None) -> dict[str, Any]:
    """Run ``bodies[name]()`` for every name under ``lockstep`` (``begin``/``finish``
    around each), on threads, except ``main`` which runs on the calling thread (one that
    installs signal handlers must). Returns each body's result; re-raises the first error."""
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def body(name: str) -> None:
        lockstep.begin(name)
        try:
            results[name] = bodies[name]()
        except BaseException as error:  # re-raised on the calling thread
            errors.append(error)
        finally:
            lockstep.finish(name)

    threads = [threading.Thread(target=body, args=(name,), name=name) for name in bodies if name != main]
    for thread in threads:
        thread.start()
    try:
        if main is not None:
            body(main)
    finally:
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return results
