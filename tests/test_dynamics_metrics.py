"""Dynamics metrics against hand computations on tiny models, and their cadence."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from optimus_preflight.dynamics.hooks import ActivationProbe
from optimus_preflight.dynamics.measures import activation_modules, skip_rate, snapshot_groups, update_ratios
from optimus_preflight.dynamics.monitor import DynamicsMonitor
from optimus_preflight.reporting.progress import Progress
from optimus_preflight.reporting.sinks import MetricsLogger
from optimus_preflight.reporting.step_log import StepLogger
from tests.step_helpers import make_runner, mean_squared_error, window


class ListSink:
    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)

    def close(self):
        pass


class HistogramRecorder:
    def __init__(self):
        self.tags: list[tuple[str, int]] = []

    def histogram(self, tag, values, step):
        assert torch.isfinite(values).all()
        self.tags.append((tag, step))


def attach(runner, monitor) -> list[int]:
    """What DynamicsCallback does at before_optimizer_step: the returned list holds the
    step the runner is in."""
    current = [0]
    runner.optimizer_step_hooks.append(lambda: monitor.before_optimizer_step(current[0]))
    return current


def drive(runner, monitor, batches, steps, *, every_n_steps=1):
    """The training loop's step/log sequence, with the real StepLogger and the dynamics
    callback's parts."""
    sink = ListSink()
    current = attach(runner, monitor)
    logger = StepLogger(
        MetricsLogger([sink]),
        Progress("none", steps),
        every_n_steps=every_n_steps,
        device=torch.device("cpu"),
        scaler=runner.scaler,
        group_names=monitor.group_names if monitor else ["0"],
        wants_record=monitor.measures,
        extend_record=lambda step, result, record: record.update(
            monitor.on_logged_step(step, result, record["skipped_steps"], record["loss"])),
    )
    skipped = 0
    for step in range(1, steps + 1):
        current[0] = step
        result = runner.run(window(batches))
        skipped += not result.stepped
        logger.on_step(step, result, skipped)
        monitor.prepare(step + 1)
    logger.close()
    monitor.close()
    return sink.records


def test_update_ratio_matches_hand_computation_per_group():
    weight = nn.Parameter(torch.tensor([[3.0, 4.0]]))  # ||W|| = 5
    bias = nn.Parameter(torch.tensor([2.0]))
    optimizer = torch.optim.SGD([{"params": [weight], "lr": 0.1}, {"params": [bias], "lr": 0.5}])
    before = snapshot_groups(optimizer)
    weight.grad = torch.tensor([[1.0, 2.0]])  # ||g|| = sqrt(5)
    bias.grad = torch.tensor([-1.0])
    optimizer.step()
    ratios = update_ratios(optimizer, before, ["decay", "no_decay"])
    assert ratios["decay"] == pytest.approx(0.1 * math.sqrt(5) / 5)
    assert ratios["no_decay"] == pytest.approx(0.5 * 1.0 / 2.0)


def test_update_ratio_norms_span_the_whole_group_and_skip_zero_weights():
    a = nn.Parameter(torch.tensor([1.0, 0.0]))
    b = nn.Parameter(torch.tensor([[0.0], [2.0]]))
    zero = nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([{"params": [a, b]}, {"params": [zero]}], lr=1.0)
    before = snapshot_groups(optimizer)
    with torch.no_grad():
        a.add_(torch.tensor([0.0, 0.3]))
        b.add_(torch.tensor([[0.4], [0.0]]))
        zero.add_(1.0)
    ratios = update_ratios(optimizer, before, ["g", "z"])
    assert ratios == {"g": pytest.approx(0.5 / math.sqrt(5))}  # sqrt(.09+.16) / sqrt(1+4)


def test_activation_probe_counts_zeros_over_micro_batches_in_training_mode_only():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1), nn.GELU())
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(2))
        model[0].bias.zero_()
    probe = ActivationProbe(activation_modules(model), keep_samples=True)
    model(torch.tensor([[1.0, -1.0], [-2.0, -3.0]]))  # relu out: [[1,0],[0,0]] -> 3 zeros of 4
    model(torch.tensor([[1.0, 1.0]]))  # 0 zeros of 2
    model.eval()
    model(torch.tensor([[-1.0, -1.0]]))  # eval forwards do not count
    model.train()
    assert probe.dead_fractions() == {"1": pytest.approx(3 / 6)}
    assert set(probe.samples) == {"1", "3"}  # every activation is sampled for histograms
    assert torch.equal(probe.samples["1"], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    probe.remove()
    assert all(not module._forward_hooks for module in model.modules())


def test_skip_rate_is_the_share_of_steps_since_the_last_measurement():
    assert skip_rate(7, 4, 60, 50) == pytest.approx(0.3)
    assert skip_rate(0, 0, 5, 5) == 0.0


def _relu_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 3, generator=generator), torch.randn(8, 2, generator=generator)


def test_monitor_measures_only_its_steps_and_leaves_nothing_attached_between():
    model = _relu_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    runner, _ = make_runner(model, mean_squared_error, optimizer=optimizer)
    histograms = HistogramRecorder()
    monitor = DynamicsMonitor(model, optimizer, runner.scaler, every_n_steps=3, group_names=["all"], max_steps=7, histograms=histograms)
    batch = _batch()
    seen = []
    current = attach(runner, monitor)
    for step in range(1, 8):
        current[0] = step
        armed = monitor.measures(step)
        hooked = any(module._forward_hooks for module in model.modules())
        assert armed == hooked == (step % 3 == 0)
        weights = [p.detach().clone() for p in model.parameters()]
        result = runner.run(window([batch]))
        if monitor.measures(step):
            metrics = monitor.on_logged_step(step, result, 0, result.loss.item())
            delta = math.sqrt(sum(float((p.detach() - w).pow(2).sum()) for p, w in zip(model.parameters(), weights)))
            norm = math.sqrt(sum(float(w.pow(2).sum()) for w in weights))
            assert metrics["update_ratio/all"] == pytest.approx(delta / norm, rel=1e-5)
            seen.append(step)
        else:
            monitor.prepare(step + 1)
    assert seen == [3, 6]
    assert not monitor.measures(9) and not any(m._forward_hooks for m in model.modules())  # step 9 > max_steps
    tags = {tag for tag, _ in histograms.tags}
    assert {"weights/0.weight", "grads/0.weight", "activations/1"} <= tags
    assert {step for _, step in histograms.tags} == {3, 6}


def test_dead_fraction_and_scale_keys_through_the_step_logger():
    model = _relu_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # fixed weights: the hand count holds at every step
    runner, _ = make_runner(model, mean_squared_error, optimizer=optimizer, precision="fp16")
    monitor = DynamicsMonitor(model, optimizer, runner.scaler, every_n_steps=2, group_names=["all"], precision="fp16")
    probe_input = _batch()[0]
    records = drive(runner, monitor, [_batch()], 4, every_n_steps=4)
    # Dynamics steps are logged even between logging steps (step 1 always is); others stay unlogged.
    assert [r["step"] for r in records] == [1, 2, 4]
    with torch.autocast("cpu", dtype=torch.float16):
        hidden = model[1](model[0](probe_input))
    assert records[-1]["dead_fraction/1"] == float((hidden == 0).sum()) / hidden.numel()
    assert records[-1]["grad_scale"] == runner.scaler.get_scale()
    assert records[-1]["skip_rate"] == 0.0 and "warnings" not in records[-1]


def test_monitor_never_stays_attached_past_a_step_it_missed():
    model = _relu_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    runner, _ = make_runner(model, mean_squared_error, optimizer=optimizer)
    monitor = DynamicsMonitor(model, optimizer, runner.scaler, every_n_steps=3, group_names=["all"], start_step=2)
    assert monitor.measures(3)
    monitor.prepare(5)  # step 3 was never reported (an interrupted window, say)
    assert not monitor.measures(3)
    assert not any(module._forward_hooks for module in model.modules())
    monitor.prepare(6)
    assert monitor.measures(6)
    monitor.close()
    assert not monitor.measures(6) and not any(module._forward_hooks for module in model.modules())
