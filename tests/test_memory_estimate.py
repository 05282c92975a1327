"""estimate_step_memory: fake-tensor trace vs the same two steps measured on real tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimus_preflight.memory import MemoryEstimate, estimate_step_memory, measure_step_memory
from optimus_preflight.memory.cuda_rules import MIN_BLOCK
from optimus_preflight.memory.tracker import REPORT_KEYS
from tests.memory_models import MLP, OPTIMIZERS, cases

CASES = cases()


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_prediction_within_2_percent_of_measured_peak(name, precision, optimizer):
    model_fn, batch, loss_fn = CASES[name]
    optimizer_fn = OPTIMIZERS[optimizer]
    predicted = estimate_step_memory(model_fn, batch, loss_fn, optimizer_fn, precision=precision)
    measured = measure_step_memory(model_fn, batch, loss_fn, optimizer_fn, precision=precision)
    assert predicted.method == "fake"
    assert abs(predicted.peak_bytes - measured.peak_bytes) <= 0.02 * measured.peak_bytes
    assert predicted.peak_at == measured.peak_at


def test_accumulation_is_honoured_and_keeps_gradients_across_micro_batches():
    model_fn, batch, loss_fn = CASES["transformer"]
    single = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["sgd_momentum"])
    accumulated = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["sgd_momentum"], accumulation_steps=3)
    measured = measure_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["sgd_momentum"], accumulation_steps=3)
    assert abs(accumulated.peak_bytes - measured.peak_bytes) <= 0.02 * measured.peak_bytes
    # In the later micro-batches the first one's gradients are alive during backward.
    assert "micro-batch" in accumulated.peak_at and accumulated.breakdown["grads"] > 0
    assert accumulated.peak_bytes > single.peak_bytes


def test_breakdown_sums_to_peak_and_uses_the_design_keys():
    model_fn, batch, loss_fn = CASES["mlp"]
    estimate = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["adamw"])
    assert tuple(estimate.breakdown) == REPORT_KEYS
    assert sum(estimate.breakdown.values()) == estimate.peak_bytes
    params = sum(p.numel() * 4 for p in MLP().parameters())
    assert estimate.breakdown["params"] == params
    # AdamW: two fp32 state tensors per parameter, plus a 4-byte step counter each.
    assert estimate.breakdown["optimizer_state"] == 2 * params + 4 * len(list(MLP().parameters()))
    assert isinstance(estimate, MemoryEstimate) and estimate.elapsed_s > 0


def test_bf16_autocast_shrinks_transformer_activations():
    model_fn, batch, loss_fn = CASES["transformer"]
    fp32 = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["sgd_momentum"], precision="fp32")
    bf16 = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["sgd_momentum"], precision="bf16")
    assert bf16.breakdown["params"] == fp32.breakdown["params"]  # autocast keeps fp32 weights
    assert bf16.breakdown["activations"] != fp32.breakdown["activations"]


def test_a_model_too_large_for_this_machine_is_estimated_without_allocating_it():
    # 16 x 8192 x 8192 fp32 weights = 4.3 GB of parameters, 17 GB with grads and AdamW state.
    def big() -> nn.Module:
        return nn.Sequential(*(nn.Linear(8192, 8192, bias=False) for _ in range(16)))

    batch = (torch.empty(2, 8192, device="meta"), torch.empty(2, 8192, device="meta"))
    estimate = estimate_step_memory(big, batch, lambda m, b: F.mse_loss(m(b[0]), b[1]), OPTIMIZERS["adamw"])
    params = 16 * 8192 * 8192 * 4
    assert estimate.method == "fake"
    assert estimate.breakdown["params"] == params
    assert estimate.peak_bytes >= 4 * params  # params + grads + two AdamW states


def test_dict_batches_and_scalar_losses():
    def loss_fn(model, batch):
        return F.cross_entropy(model(batch["x"]), batch["y"])

    batch = {"x": torch.randn(8, 64), "y": torch.randint(0, 10, (8,))}
    predicted = estimate_step_memory(MLP, batch, loss_fn, OPTIMIZERS["adamw"])
    measured = measure_step_memory(MLP, batch, loss_fn, OPTIMIZERS["adamw"])
    assert predicted.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.02)


def test_cuda_target_rounds_every_storage_and_reports_overheads_separately():
    model_fn, batch, loss_fn = CASES["transformer"]
    cpu = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["sgd_momentum"])
    cuda = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["sgd_momentum"], device="cuda")
    assert cuda.method == "fake" and cuda.device == "cuda"
    assert all(value % MIN_BLOCK == 0 for value in cuda.detail.values())
    assert cuda.peak_bytes > cpu.peak_bytes
    assert cuda.allocator_peak_bytes >= cuda.peak_bytes and cuda.reserved_bytes >= cuda.allocator_peak_bytes
    assert cuda.workspace_bytes > 0 and cuda.context_bytes > 0
    assert cuda.required_bytes == cuda.allocator_peak_bytes + cuda.workspace_bytes + cuda.context_bytes
    assert any("fake CPU tensors" in note for note in cuda.notes)


def test_cuda_target_runs_optimizers_with_their_foreach_default():
    # foreach AdamW (CUDA's default) allocates temporaries for all parameters at once (O11).
    def model_fn() -> nn.Module:
        return nn.Sequential(*(nn.Linear(256, 256) for _ in range(4)))

    batch = (torch.empty(2, 256, device="meta"), torch.empty(2, 256, device="meta"))

    def loss_fn(m, b):
        return F.mse_loss(m(b[0]), b[1])

    cuda = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["adamw"], device="cuda")
    per_tensor = estimate_step_memory(
        model_fn, batch, loss_fn, lambda p: torch.optim.AdamW(p, foreach=False), device="cuda"
    )
    assert cuda.peak_at.endswith("optimizer.step")
    assert cuda.peak_bytes > per_tensor.peak_bytes


def test_data_dependent_ops_fall_back_to_the_analytic_estimate_with_the_reason():
    def loss_with_item(model, batch):
        loss = F.cross_entropy(model(batch[0]), batch[1])
        if loss.item() > 1e9:  # data-dependent Python control flow
            raise AssertionError
        return loss

    def loss_with_mask(model, batch):
        keep = batch[1] != 3
        return F.cross_entropy(model(batch[0])[keep], batch[1][keep])

    model_fn, batch, _ = CASES["mlp"]
    params = sum(p.numel() * 4 for p in MLP().parameters())
    for loss_fn, op in ((loss_with_item, "_local_scalar_dense"), (loss_with_mask, "nonzero")):
        estimate = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["adamw"])
        assert estimate.method == "analytic"
        assert op in estimate.reason and "step 1, forward" in estimate.reason
        assert estimate.breakdown["params"] == params and estimate.breakdown["grads"] == params
        assert estimate.breakdown["optimizer_state"] == 2 * params
        assert estimate.breakdown["activations"] > 0  # what the trace saw before the failure
        assert estimate.peak_bytes == sum(estimate.breakdown.values())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"precision": "int8"}, "precision"),
        ({"device": "tpu"}, "device"),
        ({"accumulation_steps": 0}, "accumulation_steps"),
    ],
)
def test_invalid_arguments_are_refused(kwargs, match):
    model_fn, batch, loss_fn = CASES["mlp"]
    with pytest.raises(ValueError, match=match):
        estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["adamw"], **kwargs)


def test_the_estimate_leaves_the_random_generators_alone():
    def seeding_factory() -> nn.Module:
        torch.manual_seed(1234)  # recipes often seed in build_model
        return MLP()

    model_fn, batch, loss_fn = CASES["mlp"]
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    estimate_step_memory(seeding_factory, batch, loss_fn, OPTIMIZERS["adamw"])
    assert torch.equal(torch.rand(3), expected)


def test_a_factory_returning_a_live_model_is_traced_on_a_fake_copy():
    model_fn, batch, loss_fn = CASES["cnn"]

    def with_buffer() -> nn.Module:
        model = model_fn()
        model.register_buffer("extra", torch.zeros(3))
        return model

    live = with_buffer()  # real weights, built before the call
    weights = {k: v.clone() for k, v in live.state_dict().items()}
    from_live = estimate_step_memory(lambda: live, batch, loss_fn, OPTIMIZERS["adamw"])
    from_factory = estimate_step_memory(with_buffer, batch, loss_fn, OPTIMIZERS["adamw"])
    assert from_live.method == "fake" and from_live.peak_bytes == from_factory.peak_bytes
    assert all(torch.equal(live.state_dict()[k], v) for k, v in weights.items())  # untouched


def test_a_model_that_cannot_be_built_raises_with_both_reasons():
    from optimus_preflight.memory.analytic import EstimateError

    def broken() -> nn.Module:
        raise ValueError("no such layer size")

    _, batch, loss_fn = CASES["mlp"]
    with pytest.raises(EstimateError, match="no such layer size.*meta device failed too"):
        estimate_step_memory(broken, batch, loss_fn, OPTIMIZERS["adamw"])


def test_a_constructor_that_deep_copies_layers_estimates_without_torch_warnings():
    # nn.Transformer clones its layers with copy.deepcopy; inside the fake trace torch warns about
    # the fake tensors' data pointers, which a user would read as a bug in their own model.
    import warnings

    def model_fn():
        return nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True)

    batch = (torch.randn(4, 6, 16), torch.randn(4, 5, 16))

    def loss_fn(model, batch):
        return model(*batch).square().mean()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        estimate = estimate_step_memory(model_fn, batch, loss_fn, OPTIMIZERS["adamw"])
    assert estimate.method == "fake" and estimate.peak_bytes > 0
