"""Set q's healthy cases: 5 corrected twins of broken cases, 5 unusual but correct setups. None may raise a warning."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_q import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_q.registry import healthy, loader, rng, seed, twin

# ---------------------------------------------------------------------------------------------------------------
# Corrected twins (the broken builder with its one-line fix)

healthy("clickstream_padding_mask_fixed",
        "Twin of clickstream_padding_mask_inverted: a 2-layer batch_first TransformerEncoder over right-padded "
        "sessions, src_key_padding_mask=(attention_mask == 0), [CLS] readout, AdamW and clipping.")(
    twin(cases_shapes.clickstream_padding_mask_inverted))

healthy("music_tags_bce_fixed",
        "Twin of music_tags_multilabel_ce: multi-hot tags (0 to 3 per clip) trained with BCEWithLogitsLoss.")(
    twin(cases_targets.music_tags_multilabel_ce))

healthy("horizon_heads_separate_fixed",
        "Twin of horizon_heads_list_multiplied: six separate nn.Linear heads in an nn.ModuleList on a shared trunk.")(
    twin(cases_trained.horizon_heads_list_multiplied))

healthy("bert_linear_schedule_fixed",
        "Twin of bert_schedule_total_steps_divided_twice: a tiny BertForSequenceClassification from a config, dict "
        "batches with attention_mask and labels, get_linear_schedule_with_warmup over epochs * len(train_loader).")(
    twin(cases_mechanics.bert_schedule_total_steps_divided_twice))

healthy("pupil_flip_keypoint_fixed",
        "Twin of pupil_flip_keypoint_not_mirrored: random horizontal flips applied to the eye crop and to the x "
        "keypoint (x -> 1 - x), no augmentation on validation.")(
    twin(cases_data.pupil_flip_keypoint_not_mirrored))


# ---------------------------------------------------------------------------------------------------------------
# 1. Semi-supervised node classification with a dense GCN: one full-graph batch, unlabelled nodes at -100.


class GraphSnapshot(Dataset):
    def __init__(self, x, a_hat, y):
        self.item = (x, a_hat, y)

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return self.item


def citation_graph(s: int, n: int = 300, classes: int = 3):
    g = rng(s)
    labels = np.repeat(np.arange(classes), n // classes)
    same = labels[:, None] == labels[None, :]
    a = (g.random((n, n)) < np.where(same, 0.08, 0.01)).astype(np.float32)
    a = np.triu(a, 1)
    a = a + a.T + np.eye(n, dtype=np.float32)
    d = 1.0 / np.sqrt(a.sum(1))
    a_hat = a * d[:, None] * d[None, :]
    x = rng(s + 1).normal(size=(classes, 16))[labels] + 1.5 * g.normal(size=(n, 16))
    order = g.permutation(n)
    y_train, y_val = np.full(n, -100), np.full(n, -100)
    for c in range(classes):
        idx = order[labels[order] == c]
        y_train[idx[:20]] = c
        y_val[idx[20:50]] = c
    t = lambda v, dt=torch.float32: torch.tensor(v, dtype=dt)  # noqa: E731
    return t(x), t(a_hat), t(y_train, torch.int64), t(y_val, torch.int64)


class DenseGCN(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 16, classes: int = 3):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(d_in, hidden), nn.Linear(hidden, classes)

    def forward(self, x, a_hat):
        h = F.relu(a_hat @ self.lin1(x))
        return a_hat @ self.lin2(h)


def masked_node_loss(model, batch):
    x, a_hat, y = batch
    return F.cross_entropy(model(x, a_hat), y, ignore_index=-100)


@healthy("gcn_semi_supervised_full_graph",
         "A dense 2-layer GCN on a 300-node community graph: one full-graph batch (DataLoader with batch_size=None), "
         "60 labelled nodes and the rest at -100 (ignore_index), Adam with weight decay.")
def gcn_semi_supervised_full_graph():
    seed(50)
    x, a_hat, y_train, y_val = citation_graph(261)
    model = DenseGCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4),
                train_loader=loader(GraphSnapshot(x, a_hat, y_train), None),
                val_loader=loader(GraphSnapshot(x, a_hat, y_val), None, shuffle=False),
                loss_fn=masked_node_loss, max_steps=200)


# ---------------------------------------------------------------------------------------------------------------
# 2. Wafer defect inspection: a two-head CNN (defect type + defect centre) fed by a class-balancing sampler.


def wafer_tiles(n: int, s: int, size: int = 20):
    """Tiles (n, 1, 20, 20) with one defect: 0 scratch (a line), 1 pit (a dot), 2 stain (a wide blob); type
    frequencies 70 / 20 / 10 %; centre (x, y) in [0, 1]."""
    g = rng(s)
    yy, xx = np.mgrid[:size, :size]
    labels = g.choice(3, size=n, p=[0.7, 0.2, 0.1])
    centres = g.uniform(5, size - 6, size=(n, 2))
    imgs = g.normal(0.2, 0.05, size=(n, 1, size, size)).astype(np.float32)
    for i in range(n):
        cx, cy = centres[i]
        if labels[i] == 0:
            ang = g.uniform(0, np.pi)
            dist = np.abs((xx - cx) * np.sin(ang) - (yy - cy) * np.cos(ang))
            along = np.abs((xx - cx) * np.cos(ang) + (yy - cy) * np.sin(ang))
            imgs[i, 0] += 0.6 * ((dist < 0.8) & (along < 5))
        elif labels[i] == 1:
            imgs[i, 0] += 0.7 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * 0.9 ** 2))
        else:
            imgs[i, 0] += 0.35 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * 3.0 ** 2))
    return (torch.from_numpy(imgs), torch.from_numpy(labels),
            torch.tensor(centres / (size - 1), dtype=torch.float32))


class DefectNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                   nn.Linear(32 * 5 * 5, 64), nn.ReLU())
        self.type_head = nn.Linear(64, 3)
        self.centre_head = nn.Linear(64, 2)

    def forward(self, x):
        z = self.trunk(x)
        return self.type_head(z), torch.sigmoid(self.centre_head(z))


def defect_multitask_loss(model, batch):
    img, kind, centre = batch
    logits, pred_centre = model(img)
    return F.cross_entropy(logits, kind) + 0.5 * F.smooth_l1_loss(pred_centre, centre, beta=0.05)


@healthy("wafer_two_heads_balanced_sampler",
         "A CNN with a defect-type head and a defect-centre regression head (CE + 0.5 * SmoothL1), trained through a "
         "WeightedRandomSampler with per-sample weights 1 / count(class) on 70/20/10 % classes.")
def wafer_two_heads_balanced_sampler():
    seed(51)
    imgs, kinds, centres = wafer_tiles(1400, 271)
    counts = np.bincount(kinds[:1100].numpy(), minlength=3)
    weights = torch.tensor(1.0 / counts[kinds[:1100].numpy()], dtype=torch.double)
    sampler = WeightedRandomSampler(weights, num_samples=1100, replacement=True,
                                    generator=torch.Generator().manual_seed(5))
    model = DefectNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=DataLoader(TensorDataset(imgs[:1100], kinds[:1100], centres[:1100]), batch_size=32,
                                        sampler=sampler),
                val_loader=loader(TensorDataset(imgs[1100:], kinds[1100:], centres[1100:]), 100, shuffle=False),
                loss_fn=defect_multitask_loss, max_steps=200)


# ---------------------------------------------------------------------------------------------------------------
# 3. A tiny ViT from a config, bf16, two AdamW groups and a cosine schedule stepped per batch.


class OrientedBars(Dataset):
    """16x16 grey images of a bar at 0, 45, 90 or 135 degrees through a random point; dict samples."""

    def __init__(self, n: int, s: int, size: int = 16):
        g = rng(s)
        yy, xx = np.mgrid[:size, :size]
        self.labels = g.integers(0, 4, size=n)
        self.imgs = g.normal(0, 0.15, size=(n, 1, size, size)).astype(np.float32)
        for i in range(n):
            ang = self.labels[i] * np.pi / 4
            cx, cy = g.uniform(5, size - 5, size=2)
            dist = np.abs((xx - cx) * np.sin(ang) - (yy - cy) * np.cos(ang))
            self.imgs[i, 0] += (dist < 0.9).astype(np.float32)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"pixel_values": torch.from_numpy(self.imgs[i]), "labels": torch.tensor(self.labels[i])}


@healthy("tiny_vit_config_bf16_cosine",
         "A 2-layer ViTForImageClassification built from a ViTConfig (16x16 grey images, 4x4 patches), dict batches "
         "and model(**batch).loss, AdamW with a no-decay group for biases and LayerNorms, a warm-up cosine schedule "
         "stepped per batch, bf16.")
def tiny_vit_config_bf16_cosine():
    from transformers import ViTConfig, ViTForImageClassification, get_cosine_schedule_with_warmup

    seed(52)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, num_labels=4, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    model = ViTForImageClassification(config)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=2e-3)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=20, num_training_steps=200)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(OrientedBars(1200, 281), 32), val_loader=loader(OrientedBars(300, 283), 100,
                                                                                    shuffle=False),
                loss_fn=None, precision="bf16", max_steps=200, clip_grad_norm=1.0)


# ---------------------------------------------------------------------------------------------------------------
# 4. Intentionally frozen pretrained word vectors under a packed bidirectional GRU.


def polar_sentences(n: int, s: int, vocab: int = 300, max_len: int = 20):
    """Sentences of 5..20 word ids, right-padded with 0; label 1 when the words' polarities sum above 0. The
    pretrained vectors (built on a large unlabelled corpus) already encode each word's polarity."""
    g = rng(s)
    pol = rng(291).choice([-1.0, 0.0, 1.0], size=vocab, p=[0.3, 0.4, 0.3])
    pol[0] = 0.0
    ids = np.zeros((n, max_len), np.int64)
    lengths = np.zeros(n, np.int64)
    labels = np.zeros(n, np.int64)
    i = 0
    while i < n:
        length = g.integers(5, max_len + 1)
        toks = g.integers(1, vocab, size=length)
        score = pol[toks].sum()
        if score == 0:
            continue
        ids[i, :length], lengths[i], labels[i] = toks, length, int(score > 0)
        i += 1
    vectors = 0.3 * rng(293).normal(size=(vocab, 16))
    vectors[:, 0] = pol
    vectors[0] = 0.0
    return (torch.from_numpy(ids), torch.from_numpy(lengths), torch.from_numpy(labels),
            torch.tensor(vectors, dtype=torch.float32))


class FrozenVectorGRU(nn.Module):
    def __init__(self, vectors: torch.Tensor):
        super().__init__()
        self.embedding = nn.Embedding.from_pretrained(vectors, freeze=True, padding_idx=0)
        self.gru = nn.GRU(16, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, 2)

    def forward(self, ids, lengths):
        packed = pack_padded_sequence(self.embedding(ids), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h_n = self.gru(packed)  # (2, batch, 32)
        return self.head(torch.cat([h_n[0], h_n[1]], dim=1))


def packed_sentence_loss(model, batch):
    ids, lengths, y = batch
    return F.cross_entropy(model(ids, lengths), y)


@healthy("frozen_vectors_packed_bigru",
         "Pretrained word vectors kept frozen on purpose (from_pretrained(freeze=True), vectors that already encode "
         "polarity) under a bidirectional GRU over packed variable-length sentences; the optimizer gets only the "
         "trainable parameters.")
def frozen_vectors_packed_bigru():
    seed(53)
    ids, lengths, y, vectors = polar_sentences(2000, 295)
    model = FrozenVectorGRU(vectors)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.Adam(trainable, lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1600], lengths[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], lengths[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=packed_sentence_loss, max_steps=200)


# ---------------------------------------------------------------------------------------------------------------
# 5. A physics-informed network for u'' = -pi^2 sin(pi x) on [0, 1], u(0) = u(1) = 0 (solution sin(pi x)).


def poisson_residual_loss(model, batch):
    (x,) = batch
    with torch.enable_grad():  # the residual needs d2u/dx2, also when evaluated under no_grad
        x = x.detach().clone().requires_grad_(True)
        u = model(x)
        du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
        d2u = torch.autograd.grad(du.sum(), x, create_graph=True)[0]
        residual = d2u + math.pi ** 2 * torch.sin(math.pi * x)
        boundary = torch.tensor([[0.0], [1.0]], device=x.device, dtype=x.dtype)
        return residual.pow(2).mean() + 10.0 * model(boundary).pow(2).mean()


@healthy("pinn_poisson_autograd_residual",
         "A tanh MLP trained as a physics-informed network: the loss differentiates the output twice with respect to "
         "the collocation inputs (torch.autograd.grad, create_graph=True) plus a boundary penalty; 1-tuple batches.")
def pinn_poisson_autograd_residual():
    seed(54)
    x = torch.tensor(rng(301).uniform(0, 1, size=(1024, 1)), dtype=torch.float32)
    xv = torch.linspace(0.0, 1.0, 101).unsqueeze(1)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x), 64), val_loader=loader(TensorDataset(xv), 101, shuffle=False),
                loss_fn=poisson_residual_loss, max_steps=300)
