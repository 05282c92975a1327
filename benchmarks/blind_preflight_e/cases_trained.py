"""Set e, family 3: what is trained (parameters frozen, missing from the optimizer, re-created, gradient cut,
dropout misuse, accidental sharing)."""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_e.cases_shapes import bar_orientations, keyword_sequences
from benchmarks.blind_preflight_e.registry import case, loader, seed, teacher_classes

FAMILY = "what_is_trained"
log = logging.getLogger(__name__)


def bars(n=2500, s=0):
    x, y = bar_orientations(n, s=s)
    return (loader(TensorDataset(x[:2048], y[:2048]), 64),
            loader(TensorDataset(x[2048:], y[2048:]), 128, shuffle=False))


class BarNet(nn.Module):
    def __init__(self, width=16, classes=4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.features(x))


# --------------------------------------------------------------------------- 1. init helper re-creates the parameters


def build_classifier():
    model = BarNet()
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def apply_init(model, scheme="kaiming"):
    """The config's weight-init scheme."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.weight = nn.Parameter(nn.init.kaiming_normal_(torch.empty_like(m.weight), nonlinearity="relu"))
            if m.bias is not None:
                m.bias = nn.Parameter(torch.zeros_like(m.bias))


@case("cnn_init_helper_replaces_parameters_after_optimizer", FAMILY,
      "apply_init() assigns new nn.Parameter objects to every conv and linear weight/bias, and it runs after "
      "build_classifier() created the SGD optimizer: the optimizer still holds the replaced tensors, so the convs "
      "and the head get gradients but are never updated (only the BatchNorm affine parameters train)",
      r"(not|never|missing|absent)[^.]*optimi[sz]er|optimi[sz]er[^.]*(miss|not|lack|doesn't|does not|never|stale|old|"
      r"orphan|replaced)|re.?(creat|initiali[sz]|assign|plac)\w*[^.]*param|new (nn\.)?Parameter")
def cnn_init_helper_replaces_parameters_after_optimizer():
    seed(0)
    model, optimizer = build_classifier()
    apply_init(model)
    train, val = bars(s=21)
    return dict(model=model, optimizer=optimizer, train_loader=train, val_loader=val,
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 2. binary codes rounded without a straight-through estimator


def factor_data(n=4096, d=32, k=8, s=0):
    g = torch.Generator().manual_seed(s)
    codes = torch.randint(0, 2, (n, k), generator=g).float()
    w = torch.randn(k, d, generator=g)
    return codes @ w + 0.1 * torch.randn(n, d, generator=g)


class HashingAutoencoder(nn.Module):
    """Semantic hashing: 8-bit binary codes in the bottleneck."""

    def __init__(self, d=32, bits=8, straight_through=False):
        super().__init__()
        self.straight_through = straight_through
        self.encoder = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, bits))
        self.decoder = nn.Sequential(nn.Linear(bits, 64), nn.ReLU(), nn.Linear(64, d))

    def forward(self, x):
        p = torch.sigmoid(self.encoder(x))
        code = p + (torch.round(p) - p).detach() if self.straight_through else torch.round(p)   # BUG when False
        return self.decoder(code)


def recon_loss(model, batch):
    (x,) = batch
    return F.mse_loss(model(x), x)


@case("hashing_autoencoder_round_without_straight_through", FAMILY,
      "the bottleneck binarises the codes with torch.round(sigmoid(h)), whose gradient is zero everywhere, and no "
      "straight-through estimator is used: the encoder receives exactly zero gradient and never changes, so only "
      "the decoder learns (from fixed random codes)",
      r"round|straight.?through|non.?differentiable|(zero|no|none)[^.]*grad\w*[^.]*encoder|encoder[^.]*(zero|no|never|"
      r"none)[^.]*(grad|updat)|gradient[^.]*(zero|cut|block|vanish)")
def hashing_autoencoder_round_without_straight_through():
    seed(0)
    x = factor_data(s=22)
    model = HashingAutoencoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x), 64), loss_fn=recon_loss, max_steps=2000)


# --------------------------------------------------------------------------- 3. LoRA with both factors zero


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank=4, alpha=8.0):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.zeros(rank, base.in_features))    # BUG: A must be random (B starts at 0)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


def add_lora(model: nn.Module, rank=4):
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, LoRALinear(child, rank))
        else:
            add_lora(child, rank)
    return model


def pretrained_mlp(d=20, classes=4):
    torch.manual_seed(123)       # stands in for loading the pretrained checkpoint
    return nn.Sequential(nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, classes))


@case("lora_adapters_both_factors_zero_init", FAMILY,
      "the hand-written LoRA layer initialises both lora_A and lora_B to zeros (only B should start at zero, A is "
      "random): the update B@A has zero gradient with respect to each factor while the other is zero, so with the "
      "base frozen on purpose nothing in the model ever changes",
      r"zero.?init|initiali[sz]ed (to|at|with|as) zeros?|both[^.]*zero|lora|zero gradients?|gradients?[^.]*(exactly |"
      r"all |identically )?zero")
def lora_adapters_both_factors_zero_init():
    seed(0)
    model = pretrained_mlp()
    model.requires_grad_(False)                  # the pretrained weights stay frozen: only the adapters train
    add_lora(model)
    x, y = teacher_classes(3000, 20, 4, s=23)
    return dict(model=model,
                optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 4. functional dropout without training=


class ChurnMLP(nn.Module):
    def __init__(self, d=20, hidden=128, p=0.3):
        super().__init__()
        self.p = p
        self.fc1, self.fc2, self.out = nn.Linear(d, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 2)

    def forward(self, x):
        h = F.dropout(F.relu(self.fc1(x)), self.p)           # BUG: training=self.training missing (default True)
        h = F.dropout(F.relu(self.fc2(h)), self.p)
        return self.out(h)


@case("churn_mlp_functional_dropout_never_off", FAMILY,
      "the MLP calls F.dropout(h, p) without training=self.training; the functional form defaults to training=True, "
      "so dropout stays on under model.eval(): validation and inference predictions are random draws that differ "
      "from call to call",
      r"F\.dropout|functional dropout|training\s*=|self\.training|dropout[^.]*(eval|inference|always|active|"
      r"stochastic|non.?determin|random)|(eval|inference)[^.]*(dropout|stochastic|non.?determin|differ|random)")
def churn_mlp_functional_dropout_never_off():
    seed(0)
    x, y = teacher_classes(3000, 20, 2, s=24)
    model = ChurnMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 5. nn.Parameter(...).float() is not a parameter


def ratings_table(users=300, items=200, n=12000, rank=6, s=0):
    g = torch.Generator().manual_seed(s)
    U, V = torch.randn(users, rank, generator=g), torch.randn(items, rank, generator=g)
    u = torch.randint(0, users, (n,), generator=g)
    i = torch.randint(0, items, (n,), generator=g)
    r = (U[u] * V[i]).sum(1) / rank ** 0.5 + 0.1 * torch.randn(n, generator=g)
    return u, i, r


class MatrixFactorization(nn.Module):
    """Factors initialised from a truncated SVD computed in numpy (float64)."""

    def __init__(self, users=300, items=200, rank=16, seed_=5):
        super().__init__()
        rng = np.random.default_rng(seed_)
        u0, v0 = rng.normal(0, 0.1, (users, rank)), rng.normal(0, 0.1, (items, rank))   # stands in for the SVD
        self.user_factors = nn.Parameter(torch.from_numpy(u0)).float()     # BUG: .float() returns a plain tensor
        self.item_factors = nn.Parameter(torch.from_numpy(v0)).float()
        self.user_bias = nn.Embedding(users, 1)
        self.item_bias = nn.Embedding(items, 1)

    def forward(self, u, i):
        dot = (self.user_factors[u] * self.item_factors[i]).sum(1)
        return dot + self.user_bias(u).squeeze(1) + self.item_bias(i).squeeze(1)


def mf_loss(model, batch):
    u, i, r = batch
    return F.mse_loss(model(u, i), r)


@case("mf_recommender_parameter_cast_after_wrapping", FAMILY,
      "the factor matrices are created as nn.Parameter(torch.from_numpy(svd_u)).float(): the Parameter wraps the "
      "float64 array and .float() returns a new, non-leaf float32 tensor, which is stored as a plain attribute; the "
      "user and item factors are not registered, not in model.parameters() nor the optimizer, and stay at their "
      "initial values (only the biases train)",
      r"nn\.Parameter|regist|not (a |an )?(registered|parameter|leaf)|non.?leaf|\.float\(\)|(not|never|missing|absent)"
      r"[^.]*(optimi[sz]er|parameters\(\))|optimi[sz]er[^.]*(miss|not|lack|never)")
def mf_recommender_parameter_cast_after_wrapping():
    seed(0)
    u, i, r = ratings_table(s=28)
    model = MatrixFactorization()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(u[:10000], i[:10000], r[:10000]), 128),
                val_loader=loader(TensorDataset(u[10000:], i[10000:], r[10000:]), 512, shuffle=False),
                loss_fn=mf_loss, max_steps=2000)


# --------------------------------------------------------------------------- 6. reentrant checkpoint on an input without grad


class CheckpointedBarNet(BarNet):
    """Activation checkpointing on every block to fit larger images."""

    def forward(self, x):
        h = checkpoint(self.features[:3], x, use_reentrant=True)    # BUG: reentrant + an input without grad
        h = checkpoint(self.features[3:], h, use_reentrant=True)
        return self.head(h)


@case("cnn_reentrant_checkpoint_on_raw_images", FAMILY,
      "every block is wrapped in torch.utils.checkpoint.checkpoint(..., use_reentrant=True) and the first one receives "
      "the raw images, which do not require grad: the reentrant implementation then returns an output detached from "
      "the block's parameters, so both checkpointed blocks get no gradient and only the linear head trains "
      "(use_reentrant=False is the fix)",
      r"checkpoint|reentrant|(features|conv|blocks?)[^.]*(no|zero|none|never)[^.]*(grad|updat)")
def cnn_reentrant_checkpoint_on_raw_images():
    seed(0)
    model = CheckpointedBarNet()
    train, val = bars(s=26)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=train,
                val_loader=val, loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 7. param group from a consumed filter()


class ReviewGRU(nn.Module):
    def __init__(self, vocab=40, d=32):
        super().__init__()
        self.encoder = nn.ModuleDict({"embed": nn.Embedding(vocab, d, padding_idx=0),
                                      "gru": nn.GRU(d, d, batch_first=True)})
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        out, _ = self.encoder["gru"](self.encoder["embed"](ids))
        lengths = (ids != 0).sum(1).clamp(min=1)
        return self.head(out[torch.arange(ids.size(0)), lengths - 1])


@case("gru_param_group_from_consumed_filter", FAMILY,
      "the backbone's parameter group is filter(lambda p: p.requires_grad, model.encoder.parameters()), a one-shot "
      "iterator that the logging line before the optimizer already consumed to count the parameters: the backbone "
      "group is empty, so the GRU (and the embedding) get gradients but only the head is ever updated",
      r"(not|never|missing|absent)[^.]*optimi[sz]er|optimi[sz]er[^.]*(miss|not|lack|doesn't|does not|never)|empty ("
      r"param(eter)?.)?group|(param(eter)?.)?group[^.]*empty|generator|iterator|exhaust|consumed")
def gru_param_group_from_consumed_filter():
    seed(0)
    ids, y = keyword_sequences(3000, s=27)
    model = ReviewGRU()
    backbone = filter(lambda p: p.requires_grad, model.encoder.parameters())
    log.info("trainable backbone parameters: %d", sum(p.numel() for p in backbone))
    optimizer = torch.optim.AdamW([{"params": backbone, "lr": 1e-3},
                                   {"params": model.head.parameters(), "lr": 3e-3}], weight_decay=0.01)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 32),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


