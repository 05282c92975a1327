"""The default check list. Extend it by appending a Check subclass to ``DEFAULT_CHECKS``
(order within a stage is kept), or override ``preflight_checks()`` in a recipe."""

from __future__ import annotations

from typing import Any

from optimus_preflight.preflight.checks import (
    batch_checks,
    config_checks,
    data_checks,
    env_checks,
    model_checks,
    step_checks,
    step_runs,
    throughput,
)
from optimus_preflight.preflight.checks.lr_finder_check import LRFinderCheck
from optimus_preflight.preflight.checks.memory_checks import HostMemoryCheck, VRAMHeadroomCheck
from optimus_preflight.preflight.framework import Check, validate_checks

DEFAULT_CHECKS: list[type[Check]] = [
    env_checks.DeviceCheck,
    env_checks.SharedMemoryCheck,
    env_checks.HostRamCheck,
    env_checks.RunDirCheck,
    env_checks.DiskSpaceCheck,
    config_checks.LrScheduleCheck,
    data_checks.FirstBatchCheck,
    data_checks.LoaderMemoryCheck,
    data_checks.DuplicateSamplesCheck,
    batch_checks.CollateCheck,
    batch_checks.FinalBatchCheck,
    batch_checks.SamplingCheck,
    model_checks.OptimizerParamsCheck,
    model_checks.ModesCheck,
    model_checks.WeightDecayCheck,
    model_checks.OptimizerEpsCheck,
    VRAMHeadroomCheck,
    HostMemoryCheck,
    step_checks.FirstStepCheck,
    step_checks.GradientsCheck,
    step_checks.LossFunctionCheck,
    step_checks.TargetsCheck,
    step_checks.InitialLossCheck,
    step_runs.AccumulationCheck,
    step_runs.CheckpointRoundTripCheck,
    step_runs.OverfitCheck,
    LRFinderCheck,
    throughput.ThroughputCheck,
]
validate_checks(DEFAULT_CHECKS)


def default_checks(cfg: Any) -> list[Check]:
    """Fresh instances of the default checks that apply to ``cfg``."""
    validate_checks(DEFAULT_CHECKS)  # a recipe or plugin may have appended to it
    return [check_class() for check_class in DEFAULT_CHECKS if check_class.applies(cfg)]
