"""Preflight: checks that catch hangs, OOMs and silent mistraining before a long run.

Public API: the framework, the default checks and the report; the first-batch startup
check of a loader is ``preflight.loader_startup.check_first_batch``.
"""

from optimus_preflight.preflight.checks.batch_checks import CollateCheck, FinalBatchCheck, SamplingCheck
from optimus_preflight.preflight.checks.config_checks import LrScheduleCheck
from optimus_preflight.preflight.checks.data_checks import DuplicateSamplesCheck, FirstBatchCheck, LoaderMemoryCheck
from optimus_preflight.preflight.checks.env_checks import (
    DeviceCheck,
    DiskSpaceCheck,
    HostRamCheck,
    RunDirCheck,
    SharedMemoryCheck,
)
from optimus_preflight.preflight.checks.lr_finder_check import LRFinderCheck
from optimus_preflight.preflight.checks.memory_checks import HostMemoryCheck, VRAMHeadroomCheck
from optimus_preflight.preflight.checks.model_checks import (
    ModesCheck,
    OptimizerEpsCheck,
    OptimizerParamsCheck,
    WeightDecayCheck,
)
from optimus_preflight.preflight.checks.step_checks import (
    FirstStepCheck,
    GradientsCheck,
    InitialLossCheck,
    LossFunctionCheck,
    TargetsCheck,
)
from optimus_preflight.preflight.checks.step_runs import AccumulationCheck
from optimus_preflight.preflight.checks.step_smoke import CheckpointRoundTripCheck, OverfitCheck
from optimus_preflight.preflight.checks.throughput import ThroughputCheck
from optimus_preflight.preflight.defaults import DEFAULT_CHECKS, default_checks
from optimus_preflight.preflight.framework import (
    Check,
    CheckResult,
    CheckStatus,
    Findings,
    Issue,
    Severity,
    Stage,
    run_checks,
)
from optimus_preflight.preflight.framework.console import format_report, log_report
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.preserve import TrainingStateSnapshot, preserved_training_state
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.preflight.framework.runner import run_preflight_checks
from optimus_preflight.preflight.standalone import run_preflight

__all__ = [
    # framework and report
    "Check",
    "CheckResult",
    "CheckStatus",
    "Findings",
    "Issue",
    "Severity",
    "Stage",
    "run_checks",
    "run_preflight",
    "run_preflight_checks",
    "PreflightContext",
    "PreflightReport",
    "format_report",
    "log_report",
    "TrainingStateSnapshot",
    "preserved_training_state",
    "DEFAULT_CHECKS",
    "default_checks",
    # checks
    "DeviceCheck",
    "SharedMemoryCheck",
    "HostRamCheck",
    "RunDirCheck",
    "DiskSpaceCheck",
    "LrScheduleCheck",
    "FirstBatchCheck",
    "LoaderMemoryCheck",
    "DuplicateSamplesCheck",
    "CollateCheck",
    "FinalBatchCheck",
    "SamplingCheck",
    "OptimizerParamsCheck",
    "ModesCheck",
    "WeightDecayCheck",
    "OptimizerEpsCheck",
    "FirstStepCheck",
    "GradientsCheck",
    "LossFunctionCheck",
    "TargetsCheck",
    "InitialLossCheck",
    "AccumulationCheck",
    "CheckpointRoundTripCheck",
    "OverfitCheck",
    "ThroughputCheck",
    "VRAMHeadroomCheck",
    "HostMemoryCheck",
    "LRFinderCheck",
]
