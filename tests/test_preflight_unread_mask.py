"""TARGET_MASK_UNUSED: placeholder labels trained because the batch's label mask is never read."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.unread_mask import UnreadMaskCheck


def partly_labelled_graphs(graphs: int = 64, nodes: int = 20, classes: int = 4):
    g = torch.Generator().manual_seed(0)
    truth = torch.randint(0, classes, (graphs, nodes), generator=g)
    x = F.one_hot(truth, classes).float() + 0.5 * torch.randn(graphs, nodes, classes, generator=g)
    adjacency = (torch.rand(graphs, nodes, nodes, generator=g) < 0.2).float() + torch.eye(nodes)
    adjacency = adjacency / adjacency.sum(-1, keepdim=True)
    labelled = torch.rand(graphs, nodes, generator=g) < 0.2  # 80% of the nodes carry no label
    return TensorDataset(x, adjacency, torch.where(labelled, truth, torch.zeros_like(truth)), labelled)


class MeanAggregation(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def forward(self, x, adjacency):
        return self.layer(torch.cat([x, adjacency @ x], -1))


def node_loss(use_mask: bool):
    def loss_fn(model, batch):
        x, adjacency, y, labelled = batch
        logits = model(x, adjacency)
        if use_mask:
            return F.cross_entropy(logits[labelled], y[labelled])
        return F.cross_entropy(logits.reshape(-1, 4), y.reshape(-1))
    return loss_fn


@pytest.mark.parametrize("use_mask", [False, True], ids=["mask_never_read", "mask_applied"])
def test_a_node_loss_that_never_reads_its_train_mask(use_mask):
    model = MeanAggregation()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(partly_labelled_graphs(), batch_size=16, shuffle=True), loss_fn=node_loss(use_mask),
                           checks=[FirstBatchCheck(), FirstStepCheck(), UnreadMaskCheck()])
    result = report.check("step.unread_mask")
    issues = [i for i in result.issues if i.code == "TARGET_MASK_UNUSED"]
    assert bool(issues) == (not use_mask), result.data
    if issues:
        assert "every target is 0" in issues[0].message and "logits[mask], y[mask]" in issues[0].fix


def test_a_mask_the_model_reads_is_quiet():
    # An attention-style mask the model consumes, beside labels that are 0 where it is False.
    model = MeanAggregation()

    def masked_inputs(model, batch):
        x, adjacency, y, labelled = batch
        return F.cross_entropy(model(x * labelled[..., None], adjacency).reshape(-1, 4), y.reshape(-1))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(partly_labelled_graphs(), batch_size=16), loss_fn=masked_inputs,
                           checks=[FirstBatchCheck(), FirstStepCheck(), UnreadMaskCheck()])
    assert not report.check("step.unread_mask").issues


class OneGraph(torch.utils.data.Dataset):
    """A whole graph per batch (transductive node classification): features, labels, one mask."""

    def __init__(self, x, y, mask):
        self.x, self.y, self.mask = x, y, mask

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return self.x, self.y, self.mask


def transductive_split(apply_train_mask: bool, val_on_same_graph: bool = True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
    train_mask = torch.rand(300, generator=g) < 0.6
    model = nn.Linear(8, 3)

    def loss_fn(model, batch):
        x, y, mask = (part[0] for part in batch)  # unpacking the batch of one graph
        logits = model(x)
        return F.cross_entropy(logits[mask], y[mask]) if apply_train_mask else F.cross_entropy(logits, y)

    val_y = y if val_on_same_graph else y.roll(1)
    return run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                         DataLoader(OneGraph(x, y, train_mask), batch_size=1), loss_fn=loss_fn,
                         val_loader=DataLoader(OneGraph(x, val_y, ~train_mask), batch_size=1),
                         checks=[FirstBatchCheck(), FirstStepCheck(), UnreadMaskCheck()])


@pytest.mark.parametrize("apply_train_mask", [False, True], ids=["train_mask_never_read", "train_mask_applied"])
def test_a_node_loss_over_the_validation_nodes_fires(apply_train_mask):
    result = transductive_split(apply_train_mask).check("step.unread_mask")
    issues = [i for i in result.issues if i.code == "TARGET_MASK_UNUSED"]
    assert bool(issues) == (not apply_train_mask), result.data
    if issues:
        assert "trains on the validation labels" in issues[0].message and "116 of the positions" in issues[0].message
        assert "logits[train_mask]" in issues[0].fix


def test_an_unread_mask_beside_validation_labels_of_another_graph_is_quiet():
    # Without the same labels in validation nothing says the left-out positions are held out.
    assert not transductive_split(False, val_on_same_graph=False).check("step.unread_mask").issues


def masked_or_not(read_mask: bool):
    def loss_fn(model, batch):
        x, y, observed = batch
        err = (model(x) - y) ** 2
        return (err * observed).sum() / observed.sum() if read_mask else err.mean()
    return loss_fn


@pytest.mark.parametrize("read_mask", [False, True])
def test_missing_regression_targets_filled_beside_a_mask_the_loss_never_reads(read_mask):
    g = torch.Generator().manual_seed(0)
    series = torch.randn(256, 15, generator=g).cumsum(1)
    x, y = series[:, :12], series[:, 12:]
    observed = (torch.rand(256, 3, generator=g) > 0.5).float()  # every batch of 32 leaves out well over 20%
    model = nn.Linear(12, 3)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y * observed, observed), batch_size=32, shuffle=True),
                           loss_fn=masked_or_not(read_mask),
                           checks=[FirstBatchCheck(), FirstStepCheck(), UnreadMaskCheck()])
    issues = report.check("step.unread_mask").issues
    assert [i.code for i in issues] == ([] if read_mask else ["TARGET_MASK_UNUSED"])
    if issues:
        assert "every target is 0, a fill for missing values" in issues[0].message
        assert "* mask).sum() / mask.sum()" in issues[0].fix
