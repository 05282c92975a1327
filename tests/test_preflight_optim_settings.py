"""Fires / stays-quiet pairs for optimizer and sampler settings that torch accepts and
silently ignores or misreads: a param group key the optimizer never reads
(OPTIM_GROUP_UNKNOWN_KEY), SGD's dampening (SGD_DAMPENING), per-group lambdas made in a
loop that binds its variable late (LR_LAMBDA_LATE_BINDING), and a WeightedRandomSampler
drawing a whole epoch without replacement (SAMPLER_NO_REPLACEMENT). Each written the
way users write it and run through ``run_preflight``."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, MultiplicativeLR
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.config_checks import LrScheduleCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.model_checks import OptimizerParamsCheck
from optimus_preflight.preflight.checks.sampler_coverage import SamplerCoverageCheck

g = torch.Generator().manual_seed(0)
X = torch.randn(400, 8, generator=g)
Y = torch.cat([torch.zeros(360, dtype=torch.long), torch.ones(40, dtype=torch.long)])  # 90/10


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def issues(model, optimizer, check, code, loader=None, **kwargs):
    loader = loader or DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)
    report = run_preflight(model, optimizer, loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), check], **kwargs)
    return [issue for _, issue in report.issues() if issue.code == code]


# ---------------------------------------------------------------- OPTIM_GROUP_UNKNOWN_KEY

def test_a_head_group_with_learning_rate_runs_at_the_default_lr():
    model = net()
    optimizer = torch.optim.SGD([{"params": model[0].parameters()},
                                 {"params": model[2].parameters(), "learning_rate": 0.05}], lr=0.001, momentum=0.9)
    found = issues(model, optimizer, OptimizerParamsCheck(), "OPTIM_GROUP_UNKNOWN_KEY")
    assert len(found) == 1 and found[0].severity.value == "warning"
    assert "parameter group 1" in found[0].message and "'learning_rate': 0.05" in found[0].message
    assert "lr=0.001 (group['lr'], the optimizer's default)" in found[0].message
    assert "{'params': ..., 'lr': 0.05}" in found[0].fix


def test_keras_names_on_adam_are_folded_into_betas_and_eps():
    model = net()
    optimizer = torch.optim.Adam([{"params": model.parameters(), "beta1": 0.5, "epsilon": 1e-6, "wd": 0.01}],
                                 lr=2e-4)
    found = issues(model, optimizer, OptimizerParamsCheck(), "OPTIM_GROUP_UNKNOWN_KEY")
    assert len(found) == 1
    assert "betas=(0.9, 0.999)" in found[0].message and "eps=1e-08" in found[0].message
    assert "'betas': (0.5, 0.999)" in found[0].fix and "'eps': 1e-06" in found[0].fix
    assert "'weight_decay': 0.01" in found[0].fix


def test_sgd_momentum_left_in_a_group_after_switching_to_adam():
    model = net()
    optimizer = torch.optim.Adam([{"params": model.parameters(), "lr": 1e-3, "momentum": 0.8}])
    found = issues(model, optimizer, OptimizerParamsCheck(), "OPTIM_GROUP_UNKNOWN_KEY")
    assert len(found) == 1 and "'betas': (0.8, 0.999)" in found[0].fix


def test_groups_with_the_real_keys_and_the_keys_schedulers_add_are_quiet():
    model = net()
    optimizer = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.01, "name": "body", "layer_id": 0},
                                 {"params": model[2].parameters(), "lr": 0.1, "lr_scale": 1.0}],
                                lr=0.1, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[0.01, 0.1], total_steps=100)
    assert issues(model, optimizer, OptimizerParamsCheck(), "OPTIM_GROUP_UNKNOWN_KEY", scheduler=scheduler) == []
    assert {"initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum"} <= set(optimizer.param_groups[0])
    named = net()
    adamw = torch.optim.AdamW(named.named_parameters(), lr=1e-3)  # groups carry 'param_names'
    assert issues(named, adamw, OptimizerParamsCheck(), "OPTIM_GROUP_UNKNOWN_KEY") == []


# ---------------------------------------------------------------- SGD_DAMPENING

def test_sgd_dampening_shrinks_every_momentum_step():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.9)
    found = issues(model, optimizer, OptimizerParamsCheck(), "SGD_DAMPENING")
    assert len(found) == 1 and found[0].severity.value == "warning"
    assert "10x smaller" in found[0].message and "dampening=0.9" in found[0].message
    assert "dampening at its default 0" in found[0].fix


def test_the_measured_steps_are_one_over_one_minus_dampening_smaller():
    """The mechanism the message states, on torch's SGD: a constant gradient, 200 steps."""
    steps = {}
    for dampening in (0.0, 0.9):
        w = nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([w], lr=1.0, momentum=0.9, dampening=dampening)
        for _ in range(200):
            before = w.item()
            w.grad = torch.ones(1)
            optimizer.step()
        steps[dampening] = before - w.item()
    assert math.isclose(steps[0.0] / steps[0.9], 10, rel_tol=1e-3)


@pytest.mark.parametrize("settings", [dict(momentum=0.9), dict(momentum=0.9, nesterov=True), dict(dampening=0.5)],
                         ids=["momentum_no_dampening", "nesterov", "dampening_without_momentum"])
def test_sgd_without_dampening_or_without_momentum_is_quiet(settings):
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **settings)
    assert issues(model, optimizer, OptimizerParamsCheck(), "SGD_DAMPENING") == []


# ---------------------------------------------------------------- LR_LAMBDA_LATE_BINDING

def two_groups():
    model = net()
    return model, torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters()}], lr=0.1)


def decay(step: int, rate: float) -> float:
    return rate ** (step / 100)


def test_per_group_lambdas_from_a_comprehension_all_read_the_last_rate():
    model, optimizer = two_groups()
    rates = [0.5, 0.9]
    scheduler = LambdaLR(optimizer, [lambda step: decay(step, rate) for rate in rates])  # noqa: B023 (the defect)
    found = issues(model, optimizer, LrScheduleCheck(), "LR_LAMBDA_LATE_BINDING", scheduler=scheduler,
                   max_steps=500)
    assert len(found) == 1 and found[0].severity.value == "error"
    assert "rate=0.9" in found[0].message and "both parameter groups get the same factors" in found[0].message
    assert "lambda step, rate=rate" in found[0].fix and "functools.partial" in found[0].fix


def test_per_group_lambdas_appended_in_a_for_loop_inside_a_function():
    def build(optimizer):
        factors = []
        for rate in (0.5, 0.9):
            factors.append(lambda step: rate ** step)  # noqa: B023 (the defect)
        return MultiplicativeLR(optimizer, factors)

    model, optimizer = two_groups()
    found = issues(model, optimizer, LrScheduleCheck(), "LR_LAMBDA_LATE_BINDING", scheduler=build(optimizer),
                   max_steps=200)
    assert len(found) == 1


@pytest.mark.parametrize("make", [
    lambda rates: [lambda step, rate=rate: decay(step, rate) for rate in rates],
    lambda rates: [functools.partial(decay, rate=rate) for rate in rates],
], ids=["default_argument", "partial"])
def test_lambdas_that_bind_their_rate_are_quiet(make):
    model, optimizer = two_groups()
    scheduler = LambdaLR(optimizer, make([0.5, 0.9]))
    assert issues(model, optimizer, LrScheduleCheck(), "LR_LAMBDA_LATE_BINDING", scheduler=scheduler,
                  max_steps=500) == []


def test_one_function_for_every_group_is_quiet():
    model, optimizer = two_groups()
    scheduler = LambdaLR(optimizer, lambda step: 0.99 ** step)  # torch repeats the one function per group
    assert scheduler.lr_lambdas[0] is scheduler.lr_lambdas[1]
    assert issues(model, optimizer, LrScheduleCheck(), "LR_LAMBDA_LATE_BINDING", scheduler=scheduler,
                  max_steps=500) == []


def test_a_factory_called_per_group_with_the_same_value_is_quiet():
    def warmup(steps):
        return lambda step: min(1.0, (step + 1) / steps)

    model, optimizer = two_groups()
    scheduler = LambdaLR(optimizer, [warmup(50) for _ in optimizer.param_groups])
    assert issues(model, optimizer, LrScheduleCheck(), "LR_LAMBDA_LATE_BINDING", scheduler=scheduler,
                  max_steps=500) == []


# ---------------------------------------------------------------- LR_LAMBDA_RETURNS_LR

@pytest.mark.parametrize("form", ["returns_the_lr", "returns_a_factor", "absolute_with_base_1", "warmup_to_the_lr"])
def test_a_lambda_that_returns_the_learning_rate_itself(form):
    lr = 1.0 if form == "absolute_with_base_1" else 3e-3
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    lam = {"returns_the_lr": lambda step: 3e-3 * 0.98 ** (step / 10),
           "returns_a_factor": lambda step: 0.98 ** (step / 10),
           "absolute_with_base_1": lambda step: 3e-3 * 0.98 ** (step / 10),  # Adam(lr=1): the deliberate form
           "warmup_to_the_lr": lambda step: 3e-3 * min(1.0, (step + 1) / 50)}[form]
    found = issues(model, optimizer, LrScheduleCheck(), "LR_LAMBDA_RETURNS_LR", scheduler=LambdaLR(optimizer, lam),
                   max_steps=300)
    assert bool(found) == (form in ("returns_the_lr", "warmup_to_the_lr"))
    if found:
        assert "9e-06" in found[0].message and "333x too small" in found[0].message
        assert "only the multiplicative factor" in found[0].fix


# ---------------------------------------------------------------- SAMPLER_NO_REPLACEMENT

def balanced_loader(num_samples: int, replacement: bool) -> DataLoader:
    weights = (1.0 / torch.bincount(Y).double())[Y]
    sampler = WeightedRandomSampler(weights, num_samples=num_samples, replacement=replacement)
    return DataLoader(TensorDataset(X, Y), batch_size=32, sampler=sampler)


def test_weighted_sampling_without_replacement_over_the_whole_epoch_does_not_rebalance():
    model = net()
    found = issues(model, torch.optim.SGD(model.parameters(), lr=0.1), SamplerCoverageCheck(),
                   "SAMPLER_NO_REPLACEMENT", loader=balanced_loader(len(Y), replacement=False))
    assert len(found) == 1 and found[0].severity.value == "warning"
    assert "replacement=False" in found[0].message and "reorder" in found[0].message
    assert "replacement=True" in found[0].fix
    # The mechanism: the epoch is every sample once, the minority share still 10%.
    drawn = torch.tensor(list(balanced_loader(len(Y), replacement=False).sampler))
    assert len(set(drawn.tolist())) == len(Y) and Y[drawn].float().mean().item() == pytest.approx(0.1)


@pytest.mark.parametrize("num_samples, replacement", [(400, True), (100, False)],
                         ids=["with_replacement", "weighted_subsample"])
def test_with_replacement_or_a_weighted_subsample_is_quiet(num_samples, replacement):
    model = net()
    assert issues(model, torch.optim.SGD(model.parameters(), lr=0.1), SamplerCoverageCheck(),
                  "SAMPLER_NO_REPLACEMENT", loader=balanced_loader(num_samples, replacement)) == []


@pytest.mark.parametrize(("eta_min", "fires"), [(0.1, True), (1e-4, False)])
def test_cosine_eta_min_given_as_a_ratio_raises_the_lr(eta_min, fires):
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200, eta_min=eta_min)
    found = issues(model, optimizer, LrScheduleCheck(), "O8", scheduler=scheduler, max_steps=200)
    above = [i for i in found if "eta_min" in i.message]
    assert bool(above) == fires
    if fires:
        assert "eta_min = ratio * lr" in above[0].fix


@pytest.mark.parametrize("capped", [False, True])
def test_a_warm_up_lambda_without_a_cap_keeps_raising_the_lr(capped):
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    warmup = 10
    ramp = (lambda step: min(1.0, (step + 1) / warmup)) if capped else (lambda step: (step + 1) / warmup)
    found = issues(model, optimizer, LrScheduleCheck(), "O8", scheduler=LambdaLR(optimizer, ramp), max_steps=300)
    assert bool(found) == (not capped)
    if found:
        (issue,) = found
        assert "the LambdaLR factor never stops rising" in issue.message and "30x the optimizer's lr" in issue.message
        assert "min(1.0, (step + 1) / warmup_steps)" in issue.fix


def test_a_lambda_that_peaks_and_decays_above_the_lr_keeps_the_units_message():
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = LambdaLR(optimizer, lambda step: 50.0 * 0.99 ** step)  # a peak LR given as the factor
    (issue,) = issues(model, optimizer, LrScheduleCheck(), "O8", scheduler=scheduler, max_steps=300)
    assert "wrong units" in issue.message and "never stops rising" not in issue.message


def test_one_cycle_peaks_above_the_optimizer_lr_by_design():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=200)
    assert not [i for i in issues(model, optimizer, LrScheduleCheck(), "O8", scheduler=scheduler, max_steps=200)
                if "x the optimizer's lr" in i.message]


# ---------------------------------------------------------------- schedules that go negative or compound
def test_a_linear_decay_lambda_past_its_length_goes_negative():
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    decay_steps = 150  # three epochs of 50 batches, while the run is 300 optimizer steps
    scheduler = LambdaLR(optimizer, lambda step: 1 - step / decay_steps)
    found = issues(model, optimizer, LrScheduleCheck(), "O8", scheduler=scheduler, max_steps=300)
    assert len(found) == 1 and found[0].severity.value == "error"
    assert "becomes negative at step 151" in found[0].message and "max(0.0, 1 - step / total_steps)" in found[0].fix


def test_a_cosine_shape_given_to_multiplicative_lr_compounds():
    model = net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cosine = lambda step: 0.5 * (1 + math.cos(math.pi * step / 300))  # noqa: E731
    found = issues(model, optimizer, LrScheduleCheck(), "O8", scheduler=MultiplicativeLR(optimizer, cosine),
                   max_steps=300)
    assert len(found) == 1 and "the factors compound" in found[0].message and "LambdaLR" in found[0].fix


@pytest.mark.parametrize("make", [lambda opt: MultiplicativeLR(opt, lambda step: 0.99),
                                  lambda opt: LambdaLR(opt, lambda step: max(0.0, 1 - step / 300))],
                         ids=["constant_factor", "clamped_linear_decay"])
def test_a_constant_multiplicative_factor_or_a_clamped_decay_is_quiet(make):
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    found = issues(model, optimizer, LrScheduleCheck(), "O8", scheduler=make(optimizer), max_steps=300)
    assert not [issue for issue in found if "negative" in issue.message or "compound" in issue.message]


# ---------------------------------------------------------------- LR_LAYER_DECAY
def layered_groups(model: nn.Module, layer_decay: float, lr: float = 2e-3) -> list[dict]:
    layers = [module for module in model if any(True for _ in module.parameters())]
    return [{"params": list(layer.parameters()), "lr": lr * layer_decay ** depth}
            for depth, layer in enumerate(reversed(layers))]


@pytest.mark.parametrize("layer_decay, fires", [(0.1, True), (0.9, False), (0.65, False)],
                         ids=["share_lost_per_layer", "kept_0.9", "kept_0.65"])
def test_a_layer_decay_given_as_the_share_lost_per_layer(layer_decay, fires):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(layered_groups(model, layer_decay))
    found = issues(model, optimizer, OptimizerParamsCheck(), "LR_LAYER_DECAY")
    assert bool(found) == fires
    if fires:
        assert "0.1 per group" in found[0].message and "0.weight" in found[0].message and "0.9" in found[0].fix


def test_a_two_rate_fine_tune_is_quiet():
    model = net()
    optimizer = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 1e-5},
                                   {"params": model[2].parameters(), "lr": 1e-3}])
    assert issues(model, optimizer, OptimizerParamsCheck(), "LR_LAYER_DECAY") == []


@pytest.mark.parametrize("batch_size, fires", [(32, True), (len(X), False)], ids=["mini_batches", "full_batch"])
def test_rprop_on_mini_batches(batch_size, fires):
    model = net()
    optimizer = torch.optim.Rprop(model.parameters(), lr=0.01)
    found = issues(model, optimizer, OptimizerParamsCheck(), "RPROP_MINIBATCH",
                   loader=DataLoader(TensorDataset(X, Y), batch_size=batch_size, shuffle=True))
    assert bool(found) == fires
    if found:
        assert "full-batch method" in found[0].message and "Adam" in found[0].fix


def test_a_cosine_with_t_max_in_epochs_stepped_per_batch_is_named_as_cycling():
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)  # 10 epochs, stepped per batch
    found = issues(model, optimizer, LrScheduleCheck(), "O8", scheduler=scheduler, max_steps=600)
    (issue,) = [i for i in found if "climbs back" in i.message]
    assert "reaches 0 at step 10" in issue.message and "cycles between its peak and ~0" in issue.message
    assert "T_max" in issue.message + issue.fix
