"""StopSignals: handlers set a flag, restore on uninstall, end a stuck data wait; the
watcher thread sees a second Ctrl+C inside a C++ call; ForcedExit ends the process once."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
import torch

from optimus_preflight.checkpoint.forced_exit import ForcedExit, second_ctrl_c_message
from optimus_preflight.checkpoint.signals import StopRequested, StopSignals
from optimus_preflight.errors import UserError


def test_install_sets_flag_and_uninstall_restores_previous_handlers():
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    signals = StopSignals("SIGUSR1")
    assert signals.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert signals.requested and signals.received == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGUSR1  # the first signal is the one reported
    finally:
        signals.uninstall()
    assert {s: signal.getsignal(s) for s in previous} == previous


def test_signal_during_an_interruptible_wait_raises_stop_requested():
    signals = StopSignals(None)
    signals.install()
    try:
        with pytest.raises(StopRequested):
            with signals.interruptible():
                os.kill(os.getpid(), signal.SIGTERM)
                raise AssertionError("the wait should have been interrupted")
        with pytest.raises(StopRequested):  # once requested, the next wait ends at once
            with signals.interruptible():
                pass
    finally:
        signals.uninstall()


def test_second_sigint_raises_keyboard_interrupt():
    signals = StopSignals(None)
    signals.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signals.uninstall()


def test_unknown_extra_signal_is_a_user_error():
    with pytest.raises(UserError, match="checkpoint.extra_signal"):
        StopSignals("SIGNOPE")


def _block_main_thread_in_cpp(seconds: float):
    """A C++ call that holds the main thread (GIL released, no bytecode run) like a long
    backward, for a fixed time; returns the future that ends it early."""
    done = torch.futures.Future()
    timer = threading.Timer(seconds, lambda: done.done() or done.set_result(None))
    timer.daemon = True
    timer.start()
    return done


def test_second_sigint_inside_a_cpp_call_reaches_force_quit_from_the_watcher():
    signals = StopSignals(None)
    calls = []
    done = _block_main_thread_in_cpp(30)

    def force_quit():
        calls.append((threading.current_thread() is threading.main_thread(), time.monotonic()))
        if not done.done():
            done.set_result(None)

    signals.force_quit = force_quit
    signals.install()
    try:
        def ctrl_c_twice():
            main = threading.main_thread().ident
            while "torch/futures" not in sys._current_frames()[main].f_code.co_filename:
                time.sleep(0.01)  # until the main thread sits in wait() below
            os.kill(os.getpid(), signal.SIGINT)
            while signals.seen is None:  # two pending SIGINTs would merge into one
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=ctrl_c_twice, daemon=True).start()
        started = time.monotonic()
        done.wait()
        # CPython runs a handler once for deliveries that arrived while the main thread
        # was busy (a flag, not a count): only the watcher saw two Ctrl+C.
        time.sleep(0.5)
    finally:
        signals.uninstall()
    on_main_thread, when = calls[0]
    assert not on_main_thread and when - started < 10  # the watcher, long before the 30 s
    assert signals.seen == signal.SIGINT and signals.requested


def test_watcher_restores_the_previous_wakeup_fd_and_leaves_forked_children_alone():
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    original = signal.set_wakeup_fd(write_fd)
    signals = StopSignals(None)
    try:
        signals.install()
        pid = os.fork()
        if pid == 0:  # a DataLoader worker: its signals must not count as the parent's
            os._exit(0 if signal.set_wakeup_fd(-1) == -1 else 1)
        assert os.waitpid(pid, 0)[1] == 0
        signals.uninstall()
        assert signal.set_wakeup_fd(write_fd) == write_fd
    finally:
        signal.set_wakeup_fd(original)
        os.close(read_fd)
        os.close(write_fd)


def test_forced_exit_runs_once_swallows_failing_steps_and_has_last_words():
    exits, words = [], []
    forced = ForcedExit(exit_process=exits.append)
    forced.last_words.append(words.append)

    def broken():
        raise OSError("disk full")

    forced.run(130, "interrupted", [("broken", broken), ("after", lambda: words.append("after"))])
    forced.run(2, "failed")  # a second caller waits for the first exit; runs nothing
    assert exits == [130] and words == ["after", "interrupted"]


def test_forced_exit_ends_the_process_even_when_a_step_hangs():
    exits = []
    release = threading.Event()
    forced = ForcedExit(grace_s=0.2, exit_process=lambda code: (exits.append(code), release.set()))
    threading.Thread(target=forced.run, args=(2, "failed", [("hangs", lambda: release.wait(30))]), daemon=True).start()
    assert release.wait(10) and exits[0] == 2


def test_second_ctrl_c_message_names_the_checkpoint_and_the_resume_command(tmp_path):
    line = second_ctrl_c_message(tmp_path / "step_00000004", "optimus-train checkpoint.resume=auto")
    assert "step_00000004" in line and line.endswith("checkpoint.resume=auto") and "\n" not in line
    assert "no checkpoint" in second_ctrl_c_message(None, "optimus-train")
