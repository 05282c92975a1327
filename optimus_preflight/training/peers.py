"""Torchrun ranks that stop answering: bounded agreements, a heartbeat, and a watchdog.

A collective that a peer never joins waits for the process group's timeout, and torch's
timeout error names no rank. A stopped (SIGSTOP), hung or unreachable rank must instead
end the others within a bound, with its rank named. So:

- the agreements the toolkit makes at step boundaries (the stop flag, the barrier after a
  save) go through the rendezvous store torch.distributed already has: one key per rank,
  polled, so the wait is bounded, the ranks that never posted are known by name, no flag
  moves to a GPU, and nothing is left pending in the process group (a pending gloo op
  would hold up its teardown for the whole timeout);
- every rank beats a counter in the store from a daemon thread, so a rank can tell which
  peers went silent even while its own main thread is stuck in a collective it does not
  own (DDP's gradient all-reduce);
- ``StuckWatchdog`` reports a main thread that has not moved for the bound while a peer's
  heartbeat is stale: it waits for a peer that will not come.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Sequence

from optimus_preflight.errors import UserError

HEARTBEAT_PERIOD_S = 1.0
# Several missed beats: a loaded host may delay one, a stopped process misses them all.
STALE_AFTER_S = 5.0

Bound = Callable[[], tuple[float, str]]  # -> (seconds, the config key that sets them)


def ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))


class PeersUnresponsive(UserError):
    """Ranks that did not answer within a bound. An environment failure the user acts on
    (a stopped, hung or unreachable process), so one message and exit 2 (docs/ARCHITECTURE.md)."""

    def __init__(self, ranks: Sequence[int], *, waited_s: float, limit_s: float, key: str, during: str, outcome: str = ""):
        self.ranks = sorted(ranks)
        self.waited_s, self.limit_s, self.during, self.outcome = waited_s, limit_s, during, outcome
        who = ranks_text(self.ranks) if self.ranks else "a peer rank"
        super().__init__(
            f"{who} did not answer {during} for {waited_s:.0f} s ({key}={limit_s:g}): stopped, hung, or its host is unreachable",
            key=key,
            fix=f"Check that process and its host (if it is only slow, raise {key}). {outcome}".strip(),
        )

    def with_outcome(self, outcome: str) -> PeersUnresponsive:
        return PeersUnresponsive(self.ranks, waited_s=self.waited_s, limit_s=self.limit_s, key=self.key or "", during=self.during, outcome=outcome)


def is_collective_timeout(error: BaseException) -> bool:
    """gloo reports a peer that never joined as a RuntimeError 'Timed out waiting ...'."""
    return isinstance(error, RuntimeError) and "timed out" in str(error).lower()


class Peers:
    """This rank's view of the others through the rendezvous store (a torch Store)."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout_s: float):
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        # torchrun restarts reuse the store: keys of a previous attempt must not answer.
        self.prefix = f"optimus/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._round = 0  # every rank gathers in the same order, so rounds match
        self._beats: dict[int, tuple[int, float]] = {}  # rank -> (counter, when it last moved)
        self._stopped = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # ---------------------------------------------------------------- agreement
    def gather(self, value: int, *, during: str, bound: Bound) -> list[int]:
        """Every rank's ``value``, or PeersUnresponsive naming the ranks that did not post
        theirs within ``bound()`` (re-read while waiting: a stop may shorten it)."""
        this_round, self._round = self._round, self._round + 1
        keys = [f"{self.prefix}/round{this_round}/{rank}" for rank in range(self.world_size)]
        self.store.set(keys[self.rank], str(int(value)))
        started = time.monotonic()
        pause = 0.0005
        while not self.store.check(keys):
            limit, key = bound()
            waited = time.monotonic() - started
            if waited >= limit:
                missing = [rank for rank, k in enumerate(keys) if not self.store.check([k])]
                if missing:
                    raise PeersUnresponsive(missing, waited_s=waited, limit_s=limit, key=key, during=during)
                continue
            # Ranks in lockstep arrive within milliseconds: poll fast first, then back off.
            time.sleep(min(pause, limit - waited))
            pause = min(pause * 2, 0.05)
        values = [int(v) for v in self.store.multi_get(keys)]
        if this_round:
            # Everyone posted this round, so everyone has read the previous one.
            self.store.delete_key(f"{self.prefix}/round{this_round - 1}/{self.rank}")
        return values

    # ---------------------------------------------------------------- announcements
    def announce(self, topic: str, value: str) -> None:
        """Post ``value`` under ``topic`` for this rank (e.g. that its data stalled)."""
        self.store.set(f"{self.prefix}/{topic}/{self.rank}", value)

    def announcements(self, topic: str, ranks: Sequence[int] | None = None) -> dict[int, str]:
        """What the other ranks (or ``ranks``) posted under ``topic`` so far."""
        found = {}
        for rank in range(self.world_size) if ranks is None else ranks:
            key = f"{self.prefix}/{topic}/{rank}"
            if rank != self.rank and self.store.check([key]):
                found[rank] = self.store.get(key).decode()
        return found

    def wait_for(self, topic: str, ranks: Sequence[int], timeout_s: float) -> dict[int, str]:
        """The posts of ``ranks`` under ``topic``, waiting up to ``timeout_s`` for them all."""
        deadline = time.monotonic() + timeout_s
        wanted = [rank for rank in ranks if rank != self.rank]
        while len(found := self.announcements(topic, wanted)) < len(wanted) and time.monotonic() < deadline:
            time.sleep(0.05)
        return found

    # ---------------------------------------------------------------- heartbeat
    def _beat_key(self, rank: int) -> str:
        return f"{self.prefix}/heartbeat/{rank}"

    def start_heartbeat(self, period_s: float = HEARTBEAT_PERIOD_S) -> None:
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._beat, args=(period_s,), name="optimus-heartbeat", daemon=True)
            self._heartbeat.start()

    def stop(self) -> None:
        self._stopped.set()

    def _beat(self, period_s: float) -> None:
        key = self._beat_key(self.rank)
        while True:
            try:
                self.store.add(key, 1)
            except Exception:  # the store is gone: torchrun is tearing the job down
                pass
            if self._stopped.wait(period_s):
                return

    def stale_ranks(self, older_than_s: float = STALE_AFTER_S) -> list[int]:
        """Peers whose heartbeat has not moved for ``older_than_s``, as observed across
        calls to this method: call it repeatedly (one store read per peer per call)."""
        now = time.monotonic()
        stale = []
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            count = self.store.add(self._beat_key(rank), 0)  # reads; creates a missing key at 0
            seen = self._beats.get(rank)
            if seen is None or seen[0] != count:
                self._beats[rank] = (count, now)
            elif now - seen[1] >= older_than_s:
                stale.append(rank)
        return stale

    def silent_ranks(self, window_s: float = STALE_AFTER_S) -> list[int]:
        """A blocking probe: the peers whose heartbeat does not move within ``window_s``."""
        try:
            self.stale_ranks(window_s)
            time.sleep(window_s + HEARTBEAT_PERIOD_S / 2)
            return self.stale_ranks(window_s)
        except Exception:  # the store itself is gone: nothing more to learn
            return []


def main_thread_position() -> tuple[int, Any, int] | None:
    """Where the main thread is: unchanged across samples while it sits in one C call."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return None if frame is None else (id(frame), frame.f_code, frame.f_lasti)


def main_thread_cpu_s() -> float:
    """CPU seconds the main thread has used: a long compute call uses them, a thread
    parked in a collective waiting for a peer does not."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(threading.main_thread().ident))
    except (AttributeError, OSError):  # no per-thread CPU clock here: position alone decides
        return 0.0


def main_thread_in(path_part: str) -> bool:
    """Whether any frame of the main thread's stack runs code from a matching file."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if path_part in frame.f_code.co_filename.replace(os.sep, "/"):
            return True
        frame = frame.f_back
    return False


# A rank whose data watchdog stopped it posts its stall here: its peers wait for it in a
# collective it will never join, while its heartbeat goes on.
STALLED = "stalled"


class StuckWatchdog:
    """Calls ``on_stuck(stale_ranks, stuck_s)`` (once, from its own thread) when the main
    thread has been parked for ``bound()`` seconds while some peer's heartbeat is stale;
    or ``on_peer_stalled({rank: headline})`` when it is parked while a peer announced
    that its data stalled (``STALLED``), without waiting for the bound: that peer will
    never join the collective.

    Parked: at the same spot and using no CPU, as in a collective waiting for a peer. A
    main thread that computes (even inside one long C call) is never reported, nor one
    in ``Peers.gather``, which bounds its own wait.
    """

    def __init__(self, peers: Peers, bound: Callable[[], float], on_stuck: Callable[[list[int], float], object], *, period_s: float = HEARTBEAT_PERIOD_S, stale_after_s: float = STALE_AFTER_S,
                 on_peer_stalled: Callable[[dict[int, str]], object] | None = None):
        self.peers = peers
        self.on_peer_stalled = on_peer_stalled
        self.bound = bound
        self.on_stuck = on_stuck
        self.period_s = period_s
        self.stale_after_s = stale_after_s
        self._stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="optimus-stuck-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        position, cpu, since = main_thread_position(), main_thread_cpu_s(), time.monotonic()
        last = since
        while not self._stopped.wait(self.period_s):
            now, current, current_cpu = time.monotonic(), main_thread_position(), main_thread_cpu_s()
            # Even a starved compute thread gets more than this; a parked one gets ~0.
            computing = current_cpu - cpu > (now - last) / 10
            last, cpu = now, current_cpu
            if current != position or computing or main_thread_in("/optimus_preflight/peers.py"):
                position, since = current, now
                continue
            stuck_s, bound = now - since, self.bound()
            # Peers' heartbeats are read only once this rank has been stuck a while, so a
            # healthy run costs the store nothing.
            if stuck_s < min(bound, self.stale_after_s):
                continue
            try:
                stalled = self.peers.announcements(STALLED) if self.on_peer_stalled is not None else {}
                stale = [] if stalled else self.peers.stale_ranks(self.stale_after_s)
            except Exception:  # the store is gone: torchrun is ending the job anyway
                continue
            if stalled and main_thread_position() == position:
                self.on_peer_stalled(stalled)
                return
            if stale and stuck_s >= bound and main_thread_position() == position:
                self.on_stuck(stale, stuck_s)
                return
