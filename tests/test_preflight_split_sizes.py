"""data.split_sizes: a training split smaller than half the validation split (test_size
given the training share, SPLIT_TRAIN_SMALLER) and a DataLoader with batch_size=None over
a map-style dataset of single samples (BATCHING_DISABLED); an 80/20 split and a dataset
that serves whole batches itself under batch_size=None stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_sizes import SplitSizesCheck


def codes(train, val=None) -> list[str]:
    model = nn.Linear(6, 3)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), train, val_loader=val,
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitSizesCheck()])
    return [i.code for i in report.check("data.split_sizes").issues]


def table(rows: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g))


@pytest.mark.parametrize("test_size", [0.8, 0.2])
def test_a_split_fraction_given_for_the_wrong_side(test_size):
    held_out = int(1000 * test_size)
    found = codes(DataLoader(table(1000 - held_out, 0), batch_size=32, shuffle=True),
                  DataLoader(table(held_out, 1), batch_size=64))
    assert found == (["SPLIT_TRAIN_SMALLER"] if test_size == 0.8 else [])


def test_split_fraction_reads_round_shares_within_a_sample():
    from optimus_preflight.preflight.checks.split_sizes import split_fraction

    assert split_fraction(200, 800) == "20%" and split_fraction(333, 667) == "a third"
    assert split_fraction(201, 799) == "20%" and split_fraction(1800, 4270) is None


def test_a_validation_set_larger_by_no_split_fraction_is_a_note():
    # 150 users x 12 training interactions against 3 held-out items x 10 sampled negatives each, less collisions
    model = nn.Linear(6, 3)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(table(1800, 0), batch_size=32, shuffle=True),
                           val_loader=DataLoader(table(4270, 1), batch_size=64), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), SplitSizesCheck()])
    issues = report.check("data.split_sizes").issues
    assert [(i.code, i.severity.value) for i in issues] == [("SPLIT_TRAIN_SMALLER", "info")]
    assert "No split fraction makes these sizes" in issues[0].message


def test_batch_size_none_over_single_samples():
    assert codes(DataLoader(table(256, 2), batch_size=None, shuffle=True)) == ["BATCHING_DISABLED"]


class Prebatched(Dataset):
    """Items that are whole batches already: what batch_size=None is for."""

    def __init__(self):
        self.data = table(512, 3)

    def __len__(self):
        return 16

    def __getitem__(self, index):
        return self.data[index * 32:(index + 1) * 32]


def test_batch_size_none_over_a_dataset_of_batches_is_quiet():
    assert codes(DataLoader(Prebatched(), batch_size=None, shuffle=True)) == []


def test_batch_size_none_over_one_whole_graph_is_quiet():
    # Transductive node classification: features, adjacency, labels and a node index of another
    # length share no size, yet the one item is the whole batch.
    g = torch.Generator().manual_seed(0)
    graph = (torch.randn(64, 8, generator=g), torch.eye(64), torch.randint(0, 3, (64,), generator=g), torch.arange(40))
    model = nn.Linear(8, 3)

    def node_loss(model, batch):
        x, adjacency, y, train_index = batch
        return nn.functional.cross_entropy((adjacency @ model(x))[train_index], y[train_index])

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader([graph], batch_size=None),
                           loss_fn=node_loss, checks=[FirstBatchCheck(), SplitSizesCheck()])
    assert not report.check("data.split_sizes").issues


class BpttChunks(Dataset):
    """A torchtext-style batchifier: (batch, bptt) inputs beside (bptt, batch) targets, no
    axis first in both (the targets' layout is step.batch_layout's business)."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        stream = torch.arange(index, index + 21 * 32).reshape(21, 32) % 50
        return stream[:-1].t().contiguous(), stream[1:]


def test_batch_size_none_over_batches_whose_tensors_put_the_batch_on_other_axes_is_quiet():
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(BpttChunks(), batch_size=None, shuffle=True),
                           loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]).reshape(-1, 50), b[1].t().reshape(-1)),
                           checks=[FirstBatchCheck(), SplitSizesCheck()])
    assert report.check("data.split_sizes").issues == []


class SingleWindows(Dataset):
    """Single samples of unequal-length tensors: a (3, 16) window and a (1,) target."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.randn(3, 16), torch.tensor([float(index % 2)])


def test_batch_size_none_over_single_samples_without_a_common_size():
    model = nn.Sequential(nn.Flatten(0), nn.Linear(48, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(SingleWindows(), batch_size=None, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), SplitSizesCheck()])
    assert [i.code for i in report.check("data.split_sizes").issues] == ["BATCHING_DISABLED"]
