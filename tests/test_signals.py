"""StopSignals: handlers set a flag, restore on uninstall, end a stuck data wait."""

from __future__ import annotations

import os
import signal

import pytest

from optimus_preflight.errors import UserError
from optimus_preflight.signals import StopRequested, StopSignals


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
