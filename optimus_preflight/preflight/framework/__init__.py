"""The preflight framework: what a check is and reports (``check``, ``issues``), the
registry of check classes and their issue codes, running checks in isolation
(``execution``), what a check may look at (``context``, ``artifacts``), the training
state it must leave as found (``preserve``), and one preflight run with its report
(``runner``, ``report``, ``console``, ``consensus``).

Nothing here imports a check, a data access helper or an analysis. The names below are
what a check's author needs; the rest is imported from its module.
"""

from optimus_preflight.preflight.framework.check import Check, PreflightBug, SkipCheck, StopCheck
from optimus_preflight.preflight.framework.execution import CheckResult, run_check, run_checks
from optimus_preflight.preflight.framework.issues import CheckStatus, Findings, Issue, Severity, Stage
from optimus_preflight.preflight.framework.registry import CheckDefinitionError, known_checks, known_codes

__all__ = [
    "Check",
    "CheckDefinitionError",
    "CheckResult",
    "CheckStatus",
    "Findings",
    "Issue",
    "PreflightBug",
    "Severity",
    "SkipCheck",
    "Stage",
    "StopCheck",
    "known_checks",
    "known_codes",
    "run_check",
    "run_checks",
]
