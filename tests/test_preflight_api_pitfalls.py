"""Torch calls whose defaults do something other than what the line reads as, seen during the
first step: .T on a 1-D tensor (TRANSPOSE_1D) and torch.meshgrid without indexing=
(MESHGRID_INDEXING); their explicit forms stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck


def codes(loss_fn, model: nn.Module, loader: DataLoader) -> list:
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    return [i for i in report.check("step.loss_function").issues if i.code in ("TRANSPOSE_1D", "MESHGRID_INDEXING")]


@pytest.mark.parametrize("mask", ["transpose", "outer"])
def test_a_same_label_mask_from_a_1d_transpose(mask):
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(256, 12, generator=g), torch.randint(0, 4, (256,), generator=g)),
                        batch_size=32, shuffle=True)

    def supcon(model, batch):
        x, labels = batch
        z = F.normalize(model(x), dim=1)
        logits = z @ z.T / 0.1
        positives = (labels == labels.T) if mask == "transpose" else (labels[:, None] == labels[None, :])
        log_prob = logits - logits.logsumexp(1, keepdim=True)
        return -(log_prob * positives).sum(1).div(positives.sum(1)).mean()

    found = codes(supcon, nn.Linear(12, 8), loader)
    if mask == "transpose":
        assert [i.code for i in found] == ["TRANSPOSE_1D"] and "labels[:, None] == labels[None, :]" in found[0].fix
    else:
        assert not found


@pytest.mark.parametrize("indexing", [None, "xy"])
def test_meshgrid_without_indexing_in_the_forward(indexing):
    class CoordConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 3, padding=1)

        def forward(self, x):
            lin = torch.linspace(-1, 1, x.shape[-1])
            grids = torch.meshgrid(lin, lin) if indexing is None else torch.meshgrid(lin, lin, indexing=indexing)
            coords = torch.stack(grids).expand(len(x), 2, -1, -1)
            return self.conv(torch.cat([x, coords[:, :1]], 1)).mean((2, 3))

    g = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(64, 2, 8, 8, generator=g), torch.randint(0, 2, (64,), generator=g)),
                        batch_size=16)
    found = codes(nn.CrossEntropyLoss(), CoordConv(), loader)
    if indexing is None:
        assert [i.code for i in found] == ["MESHGRID_INDEXING"] and "indexing='xy'" in found[0].fix
    else:
        assert not found


@pytest.mark.parametrize("student", ["softmax", "log_softmax"])
def test_kl_div_given_probabilities_as_its_input(student):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(128, 12, generator=g)
    teacher_logits = x @ torch.randn(12, 6, generator=g)
    loader = DataLoader(TensorDataset(x, teacher_logits), batch_size=32, shuffle=True)
    kl = nn.KLDivLoss(reduction="batchmean")

    def distill(model, batch):
        xb, tb = batch
        s = model(xb)
        s = F.softmax(s, -1) if student == "softmax" else F.log_softmax(s, -1)
        return kl(s, F.softmax(tb, -1))

    model = nn.Linear(12, 6)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=distill,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "KL_DIV_INPUT_NOT_LOG"]
    if student == "softmax":
        assert len(found) == 1 and "F.log_softmax(student_logits" in found[0].fix
    else:
        assert not found


@pytest.mark.parametrize("softmax_dim", [1, -1])
def test_a_soft_argmax_normalised_across_the_keypoints(softmax_dim):
    class SoftArgmax(nn.Module):
        def __init__(self, k: int = 3, size: int = 8):
            super().__init__()
            self.heat = nn.Conv2d(k, k, 3, padding=1)
            ys, xs = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
            self.register_buffer("gx", xs.reshape(-1))
            self.register_buffer("gy", ys.reshape(-1))

        def forward(self, x):
            p = F.softmax(self.heat(x).flatten(2), dim=softmax_dim)  # (N, K, H*W)
            return torch.stack([(p * self.gx).sum(-1), (p * self.gy).sum(-1)], -1)

    g = torch.Generator().manual_seed(4)
    loader = DataLoader(TensorDataset(torch.randn(64, 3, 8, 8, generator=g), torch.rand(64, 3, 2, generator=g)),
                        batch_size=16)
    model = SoftArgmax()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "SOFTMAX_OFF_AXIS"]
    if softmax_dim == 1:
        assert len(found) == 1 and "soft-argmax" in found[0].message and "dim=-1" in found[0].fix
    else:
        assert not found


@pytest.mark.parametrize("activation", [None, "sigmoid"])
def test_a_soft_dice_computed_on_raw_logits(activation):
    def dice_loss(model, batch, smooth: float = 1.0):
        img, mask = batch
        pred = model(img).squeeze(1)
        if activation == "sigmoid":
            pred = torch.sigmoid(pred)
        inter = (pred * mask).sum()
        return 1 - (2 * inter + smooth) / (pred.sum() + mask.sum() + smooth)

    g = torch.Generator().manual_seed(6)
    images = torch.randn(64, 1, 8, 8, generator=g)
    masks = (images[:, 0] > 0.5).float()
    model = nn.Conv2d(1, 1, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(images, masks), batch_size=16), loss_fn=dice_loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "OVERLAP_ON_LOGITS"]
    if activation is None:
        assert len(found) == 1 and "torch.sigmoid(logits)" in found[0].fix
    else:
        assert not found


@pytest.mark.parametrize("pool_dim", [2, 1])
def test_embeddings_averaged_over_their_own_axis(pool_dim):
    class MeanPool(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 12)
            self.head = nn.Linear(12, 3)

        def forward(self, ids):
            return self.head(self.embed(ids).mean(dim=pool_dim))

    g = torch.Generator().manual_seed(7)
    loader = DataLoader(TensorDataset(torch.randint(0, 50, (64, 12), generator=g), torch.randint(0, 3, (64,), generator=g)),
                        batch_size=16)
    model = MeanPool()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "EMBEDDING_DIM_POOLED"]
    if pool_dim == 2:
        assert len(found) == 1 and "sequence length equals the embedding size" in found[0].message
        assert "e.mean(dim=1)" in found[0].fix
    else:
        assert not found


@pytest.mark.parametrize("similarity, fires", [
    (lambda z1, z2: F.cosine_similarity(z1[:, None], z2[None]), True),  # default dim=1: the batch axis
    (lambda z1, z2: nn.CosineSimilarity()(z1[:, None], z2[None]), True),
    (lambda z1, z2: F.cosine_similarity(z1[:, None], z2[None], dim=-1), False),
    (lambda z1, z2: F.normalize(z1, dim=-1) @ F.normalize(z2, dim=-1).T, False),
], ids=["default_dim", "module_default_dim", "dim_-1", "normalize_matmul"])
def test_a_cosine_similarity_over_the_broadcast_batch_axis(similarity, fires):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(256, 12, generator=g)
    loader = DataLoader(TensorDataset(x, x + 0.1 * torch.randn(256, 12, generator=g)), batch_size=32, shuffle=True)

    def info_nce(model, batch):
        z1, z2 = model(batch[0]), model(batch[1])
        logits = similarity(z1, z2) / 0.1
        return F.cross_entropy(logits, torch.arange(len(logits), device=logits.device))

    torch.manual_seed(0)
    model = nn.Linear(12, 8)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=info_nce,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "COSINE_OVER_BROADCAST_DIM"]
    assert bool(found) == fires
    if fires:
        assert "dim=1" in found[0].message and "dim=-1" in found[0].fix
    assert not [i for i in report.check("step.loss_function").issues if i.code == "CRASHED"]


def test_a_pairwise_cosine_of_two_batches_of_vectors_is_no_broadcast():
    from optimus_preflight.preflight.analyses.api_pitfalls import cosine_over_broadcast

    a, b = torch.randn(16, 8), torch.randn(16, 8)
    assert cosine_over_broadcast((a, b), {}) is None
    assert cosine_over_broadcast((a[:, None], b[None]), {}) == ((16, 1, 8), (1, 16, 8), 1)
    assert cosine_over_broadcast((a[:, None], b[None]), {"dim": -1}) is None
    assert cosine_over_broadcast((a, b[:1]), {"dim": 0}) == ((16, 8), (1, 8), 0)  # a prototype broadcast over rows
