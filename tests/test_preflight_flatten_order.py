"""step.batch_layout, FLATTEN_ORDER_MISMATCH: seq-first (T, B, C) logits flattened against
batch-first (B, T) targets. Flattening both from one layout stays quiet, whatever the model
or the shift of a language model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.flatten_order import leading_axes
from optimus_preflight.preflight.checks.batch_layout import BatchLayoutCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck

BATCH, LENGTH, VOCAB, TAGS = 16, 10, 30, 5


class Tagger(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.embed, self.head = nn.Embedding(VOCAB, 16), nn.Linear(16, TAGS)
        if kind == "transformer":
            self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0), 1,
                                              enable_nested_tensor=False)
        else:
            self.body = nn.LSTM(16, 16, batch_first=kind == "lstm_batch_first")

    def forward(self, tokens):  # (B, T) -> (T, B, tags) seq-first, or (B, T, tags)
        h = self.embed(tokens)
        if self.kind != "lstm_batch_first":
            h = h.transpose(0, 1)
        h = self.body(h)
        return self.head(h[0] if isinstance(h, tuple) else h)


def codes(model, loss_fn):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (256, LENGTH), generator=g)
    loader = DataLoader(TensorDataset(tokens, tokens % TAGS), batch_size=BATCH, shuffle=True)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), BatchLayoutCheck()])
    return [issue for _, issue in report.issues() if issue.code == "FLATTEN_ORDER_MISMATCH"]


def flat(model, batch):
    tokens, tags = batch
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1))


def transposed_first(model, batch):
    tokens, tags = batch
    logits = model(tokens).transpose(0, 1)
    return F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1))


@pytest.mark.parametrize("kind", ["transformer", "lstm_seq_first"])
def test_seq_first_logits_flattened_against_batch_first_targets(kind):
    found = codes(Tagger(kind), flat)
    assert len(found) == 1
    assert f"({LENGTH}, {BATCH}) leading axes and targets flattened from ({BATCH}, {LENGTH})" in found[0].message
    assert "transpose(0, 1)" in found[0].fix


@pytest.mark.parametrize("kind,loss_fn", [("transformer", transposed_first), ("lstm_seq_first", transposed_first),
                                          ("lstm_batch_first", flat)])
def test_predictions_and_targets_flattened_from_one_layout_stay_quiet(kind, loss_fn):
    assert codes(Tagger(kind), loss_fn) == []


def test_a_shifted_language_model_loss_stays_quiet():
    def shifted(model, batch):
        tokens, _ = batch
        logits = model(tokens).transpose(0, 1)[:, :-1]
        return F.cross_entropy(logits.reshape(-1, TAGS), (tokens % TAGS)[:, 1:].reshape(-1))

    assert codes(Tagger("transformer"), shifted) == []


def test_leading_axes_are_the_prefix_whose_product_is_the_rows():
    assert leading_axes((12, 32, 5), 384) == (12, 32)
    assert leading_axes((32, 12), 384) == (32, 12)
    assert leading_axes((7, 5), 10) is None


@pytest.mark.parametrize("flatten, fires", [("view", True), ("permute_then_reshape", False), ("unflattened", False)])
def test_segmentation_logits_viewed_to_rows_without_moving_the_class_axis(flatten, fires):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))  # (N, 4, H, W) logits

    def loss_fn(model, batch):
        images, masks = batch
        logits = model(images)
        if flatten == "unflattened":
            return F.cross_entropy(logits, masks)
        if flatten == "view":
            rows = logits.view(-1, 4)  # the bug: the class axis is dim 1
        else:
            rows = logits.permute(0, 2, 3, 1).reshape(-1, 4)
        return F.cross_entropy(rows, masks.view(-1))

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 3, 12, 12, generator=g), torch.randint(0, 4, (64, 12, 12), generator=g))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=16),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), BatchLayoutCheck()])
    found = [i for i in report.check("step.batch_layout").issues if i.code == "FLATTEN_ORDER_MISMATCH"]
    assert bool(found) == fires
    if fires:
        assert "(16, 4, 12, 12)" in found[0].message and "permute(0, 2, 3, 1)" in found[0].fix


class StreamChunks(torch.utils.data.Dataset):
    """BPTT batches cut from one (N, B) token stream: the (T, B) targets are views whose _base
    is the whole stream, not the (T, B) tensor that is flattened."""

    def __init__(self, transpose_targets: bool):
        self.stream = torch.randint(0, TAGS, (8 * LENGTH + 1, BATCH), generator=torch.Generator().manual_seed(1))
        self.transpose_targets = transpose_targets

    def __len__(self):
        return 8

    def __getitem__(self, index):
        rows = slice(index * LENGTH, (index + 1) * LENGTH)
        inputs, targets = self.stream[rows].t(), self.stream[index * LENGTH + 1:(index + 1) * LENGTH + 1]
        return inputs, targets.t() if self.transpose_targets else targets


@pytest.mark.parametrize("transpose_targets", [False, True])
def test_targets_sliced_from_a_stream_are_read_in_the_layout_they_are_flattened_from(transpose_targets):
    model = Tagger("lstm_batch_first")
    loader = DataLoader(StreamChunks(transpose_targets), batch_size=None, shuffle=True)

    def loss_fn(model, batch):
        tokens, targets = batch
        return F.cross_entropy(model(tokens).reshape(-1, TAGS), targets.reshape(-1))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), BatchLayoutCheck()])
    found = [issue for _, issue in report.issues() if issue.code == "FLATTEN_ORDER_MISMATCH"]
    if transpose_targets:
        assert found == []
    else:
        assert len(found) == 1
        assert f"({BATCH}, {LENGTH}) leading axes and targets flattened from ({LENGTH}, {BATCH})" in found[0].message


class SteppingDecoder(nn.Module):
    """A decoder loop over the positions, one GRUCell step each, its outputs stacked."""

    def __init__(self, stack_dim: int):
        super().__init__()
        self.stack_dim = stack_dim
        self.embed, self.cell, self.head = nn.Embedding(VOCAB, 16), nn.GRUCell(16, 16), nn.Linear(16, TAGS)

    def forward(self, tokens):
        h = torch.zeros(len(tokens), 16)
        steps = []
        for t in range(tokens.shape[1]):
            h = self.cell(self.embed(tokens[:, t]), h)
            steps.append(self.head(h))
        return torch.stack(steps, dim=self.stack_dim)


@pytest.mark.parametrize("stack_dim", [0, 1], ids=["stacked_step_major", "stacked_batch_major"])
def test_per_step_outputs_stacked_step_major_are_named(stack_dim):
    issues = codes(SteppingDecoder(stack_dim), flat)
    assert bool(issues) == (stack_dim == 0)
    if issues:
        assert "torch.stack(outputs, dim=0)" in issues[0].message and "torch.stack(outputs, dim=1)" in issues[0].fix
