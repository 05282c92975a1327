"""Training dynamics: metrics every N steps, in-training warnings, the LR range test.

The preflight check that runs the LR range test is ``optimus_preflight.preflight.checks.lr_finder_check``.
"""

from optimus_preflight.dynamics.lr_finder import LRRangeResult, lr_range_test
from optimus_preflight.dynamics.monitor import DynamicsMonitor, monitor_for_recipe
from optimus_preflight.dynamics.watchdog import DynamicsWarning, Watchdog

__all__ = [
    "DynamicsMonitor",
    "DynamicsWarning",
    "LRRangeResult",
    "Watchdog",
    "lr_range_test",
    "monitor_for_recipe",
]
