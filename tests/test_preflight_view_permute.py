"""VIEW_AS_PERMUTE: a .view/.reshape to the input's sizes in another order, where
permute/transpose was meant (a (B, T, C) sequence viewed as (B, C, T) for a Conv1d); a
permute, a view that only moves size-1 axes, and a head split stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.view_permute import permuted_view
from optimus_preflight.preflight.checks.batch_layout import BatchLayoutCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

LAYOUTS = {
    "view": (lambda x: x.view(x.shape[0], x.shape[2], x.shape[1]), True),
    "reshape": (lambda x: x.reshape(x.shape[0], x.shape[2], -1), True),
    "transpose": (lambda x: x.transpose(1, 2), False),
    "permute_then_view": (lambda x: x.permute(0, 2, 1).contiguous().view(x.shape[0], x.shape[2], x.shape[1]), False),
}


class SensorConv(nn.Module):
    def __init__(self, to_channels_first):
        super().__init__()
        torch.manual_seed(0)
        self.to_channels_first = to_channels_first
        self.conv, self.head = nn.Conv1d(6, 16, 5, padding=2), nn.Linear(16, 3)

    def forward(self, x):  # (B, T=50, C=6)
        return self.head(self.conv(self.to_channels_first(x)).mean(-1))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_view_to_permuted_sizes_fires_and_axis_swaps_stay_quiet(layout):
    function, fires = LAYOUTS[layout]
    x, y = torch.randn(256, 50, 6), torch.randint(0, 3, (256,))
    model = SensorConv(function)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "VIEW_AS_PERMUTE"]
    assert bool(issues) == fires
    if fires:
        assert "(32, 50, 6)" in issues[0].message and "(32, 6, 50)" in issues[0].message
        assert "permute" in issues[0].fix


def test_only_a_reordering_of_sizes_larger_than_one_counts():
    assert permuted_view((32, 50, 6), (32, 6, 50))
    assert not permuted_view((32, 1, 64), (32, 64, 1))  # an unsqueeze moved
    assert not permuted_view((32, 10, 64), (32, 10, 8, 8))  # a head split
    assert not permuted_view((16, 16, 16), (16, 16, 16))  # equal sizes: nothing to tell


@pytest.mark.parametrize("to_nchw, fires", [(lambda x: x.reshape(x.shape[0], 3, 16, 16), True),
                                            (lambda x: x.permute(0, 3, 1, 2), False)], ids=["reshape", "permute"])
def test_an_hwc_image_batch_reshaped_to_nchw_is_named_as_such(to_nchw, fires):
    images, labels = torch.rand(128, 16, 16, 3), torch.randint(0, 4, (128,))  # numpy/PIL/cv2 layout
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))
    model = nn.Sequential(Lambda(to_nchw), conv)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "VIEW_AS_PERMUTE"]
    assert bool(issues) == fires
    if fires:
        assert "channels-last" in issues[0].message and "x.permute(0, 3, 1, 2)" in issues[0].fix


class Lambda(nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.out = nn.Embedding(30, 16), nn.Linear(16, 5)

    def forward(self, tokens):
        return self.out(self.embed(tokens))  # (B, T, 5)


@pytest.mark.parametrize("how, fires", [("view", True), ("permute", False)])
def test_sequence_logits_viewed_for_cross_entropy_are_named(how, fires):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 30, (256, 12), generator=g)
    tags = tokens % 5

    def loss_fn(model, batch):
        logits = model(batch[0])
        b, t, c = logits.shape
        scores = logits.view(b, c, t) if how == "view" else logits.permute(0, 2, 1)
        return nn.functional.cross_entropy(scores, batch[1])

    model = Tagger()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(tokens, tags), batch_size=32), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "VIEW_AS_PERMUTE"]
    assert bool(issues) == fires
    if issues:
        assert "(32, 12, 5) sequence logits into (32, 5, 12)" in issues[0].message
        assert "logits.permute(0, 2, 1)" in issues[0].fix


def test_axes_merged_in_runs_but_listed_in_another_order():
    from optimus_preflight.preflight.analyses.view_permute import regrouped_out_of_order

    assert regrouped_out_of_order((32, 8, 8, 40), (32, 40, 64))  # (N, C, F, T) -> (N, T, C * F)
    assert not regrouped_out_of_order((32, 40, 8, 8), (32, 40, 64))  # (N, T, C, F) -> (N, T, C * F): in order
    assert not regrouped_out_of_order((32, 3, 16, 16), (32, 768))  # flatten
    assert not regrouped_out_of_order((32, 10, 4, 16), (32, 10, 64))  # heads merged back
    assert not regrouped_out_of_order((32, 8, 8, 8), (32, 8, 64))  # ambiguous sizes: an in-order merge fits


@pytest.mark.parametrize("permute_time", [False, True])
def test_a_crnn_reshaping_conv_features_to_a_sequence_without_moving_time(permute_time):
    class CRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.MaxPool2d((2, 1)))
            self.rnn = nn.GRU(4 * 8, 16, batch_first=True)
            self.head = nn.Linear(16, 3)

        def forward(self, spec):
            x = self.conv(spec)  # (N, C, F, T)
            n, c, f, t = x.shape
            if permute_time:
                x = x.permute(0, 3, 1, 2)
            _, h = self.rnn(x.reshape(n, t, c * f))
            return self.head(h[-1])

    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(64, 1, 16, 30, generator=g), torch.randint(0, 3, (64,), generator=g)),
                        batch_size=16)
    model = CRNN()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), BatchLayoutCheck()])
    found = [i for i in report.check("step.batch_layout").issues if i.code == "VIEW_AS_PERMUTE"]
    if permute_time:
        assert not found
    else:
        assert len(found) == 1 and "permute(0, 3, 1, 2)" in found[0].fix


class TwoTargetRows(torch.utils.data.Dataset):
    """Two regression targets per row returned as a plain list, as a CSV reader gives them:
    default_collate turns them into a list of two (B,) tensors, one per target."""

    def __init__(self, n=256):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=generator)
        self.y = self.x[:, :2] * 2.0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], [float(self.y[i, 0]), float(self.y[i, 1])]


@pytest.mark.parametrize("stack, fires", [(lambda fields: torch.stack(fields).view(-1, 2), True),
                                          (lambda fields: torch.stack(fields, dim=1), False)],
                         ids=["stack_then_view", "stack_dim1"])
def test_collated_fields_stacked_then_viewed_are_named_with_the_stack_that_fixes_them(stack, fires):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))

    def loss_fn(model, batch):
        features, fields = batch
        return nn.functional.mse_loss(model(features), stack(fields).float())

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TwoTargetRows(), batch_size=32, shuffle=True),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "VIEW_AS_PERMUTE"]
    assert bool(issues) == fires
    if fires:
        assert "default_collate" in issues[0].message and "(2, 32)" in issues[0].message
        assert "torch.stack(fields, dim=1)" in issues[0].fix


def test_the_fix_names_the_permutation_the_view_meant():
    from optimus_preflight.preflight.checks.batch_layout import axis_order

    assert axis_order((32, 50, 6), (32, 6, 50)) == (0, 2, 1)
    assert axis_order((8, 8, 3), (8, 3, 8)) == (0, 2, 1)  # equal sizes keep their place where they can
    assert axis_order((4, 5), (5, 6)) is None


class HandAttention(nn.Module):
    """A hand-written multi-head self-attention over (B, S, E) token embeddings."""

    def __init__(self, transpose: bool, heads: int = 4, width: int = 32):
        super().__init__()
        torch.manual_seed(0)
        self.transpose, self.heads = transpose, heads
        self.embed, self.qkv, self.head = nn.Embedding(20, width), nn.Linear(width, 3 * width), nn.Linear(width, 2)

    def split(self, x):
        b, s, e = x.shape
        if self.transpose:
            return x.view(b, s, self.heads, e // self.heads).transpose(1, 2)
        return x.reshape(b, self.heads, s, e // self.heads)

    def forward(self, ids):
        q, k, v = (self.split(t) for t in self.qkv(self.embed(ids)).chunk(3, dim=-1))
        weights = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(ids.shape[0], ids.shape[1], -1)
        return self.head(out.mean(1))


@pytest.mark.parametrize("transpose", [False, True], ids=["reshape_to_heads_first", "view_then_transpose"])
def test_heads_split_in_front_of_the_positions_by_a_reshape(transpose):
    from optimus_preflight.preflight.analyses.view_permute import split_in_front

    assert split_in_front((32, 10, 32), (32, 4, 10, 8)) and not split_in_front((32, 10, 32), (32, 10, 4, 8))
    assert not split_in_front((32, 4, 32), (32, 4, 4, 8))  # as many heads as positions: the sizes cannot tell
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (256, 10), generator=g)
    model = HandAttention(transpose)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, (ids == 3).any(1).long()), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "VIEW_AS_PERMUTE"]
    assert bool(issues) == (not transpose)
    if issues:
        assert "(32, 4, 10, 8)" in issues[0].message and "x.view(32, 10, 4, 8).transpose(1, 2)" in issues[0].fix
