"""Step-stage checks: one real step (and a few more) on broken setups, each firing its code."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.loss_findings import init_loss_finding
from optimus_preflight.preflight.analyses.loss_spy import LossSpy
from optimus_preflight.preflight.checks.config_checks import LrScheduleCheck, schedule_findings
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import (
    FirstStepCheck,
    GradientsCheck,
    InitialLossCheck,
    LossFunctionCheck,
    TargetsCheck,
)
from optimus_preflight.preflight.checks.step_runs import AccumulationCheck
from optimus_preflight.preflight.checks.step_smoke import CheckpointRoundTripCheck, OverfitCheck
from optimus_preflight.preflight.checks.throughput import MIN_WAIT_WORTH_FIXING_S, ThroughputCheck
from optimus_preflight.preflight.framework import CheckStatus
from optimus_preflight.training.distributed import DistEnv
from tests.preflight_support import CLASSES, FEATURES, assert_quiet, classifier, codes, plain_context, run

PROBE_CHECKS = (FirstStepCheck, GradientsCheck, LossFunctionCheck, TargetsCheck, InitialLossCheck)


def test_probe_checks_are_quiet_on_a_healthy_classifier(tmp_path):
    results = run(plain_context(tmp_path), *PROBE_CHECKS)
    for result in results.values():
        assert_quiet(result)
    assert results["step.initial_loss"].data["applicable"]


# --------------------------------------------------------------- O3 and errors
def _ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


@pytest.mark.parametrize(("loss", "code", "words"), [
    (lambda m, b: _ce(m, b).detach(), "O3", "detached"),
    (lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none"), "O3", "not a scalar"),
    (lambda m, b: _ce(m, b).item(), "O3", "float"),
    (lambda m, b: _ce(m, b) * float("nan"), "LOSS_NONFINITE", "nan"),
])
def test_the_loss_must_be_a_finite_scalar_attached_to_the_graph(tmp_path, loss, code, words):
    result = run(plain_context(tmp_path, loss=loss), FirstStepCheck)["step.first_step"]
    assert codes(result) == {code} and result.status == CheckStatus.ERROR
    assert words in result.issues[0].message


def _raises(model, batch):
    logits = model(batch[0])
    raise RuntimeError(f"shape mismatch {tuple(logits.shape)}")


def test_an_exception_in_compute_loss_names_the_users_frame(tmp_path):
    result = run(plain_context(tmp_path, loss=_raises), FirstStepCheck)["step.first_step"]
    assert codes(result) == {"STEP_ERROR"}
    assert "test_preflight_step.py" in result.issues[0].message and "_raises" in result.issues[0].message


def test_compute_loss_switching_the_model_to_eval(tmp_path):
    def loss(model, batch):
        model.eval()
        return _ce(model, batch)

    result = run(plain_context(tmp_path, loss=loss), FirstStepCheck)["step.first_step"]
    assert codes(result) == {"O5"}


# ------------------------------------------------------------------ gradients
class UnusedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = classifier()
        self.aux = nn.Linear(FEATURES, 2)  # never called in forward

    def forward(self, x):
        return self.body(x)


def test_params_that_get_no_gradient_are_named(tmp_path):
    ctx = plain_context(tmp_path, model=UnusedHead)
    result = run(ctx, GradientsCheck)["step.gradients"]
    assert codes(result) == {"GRAD_NONE"} and result.status == CheckStatus.WARNING
    assert "aux.weight" in result.issues[0].message and "never called in the forward" in result.issues[0].message
    ctx.training = dataclasses.replace(ctx.training, dist=DistEnv(rank=0, world_size=2))
    distributed = run(ctx, GradientsCheck)["step.gradients"]
    assert distributed.status == CheckStatus.ERROR and "find_unused_parameters" in distributed.issues[0].fix


def test_nonfinite_and_all_zero_gradients(tmp_path):
    def nan_bias_grad(model, batch):  # d sqrt(0 * b) / db = inf * 0 = nan; the loss stays finite
        return _ce(model, batch) + (model[0].bias * 0).sqrt().sum()

    result = run(plain_context(tmp_path, loss=nan_bias_grad), GradientsCheck)["step.gradients"]
    assert codes(result) == {"GRAD_NONFINITE"} and "0.bias" in result.issues[0].message
    result = run(plain_context(tmp_path, loss=lambda m, b: _ce(m, b) * 0), GradientsCheck)["step.gradients"]
    assert codes(result) == {"GRAD_ZERO"}


# -------------------------------------------------------------- loss functions
def _head(final: nn.Module):
    return lambda: nn.Sequential(classifier(), final)


def _one_hot(batch):
    return F.one_hot(batch[1], CLASSES).float()


@pytest.mark.parametrize(("model", "loss", "code", "severity"), [
    (_head(nn.Softmax(dim=1)), None, "O12", "error"),
    (_head(nn.LogSoftmax(dim=1)), None, "O12", "info"),
    (classifier, lambda m, b: F.nll_loss(m(b[0]), b[1]), "O16", "error"),
    (_head(nn.Softmax(dim=1)), lambda m, b: nn.NLLLoss()(m(b[0]), b[1]), "O16", "error"),
    (_head(nn.Sigmoid()), lambda m, b: nn.BCELoss()(m(b[0]), _one_hot(b)), "O13", "info"),
    (_head(nn.Sigmoid()), lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), _one_hot(b)), "O13", "warning"),
])
def test_what_reaches_the_criterion(tmp_path, model, loss, code, severity):
    result = run(plain_context(tmp_path, model=model, loss=loss), LossFunctionCheck)["step.loss_function"]
    assert codes(result) == {code} and result.issues[0].severity.value == severity


@pytest.mark.parametrize(("model", "loss"), [
    (_head(nn.LogSoftmax(dim=1)), lambda m, b: F.nll_loss(m(b[0]), b[1])),
    (classifier, lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), _one_hot(b))),
])
def test_correct_criterion_pairings_are_quiet(tmp_path, model, loss):
    assert_quiet(run(plain_context(tmp_path, model=model, loss=loss), LossFunctionCheck)["step.loss_function"])


def _labels(values: torch.Tensor) -> TensorDataset:
    return TensorDataset(torch.randn(len(values), FEATURES), values)


@pytest.mark.parametrize(("targets", "words"), [
    (torch.arange(64) % (CLASSES + 1), "span [0, 4]"),           # 1-indexed labels: C is out of range
    ((torch.arange(64) % CLASSES).float(), "floating-point"),
    ((torch.arange(64) % CLASSES).int(), "int32"),
])
def test_targets_out_of_range_or_of_the_wrong_dtype(tmp_path, targets, words):
    results = run(plain_context(tmp_path, dataset=_labels(targets)), FirstStepCheck, TargetsCheck)
    assert codes(results["step.targets"]) == {"O14"} and words in results["step.targets"].issues[0].message
    assert results["step.first_step"].status == CheckStatus.ERROR  # on the CPU the criterion raises too


def test_ignore_index_targets_are_not_out_of_range(tmp_path):
    targets = torch.where(torch.arange(64) % 5 == 0, -100, torch.arange(64) % CLASSES)
    assert_quiet(run(plain_context(tmp_path, dataset=_labels(targets)), TargetsCheck)["step.targets"])


class Overconfident(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = classifier()
        with torch.no_grad():
            self.body[2].weight.mul_(200)

    def forward(self, x):
        return self.body(x)


def test_initial_loss_far_above_ln_classes(tmp_path):
    result = run(plain_context(tmp_path, model=Overconfident), InitialLossCheck)["step.initial_loss"]
    assert codes(result) == {"O1"} and result.status == CheckStatus.WARNING


class CosineHead(nn.Module):
    """ArcFace-style logits: normalised features against normalised class centres, times s=30,
    as at the first step, before any margin is learnt around."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 16))
        self.centres = nn.Parameter(torch.randn(CLASSES, 16))

    def forward(self, x):
        return 30 * F.normalize(self.features(x), dim=1) @ F.normalize(self.centres, dim=1).T


def test_scaled_cosine_logits_start_high_by_design_and_get_a_note(tmp_path):
    result = run(plain_context(tmp_path, model=CosineHead), InitialLossCheck)["step.initial_loss"]
    assert codes(result) == {"O1"} and result.status == CheckStatus.PASSED
    assert result.issues[0].severity.value == "info" and "F.normalize" in result.issues[0].message


# ---------------------------------------------------------------- accumulation
def _summed(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1], reduction="sum")


@pytest.mark.parametrize(("loss", "fires"), [(None, False), (_summed, True)])
def test_accumulation_scaling_is_verified_numerically(tmp_path, loss, fires):
    result = run(plain_context(tmp_path, "trainer.accumulation_steps=2", loss=loss), AccumulationCheck)["step.accumulation"]
    if fires:
        assert codes(result) == {"O9"} and result.data["norm_ratio"] == pytest.approx(0.5, rel=1e-3)
    else:
        assert_quiet(result)
        assert result.data["norm_ratio"] == pytest.approx(1.0, abs=1e-4)


def _indexes_the_whole_batch(model, batch):
    """A loss that reads a fixed row of the batch, as a collated graph's edge index reads node
    rows: cut by rows, the batch no longer holds that row."""
    logits = model(batch[0])
    return F.cross_entropy(logits, batch[1]) + 0.0 * logits[len(batch[0]) - 1 if len(batch[0]) > 8 else 99].sum()


def test_a_batch_that_cannot_be_cut_by_rows_is_not_verified_and_the_check_does_not_crash(tmp_path):
    result = run(plain_context(tmp_path, "trainer.accumulation_steps=2", loss=_indexes_the_whole_batch),
                 AccumulationCheck)["step.accumulation"]
    assert result.status == CheckStatus.PASSED and [issue.severity.value for issue in result.issues] == ["info"]
    assert "not verified: compute_loss raised IndexError on the batch cut into 2 micro-batches" in result.issues[0].message


def _zeroes_gradients(model, batch):
    model.zero_grad()  # "clean slate for each batch": throws the window's earlier micro-batches away
    return F.cross_entropy(model(batch[0]), batch[1])


def test_zero_grad_inside_compute_loss_is_named_as_the_cause(tmp_path):
    ctx = plain_context(tmp_path, "trainer.accumulation_steps=4", loss=_zeroes_gradients)
    result = run(ctx, AccumulationCheck)["step.accumulation"]
    assert codes(result) == {"O9"} and result.status == CheckStatus.ERROR
    assert "zero_grad()" in result.issues[0].message and "Remove the zero_grad()" in result.issues[0].fix
    assert result.data["zero_grad_calls"] == 4


class ClearsGradsInAHook(nn.Module):
    """A forward pre-hook that sets every .grad to None: "free memory before each batch"."""

    def __init__(self):
        super().__init__()
        self.net = classifier()
        self.register_forward_pre_hook(self._clear)

    def _clear(self, module, args):
        for param in self.parameters():
            param.grad = None

    def forward(self, x):
        return self.net(x)


def test_grads_set_to_none_in_a_hook_are_named_as_the_cause(tmp_path):
    ctx = plain_context(tmp_path, "trainer.accumulation_steps=4", model=ClearsGradsInAHook)
    result = run(ctx, AccumulationCheck)["step.accumulation"]
    assert codes(result) == {"O9"} and "p.grad = None" in result.issues[0].message
    assert result.data["cleared_between_micro_batches"] == 3


def test_accumulation_check_only_runs_when_accumulating(tiny_cfg):
    assert not AccumulationCheck.applies(tiny_cfg)


# --------------------------------------------------------------- LR schedule
@pytest.mark.parametrize(("overrides", "scheduler", "severity"), [
    (("scheduler.total_steps=4",), None, "warning"),                 # ends (restarts) halfway
    (("scheduler.total_steps=40",), None, "info"),                   # cut short at its full rate: no annealing
    ((), lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2), "warning"),  # ~0 at step 2
    ((), lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=4), "error"),
    ((), None, None),
])
def test_lr_schedule_length_vs_planned_steps(tmp_path, overrides, scheduler, severity):
    result = run(plain_context(tmp_path, *overrides, scheduler=scheduler), LrScheduleCheck)["config.lr_schedule"]
    if severity is None:
        assert_quiet(result)
    else:
        assert codes(result) == {"O8"} and {i.severity.value for i in result.issues} == {severity}


def test_schedule_findings_tolerate_a_warmup_from_zero():
    points = [(step, min(step / 50, 1.0)) for step in range(100)]
    assert schedule_findings(points, 100, None) == []


def test_a_warmup_stuck_at_zero_by_integer_division_is_named():
    stuck = [(step, min(1, step // 60)) for step in range(100)]  # min(1, step // warmup): 0, then 1
    found = schedule_findings(stuck, 100, None)
    assert [severity for severity, _ in found] == ["warning ramp"]
    assert "first 60 of trainer.max_steps=100" in found[0][1] and "step // warmup_steps" in found[0][1]
    long_ramp = [(step, min((step + 1) / 90, 1.0)) for step in range(100)]  # a float ramp over 90% of the run
    assert schedule_findings(long_ramp, 100, None) == []


def test_a_per_epoch_decay_stepped_per_batch_is_named_with_its_setting():
    from torch.utils.data import DataLoader, TensorDataset

    from optimus_preflight.preflight import run_preflight
    from optimus_preflight.preflight.checks.config_checks import epoch_settings

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    report = run_preflight(model, optimizer, DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))),
                                                        batch_size=16),
                           loss_fn=torch.nn.CrossEntropyLoss(), max_steps=300,
                           scheduler=torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.95),
                           checks=[LrScheduleCheck()])
    issue = next(i for i in report.check("config.lr_schedule").issues if i.code == "O8")
    assert "ExponentialLR(gamma=0.95)" in issue.message and "under 1% after 90 steps" in issue.message
    assert "0.95 ** (1 / len(train_loader))" in issue.fix
    step = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters(), lr=0.1), step_size=10, gamma=0.5)
    assert "step_size=10 counts batches" in epoch_settings(step)[0]
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters(), lr=0.1), lambda s: 0.9 ** s)
    assert epoch_settings(lambda_lr) is None


def test_a_scheduler_built_on_an_optimizer_that_was_rebuilt_is_an_error():
    from torch.utils.data import DataLoader, TensorDataset

    from optimus_preflight.preflight import run_preflight

    model = torch.nn.Linear(4, 2)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), batch_size=16)

    def lr_issues(optimizer, scheduler):
        report = run_preflight(model, optimizer, loader, loss_fn=torch.nn.CrossEntropyLoss(), max_steps=100,
                               scheduler=scheduler, checks=[LrScheduleCheck()])
        return {i.code for i in report.check("config.lr_schedule").issues}

    first = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(first, lambda step: min(1.0, (step + 1) / 10))
    assert "SCHEDULER_OTHER_OPTIMIZER" in lr_issues(torch.optim.SGD(model.parameters(), lr=0.1), scheduler)
    assert "SCHEDULER_OTHER_OPTIMIZER" not in lr_issues(first, scheduler)


# ------------------------------------------------------------------- overfit
def test_overfit_smoke_passes_when_the_loop_can_memorise(tmp_path):
    result = run(plain_context(tmp_path, "preflight.overfit_steps=40", "optimizer.lr=0.01"), OverfitCheck)["step.overfit"]
    assert_quiet(result)
    assert result.data["best_loss"] < 0.5 * result.data["first_loss"]


def test_overfit_smoke_fails_when_only_a_bias_learns(tmp_path):
    ctx = plain_context(tmp_path, "preflight.overfit_steps=40",
                         optimizer=lambda m: torch.optim.AdamW([m[2].bias], lr=0.05))
    result = run(ctx, OverfitCheck)["step.overfit"]
    assert codes(result) == {"O1"} and result.status == CheckStatus.ERROR


# ------------------------------------------------------------------ checkpoint
class Opaque:
    """Not a type torch.load(weights_only=True) accepts."""


class LambdaWithState:
    def __init__(self):
        self.note = Opaque()

    def __call__(self, step):
        return 1.0


def test_checkpoint_round_trip(tmp_path):
    result = run(plain_context(tmp_path), CheckpointRoundTripCheck)["step.checkpoint"]
    assert_quiet(result)
    assert result.data["bytes"] > 0
    assert not list((tmp_path / "run").glob(".preflight-ckpt-*"))  # the temp dir is gone
    broken = plain_context(tmp_path, scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, LambdaWithState()))
    result = run(broken, CheckpointRoundTripCheck)["step.checkpoint"]
    assert codes(result) == {"CKPT_LOAD"}


# ------------------------------------------------------------------ throughput
def _compute_heavy_classifier():
    return nn.Sequential(nn.Linear(FEATURES, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, CLASSES))


class _SlowerThanTheStepCollate:
    """Loading always takes ten times the compute between two fetches (in this
    process, num_workers=0), however fast or loaded the machine is: the wait share
    stays near 90 % instead of depending on how long a fixed sleep is against a step."""

    def __init__(self):
        self.last_return: float | None = None

    def __call__(self, samples):
        now = time.perf_counter()
        compute = now - self.last_return if self.last_return is not None else 0.0
        time.sleep(max(0.02, 10 * compute))
        batch = torch.utils.data.default_collate(samples)
        self.last_return = time.perf_counter()
        return batch


def test_input_bound_burst_warns_and_reports_the_eta(tmp_path):
    collate = _SlowerThanTheStepCollate()
    # A long run: the wait adds up to hours (>= 0.02 s x 0.9 x 100000 steps).
    ctx = plain_context(tmp_path, "trainer.max_steps=100000", "scheduler.warmup_steps=10",
                         loader=lambda data: DataLoader(data, batch_size=16, collate_fn=collate))
    result = run(ctx, ThroughputCheck)["step.throughput"]
    assert codes(result) == {"DATA_BOUND"} and result.data["bound"] == "input-bound"
    assert result.status == CheckStatus.WARNING and result.data["projected_wait_s"] >= MIN_WAIT_WORTH_FIXING_S
    assert "of the" in result.issues[0].message and "ETA" in result.issues[0].message


def test_an_input_bound_run_that_wastes_seconds_is_only_a_note(tmp_path):
    """The same starved loader on an 8-step run: the fix would save well under a minute."""
    collate = _SlowerThanTheStepCollate()
    ctx = plain_context(tmp_path, loader=lambda data: DataLoader(data, batch_size=16, collate_fn=collate))
    result = run(ctx, ThroughputCheck)["step.throughput"]
    assert result.data["bound"] == "input-bound" and result.data["projected_wait_s"] < MIN_WAIT_WORTH_FIXING_S
    assert_quiet(result)
    assert [(issue.code, issue.severity.value) for issue in result.issues] == [("DATA_BOUND", "info")]


def test_a_healthy_compute_bound_burst_is_quiet_and_reports_the_eta(tmp_path):
    # A step that computes far longer than its batch takes to load, whatever the machine's
    # speed (the tiny classifier's step is as short as its data fetch).
    healthy = run(plain_context(tmp_path, model=_compute_heavy_classifier), ThroughputCheck)["step.throughput"]
    assert_quiet(healthy)
    assert healthy.data["eta_s"] == pytest.approx(healthy.data["s_per_step"] * 8, abs=0.01)


class OrderBlindEncoder(nn.Module):
    """Event codes plus a learned position table, then a stack of two blocks and a head."""

    def __init__(self, add_in_place_result: bool, head_reads: int = -1):
        super().__init__()
        self.use_result, self.head_reads = add_in_place_result, head_reads
        self.tokens, self.pos = nn.Embedding(20, 16), nn.Embedding(8, 16)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(16, 2)

    def forward(self, ids):
        h = self.tokens(ids)
        positions = self.pos(torch.arange(ids.shape[1]))
        if self.use_result:
            h = h + positions
        else:
            h.add(positions)  # out of place: the sum is dropped
        states = [h]
        for block in self.blocks:
            states.append(block(states[-1]))
        return self.head(states[self.head_reads].mean(1))


def first_step_issues(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn, check, code: str,
                      lr: float = 1e-3) -> list:
    """The issues of ``code`` that ``check`` reports after the first step on (inputs, targets) batches of 16."""
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=16)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), lr), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), check])
    return [i for i in report.check(check.name).issues if i.code == code]


def _gradient_issue(model: nn.Module) -> list:
    g = torch.Generator().manual_seed(0)
    return first_step_issues(model, torch.randint(0, 20, (64, 8), generator=g), torch.randint(0, 2, (64,), generator=g),
                             nn.CrossEntropyLoss(), GradientsCheck(), "GRAD_NONE")


def test_a_module_whose_output_is_dropped_is_named_as_discarded():
    issues = _gradient_issue(OrderBlindEncoder(add_in_place_result=False))
    assert len(issues) == 1 and "pos.weight" in issues[0].message
    assert "pos ran in the forward" in issues[0].message and "h = h + pos" in issues[0].message
    assert not _gradient_issue(OrderBlindEncoder(add_in_place_result=True))


def test_a_head_that_reads_an_earlier_layer_names_the_layers_that_never_contribute():
    issues = _gradient_issue(OrderBlindEncoder(add_in_place_result=True, head_reads=0))
    assert len(issues) == 1 and "blocks.0, blocks.1" in issues[0].message
    assert "hidden_states[-1]" in issues[0].fix


def _zero_gradient_issues(model: nn.Module, loss_fn, classes: int = 16) -> list:
    g = torch.Generator().manual_seed(0)
    return first_step_issues(model, torch.randn(64, 10, generator=g), torch.randint(0, classes, (64,), generator=g),
                             loss_fn, GradientsCheck(), "GRAD_ZERO")


@pytest.mark.parametrize("cap", [2.0, 100.0])
def test_a_loss_clamped_below_its_start_has_no_gradient_and_names_the_clamp(cap):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))

    def capped(model, batch):
        x, y = batch
        return nn.functional.cross_entropy(model(x), y).clamp(max=cap)  # "against spikes"

    issues = _zero_gradient_issues(model, capped)
    if cap < math.log(16):
        assert len(issues) == 1 and "torch.clamp" in issues[0].message and "clip the gradients" in issues[0].fix
    else:
        assert not issues


@pytest.mark.parametrize("dim", [-1, 1])
def test_attention_pooling_softmaxed_over_its_size_one_dim_names_the_softmax(dim):
    torch.manual_seed(0)

    class AttentionPooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rnn = nn.Embedding(30, 16), nn.GRU(16, 16, batch_first=True)
            self.score, self.head = nn.Linear(16, 1), nn.Linear(16, 4)

        def forward(self, ids):
            states, _ = self.rnn(self.embed(ids))
            weights = torch.softmax(self.score(states), dim=dim)  # (B, T, 1): dim=-1 is the bug
            return self.head((weights * states).sum(dim=1))

    g = torch.Generator().manual_seed(0)
    issues = first_step_issues(AttentionPooled(), torch.randint(0, 30, (64, 12), generator=g),
                               torch.randint(0, 4, (64,), generator=g), nn.CrossEntropyLoss(), GradientsCheck(),
                               "GRAD_ZERO")
    if dim == -1:
        assert len(issues) == 1 and "score.weight" in issues[0].message
        assert "softmax over dim 2 of a (16, 12, 1) tensor" in issues[0].message and "dim=1" in issues[0].fix
    else:
        assert not issues


def test_a_log_softmax_over_one_binary_logit_makes_every_gradient_zero():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 1), nn.LogSoftmax(dim=1))
    issues = _zero_gradient_issues(model, lambda m, b: nn.functional.nll_loss(m(b[0]), torch.zeros_like(b[1])), 1)
    assert len(issues) == 1 and "every gradient of the first step is exactly zero" in issues[0].message
    assert "BCEWithLogitsLoss" in issues[0].fix


@pytest.mark.parametrize("start", ["zeros", "ones"])
def test_a_freeze_mask_hook_built_from_zeros_zeroes_every_row(start):
    torch.manual_seed(0)

    class Basket(nn.Module):
        def __init__(self):
            super().__init__()
            self.items = nn.Embedding(40, 8)
            self.head = nn.Linear(8, 4)
            mask = (torch.zeros if start == "zeros" else torch.ones)(40, 1)
            mask[:10] = 0  # the pretrained rows stay frozen
            self.items.weight.register_hook(lambda grad: grad * mask)

        def forward(self, ids):
            return self.head(self.items(ids).mean(1))

    g = torch.Generator().manual_seed(0)
    issues = first_step_issues(Basket(), torch.randint(10, 40, (64, 5), generator=g), torch.randint(0, 4, (64,), generator=g),
                               nn.CrossEntropyLoss(), GradientsCheck(), "GRAD_ZERO")
    if start == "zeros":
        assert len(issues) == 1 and "items.weight" in issues[0].message and "torch.ones" in issues[0].fix
    else:
        assert not issues


@pytest.mark.parametrize("stored", ["log", "raw"])
def test_a_logit_scale_stored_unlogged_saturates_the_softmax_and_is_named(stored):
    torch.manual_seed(0)
    scale = nn.Parameter(torch.tensor(math.log(1 / 0.07) if stored == "log" else 1 / 0.07))
    a = F.normalize(torch.randn(64, 16), dim=1)
    b = F.normalize(torch.randn(64, 16), dim=1)
    spy = LossSpy()
    with spy:
        F.cross_entropy(scale.exp() * a @ b.T, torch.arange(64))
    finding, _ = init_loss_finding(spy.calls)
    if stored == "raw":
        assert finding is not None and finding.severity == "warning" and "logit_scale" in finding.message
        assert "math.log(1 / 0.07)" in finding.fix
    else:
        assert finding is None or "logit_scale" not in finding.message


@pytest.mark.parametrize("draws", ["reseeded", "private"])
def test_a_loss_that_seeds_the_global_rng_every_call(draws):
    torch.manual_seed(0)
    users, items = nn.Embedding(30, 8), nn.Embedding(100, 8)
    model = nn.ModuleDict({"user_table": users, "item_table": items})
    private = torch.Generator().manual_seed(0)

    def bpr(model, batch):
        user, positive = batch
        if draws == "reseeded":
            torch.manual_seed(0)  # "reproducible negatives"
            negative = torch.randint(0, 100, positive.shape)
        else:
            negative = torch.randint(0, 100, positive.shape, generator=private)
        u = model["user_table"](user)
        scores = (u * model["item_table"](positive)).sum(1) - (u * model["item_table"](negative)).sum(1)
        return -F.logsigmoid(scores).mean()

    g = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randint(0, 30, (256,), generator=g), torch.randint(0, 100, (256,), generator=g)),
                        batch_size=32, shuffle=True)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2), loader, loss_fn=bpr,
                           checks=[FirstBatchCheck(), FirstStepCheck()])
    found = [i for i in report.check("step.first_step").issues if i.code == "LOSS_RESEEDS_RNG"]
    if draws == "reseeded":
        assert len(found) == 1 and "torch.manual_seed(0)" in found[0].message and "generator=g" in found[0].fix
    else:
        assert not found


class SmoothedForTheProgressBar:
    """Returns an exponentially smoothed loss (for logging) instead of the batch's loss."""

    def __init__(self, returns: str):
        self.returns, self.smoothed = returns, None

    def __call__(self, model, batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        previous = loss.detach() if self.smoothed is None else self.smoothed
        self.smoothed = 0.98 * previous.detach() + 0.02 * loss
        return self.smoothed if self.returns == "smoothed" else loss


@pytest.mark.parametrize("returns", ["smoothed", "batch"])
def test_a_loss_function_returning_its_smoothed_logging_value(returns):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(256, 10, generator=g), torch.randint(0, 3, (256,), generator=g)),
                        batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    report = run_preflight(model, torch.optim.SGD(model.parameters(), 0.1), loader,
                           loss_fn=SmoothedForTheProgressBar(returns), checks=[FirstBatchCheck(), FirstStepCheck()])
    found = [i for i in report.check("step.first_step").issues if i.code == "LOSS_MOSTLY_DETACHED"]
    if returns == "smoothed":
        assert len(found) == 1 and "0.02x its gradient" in found[0].message and "loss.item()" in found[0].fix
    else:
        assert not found


class MonitoredMlp(nn.Module):
    """Forward hooks on the ReLUs keep activations for dead-unit monitoring."""

    def __init__(self, hook_returns_copy: bool):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
        self.activations: dict[str, torch.Tensor] = {}
        for name in ("1", "3"):
            def keep(module, args, output, name=name):
                self.activations[name] = output.detach()
                if hook_returns_copy:
                    return self.activations[name]  # replaces the module's output
            self.net[int(name)].register_forward_hook(keep)

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("hook_returns_copy", [True, False], ids=["returns_the_copy", "returns_none"])
def test_a_forward_hook_returning_a_detached_copy_is_named(hook_returns_copy):
    g = torch.Generator().manual_seed(0)
    issues = first_step_issues(MonitoredMlp(hook_returns_copy), torch.randn(64, 8, generator=g),
                               torch.randint(0, 2, (64,), generator=g), nn.CrossEntropyLoss(), GradientsCheck(),
                               "GRAD_NONE")
    assert bool(issues) == hook_returns_copy
    if issues:
        assert "net.0.weight" in issues[0].message and "forward hook on net.1, net.3" in issues[0].message
        assert "REPLACES the module's output" in issues[0].message and "return None" in issues[0].fix


@pytest.mark.parametrize("frozen_by", ["no_grad", "requires_grad"])
def test_layers_run_under_no_grad_in_forward_are_named(frozen_by):
    torch.manual_seed(0)

    class CnnThenHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.cnn = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten())
            self.head = nn.Linear(8, 3)
            if frozen_by == "requires_grad":
                self.cnn.requires_grad_(False)

        def forward(self, x):
            if frozen_by == "no_grad":
                with torch.no_grad():  # "the CNN is only a feature extractor"
                    features = self.cnn(x)
            else:
                features = self.cnn(x)
            return self.head(features)

    g = torch.Generator().manual_seed(0)
    issues = first_step_issues(CnnThenHead(), torch.randn(64, 4, 16, generator=g), torch.randint(0, 3, (64,), generator=g),
                               nn.CrossEntropyLoss(), GradientsCheck(), "GRAD_NONE")
    if frozen_by == "no_grad":
        assert len(issues) == 1 and "cnn.0" in issues[0].message and "torch.no_grad()" in issues[0].message
        assert "Remove the `with torch.no_grad():`" in issues[0].fix
    else:
        assert not issues


@pytest.mark.parametrize("round_trip", ["numpy", "data", "torch"])
def test_a_round_trip_out_of_autograd_in_forward_is_named(round_trip):
    import numpy as np

    torch.manual_seed(0)

    class ClippedEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
            self.head = nn.Linear(16, 3)

        def forward(self, x):
            h = self.encoder(x)
            if round_trip == "numpy":  # .detach() added because .numpy() refused a tensor that requires grad
                h = torch.from_numpy(np.clip(h.detach().numpy(), -1.0, 1.0)).to(x.device)
            elif round_trip == "data":
                h = h.data.clamp(-1.0, 1.0)
            else:
                h = h.clamp(-1.0, 1.0)
            return self.head(h)

    g = torch.Generator().manual_seed(0)
    issues = first_step_issues(ClippedEncoder(), torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g),
                               nn.CrossEntropyLoss(), GradientsCheck(), "GRAD_NONE")
    if round_trip == "torch":
        assert not issues
        return
    assert len(issues) == 1 and "encoder.0" in issues[0].message and "encoder.2" in issues[0].message
    expected = ".detach().numpy() on a (16, 16) tensor" if round_trip == "numpy" else ".data on a (16, 16) tensor"
    assert expected in issues[0].message and "torch.clamp(h, lo, hi)" in issues[0].fix


@pytest.mark.parametrize("straight_through", [False, True])
def test_hard_binary_codes_without_a_straight_through_estimator_are_named(straight_through):
    torch.manual_seed(0)

    class Hashing(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16))
            self.head = nn.Linear(16, 3)

        def forward(self, x):
            s = self.encoder(x)
            bits = (s > 0).float()
            return self.head(s + (bits - s).detach() if straight_through else bits)

    g = torch.Generator().manual_seed(0)
    issues = first_step_issues(Hashing(), torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g),
                               nn.CrossEntropyLoss(), GradientsCheck(), "GRAD_NONE")
    assert bool(issues) == (not straight_through)
    if issues:
        assert "compares a (16, 16) tensor computed from encoder.0, encoder.2 with >" in issues[0].message
        assert "s + ((s > 0).float() - s).detach()" in issues[0].fix


def test_a_stop_gradient_branch_beside_a_trained_one_is_not_blamed():
    torch.manual_seed(0)

    class SimSiamLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.predictor = nn.Linear(8, 16), nn.Linear(16, 16)

        def forward(self, x):
            z = self.encoder(x)
            return self.predictor(z), z.detach()  # stop-gradient on the target branch only

    def loss_fn(model, batch):
        x, _ = batch
        p, z = model(x + 0.1 * torch.randn_like(x))
        return -F.cosine_similarity(p, z, dim=1).mean()

    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(64, 8, generator=g), torch.zeros(64)), batch_size=32)
    model = SimSiamLike()
    report = run_preflight(model, torch.optim.SGD(model.parameters(), 0.1), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    assert [i.code for _, i in report.issues() if i.code == "GRAD_NONE"] == []


@pytest.mark.parametrize("contrastive", [True, False], ids=["in_batch_negatives", "per_pair_loss"])
def test_accumulation_under_a_loss_that_couples_the_batch_names_the_negatives(contrastive):
    from optimus_preflight.preflight import run_preflight
    from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
    from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

    torch.manual_seed(0)
    image, text = torch.nn.Linear(10, 8), torch.nn.Linear(10, 8)
    model = torch.nn.ModuleDict({"image": image, "text": text})
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 10, generator=g)
    pairs = torch.utils.data.TensorDataset(x, x + 0.1 * torch.randn(256, 10, generator=g))

    def clip_loss(m, batch):
        a = torch.nn.functional.normalize(m["image"](batch[0]), dim=1)
        b = torch.nn.functional.normalize(m["text"](batch[1]), dim=1)
        if not contrastive:  # a per-pair cosine loss: no other sample involved
            return (1 - (a * b).sum(1)).mean()
        logits = a @ b.T / 0.07
        return torch.nn.functional.cross_entropy(logits, torch.arange(len(a)))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           torch.utils.data.DataLoader(pairs, batch_size=16), loss_fn=clip_loss,
                           accumulation_steps=4, checks=[FirstBatchCheck(), FirstStepCheck(), AccumulationCheck()])
    issues = [i for i in report.check("step.accumulation").issues if i.code == "O9" and i.severity.value == "error"]
    assert bool(issues) == contrastive
    if issues:
        assert "couples the samples of its batch" in issues[0].message and "GradCache" in issues[0].fix


@pytest.mark.parametrize("summed", [False, True], ids=["mean_over_sampled_negatives", "summed"])
def test_accumulation_with_a_loss_that_draws_its_negatives(summed):
    """Sampled negatives differ between the full batch and its micro-batches: the comparison is
    judged against how much the loss differs from itself; a sum still fires."""
    from optimus_preflight.preflight import run_preflight
    from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
    from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

    torch.manual_seed(0)
    items = torch.nn.Embedding(100, 8)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(512, 8, generator=g), torch.randint(0, 100, (512,), generator=g))

    def sampled_softmax(model, batch):
        user, positive = batch
        negatives = torch.randint(0, 100, (len(user), 16))
        ids = torch.cat([positive[:, None], negatives], 1)
        logits = (model(ids) * user[:, None]).sum(-1)
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(user), dtype=torch.long),
                                                 reduction="sum" if summed else "mean")
        return loss

    report = run_preflight(items, torch.optim.Adam(items.parameters(), 1e-3),
                           torch.utils.data.DataLoader(data, batch_size=64), loss_fn=sampled_softmax,
                           accumulation_steps=2, checks=[FirstBatchCheck(), FirstStepCheck(), AccumulationCheck()])
    check = report.check("step.accumulation")
    errors = [i for i in check.issues if i.code == "O9" and i.severity.value == "error"]
    assert check.data.get("stochastic_loss") and bool(errors) == summed


class TwoTower(nn.Module):
    def __init__(self, score_against_items: bool):
        super().__init__()
        self.against_items = score_against_items
        self.user_tower = nn.Sequential(nn.Embedding(20, 16), nn.Linear(16, 16))
        self.item_tower = nn.Sequential(nn.Embedding(30, 16), nn.Linear(16, 16))

    def forward(self, pairs):
        q, k = self.user_tower(pairs[:, 0]), self.item_tower(pairs[:, 1])
        return q @ (k if self.against_items else q).T  # in-batch logits, positives on the diagonal


def test_a_tower_whose_whole_output_is_dropped_names_the_variable_read_in_its_place():
    g = torch.Generator().manual_seed(0)
    pairs = torch.stack([torch.randint(0, 20, (64,), generator=g), torch.randint(0, 30, (64,), generator=g)], 1)

    def in_batch(model, batch):
        logits = model(batch[0])
        return nn.functional.cross_entropy(logits, torch.arange(len(logits)))

    issues = first_step_issues(TwoTower(False), pairs, pairs[:, 0], lambda m, b: in_batch(m, b), GradientsCheck(),
                               "GRAD_NONE")
    assert len(issues) == 1 and "all of item_tower" in issues[0].message and "q @ q.T" in issues[0].message
    assert not first_step_issues(TwoTower(True), pairs, pairs[:, 0], lambda m, b: in_batch(m, b), GradientsCheck(),
                                 "GRAD_NONE")
