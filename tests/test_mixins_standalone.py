"""Each mixin alone, in a class that is not TrainRecipe, with public types only: the
optimus_dl interface (names, arguments, return shapes) and each mixin's promise."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.config.schema import TrainerConfig
from optimus_preflight.errors import TrainingInterrupted
from optimus_preflight.mixins import (
    PreflightMixin,
    TrainingContextMixin,
    TrainingInterruptionMixin,
    TrainingIterationMixin,
)
from optimus_preflight.recipe import TrainRecipe
from tests.conftest import tiny_config

MIXINS = [TrainingContextMixin, PreflightMixin, TrainingIterationMixin, TrainingInterruptionMixin]


def _data(n: int = 32) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=generator), torch.randint(0, 3, (n,), generator=generator))


def _loss(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def test_the_recipe_is_one_composition_of_the_four():
    assert all(issubclass(TrainRecipe, mixin) for mixin in MIXINS)


def test_no_two_mixins_define_the_same_method():
    seen: dict[str, str] = {}
    for mixin in MIXINS:
        for name, value in vars(mixin).items():
            if callable(value) and not name.startswith("__"):
                assert name not in seen, f"{name} is defined by both {seen[name]} and {mixin.__name__}"
                seen[name] = mixin.__name__


# ------------------------------------------------------------------- context
def test_context_mixin_returns_the_optimus_dl_mapping():
    context = TrainingContextMixin(TrainerConfig(precision="bf16")).setup_training_context(torch.device("cpu"))
    assert {"scaler", "amp_ctx", "amp_cfg", "device"} <= set(context)
    assert context["device"] == torch.device("cpu") and not context["scaler"].is_enabled()
    amp_ctx = context["amp_ctx"]
    for _ in range(2):  # entered step after step, and nested
        with amp_ctx, amp_ctx:
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("given", [
    TrainerConfig(precision="fp16", accumulation_steps=2, device="cpu"),
    {"precision": "fp16", "accumulation_steps": 2},
    SimpleNamespace(amp=SimpleNamespace(enabled=True, dtype="torch.float16"), acc_steps=2, clip_grad_norm=None),
], ids=["TrainerConfig", "mapping", "optimus_dl-shaped"])
def test_every_shape_of_optimization_config_is_read(given):
    host = TrainingContextMixin(given)
    assert host.optimization_config.precision == "fp16" and host.optimization_config.accumulation_steps == 2


def test_a_composed_configs_trainer_node_is_kept_live():
    cfg = tiny_config()
    host = TrainingContextMixin(cfg)
    cfg.trainer.max_steps = 7
    assert host.optimization_config.max_steps == 7


# ----------------------------------------------------------------- iteration
class Iteration(TrainingIterationMixin):
    pass


def test_accumulated_iteration_equals_one_full_batch_step():
    full_model, accumulated_model = _model(), _model()
    full = Iteration(TrainerConfig(accumulation_steps=1))
    accumulated = Iteration(TrainerConfig(accumulation_steps=4))
    full_opt = torch.optim.SGD(full_model.parameters(), lr=0.5)
    acc_opt = torch.optim.SGD(accumulated_model.parameters(), lr=0.5)
    full.run_training_iteration(full_model, full_opt, _loss, iter(DataLoader(_data(), batch_size=32)), None)
    result = accumulated.run_training_iteration(accumulated_model, acc_opt, _loss, iter(DataLoader(_data(), batch_size=8)), None)
    assert result.micro_batches == 4 and result.stepped
    torch.testing.assert_close(accumulated_model.weight, full_model.weight, rtol=1e-6, atol=1e-7)


def test_training_batches_cross_epochs_and_commit_only_completed_steps():
    host = Iteration(TrainerConfig(accumulation_steps=3), log_freq=1)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    batches = host.training_batches(DataLoader(_data(), batch_size=8))  # 4 batches per epoch: windows 3 + 1
    for _ in range(3):
        host.run_training_iteration(model, optimizer, _loss, batches, None)
    assert batches.position.epoch == 1 and batches.position.samples_consumed == 24
    assert {"loss", "grad_norm", "learning_rate", "perf/forward_ms"} <= set(host.training_metrics)


def test_a_stop_mid_window_abandons_it_and_keeps_the_boundary():
    host = Iteration(TrainerConfig(accumulation_steps=4))
    model = _model()
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = host.training_batches(DataLoader(_data(), batch_size=8))
    batches.should_stop = lambda: True
    assert host.run_training_iteration(model, optimizer, _loss, batches, None) is None
    assert torch.equal(model.weight, before) and model.weight.grad is None
    assert batches.position.samples_consumed == 0 and batches.windows_committed == 0


def test_optimus_dl_criteria_and_the_step_in_parts():
    host = Iteration(TrainerConfig())
    context = TrainingContextMixin(TrainerConfig(precision="fp32")).setup_training_context("cpu")
    model, optimizer = _model(), None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batch = next(iter(DataLoader(_data(), batch_size=8)))

    def criterion(model, batch):  # optimus_dl's shape: (loss, exposed protocols)
        return _loss(model, batch), {"logits": None}

    forward = host.execute_forward_pass(model, criterion, batch, context["amp_ctx"])
    assert forward.exposed_protocols == {"logits": None} and forward.elapsed_time >= 0
    host.execute_backward_pass(forward.loss, context["scaler"])
    step = host.execute_optimizer_step(optimizer, model, context["scaler"], clip_grad_norm=1e-3)
    assert float(step.grad_norm) > 1e-3
    # The same step through run_training_iteration with the same criterion.
    twin, twin_opt = _model(), None
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    Iteration(TrainerConfig(clip_grad_norm=1e-3)).run_training_iteration(twin, twin_opt, criterion, iter([batch]), context)
    torch.testing.assert_close(twin.weight, model.weight)


def test_a_loader_instead_of_an_iterator_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="training_batches"):
        Iteration().run_training_iteration(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), _loss,
                                           DataLoader(_data(), batch_size=8), None)


# -------------------------------------------------------------- interruption
class OwnStep(TrainingInterruptionMixin):
    """A loop whose step is the user's own; ``stop_at``: a SIGUSR1 arrives in the
    user's code after that step."""

    def fit(self, steps: int, stop_at: int = 0) -> torch.Tensor:
        torch.manual_seed(0)
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loader = DataLoader(_data(), batch_size=4, shuffle=True)
        for step in self.training_steps(steps, model=model, optimizer=optimizer, batches=loader):
            loss = _loss(model, self.next_batch())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step == stop_at:
                signal.raise_signal(signal.SIGUSR1)
        return model.weight.detach().clone()


def test_a_signal_in_user_code_checkpoints_and_the_rerun_resumes_bit_exact(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    whole = OwnStep(save_freq=4, output_path=tmp_path / "whole").fit(20)
    calls = []
    stopped = OwnStep(save_freq=4, output_path=tmp_path / "run",
                      checkpoint_callback=lambda **kwargs: calls.append(kwargs["iteration"]))
    with pytest.raises(TrainingInterrupted) as raised:
        stopped.fit(20, stop_at=11)
    assert isinstance(raised.value, SystemExit) and raised.value.code == 128 + signal.SIGUSR1
    assert raised.value.step == 11 and calls == [4, 8, 11]
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are given back
    resumed = OwnStep(save_freq=4, output_path=tmp_path / "run").fit(20)
    assert torch.equal(resumed, whole)


class SignalsOnRead(TensorDataset):
    """Raises SIGUSR1 inside the DataLoader's fetch of its ``at``-th item read: the stop
    lands inside a wait for data, at a moment a test can choose exactly."""

    def __init__(self, at: int):
        super().__init__(*_data().tensors)
        self.reads, self.at = 0, at

    def __getitem__(self, index):
        self.reads += 1
        if self.reads == self.at:
            signal.raise_signal(signal.SIGUSR1)
        return super().__getitem__(index)


class OwnStepOverEpochs(OwnStep):
    def fit(self, steps: int, dataset: TensorDataset | None = None) -> torch.Tensor:
        torch.manual_seed(0)
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loader = DataLoader(dataset if dataset is not None else _data(), batch_size=4, shuffle=True)
        for _ in self.training_steps(steps, model=model, optimizer=optimizer, batches=loader):
            loss = _loss(model, self.next_batch())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model.weight.detach().clone()


@pytest.mark.parametrize("epoch_read", [1, 3])  # the first item of an epoch, or one after it
def test_a_stop_while_the_next_epoch_starts_resumes_every_later_epoch_bit_exact(tmp_path, epoch_read):
    """The 8 steps of epoch 0 are done; the stop comes while step 9 reads epoch 1's first
    batch, after that epoch's iterator drew its shuffle seed from the global RNG. The
    checkpoint is step 8's boundary, so it must not record epoch 1 as started: else the
    resumed run restores the boundary RNG, and epoch 2 draws another order (CI saw it:
    0.29349744 vs 0.29349732 in the README's interruption example)."""
    whole = OwnStepOverEpochs(save_freq=0, output_path=tmp_path / "whole").fit(30)
    with pytest.raises(TrainingInterrupted) as raised:
        OwnStepOverEpochs(output_path=tmp_path / "run").fit(30, SignalsOnRead(at=32 + epoch_read))
    assert raised.value.step == 8
    resumed = OwnStepOverEpochs(output_path=tmp_path / "run").fit(30)
    assert torch.equal(resumed, whole)


def test_handle_training_interruption_saves_at_the_given_iteration(tmp_path):
    host = TrainingInterruptionMixin(output_path=tmp_path)
    model = _model()
    host.setup_interruption(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            batches=DataLoader(_data(), batch_size=4))
    try:
        path = host.handle_training_interruption(7, None)
        assert path.name == "step_00000007" and (path / "manifest.json").exists()
    finally:
        host.close_interruption()


# ------------------------------------------------------------------ preflight
def test_preflight_mixin_alone(tmp_path):
    model = _model()
    host = PreflightMixin()
    report = host.run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                DataLoader(_data(), batch_size=8, shuffle=True), loss_fn=_loss, run_dir=tmp_path)
    assert host.preflight_report is report and report.status in ("passed", "warnings"), report.to_dict()
    assert (tmp_path / "preflight.json").exists()
