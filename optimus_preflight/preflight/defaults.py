"""The default check list. Extend it by appending a Check subclass to ``DEFAULT_CHECKS``
(order within a stage is kept), or override ``preflight_checks()`` in a recipe.

Also what ``preflight.disable`` may name: a defined check, or an issue code a check declares."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from optimus_preflight.config.invocation import program
from optimus_preflight.errors import UserError
from optimus_preflight.preflight.checks import (
    batch_checks,
    config_checks,
    data_checks,
    env_checks,
    model_checks,
    step_checks,
    step_runs,
    step_smoke,
    throughput,
)
from optimus_preflight.preflight.checks.adapter_checks import AdapterCheck
from optimus_preflight.preflight.checks.attention_mask import AttentionMaskCheck
from optimus_preflight.preflight.checks.autoregressive_order import AutoregressiveOrderCheck
from optimus_preflight.preflight.checks.batch_layout import BatchLayoutCheck
from optimus_preflight.preflight.checks.batch_order import BatchOrderCheck
from optimus_preflight.preflight.checks.buffer_lookups import BufferLookupsCheck
from optimus_preflight.preflight.checks.class_structure import ClassStructureCheck
from optimus_preflight.preflight.checks.coded_columns import CodedColumnsCheck
from optimus_preflight.preflight.checks.collapse import CollapseCheck
from optimus_preflight.preflight.checks.collate_context import CollateContextCheck
from optimus_preflight.preflight.checks.collate_order import CollateOrderCheck
from optimus_preflight.preflight.checks.collate_truncation import CollateTruncationCheck
from optimus_preflight.preflight.checks.column_shortcut import TrainOnlyColumnCheck
from optimus_preflight.preflight.checks.constant_buffers import ConstantBuffersCheck
from optimus_preflight.preflight.checks.contrastive_targets import ContrastiveTargetsCheck
from optimus_preflight.preflight.checks.conv_layout import ConvLayoutCheck
from optimus_preflight.preflight.checks.ctc_layout import CtcLayoutCheck
from optimus_preflight.preflight.checks.custom_backward import CustomBackwardCheck
from optimus_preflight.preflight.checks.dataset_checks import DatasetLengthCheck
from optimus_preflight.preflight.checks.dataset_memory import DatasetCacheCheck
from optimus_preflight.preflight.checks.dataset_mutation import DatasetMutationCheck
from optimus_preflight.preflight.checks.derivative_graph import DerivativeGraphCheck
from optimus_preflight.preflight.checks.diffusion_inputs import DiffusionInputsCheck
from optimus_preflight.preflight.checks.distance_tables import DistanceTablesCheck
from optimus_preflight.preflight.checks.double_balancing import DoubleBalancingCheck
from optimus_preflight.preflight.checks.dropout_rate import DropoutInEvalCheck, DropoutOnOutputCheck, DropoutRateCheck
from optimus_preflight.preflight.checks.ema_horizon import EmaHorizonCheck
from optimus_preflight.preflight.checks.embedding_inputs import EmbeddingInputsCheck
from optimus_preflight.preflight.checks.feature_leak import FeatureLabelCheck
from optimus_preflight.preflight.checks.finetune_checks import FinetuneLRCheck, LoadedWeightsCheck
from optimus_preflight.preflight.checks.flip_labels import FlipLabelsCheck
from optimus_preflight.preflight.checks.flow_likelihood import FlowLikelihoodCheck
from optimus_preflight.preflight.checks.forecast_leak import ForecastLeakCheck
from optimus_preflight.preflight.checks.forward_arguments import ForwardArgumentsCheck
from optimus_preflight.preflight.checks.frame_labels import FrameLabelsCheck
from optimus_preflight.preflight.checks.graph_batch import GraphBatchCheck, GraphPropagationCheck
from optimus_preflight.preflight.checks.init_scale import InitScaleCheck
from optimus_preflight.preflight.checks.input_content import InputContentCheck
from optimus_preflight.preflight.checks.input_dependence import InputDependenceCheck
from optimus_preflight.preflight.checks.input_scale import InputScaleCheck
from optimus_preflight.preflight.checks.integer_mask import IntegerMaskCheck
from optimus_preflight.preflight.checks.label_crop import LabelCropCheck
from optimus_preflight.preflight.checks.label_masking import LabelMaskingCheck
from optimus_preflight.preflight.checks.level_invariance import LevelInvarianceCheck
from optimus_preflight.preflight.checks.loss_batch_mean import LossBatchMeanCheck
from optimus_preflight.preflight.checks.loss_bounds import LossBoundsCheck
from optimus_preflight.preflight.checks.loss_direction import LossDirectionCheck
from optimus_preflight.preflight.checks.loss_positions import LossPositionsCheck
from optimus_preflight.preflight.checks.loss_targets import LossTargetsCheck
from optimus_preflight.preflight.checks.lr_finder_check import LRFinderCheck
from optimus_preflight.preflight.checks.mask_alignment import MaskAlignmentCheck
from optimus_preflight.preflight.checks.mask_interpolation import MaskInterpolationCheck
from optimus_preflight.preflight.checks.memory_checks import HostMemoryCheck, VRAMHeadroomCheck
from optimus_preflight.preflight.checks.mix_labels import MixLabelsCheck
from optimus_preflight.preflight.checks.module_structure import ModuleStructureCheck
from optimus_preflight.preflight.checks.norm_layout import NormLayoutCheck
from optimus_preflight.preflight.checks.ordinal_codes import OrdinalCodesCheck
from optimus_preflight.preflight.checks.padding_invariance import PaddingInvarianceCheck
from optimus_preflight.preflight.checks.padding_readout import PaddingReadoutCheck
from optimus_preflight.preflight.checks.padding_side import PaddingSideCheck
from optimus_preflight.preflight.checks.pair_association import PairAssociationCheck
from optimus_preflight.preflight.checks.pair_labels import PairLabelsCheck
from optimus_preflight.preflight.checks.pair_lengths import PairLengthsCheck
from optimus_preflight.preflight.checks.pair_partners import PairPartnersCheck
from optimus_preflight.preflight.checks.pair_truncation import PairTruncationCheck
from optimus_preflight.preflight.checks.param_group_keys import ParamGroupKeysCheck
from optimus_preflight.preflight.checks.passthrough import PassthroughCheck
from optimus_preflight.preflight.checks.periodic_padding import PeriodicPaddingCheck
from optimus_preflight.preflight.checks.pin_checks import PinnedBatchCheck
from optimus_preflight.preflight.checks.pooled_axis import PooledAxisCheck
from optimus_preflight.preflight.checks.quantile_level import QuantileLevelCheck
from optimus_preflight.preflight.checks.ranking_negatives import RankingNegativesCheck
from optimus_preflight.preflight.checks.ranking_order import RankingOrderCheck
from optimus_preflight.preflight.checks.recurrence import RecurrenceCheck
from optimus_preflight.preflight.checks.regressed_classes import RegressedClassesCheck
from optimus_preflight.preflight.checks.row_scaling import RowScalingCheck
from optimus_preflight.preflight.checks.row_shift import RowShiftCheck
from optimus_preflight.preflight.checks.sample_mixing import SampleMixingCheck
from optimus_preflight.preflight.checks.sample_standardised import SampleStandardisedCheck
from optimus_preflight.preflight.checks.sampled_positive import SampledPositiveCheck
from optimus_preflight.preflight.checks.sampler_coverage import SamplerCoverageCheck
from optimus_preflight.preflight.checks.selection_alignment import SelectionAlignmentCheck
from optimus_preflight.preflight.checks.series_fill import SeriesFillCheck
from optimus_preflight.preflight.checks.shard_checks import RankBatchesCheck
from optimus_preflight.preflight.checks.shift_direction import ShiftDirectionCheck
from optimus_preflight.preflight.checks.split_codes import SplitCodesCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck
from optimus_preflight.preflight.checks.split_missing import SplitMissingCheck
from optimus_preflight.preflight.checks.split_overlap import SplitOverlapCheck
from optimus_preflight.preflight.checks.split_scale import SplitScaleCheck
from optimus_preflight.preflight.checks.split_sizes import SplitSizesCheck
from optimus_preflight.preflight.checks.split_tags import SplitTagsCheck
from optimus_preflight.preflight.checks.stateful_forward import StatefulForwardCheck
from optimus_preflight.preflight.checks.survival_order import SurvivalOrderCheck
from optimus_preflight.preflight.checks.target_alignment import TargetAlignmentCheck
from optimus_preflight.preflight.checks.target_inputs import TargetInputsCheck
from optimus_preflight.preflight.checks.target_leak import TargetLeakCheck
from optimus_preflight.preflight.checks.target_offset import TargetOffsetCheck
from optimus_preflight.preflight.checks.target_signal import TargetSignalCheck
from optimus_preflight.preflight.checks.tied_embeddings import TiedEmbeddingsCheck
from optimus_preflight.preflight.checks.token_labels import TokenLabelsCheck
from optimus_preflight.preflight.checks.trained_tensors import (
    FreshTensorsCheck,
    LossTensorsCheck,
    UnregisteredTensorsCheck,
)
from optimus_preflight.preflight.checks.transition_flags import TransitionFlagsCheck
from optimus_preflight.preflight.checks.triplet_positives import TripletPositivesCheck
from optimus_preflight.preflight.checks.truncation_signal import TruncationSignalCheck
from optimus_preflight.preflight.checks.unread_mask import UnreadMaskCheck
from optimus_preflight.preflight.checks.update_checks import UpdateCheck
from optimus_preflight.preflight.checks.val_loader import ValidationLoaderCheck
from optimus_preflight.preflight.checks.warmup_length import WarmupLengthCheck
from optimus_preflight.preflight.checks.window_labels import WindowLabelsCheck
from optimus_preflight.preflight.checks.window_overlap import WindowOverlapCheck
from optimus_preflight.preflight.checks.worker_pickling import WorkerPicklingCheck
from optimus_preflight.preflight.checks.zero_features import ZeroFeaturesCheck
from optimus_preflight.preflight.framework.check import Check
from optimus_preflight.preflight.framework.registry import known_checks, known_codes, validate_checks

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
    GraphBatchCheck,
    InputContentCheck,
    RankingNegativesCheck,
    InputScaleCheck,
    FeatureLabelCheck,
    TrainOnlyColumnCheck,
    SeriesFillCheck,
    TargetOffsetCheck,
    MaskAlignmentCheck,
    FrameLabelsCheck,
    MaskInterpolationCheck,
    LabelMaskingCheck,
    batch_checks.CollateCheck,
    CollateOrderCheck,
    CollateContextCheck,
    DatasetLengthCheck,
    DatasetCacheCheck,
    DatasetMutationCheck,
    batch_checks.FinalBatchCheck,
    batch_checks.SamplingCheck,
    SamplerCoverageCheck,
    ValidationLoaderCheck,
    SplitSizesCheck,
    CollateTruncationCheck,
    TruncationSignalCheck,
    SplitOverlapCheck,
    WindowOverlapCheck,
    SplitLabelsCheck,
    SplitScaleCheck,
    FlipLabelsCheck,
    TargetSignalCheck,
    CodedColumnsCheck,
    RankBatchesCheck,
    # Each reads many samples: they come after the cheaper readers, which meet (and name) a hanging sample first.
    SplitTagsCheck,
    SplitCodesCheck,
    SplitMissingCheck,
    WindowLabelsCheck,
    RowScalingCheck,
    SampleStandardisedCheck,
    RowShiftCheck,
    PairLengthsCheck,
    PaddingSideCheck,
    PeriodicPaddingCheck,
    ShiftDirectionCheck,
    PairAssociationCheck,
    PairTruncationCheck,
    TripletPositivesCheck,
    PairPartnersCheck,
    model_checks.OptimizerParamsCheck,
    UnregisteredTensorsCheck,
    ConstantBuffersCheck,
    model_checks.ModesCheck,
    model_checks.WeightDecayCheck,
    model_checks.OptimizerEpsCheck,
    ParamGroupKeysCheck,
    ModuleStructureCheck,
    DropoutRateCheck,
    WarmupLengthCheck,
    DropoutInEvalCheck,
    TiedEmbeddingsCheck,
    LoadedWeightsCheck,
    AdapterCheck,
    FinetuneLRCheck,
    VRAMHeadroomCheck,
    HostMemoryCheck,
    step_checks.FirstStepCheck,
    step_checks.GradientsCheck,
    UpdateCheck,
    InitScaleCheck,
    LossTensorsCheck,
    FreshTensorsCheck,
    CustomBackwardCheck,
    DerivativeGraphCheck,
    step_checks.LossFunctionCheck,
    step_checks.TargetsCheck,
    UnreadMaskCheck,
    RegressedClassesCheck,
    step_checks.PaddedLossCheck,
    TokenLabelsCheck,
    step_checks.InitialLossCheck,
    BatchLayoutCheck,
    ConvLayoutCheck,
    NormLayoutCheck,
    TargetLeakCheck,
    ForecastLeakCheck,
    SampleMixingCheck,
    CtcLayoutCheck,
    BatchOrderCheck,
    InputDependenceCheck,
    ZeroFeaturesCheck,
    EmbeddingInputsCheck,
    BufferLookupsCheck,
    PairLabelsCheck,
    RankingOrderCheck,
    QuantileLevelCheck,
    DoubleBalancingCheck,
    SurvivalOrderCheck,
    DiffusionInputsCheck,
    PooledAxisCheck,
    IntegerMaskCheck,
    SelectionAlignmentCheck,
    DistanceTablesCheck,
    ClassStructureCheck,
    OrdinalCodesCheck,
    TransitionFlagsCheck,
    ContrastiveTargetsCheck,
    CollapseCheck,
    EmaHorizonCheck,
    AutoregressiveOrderCheck,
    FlowLikelihoodCheck,
    TargetAlignmentCheck,
    TargetInputsCheck,
    LevelInvarianceCheck,
    LossTargetsCheck,
    MixLabelsCheck,
    SampledPositiveCheck,
    LabelCropCheck,
    PassthroughCheck,
    LossBoundsCheck,
    LossDirectionCheck,
    LossBatchMeanCheck,
    AttentionMaskCheck,
    RecurrenceCheck,
    PaddingReadoutCheck,
    LossPositionsCheck,
    PaddingInvarianceCheck,
    StatefulForwardCheck,
    ForwardArgumentsCheck,
    DropoutOnOutputCheck,
    GraphPropagationCheck,
    step_runs.AccumulationCheck,
    step_runs.LossScaleCheck,
    step_smoke.CheckpointRoundTripCheck,
    step_smoke.OverfitCheck,
    LRFinderCheck,
    throughput.ThroughputCheck,
]
validate_checks(DEFAULT_CHECKS)


def default_checks(cfg: Any) -> list[Check]:
    """Fresh instances of the default checks that apply to ``cfg``."""
    validate_checks(DEFAULT_CHECKS)  # a recipe or plugin may have appended to it
    return [check_class() for check_class in DEFAULT_CHECKS if check_class.applies(cfg)]


def _close_matches(entry: str, candidates: Iterable[str]) -> list[str]:
    # Case-blind, so "dp15" finds DP15 and "Step.Throughput" finds step.throughput.
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    return [by_lower[close] for close in difflib.get_close_matches(entry.lower(), by_lower, n=3)]


def check_disable_names(disable: Iterable[str]) -> None:
    """Refuse a ``preflight.disable`` entry that names no defined check and no issue code a
    check declares (``Check.codes``) or the framework reports: it would skip nothing,
    silently. Call it once the recipe's module (and so its own checks) is imported,
    before any work."""
    entries = list(disable)
    checks, codes = known_checks(), known_codes()
    unknown = [entry for entry in entries if entry not in checks and entry not in codes]
    if not unknown:
        return
    entry = unknown[0]
    close = _close_matches(entry, [*checks, *codes])
    listing = (f"`{program()} preflight.only=true preflight.verbose=true` prints every check's name; a check's "
               "issue codes are its `codes` attribute.")
    if not close:
        fix = f"Name checks or issue codes as a list, e.g. preflight.disable=[step.throughput,O6]; {listing}"
    else:
        fixed = ",".join(close[0] if name == entry else name for name in entries)
        others = f" Other close matches: {', '.join(close[1:])}." if close[1:] else ""
        fix = f"Did you mean {close[0]}? Set preflight.disable=[{fixed}].{others} {listing}"
    raise UserError(
        f"preflight.disable: {entry!r} is neither a preflight check nor an issue code a check declares, "
        "so it would skip nothing",
        key="preflight.disable",
        fix=fix,
    )
