"""Under torchrun: the ranks agree at each step boundary whether to stop, wait for each
other after a checkpoint, and a watchdog ends a run stuck in a collective that a silent
peer will never join (after rank 0 saved what it can), with the silent ranks named."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from optimus_preflight.checkpoint.forced_exit import say
from optimus_preflight.checkpoint.stop_control import StopControl
from optimus_preflight.errors import EXIT_USER_ERROR
from optimus_preflight.training.peers import Bound, Peers, PeersUnresponsive, StuckWatchdog

# Rank 0's checkpoint of the last completed step, or why there is none; the argument
# says whether the caller is the main thread.
SaveLastStep = Callable[[bool], "Path | str"]


class PeerWatch:
    def __init__(self, peers: Peers, stop: StopControl, *, stop_timeout_s: float, save_last_step: SaveLastStep,
                 last_checkpoint: Callable[[], Path | None]):
        self.peers = peers
        self.stop = stop
        # How long a rank with a stop request waits for its peers.
        self.stop_timeout_s = stop_timeout_s
        self.save_last_step = save_last_step
        self.last_checkpoint = last_checkpoint
        self._watchdog: StuckWatchdog | None = None

    def start(self) -> None:
        self._watchdog = StuckWatchdog(self.peers, lambda: self.bound(stop_shortens=True)()[0], self._abandon)
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
        steps = [("checkpoint", save), ("message", lambda: say(f"optimus-train: error: {error.with_outcome(self.outcome(saved[0]))}"))]
        # A checkpoint of a big model may take a while; a hung disk still may not hold the exit.
        forced_exit.run(EXIT_USER_ERROR, "failed", steps, grace_s=max(forced_exit.grace_s, limit))
