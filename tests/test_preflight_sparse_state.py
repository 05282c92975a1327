"""A model that holds a sparse tensor (a GCN's normalised adjacency as a torch.sparse buffer,
COO or CSR): the checks that measure or compare the model's state read it through the dense
tensors that hold it (indices and values) instead of crashing on a storage it does not have."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.sizes import tensor_bytes
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.env_checks import DiskSpaceCheck
from optimus_preflight.preflight.checks.memory_checks import HostMemoryCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.step_smoke import CheckpointRoundTripCheck

NODES = 60


def normalised_adjacency(layout: torch.layout) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(NODES, NODES, generator=g) < 0.1).float()
    a = ((a + a.T) > 0).float() + torch.eye(NODES)
    d = a.sum(1).rsqrt()
    a = d[:, None] * a * d[None, :]
    return a.to_sparse() if layout == torch.sparse_coo else a.to_sparse_csr()


class SparseGCN(nn.Module):
    def __init__(self, layout: torch.layout):
        super().__init__()
        self.register_buffer("adjacency", normalised_adjacency(layout))
        self.features = nn.Parameter(torch.randn(NODES, 8) * 0.1)
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, nodes):
        h = torch.relu(self.adjacency @ self.l1(self.features))
        return (self.adjacency @ self.l2(h))[nodes]


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_a_sparse_buffer_is_measured_and_round_trips(layout):
    model = SparseGCN(layout)
    nodes = torch.arange(NODES)
    loader = DataLoader(TensorDataset(nodes, nodes % 3), batch_size=20, shuffle=True)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2), loader, loss_fn=F.cross_entropy,
                           checks=[FirstBatchCheck(), FirstStepCheck(), DiskSpaceCheck(), HostMemoryCheck(),
                                   CheckpointRoundTripCheck()])
    assert all(check.status.value != "crashed" for check in report.checks), [
        (check.name, check.detail) for check in report.checks if check.status.value == "crashed"]
    assert not report.check("step.checkpoint").issues
    stored = model.adjacency
    parts = (stored._indices(), stored._values()) if layout == torch.sparse_coo else \
        (stored.crow_indices(), stored.col_indices(), stored.values())
    assert tensor_bytes(stored) >= sum(p.numel() * p.element_size() for p in parts) > 0


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_the_whole_preflight_is_quiet_on_a_gcn_over_a_sparse_adjacency(layout):
    model = SparseGCN(layout)
    g = torch.Generator().manual_seed(1)
    nodes = torch.randperm(NODES, generator=g)
    labels = (model.adjacency @ torch.randn(NODES, 1, generator=g)).squeeze(1).argsort().argsort() * 3 // NODES
    loader = DataLoader(TensorDataset(nodes, labels[nodes]), batch_size=20, shuffle=True)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2), loader, loss_fn=F.cross_entropy,
                           max_steps=300)
    loud = [(check.name, check.status.value, [issue.code for issue in check.issues])
            for check in report.checks if check.status.value in ("crashed", "warning", "failed")]
    assert not loud
