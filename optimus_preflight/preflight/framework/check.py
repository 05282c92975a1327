"""The base class of a preflight check, and the exceptions its ``run`` may raise.

A check is a small class with a dotted ``name``, a ``stage``, the names of the checks it
``requires`` and the issue ``codes`` it can report; its ``run`` reports issues and
measurements into ``Findings``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from optimus_preflight.preflight.framework.issues import Findings, Stage
from optimus_preflight.preflight.framework.registry import define_check

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


class SkipCheck(Exception):
    """Raised from ``run`` to end the check as ``skipped``, the message saying why
    (e.g. the data code it would call already hung in an earlier check)."""


class StopCheck(Exception):
    """Raised from ``run`` to end the check now; the issues it reported so far are its
    result (e.g. after reporting data code that hung, nothing more can be read)."""


class PreflightBug(Exception):
    """Raised from ``run`` when the error a check observed is the preflight's own, not the
    user's (a fake tensor of the memory estimate that reached the real step): the check
    crashes instead of reporting an issue that blames the user's code, and its result
    keeps ``original_traceback``, the traceback of that error."""

    def __init__(self, message: str, original_traceback: str | None = None) -> None:
        super().__init__(message)
        self.original_traceback = original_traceback


class Check:
    """Base class. Subclasses set ``name``, ``stage``, ``requires``, ``codes`` and implement ``run``.

    A base class meant only to be subclassed says so: ``class MyBase(Check, abstract=True)``.

    ``applies(cfg)`` lets a check stay out of a run it has nothing to say about (the
    overfit smoke when ``preflight.overfit_steps=0``), rather than print a line.
    A check may put a one-line ``summary`` of its measurements in ``findings.data``;
    the console shows it next to the check's name.
    """

    name: ClassVar[str]
    stage: ClassVar[Stage]
    requires: ClassVar[tuple[str, ...]] = ()
    # Every issue code ``run`` can report (its helpers' too): what ``preflight.disable``
    # accepts besides check names. Codes the framework reports for any check
    # (DATA_TIMEOUT) are ``issues.FRAMEWORK_CODES``.
    codes: ClassVar[tuple[str, ...]] = ()
    # Whether the check reads or runs the model's real weights, or judges training on this
    # machine; None: the model and step stages do. A model too large for this machine is
    # kept on the meta device for the memory verdict (preflight.memory.world_size), and
    # the checks that need weights skip.
    needs_weights: ClassVar[bool | None] = None
    # Whether ``run`` times the step. On an accelerator every other check runs under
    # ``device_bounds.HostBoundsGuard``, whose host reads of index ranges would be timed too.
    timed: ClassVar[bool] = False

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not abstract:
            define_check(cls, Check)

    @classmethod
    def applies(cls, cfg: Any) -> bool:
        return True

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        raise NotImplementedError

