"""Under torchrun: the ranks agree at each step boundary whether to stop, wait for each
other after a checkpoint, and a watchdog ends a run stuck in a collective that a silent
peer will never join (after rank 0 saved what it can), with the silent ranks named.

A rank whose data stalls (the data watchdog) is not silent, its heartbeat goes on, but
its peers wait for it in the step's collective (DDP's gradient all-reduce) for good. It
announces the stall; each peer's watchdog sees the announcement while parked, rank 0
saves the last step (its replica is the whole model) and every rank exits 2 naming the
stalled rank and the frame its data code blocks in."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from optimus_preflight.checkpoint.forced_exit import say
from optimus_preflight.checkpoint.stop_control import StopControl
from optimus_preflight.config.invocation import speaker
from optimus_preflight.errors import EXIT_USER_ERROR
from optimus_preflight.training.peers import STALLED, Bound, Peers, PeersUnresponsive, StuckWatchdog

# Rank 0's checkpoint after a stall ("path:<p>" or "none:<why>"), and each peer's word that
# it read it. The peers, stuck in a collective, end first: the stalled rank is in none, so
# their exit breaks nothing, while its exit would wake them with a broken connection.
STALL_SAVED, STALL_SEEN = "stall_saved", "stall_seen"

# Rank 0's checkpoint of the last completed step, or why there is none; the argument
# says whether the caller is the main thread.
SaveLastStep = Callable[[bool], "Path | str"]


class PeerWatch:
    def __init__(self, peers: Peers, stop: StopControl, *, stop_timeout_s: float, save_last_step: SaveLastStep,
                 last_checkpoint: Callable[[], Path | None], fetch_timeout_key: str = "data.fetch_timeout_s"):
        self.peers = peers
        self.fetch_timeout_key = fetch_timeout_key
        self.stop = stop
        # How long a rank with a stop request waits for its peers.
        self.stop_timeout_s = stop_timeout_s
        self.save_last_step = save_last_step
        self.last_checkpoint = last_checkpoint
        self._watchdog: StuckWatchdog | None = None

    def start(self) -> None:
        self._watchdog = StuckWatchdog(self.peers, lambda: self.bound(stop_shortens=True)()[0], self._abandon,
                                       on_peer_stalled=self._peer_stalled)
        self._watchdog.start()

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()

    def stop_agreed(self) -> bool:
        """At a step boundary: did any rank receive a stop signal? A rank that does not
        answer ends the run with its rank named, after rank 0 saved this step."""
        try:
            flags = self.peers.gather(self.stop.received or 0, during="the stop agreement at a step boundary",
                                      bound=self.bound(stop_shortens=True))
        except PeersUnresponsive as error:
            raise error.with_outcome(self.outcome(self.save_last_step(True))) from None
        signum = max(flags)
        if signum:
            self.stop.signals.request(signum)
        return bool(signum)

    def after_save(self, path: Path | None, *, is_main: bool) -> None:
        """The others wait for rank 0's write, however long it takes (up to the
        process-group bound); only rank 0's own wait is cut short by a stop."""
        try:
            self.peers.gather(0, during="the barrier after a checkpoint save", bound=self.bound(stop_shortens=is_main))
        except PeersUnresponsive as error:
            raise error.with_outcome(self.outcome(path or "rank 0 writes the checkpoints")) from None

    def bound(self, *, stop_shortens: bool) -> Bound:
        """How long to wait for the peers: the process-group bound, or, once this rank
        has a stop request, checkpoint.stop_timeout_s: ranks are in lockstep at step
        boundaries, so a healthy peer answers within about a step."""
        dist_timeout_s = self.peers.timeout_s

        def bound() -> tuple[float, str]:
            if stop_shortens and self.stop.signals.stop_seen:
                return min(self.stop_timeout_s, dist_timeout_s), "checkpoint.stop_timeout_s"
            return dist_timeout_s, "trainer.dist_timeout_s"

        return bound

    def outcome(self, saved: Path | str) -> str:
        resume = self.stop.resume_hint()
        if isinstance(saved, Path):
            return f"Rank 0 saved checkpoint {saved}. Resume with: {resume}"
        last = self.last_checkpoint()
        on_disk = f"the last one on disk is {last}" if last else "there is none on disk yet"
        return f"No new checkpoint ({saved}); {on_disk}. Resume with: {resume}"

    def _abandon(self, silent: list[int], stuck_s: float) -> None:
        """From the watchdog thread: the main thread is stuck in a collective that a silent
        peer will never join. Save what can be saved, say so, exit 2 now."""
        limit, key = self.bound(stop_shortens=True)()
        error = PeersUnresponsive(silent, waited_s=stuck_s, limit_s=limit, key=key, during="a collective this rank is stuck in")
        saved: list[Path | str] = ["saving it failed"]

        def save() -> None:
            saved[0] = self.save_last_step(False)

        forced_exit = self.stop.forced_exit
        steps = [("checkpoint", save), ("message", lambda: say(f"{speaker()}: error: {error.with_outcome(self.outcome(saved[0]))}"))]
        # A checkpoint of a big model may take a while; a hung disk still may not hold the exit.
        forced_exit.run(EXIT_USER_ERROR, "failed", steps, grace_s=max(forced_exit.grace_s, limit))

    # ------------------------------------------------------------------ stalls
    def stalled(self, headline: str) -> Path | str:
        """This rank's data stalled and it stands at a step boundary: tell the peers (they
        wait for it in a collective), and return rank 0's checkpoint of this step, or why
        there is none. Rank 0 writes it here; another rank waits for rank 0's word."""
        self.peers.announce(STALLED, headline)
        saved = self._stall_checkpoint(from_main_thread=True)
        if self.peers.rank == 0:
            others = [rank for rank in range(self.peers.world_size) if rank != self.peers.rank]
            self.peers.wait_for(STALL_SEEN, others, self.stop_timeout_s)
        return saved

    def _stall_checkpoint(self, *, from_main_thread: bool) -> Path | str:
        """Rank 0 saves the last step and tells the others; they wait for its word."""
        if self.peers.rank == 0:
            saved = self.save_last_step(from_main_thread)
            self.peers.announce(STALL_SAVED, _encode(saved))
            return saved
        word = self.peers.wait_for(STALL_SAVED, [0], self.stop_timeout_s).get(0)
        return _decode(word) if word is not None else f"rank 0 did not answer within {self.stop_timeout_s:g} s"

    def _peer_stalled(self, stalled: dict[int, str]) -> None:
        """From the watchdog thread: the main thread waits in a collective for a rank whose
        data stalled. Rank 0 saves the last step; every rank says which rank stalled where,
        and exits 2 now."""
        rank, headline = min(stalled.items())
        saved: list[Path | str] = ["saving it failed"]

        def save() -> None:
            saved[0] = self._stall_checkpoint(from_main_thread=False)
            self.peers.announce(STALL_SEEN, "1")

        self.stop.peer_stall = f"data stalled on rank {rank}: {headline}"
        key = self.fetch_timeout_key
        message = lambda: say(  # noqa: E731
            f"{speaker()}: error: {key}: rank {rank}: {headline}; this rank waited for it in a collective. "
            f"Fix the data code there, or raise {key} if batches are legitimately that slow. {self.outcome(saved[0])}")
        forced_exit = self.stop.forced_exit
        forced_exit.run(EXIT_USER_ERROR, "interrupted",
                        [("checkpoint", save), ("message", message)], grace_s=max(forced_exit.grace_s, 2 * self.stop_timeout_s))


def _encode(saved: Path | str) -> str:
    return f"path:{saved}" if isinstance(saved, Path) else f"none:{saved}"


def _decode(word: str) -> Path | str:
    kind, _, value = word.partition(":")
    return Path(value) if kind == "path" else value
