"""Healthy: five corrected twins of broken cases and five unusual but correct setups. None may raise a warning."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aw.cases_data import build_edge_offset_missing
from benchmarks.blind_preflight_aw.cases_mechanics import build_scatter_overwrite
from benchmarks.blind_preflight_aw.cases_shapes import build_dice_broadcast, build_graph_reg_broadcast
from benchmarks.blind_preflight_aw.cases_targets import build_no_pit
from benchmarks.blind_preflight_aw.registry import (
    Separator,
    SmallSeg3d,
    SumGNN,
    collate_graphs,
    healthy,
    loader,
    make_graphs,
    make_volumes,
    pit_si_snr,
    seed,
    twin,
    two_speakers,
)

# --------------------------------------------------------------------------------------------------- corrected twins
healthy("graph_reg_broadcast_fixed", "GNN regression with the (G, 1) prediction squeezed to (G,) before MSE.")(
    twin(build_graph_reg_broadcast))
healthy("edge_offset_missing_fixed", "Hand-written graph collate that shifts each edge_index by its node offset.")(
    twin(build_edge_offset_missing))
healthy("no_pit_fixed", "Two-speaker separation with a per-utterance permutation-invariant SI-SNR loss.")(
    twin(build_no_pit))
healthy("dice_broadcast_fixed", "3D per-volume soft Dice with the mask unsqueezed to (B, 1, D, H, W).")(
    twin(build_dice_broadcast))
healthy("scatter_overwrite_fixed", "GIN-style message passing aggregated with scatter_add.")(
    twin(build_scatter_overwrite))


# ---------------------------------------------------------------------------------------------- unusual but correct
@healthy("gnn_frozen_encoder_groups",
         "GNN whose node encoder is frozen on purpose (a fixed random projection of the atom features); AdamW with "
         "two parameter groups (message passing with weight decay, readout without) over the trainable "
         "parameters only.")
def build_gnn_frozen_encoder_groups():
    seed(0)
    graphs = make_graphs(1200, s=61)
    model = SumGNN(out=2)
    model.inp.requires_grad_(False)
    optimizer = torch.optim.AdamW([
        {"params": model.convs.parameters(), "lr": 3e-3, "weight_decay": 1e-2},
        {"params": model.readout.parameters(), "lr": 3e-3, "weight_decay": 0.0},
    ])

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        return F.cross_entropy(model(x, ei, bt), y)

    return dict(model=model, optimizer=optimizer, train_loader=loader(graphs[:1000], 32, collate_fn=collate_graphs),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=collate_graphs), loss_fn=loss_fn,
                max_steps=300)


@healthy("seg3d_dice_ce_bf16_accum",
         "Three-class 3D segmentation (bright and dark lesions) with cross-entropy + soft Dice over the foreground "
         "classes, bf16 autocast and 2-step gradient accumulation.")
def build_seg3d_dice_ce_bf16_accum():
    seed(0)
    vols, labels = make_volumes(480, s=62, classes=3)
    model = SmallSeg3d(out=3)

    def loss_fn(model, batch):
        x, y = batch
        logits = model(x).float()
        ce = F.cross_entropy(logits, y)
        probs = logits.softmax(1)[:, 1:]
        onehot = F.one_hot(y, 3).permute(0, 4, 1, 2, 3).float()[:, 1:]
        inter = (probs * onehot).sum((0, 2, 3, 4))
        dice = (2 * inter + 1) / (probs.sum((0, 2, 3, 4)) + onehot.sum((0, 2, 3, 4)) + 1)
        return ce + (1 - dice).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), precision="bf16",
                accumulation_steps=2, train_loader=loader(TensorDataset(vols[:400], labels[:400]), 8),
                val_loader=loader(TensorDataset(vols[400:], labels[400:]), 20, shuffle=False), loss_fn=loss_fn,
                max_steps=200)


@healthy("separation_pit_warmup_cosine",
         "Two-speaker separation with a per-utterance PIT SI-SNR loss, linear warm-up + cosine decay sized to "
         "max_steps=200 (LambdaLR) and gradient clipping at 5.")
def build_separation_pit_warmup_cosine():
    seed(0)
    mix, refs = two_speakers(1200, s=63)
    model = Separator()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    max_steps, warmup = 200, 20

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (max_steps - warmup)))

    def loss_fn(model, batch):
        mix, refs = batch
        return -pit_si_snr(model(mix), refs).mean()

    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at),
                clip_grad_norm=5.0, train_loader=loader(TensorDataset(mix[:1000], refs[:1000]), 16),
                val_loader=loader(TensorDataset(mix[1000:], refs[1000:]), 50, shuffle=False), loss_fn=loss_fn,
                max_steps=max_steps)


class MeanPoolGCN(nn.Module):
    """Two GCN layers on A + I with symmetric normalisation, mean pooling by node counts."""

    def __init__(self, f_in=8, hidden=32):
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(f_in, hidden), nn.Linear(hidden, hidden)])
        self.readout = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x, edge_index, batch):
        n = x.size(0)
        loop = torch.arange(n, device=x.device)
        src, dst = torch.cat([edge_index[0], loop]), torch.cat([edge_index[1], loop])
        deg = torch.zeros(n, device=x.device).index_add_(0, dst, torch.ones(dst.numel(), device=x.device))
        norm = (deg[src] * deg[dst]).rsqrt()[:, None]
        h = x
        for lin in self.lins:
            hw = lin(h)
            h = torch.relu(torch.zeros_like(hw).index_add_(0, dst, hw[src] * norm))
        g_count = int(batch.max()) + 1
        summed = torch.zeros(g_count, h.size(1), device=h.device).index_add_(0, batch, h)
        counts = torch.bincount(batch, minlength=g_count).clamp(min=1).to(h.dtype)[:, None]
        return self.readout(summed / counts)


@healthy("gcn_meanpool_onecycle",
         "Graph regression of the bond density (bonds per atom) with a GCN on A + I, mean pooling by node counts "
         "and a OneCycleLR sized to max_steps=200.")
def build_gcn_meanpool_onecycle():
    seed(0)
    graphs = make_graphs(1200, s=64)
    for gr in graphs:
        gr["density"] = gr["edge_index"].size(1) / 2 / gr["n"]
    coll = partial(collate_graphs, key="density")
    model = MeanPoolGCN()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, total_steps=200)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        return F.mse_loss(model(x, ei, bt).squeeze(-1), y)

    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(graphs[:1000], 32, collate_fn=coll),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=coll), loss_fn=loss_fn, max_steps=200)


@healthy("seg3d_weighted_ce_ignore_pad",
         "3D segmentation of volumes padded from 16^3 to 18^3 with padding voxels labelled -1 (ignore_index=-1), "
         "class-weighted cross-entropy against the foreground imbalance, Nesterov SGD.")
def build_seg3d_weighted_ce_ignore_pad():
    seed(0)
    vols, labels = make_volumes(480, s=65)
    vols = F.pad(vols, (1, 1, 1, 1, 1, 1))
    labels = F.pad(labels, (1, 1, 1, 1, 1, 1), value=-1)
    model = SmallSeg3d(out=2)
    class_weight = torch.tensor([0.25, 1.0])

    def criterion(model, batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits, y, weight=class_weight.to(logits.device, logits.dtype), ignore_index=-1)

    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True),
                train_loader=loader(TensorDataset(vols[:400], labels[:400]), 8),
                val_loader=loader(TensorDataset(vols[400:], labels[400:]), 20, shuffle=False), loss_fn=criterion,
                max_steps=300)
