"""Accumulated gradients equal full-batch gradients (fp32, tight tolerance)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.training.loaders import ResumableSampler
from optimus_preflight.training.stream import BatchStream
from tests.step_helpers import make_runner, mean_squared_error, window


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def _data(n: int):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 5, generator=generator), torch.randn(n, 3, generator=generator)


def _grads_after_one_step(batches, accumulation_steps, compute_loss=mean_squared_error):
    model = _model()
    runner, optimizer = make_runner(model, compute_loss, accumulation_steps=accumulation_steps)
    result = runner.run(window(batches))
    return optimizer.seen_grads[0], result


def _assert_grads_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)


def test_four_micro_batches_equal_one_full_batch():
    x, y = _data(16)
    full, full_result = _grads_after_one_step([(x, y)], 1)
    accumulated, accumulated_result = _grads_after_one_step([(x[i : i + 4], y[i : i + 4]) for i in range(0, 16, 4)], 4)
    _assert_grads_equal(full, accumulated)
    torch.testing.assert_close(full_result.loss, accumulated_result.loss)
    assert accumulated_result.micro_batches == 4 and accumulated_result.samples == 16


def test_short_last_window_with_a_small_last_batch():
    # An epoch of 10 samples at micro-batch 4 with K=4 ends in a 3-batch window (4, 4, 2).
    x, y = _data(10)
    full, _ = _grads_after_one_step([(x, y)], 1)
    short, result = _grads_after_one_step([(x[0:4], y[0:4]), (x[4:8], y[4:8]), (x[8:], y[8:])], 4)
    _assert_grads_equal(full, short)
    assert result.micro_batches == 3


def _token_loss(model, batch):
    """Mean over valid tokens only; returns the token count as a tensor (like real LM code)."""
    inputs, targets, mask = batch
    per_token = ((model(inputs) - targets) ** 2).mean(-1)
    count = mask.sum()
    return (per_token * mask).sum() / count, count


def test_token_weighted_loss_normalises_by_window_tokens_not_mean_of_means():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(12, 5, generator=generator)
    y = torch.randn(12, 3, generator=generator)
    # Micro-batches of 4 hold 4, 1 and 2 valid tokens.
    mask = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 1, 0], dtype=torch.float32)
    full, full_result = _grads_after_one_step([(x, y, mask)], 1, _token_loss)
    parts = [(x[i : i + 4], y[i : i + 4], mask[i : i + 4]) for i in range(0, 12, 4)]
    accumulated, result = _grads_after_one_step(parts, 3, _token_loss)
    _assert_grads_equal(full, accumulated)
    torch.testing.assert_close(full_result.loss, result.loss)

    # The naive mean of micro-batch means is measurably different here.
    model = _model()
    with torch.no_grad():
        naive = sum(_token_loss(model, part)[0] for part in parts) / 3
        exact = _token_loss(model, (x, y, mask))[0]
    assert abs(naive.item() - exact.item()) > 1e-3


def test_stream_windows_match_full_batches_over_two_epochs():
    """BatchStream + ResumableSampler: batch 4 x 4 accumulation takes the same steps as
    batch 16, across an epoch boundary with a short last window."""
    x, y = _data(26)
    dataset = TensorDataset(x, y)

    def run(batch_size, accumulation_steps, steps):
        model = _model()
        runner, optimizer = make_runner(model, mean_squared_error, accumulation_steps=accumulation_steps)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=ResumableSampler(dataset, seed=3))
        stream = BatchStream(loader, accumulation_steps)
        sizes = []
        for _ in range(steps):
            result = runner.run(stream.window())
            stream.commit()
            sizes.append(result.samples)
        return model, sizes, stream.position

    full_model, full_sizes, full_position = run(16, 1, 4)
    accumulated_model, accumulated_sizes, accumulated_position = run(4, 4, 4)
    assert full_sizes == accumulated_sizes == [16, 10, 16, 10]
    assert full_position.epoch == accumulated_position.epoch == 1
    for a, b in zip(full_model.parameters(), accumulated_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("accumulation_steps", [2, 4])
def test_accumulated_step_matches_full_batch_under_adamw_and_clipping(accumulation_steps):
    x, y = _data(8)
    models = []
    for k in (1, accumulation_steps):
        model = _model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        runner, _ = make_runner(model, mean_squared_error, accumulation_steps=k, optimizer=optimizer, clip=0.5)
        size = 8 // k
        runner.run(window([(x[i : i + size], y[i : i + size]) for i in range(0, 8, size)]))
        models.append(copy.deepcopy(model))
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
