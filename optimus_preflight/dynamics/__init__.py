"""Training dynamics: metrics every N steps, in-training warnings, the LR range test."""

from optimus_preflight.dynamics.monitor import DynamicsMonitor, monitor_for_recipe
from optimus_preflight.dynamics.watchdog import DynamicsWarning, Watchdog

__all__ = ["DynamicsMonitor", "DynamicsWarning", "Watchdog", "monitor_for_recipe"]
