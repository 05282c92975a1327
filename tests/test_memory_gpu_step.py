"""check_model_gpu_memory: the CPU-side report, state restoration, and the real GPU step."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from optimus_preflight.memory import check_model_gpu_memory, estimate_step_memory, gpu_step_report
from optimus_preflight.memory.gpu_step import restored_training_state, run_synthetic_steps
from optimus_preflight.memory.steps import run_training_steps
from optimus_preflight.memory.tracker import StorageTracker
from tests.memory_models import OPTIMIZERS, TinyTransformer, cases, lm_loss

CONF = OmegaConf.create({"trainer": {"precision": "fp32", "accumulation_steps": 1}})


def test_without_cuda_it_logs_the_cpu_estimate_instead_of_skipping(caplog):
    model_fn, batch, loss_fn = cases()["transformer"]
    model = model_fn()
    optimizer = OPTIMIZERS["adamw"](model.parameters())
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        check_model_gpu_memory(CONF, model, optimizer, batch=batch, loss_fn=loss_fn)
    if not torch.cuda.is_available():
        assert "no CUDA device: predicted CPU-side peak" in caplog.text
    report = gpu_step_report(CONF, model, optimizer, batch=batch, loss_fn=loss_fn)
    # The fake copy of the live model predicts what the model's own factory predicts.
    from_factory = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["adamw"])
    assert report.predicted.method == "fake" and report.predicted.peak_bytes == from_factory.peak_bytes


def test_it_needs_a_batch_and_only_runs_on_rank_0(caplog):
    model = TinyTransformer()
    optimizer = OPTIMIZERS["adamw"](model.parameters())
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        check_model_gpu_memory(CONF, model, optimizer)
        check_model_gpu_memory(CONF, model, optimizer, rank=1, batch=cases()["transformer"][1])
    assert "no batch given" in caplog.text
    assert "predicted" not in caplog.text


def test_synthetic_steps_leave_weights_buffers_optimizer_and_rng_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    batch = (torch.randn(4, 8), torch.randint(0, 2, (4,)))

    def loss_fn(m, b):
        return nn.functional.cross_entropy(m(b[0]), b[1])

    # One real step first, so there is optimizer state to preserve.
    run_training_steps(model, optimizer, lambda: batch, loss_fn, None, steps=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state_before = {k: v.clone() for k, v in optimizer.state[model[0].weight].items()}
    model.eval()
    random.seed(1)
    torch.manual_seed(1)
    with restored_training_state(model, optimizer):
        model.train()
        run_training_steps(model, optimizer, lambda: batch, loss_fn, None, steps=2)
        assert not torch.equal(model[0].weight, before["0.weight"])
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert all(torch.equal(optimizer.state[model[0].weight][k], v) for k, v in state_before.items())
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert random.random() == random.Random(1).random()
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(1)))


@pytest.mark.gpu
def test_gpu_step_measures_the_peak_and_restores_the_model():
    device = torch.device("cuda")
    torch.manual_seed(0)
    # ~120M parameters: large enough that the cuBLAS workspace allowance is a few percent.
    model = TinyTransformer(vocab=8192, d=1024, layers=8, heads=8, block=256).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = (torch.randint(0, 8192, (8, 256)), torch.randint(0, 8192, (8, 256)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    conf = OmegaConf.create({"trainer": {"precision": "bf16", "accumulation_steps": 1}})
    report = gpu_step_report(conf, model, optimizer, batch=batch, loss_fn=lm_loss)
    assert report.measured_peak_bytes > 0
    assert abs(report.error) < 0.10, report.describe()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert not optimizer.state


class TrackerMeter:
    """Stands in for CudaPeakMeter on the CPU: live storage bytes of the real steps."""

    def __init__(self, model):
        self.tracker = StorageTracker()
        self.tracker.track(list(model.parameters()), "params")

    def __enter__(self):
        self.tracker.__enter__()
        self.tracker.reset_peak()
        return self

    def __exit__(self, *exc):
        self.tracker.__exit__(*exc)

    def peak(self):
        return self.tracker.peak


def test_the_synthetic_steps_measure_what_the_estimate_predicts_and_restore_the_model():
    model_fn, batch, loss_fn = cases()["transformer"]
    torch.manual_seed(0)
    model = model_fn()
    optimizer = OPTIMIZERS["adamw"](model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    predicted = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["adamw"], precision="bf16")
    meter = TrackerMeter(model)
    measured = run_synthetic_steps(model, optimizer, batch, loss_fn, precision="bf16", meter=meter)
    # The estimate also counts one fresh batch per micro-batch; here the batch was made outside.
    batch_bytes = sum(t.numel() * t.element_size() for t in batch)
    assert abs(predicted.peak_bytes - batch_bytes - measured) <= 0.02 * measured
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items()) and not optimizer.state
