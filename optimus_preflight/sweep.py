"""Old path of ``reporting.sweep_summary``: saved Hydra configs name its callback."""

from optimus_preflight.reporting.sweep_summary import *  # noqa: F401,F403
