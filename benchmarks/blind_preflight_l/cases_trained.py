"""Set l, family what_is_trained: parameters the user means to train that never move."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_l.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------------
# An ECG-beat CNN: backbone frozen, then the last two blocks "unfrozen" with module.requires_grad = True.


def _beats(n: int, s: int, L: int = 96):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(L, dtype=torch.float32)
    x = 0.3 * torch.randn(n, 1, L, generator=g)
    pos = torch.randint(10, L - 30, (n,), generator=g)
    for i in range(n):
        p, c = int(pos[i]), int(y[i])
        width = [3.0, 3.0, 7.0, 7.0][c]
        sign = [1.0, -1.0, 1.0, -1.0][c]
        x[i, 0] += sign * 2.0 * torch.exp(-((t - p) / width) ** 2) - sign * 1.0 * torch.exp(-((t - p - 2.5 * width)
                                                                                              / width) ** 2)
    return x, y


class BeatNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv1d(1, 8, 7, padding=3), nn.ReLU(), nn.MaxPool1d(2))
        self.block2 = nn.Sequential(nn.Conv1d(8, 16, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2))
        self.block3 = nn.Sequential(nn.Conv1d(16, 16, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool1d(1))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.block3(self.block2(self.block1(x))).flatten(1))


@case("trained_requires_grad_set_on_module_not_params", "what_is_trained",
      bug="To fine-tune the last two blocks the code freezes every parameter and then writes "
          "model.block2.requires_grad = True and model.block3.requires_grad = True: on an nn.Module that only sets a "
          "plain Python attribute (Module.requires_grad_() or the parameters' flags are what count), so both blocks "
          "stay frozen and only the new head trains on the random backbone features.",
      cause_pattern=r"requires_grad_\(|requires_grad (attribute )?on (the |a )?(nn\.)?module|module attribute|"
                    r"plain (python )?attribute|block[23]\b.{0,80}(frozen|requires_grad|not (be )?(train|updat))|"
                    r"(frozen|not (be )?(train|updat))\w*.{0,80}block[23]\b")
def requires_grad_module(fixed: bool = False):
    seed(0)
    x, y = _beats(2048, 22)
    vx, vy = _beats(512, 23)
    model = BeatNet()
    for p in model.parameters():  # "pretrained" backbone: freeze everything ...
        p.requires_grad = False
    if fixed:
        model.block2.requires_grad_(True)
        model.block3.requires_grad_(True)
    else:
        model.block2.requires_grad = True  # ... then fine-tune the last two blocks
        model.block3.requires_grad = True
    model.head = nn.Linear(16, 4)  # new head for the 4 beat types
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                val_loader=DataLoader(TensorDataset(vx, vy), 256), loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("trained_requires_grad_set_on_module_not_params", fixed_of(requires_grad_module),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# --------------------------------------------------------------------------------------------------------------------
# A rating model whose item embeddings start from content vectors through nn.Embedding.from_pretrained.


def _ratings(s: int):
    g = gen(s)
    users, items, k = 300, 200, 3
    pu, qi = torch.randn(users, k, generator=g), torch.randn(items, k, generator=g)
    u = torch.randint(0, users, (20000,), generator=g)
    i = torch.randint(0, items, (20000,), generator=g)
    r = 3.0 + (pu[u] * qi[i]).sum(1) + 0.2 * torch.randn(20000, generator=g)
    return u, i, r


class RatingModel(nn.Module):
    def __init__(self, content: torch.Tensor, trainable_items: bool, users=300):
        super().__init__()
        self.user = nn.Embedding(users, content.size(1))
        nn.init.normal_(self.user.weight, std=0.1)
        self.item = nn.Embedding.from_pretrained(content, freeze=not trainable_items)
        self.user_bias = nn.Embedding(users, 1)
        self.item_bias = nn.Embedding(content.size(0), 1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)
        self.mu = nn.Parameter(torch.tensor(3.0))

    def forward(self, u, i):
        return (self.user(u) * self.item(i)).sum(-1) + self.user_bias(u).squeeze(-1) \
            + self.item_bias(i).squeeze(-1) + self.mu


def _rating_loss(model, batch):
    u, i, r = batch
    return F.mse_loss(model(u, i), r)


@case("trained_from_pretrained_embedding_frozen_by_default", "what_is_trained",
      bug="The item embeddings are initialised from content vectors with nn.Embedding.from_pretrained(vectors), "
          "whose freeze argument defaults to True: the item table is frozen at the (uninformative) content vectors "
          "and only the user vectors and biases train (pass freeze=False to fine-tune them).",
      cause_pattern=r"from_pretrained|freeze ?= ?(true|false)|freeze=|item (embedding|table|vector)s?.{0,80}"
                    r"(frozen|not (be )?(train|updat)|requires_grad)|(frozen|requires_grad ?= ?false).{0,80}item")
def from_pretrained(fixed: bool = False):
    seed(0)
    u, i, r = _ratings(24)
    content = 0.3 * torch.randn(200, 16, generator=gen(25))  # item vectors from a text model: unrelated to taste
    model = RatingModel(content, trainable_items=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(u[:16000], i[:16000], r[:16000]), 256),
                val_loader=DataLoader(TensorDataset(u[16000:], i[16000:], r[16000:]), 1000), loss_fn=_rating_loss,
                max_steps=2000)


fix("trained_from_pretrained_embedding_frozen_by_default", fixed_of(from_pretrained),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val RMSE (stars)", higher=False)

# --------------------------------------------------------------------------------------------------------------------
# A small transformer encoder with frozen word vectors and hand-written reentrant activation checkpointing.


def _duplicates(n: int, s: int, T: int = 8, vocab: int = 24):
    g = gen(s)
    x = torch.stack([torch.randperm(vocab, generator=g)[:T] for _ in range(n)])
    y = torch.randint(0, 2, (n,), generator=g)
    for k in range(n):
        if y[k] == 1:
            a, b = torch.randperm(T, generator=g)[:2].tolist()
            x[k, b] = x[k, a]
    return x, y


class DupEncoder(nn.Module):
    def __init__(self, reentrant: bool, vocab: int = 24, d: int = 32):
        super().__init__()
        self.reentrant = reentrant
        self.emb = nn.Embedding(vocab, d)
        self.emb.requires_grad_(False)  # keep the pretrained word vectors fixed
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
                                    for _ in range(2))
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            if self.training:  # activation checkpointing to save memory
                h = checkpoint(layer, h, use_reentrant=self.reentrant)
            else:
                h = layer(h)
        return self.head(h.mean(1))


@case("trained_reentrant_checkpoint_after_frozen_embedding", "what_is_trained",
      bug="Each encoder layer is wrapped in torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=True) while "
          "the embedding that produces h is frozen: with the reentrant variant, when no input requires grad the "
          "checkpointed output does not either ('None of the inputs have requires_grad=True. Gradients will be "
          "None'), so neither transformer layer ever gets a gradient and only the head trains (use_reentrant=False).",
      cause_pattern=r"reentrant|checkpoint|none of the inputs have requires_grad")
def reentrant_checkpoint(fixed: bool = False):
    seed(0)
    x, y = _duplicates(4096, 26)
    vx, vy = _duplicates(1024, 27)
    model = DupEncoder(reentrant=not fixed)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                val_loader=DataLoader(TensorDataset(vx, vy), 512), loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


fix("trained_reentrant_checkpoint_after_frozen_embedding", fixed_of(reentrant_checkpoint),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=600)

# --------------------------------------------------------------------------------------------------------------------
# A load forecaster that clips its bottleneck with numpy inside forward.


def _load_windows(n: int, s: int, W: int = 48):
    g = gen(s)
    t0 = torch.randint(0, 10000, (n, 1), generator=g).float()
    t = t0 + torch.arange(W + 1).float()
    amp = 1 + 0.5 * torch.rand(n, 1, generator=g)
    series = amp * torch.sin(2 * math.pi * t / 24) + 0.5 * torch.sin(2 * math.pi * t / 7) \
        + 0.1 * torch.randn(n, W + 1, generator=g)
    return series[:, :W], series[:, W:]


class LoadForecaster(nn.Module):
    def __init__(self, use_torch_clip: bool, W: int = 48):
        super().__init__()
        self.use_torch_clip = use_torch_clip
        self.encoder = nn.Sequential(nn.Linear(W, 64), nn.ReLU(), nn.Linear(64, 6))
        self.head = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        z = self.encoder(x)
        if self.use_torch_clip:
            z = z.clamp(-3, 3)
        else:  # robust clipping, as in the numpy preprocessing notebook
            z = torch.from_numpy(np.clip(z.detach().cpu().numpy(), -3, 3)).to(x.device)
        return self.head(z)


@case("trained_numpy_roundtrip_inside_forward", "what_is_trained",
      bug="forward() clips the encoder's bottleneck with np.clip(z.detach().cpu().numpy(), -3, 3) and wraps the "
          "result back with torch.from_numpy: the round trip through numpy leaves the autograd graph, so the loss "
          "never reaches the encoder, which stays at its random initialisation while only the head trains "
          "(use z.clamp(-3, 3)).",
      cause_pattern=r"numpy|np\.clip|from_numpy|detach|encoder.{0,80}(no grad|never|not (be )?(train|updat)|"
                    r"frozen|grad is none)|(cut|break|leav|disconnect)\w* .{0,30}(autograd )?graph|clamp")
def numpy_forward(fixed: bool = False):
    seed(0)
    x, y = _load_windows(3072, 28)
    vx, vy = _load_windows(768, 29)
    model = LoadForecaster(use_torch_clip=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=DataLoader(TensorDataset(vx, vy), 256),
                loss_fn=nn.MSELoss(), max_steps=2000)


fix("trained_numpy_roundtrip_inside_forward", fixed_of(numpy_forward), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (next hour)", higher=False)

# --------------------------------------------------------------------------------------------------------------------
# A DistMult knowledge-graph model whose relation table has padding_idx=0 although relation 0 is real.


def _kg_queries(s: int, entities: int = 120, relations: int = 3):
    g = gen(s)
    heads = torch.arange(entities).repeat(relations)
    rels = torch.arange(relations).repeat_interleave(entities)
    tails = torch.stack([torch.randperm(entities, generator=g) for _ in range(relations)])[rels, heads]
    return heads, rels, tails


class DistMult(nn.Module):
    def __init__(self, padding_idx, entities: int = 120, relations: int = 3, d: int = 48):
        super().__init__()
        self.ent = nn.Embedding(entities, d)
        self.rel = nn.Embedding(relations, d, padding_idx=padding_idx)
        nn.init.normal_(self.ent.weight, std=0.3)
        nn.init.normal_(self.rel.weight, std=0.3)
        if padding_idx is not None:  # as nn.Embedding does for its padding row
            with torch.no_grad():
                self.rel.weight[padding_idx].zero_()

    def forward(self, h, r):
        return (self.ent(h) * self.rel(r)) @ self.ent.weight.t()  # scores over every tail entity


def _kg_loss(model, batch):
    h, r, t = batch
    return F.cross_entropy(model(h, r), t)


@case("trained_padding_idx_on_a_real_relation", "what_is_trained",
      bug="The relation embedding is built with padding_idx=0 (copied from a text model), but relation id 0 is a "
          "real relation, not padding: its vector is initialised to zeros and its gradient is always zeroed, so "
          "every query of relation 0 scores all tail entities 0 and a third of the triples is never learned.",
      cause_pattern=r"padding_idx|relation (id |index )?0\b|(index|id|row) 0 .{0,60}(zero|never|not (be )?(train|"
                    r"updat)|gradient)")
def padding_idx_relation(fixed: bool = False):
    seed(0)
    h, r, t = _kg_queries(30)
    model = DistMult(padding_idx=None if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(h, r, t), 60), loss_fn=_kg_loss, max_steps=2000)


def _hits_at_1(model, kw):
    h, r, t = _kg_queries(30)

    def fn(m, b):
        return (m(b[0], b[1]).argmax(-1) == b[2]).sum().item(), len(b[2])
    return mean_over(model, DataLoader(TensorDataset(h, r, t), 360), fn)


fix("trained_padding_idx_on_a_real_relation", fixed_of(padding_idx_relation), _hits_at_1,
    "hits@1 over all (head, relation) queries")
