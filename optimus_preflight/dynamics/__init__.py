"""Training dynamics: metrics every N steps, in-training warnings, the LR range test."""

from optimus_preflight.dynamics.checks import LRFinderCheck, dynamics_checks
from optimus_preflight.dynamics.lr_finder import LRRangeResult, lr_range_test
from optimus_preflight.dynamics.monitor import DynamicsMonitor, monitor_for_recipe
from optimus_preflight.dynamics.watchdog import DynamicsWarning, Watchdog

__all__ = [
    "DynamicsMonitor",
    "DynamicsWarning",
    "LRFinderCheck",
    "LRRangeResult",
    "Watchdog",
    "dynamics_checks",
    "lr_range_test",
    "monitor_for_recipe",
]
