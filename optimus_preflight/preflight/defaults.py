"""The default check list. Extend it by appending a Check subclass to ``DEFAULT_CHECKS``
(order within a stage is kept), or override ``preflight_checks()`` in a recipe.

Also what ``preflight.disable`` may name: a defined check or an issue code."""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from optimus_preflight.errors import UserError
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
from optimus_preflight.preflight.checks.adapter_checks import AdapterCheck
from optimus_preflight.preflight.checks.dataset_checks import DatasetLengthCheck
from optimus_preflight.preflight.checks.dataset_memory import DatasetCacheCheck
from optimus_preflight.preflight.checks.feature_leak import FeatureLabelCheck
from optimus_preflight.preflight.checks.finetune_checks import FinetuneLRCheck, LoadedWeightsCheck
from optimus_preflight.preflight.checks.input_scale import InputScaleCheck
from optimus_preflight.preflight.checks.lr_finder_check import LRFinderCheck
from optimus_preflight.preflight.checks.memory_checks import HostMemoryCheck, VRAMHeadroomCheck
from optimus_preflight.preflight.checks.pin_checks import PinnedBatchCheck
from optimus_preflight.preflight.checks.shard_checks import RankBatchesCheck
from optimus_preflight.preflight.checks.split_overlap import SplitOverlapCheck
from optimus_preflight.preflight.checks.target_leak import TargetLeakCheck
from optimus_preflight.preflight.checks.worker_pickling import WorkerPicklingCheck
from optimus_preflight.preflight.framework.check import Check
from optimus_preflight.preflight.framework.registry import known_checks, validate_checks

DEFAULT_CHECKS: list[type[Check]] = [
    env_checks.DeviceCheck,
    env_checks.CpuCoresCheck,
    env_checks.SharedMemoryCheck,
    env_checks.HostRamCheck,
    env_checks.RunDirCheck,
    env_checks.DiskSpaceCheck,
    config_checks.PrecisionCheck,
    config_checks.LrScheduleCheck,
    WorkerPicklingCheck,
    data_checks.FirstBatchCheck,
    data_checks.LoaderMemoryCheck,
    PinnedBatchCheck,
    data_checks.DuplicateSamplesCheck,
    InputScaleCheck,
    FeatureLabelCheck,
    batch_checks.CollateCheck,
    DatasetLengthCheck,
    DatasetCacheCheck,
    batch_checks.FinalBatchCheck,
    batch_checks.SamplingCheck,
    SplitOverlapCheck,
    RankBatchesCheck,
    model_checks.OptimizerParamsCheck,
    model_checks.ModesCheck,
    model_checks.WeightDecayCheck,
    model_checks.OptimizerEpsCheck,
    LoadedWeightsCheck,
    AdapterCheck,
    FinetuneLRCheck,
    VRAMHeadroomCheck,
    HostMemoryCheck,
    step_checks.FirstStepCheck,
    step_checks.GradientsCheck,
    step_checks.LossFunctionCheck,
    step_checks.TargetsCheck,
    step_checks.PaddedLossCheck,
    step_checks.InitialLossCheck,
    TargetLeakCheck,
    step_runs.AccumulationCheck,
    step_runs.LossScaleCheck,
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


# How issue codes are written: a quoted upper-case token such as "DP15" or "ENV_DISK".
_CODE_LITERAL = re.compile(r"""["']([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*)["']""")


def issue_codes() -> set[str] | None:
    """The issue codes the defined checks can report, read from the source of the packages
    that define checks: a code is a string literal, often in a helper module rather than
    the check's own, so every file of those packages is read. None when a check's source
    cannot be read (a notebook cell): then no code can be ruled out."""
    files: set[Path] = set()
    for top in {cls.__module__.split(".")[0] for cls in known_checks().values()}:
        found = _source_files(sys.modules.get(top))
        if not found:
            return None
        files.update(found)
    codes: set[str] = set()
    for path in files:
        codes.update(_CODE_LITERAL.findall(path.read_text(encoding="utf-8", errors="replace")))
    return codes


def _source_files(module: Any) -> list[Path]:
    """A package's .py files, or a plain module's own file; [] when there is no source."""
    if module is None:
        return []
    if hasattr(module, "__path__"):
        return [path for root in module.__path__ for path in Path(root).rglob("*.py")]
    path = getattr(module, "__file__", None)
    return [Path(path)] if path and path.endswith(".py") and Path(path).is_file() else []


def _closest(entry: str, candidates: Iterable[str]) -> str | None:
    # Case-blind, so "dp15" finds DP15 and "Step.Throughput" finds step.throughput.
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    close = difflib.get_close_matches(entry.lower(), by_lower, n=1)
    return by_lower[close[0]] if close else None


def check_disable_names(disable: Iterable[str]) -> None:
    """Refuse a ``preflight.disable`` entry that names no defined check and no issue code:
    it would skip nothing, silently. Call it once the recipe's module (and so its own
    checks) is imported, before any work."""
    entries = list(disable)
    checks = known_checks()
    unknown = [entry for entry in entries if entry not in checks]
    if not unknown:
        return
    codes = issue_codes()
    # Without every code known, only a dotted entry (a check name's form) can be ruled out.
    unknown = [entry for entry in unknown if ("." in entry if codes is None else entry not in codes)]
    if not unknown:
        return
    entry = unknown[0]
    guess = _closest(entry, [*checks, *(codes or ())])
    listing = "`optimus-train preflight.only=true` prints every check's name and every issue's code."
    if guess is None:
        fix = f"Name checks or issue codes as a list, e.g. preflight.disable=[step.throughput,O6]; {listing}"
    else:
        fixed = ",".join(guess if name == entry else name for name in entries)
        fix = f"Did you mean {guess}? Set preflight.disable=[{fixed}]; {listing}"
    raise UserError(
        f"preflight.disable: {entry!r} is neither a preflight check nor an issue code, so it would skip nothing",
        key="preflight.disable",
        fix=fix,
    )
