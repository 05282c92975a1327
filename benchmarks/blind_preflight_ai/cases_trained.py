"""Set ai, family what_is_trained: weights the user believes are trained but are not (a factor table kept as a
plain tensor, requires_grad set on a Module attribute, a module left out of the hand-built param groups, pretrained
vectors frozen by from_pretrained's default, a stray .detach() in forward)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ai.cases_shapes import ratings
from benchmarks.blind_preflight_ai.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# ---------------------------------------------------------------------------------------------------------------
# ai_fm_factors_plain_tensor: click-through factorisation machine


def click_rows(n: int, s: int, n_a: int = 12, n_b: int = 12):
    """Two categorical fields (ad, site); the click depends only on their interaction."""
    g = gen(s)
    ua, ub = torch.randn(n_a, 3, generator=g), torch.randn(n_b, 3, generator=g)
    a = torch.randint(0, n_a, (n,), generator=g)
    b = torch.randint(0, n_b, (n,), generator=g)
    logit = 2.5 * (ua[a] * ub[b]).sum(1)
    y = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    return torch.stack([a, n_a + b], dim=1), y          # feature ids in one shared index space


class FactorizationMachine(nn.Module):
    def __init__(self, n_features: int, k: int = 8, fixed: bool = False):
        super().__init__()
        self.w0 = nn.Parameter(torch.zeros(1))
        self.w = nn.Embedding(n_features, 1)
        nn.init.zeros_(self.w.weight)
        if fixed:
            self.v = nn.Parameter(0.1 * torch.randn(n_features, k))
        else:
            self.v = (0.1 * torch.randn(n_features, k)).requires_grad_()   # BUG: a plain tensor, not a Parameter

    def forward(self, ids):
        v = self.v.to(ids.device)[ids]                                      # (B, fields, k)
        pair = 0.5 * (v.sum(1) ** 2 - (v ** 2).sum(1)).sum(1)
        return self.w0 + self.w(ids).sum((1, 2)) + pair


@case("ai_fm_factors_plain_tensor", "what_is_trained",
      bug="The factorisation machine keeps its factor table as a plain tensor with requires_grad_() "
          "(self.v = torch.randn(...).requires_grad_()) instead of an nn.Parameter: it is not registered, not in "
          "model.parameters(), so the optimizer never updates it and the pairwise term, the only signal, stays "
          "random; only the per-feature biases train.",
      cause_pattern=r"nn\.Parameter|not (a |an )?(registered|Parameter)|unregistered|not in "
                    r"(model\.)?parameters\(\)|plain tensor|register_parameter|(tensor|attribute).{0,60}"
                    r"requires_grad.{0,60}(not|never).{0,40}(optimi[sz]er|parameters|updated)")
def fm_factors_plain_tensor(fixed: bool = False):
    seed(0)
    ids, y = click_rows(4000, 21)
    model = FactorizationMachine(24, fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(ids[:3200], y[:3200]), 64),
                val_loader=loader(TensorDataset(ids[3200:], y[3200:]), 400, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=1000)


fix("ai_fm_factors_plain_tensor", fixed_of(fm_factors_plain_tensor),
    acc_of(lambda m, b: ((m(b[0]) > 0).float(), b[1])), "val click accuracy", steps=250)

# ---------------------------------------------------------------------------------------------------------------
# ai_module_requires_grad_attr: "pretrained" tabular backbone meant to be fine-tuned with a new head


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class FineTuner(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.backbone = Backbone()
        self.head = nn.Linear(8, n_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


def nonlinear_classes(n: int, s: int, d: int = 16, c: int = 4):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w1 = torch.randn(d, 32, generator=g)
    w2 = torch.randn(32, c, generator=g)
    return x, (torch.tanh(x @ w1 / 2) @ w2).argmax(1)


@case("ai_module_requires_grad_attr", "what_is_trained",
      bug="After freezing every parameter, the backbone is 'unfrozen' with model.backbone.requires_grad = True: "
          "that sets a plain attribute on the nn.Module and changes no parameter (the method is "
          "requires_grad_(True)), so the backbone stays frozen at its initial weights and only the small new head "
          "trains on its 8 fixed features.",
      cause_pattern=r"requires_grad_\(True\)|\.requires_grad ?= ?True.{0,80}(Module|module|attribute|no effect)|"
                    r"(Module|module) attribute|attribute on the (nn\.)?Module|(backbone|encoder).{0,60}(still |stays |"
                    r"remain\w* )?frozen|frozen.{0,40}(backbone|encoder)|(no|none of the) (backbone|encoder) "
                    r"param\w* (require|get|receive)")
def module_requires_grad_attr(fixed: bool = False):
    seed(0)
    x, y = nonlinear_classes(1600, 22)
    model = FineTuner(4)
    for p in model.parameters():                # freeze the "pretrained" weights ...
        p.requires_grad = False
    model.head = nn.Linear(8, 4)                # ... new head for our 4 classes
    if fixed:
        model.backbone.requires_grad_(True)
    else:
        model.backbone.requires_grad = True     # BUG: attribute on the Module, parameters stay frozen
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_module_requires_grad_attr", fixed_of(module_requires_grad_attr),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# ---------------------------------------------------------------------------------------------------------------
# ai_param_groups_miss_module: two-tower recommender with hand-built parameter groups


class TwoTower(nn.Module):
    def __init__(self, n_users, n_items, k=8):
        super().__init__()
        self.user_emb = nn.Embedding(n_users, k)
        self.item_emb = nn.Embedding(n_items, k)
        self.user_mlp = nn.Sequential(nn.Linear(k, k), nn.Tanh(), nn.Linear(k, k))
        self.bias = nn.Parameter(torch.tensor(3.0))
        for e in (self.user_emb, self.item_emb):
            nn.init.normal_(e.weight, std=0.3)

    def forward(self, u, i):
        return (self.user_mlp(self.user_emb(u)) * self.item_emb(i)).sum(1) + self.bias


def two_tower_groups(model, fixed):
    groups = [{"params": model.user_emb.parameters(), "lr": 3e-2},
              {"params": list(model.user_mlp.parameters()) + [model.bias], "lr": 1e-2}]
    if fixed:
        groups.append({"params": model.item_emb.parameters(), "lr": 3e-2})
    return torch.optim.Adam(groups)


@case("ai_param_groups_miss_module", "what_is_trained",
      bug="The optimizer is built from hand-listed parameter groups (user embeddings at one learning rate, the user "
          "MLP and bias at another) and the item embedding table is in no group: item_emb never gets an update, "
          "so the user tower has to fit ratings against fixed random item vectors.",
      cause_pattern=r"(not|never|missing|absent) (in|from) (any|the|an?) (param\w*[ _]groups?|optimi[sz]er)|"
                    r"param\w*[ _]groups?.{0,80}(miss|forg|omit|leave|left|skip|exclud|not (all|every))|"
                    r"item_emb|(in|belongs? to) no (param\w* )?group|not (passed|given) to the optimi[sz]er")
def param_groups_miss_module(fixed: bool = False):
    seed(0)
    u, i, r = ratings(40, 50, 3000, 23)
    model = TwoTower(40, 50)
    return dict(model=model, optimizer=two_tower_groups(model, fixed),
                train_loader=loader(TensorDataset(u[:2400], i[:2400], r[:2400]), 64),
                val_loader=loader(TensorDataset(u[2400:], i[2400:], r[2400:]), 300, shuffle=False),
                loss_fn=lambda model, batch: F.mse_loss(model(batch[0], batch[1]), batch[2]), max_steps=1000)


fix("ai_param_groups_miss_module", fixed_of(param_groups_miss_module),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val rating RMSE", steps=300, higher=False)

# ---------------------------------------------------------------------------------------------------------------
# ai_from_pretrained_frozen: text classifier on "pretrained" word vectors


def topic_docs(n: int, s: int, vocab: int = 400, length: int = 20, c: int = 4):
    """Each class owns 40 topic words; a document has 5 topic words of its class among random fillers."""
    g = gen(s)
    y = torch.randint(0, c, (n,), generator=g)
    x = torch.randint(c * 40, vocab, (n, length), generator=g)
    for j in range(n):
        pos = torch.randperm(length, generator=g)[:5]
        x[j, pos] = y[j] * 40 + torch.randint(0, 40, (5,), generator=g)
    return x, y


class BagClassifier(nn.Module):
    def __init__(self, vectors, n_classes=4, freeze=True):
        super().__init__()
        self.emb = nn.EmbeddingBag.from_pretrained(vectors, mode="mean", freeze=freeze)
        self.fc = nn.Linear(vectors.shape[1], n_classes)

    def forward(self, ids):
        return self.fc(self.emb(ids))


@case("ai_from_pretrained_frozen", "what_is_trained",
      bug="The word vectors are loaded with nn.EmbeddingBag.from_pretrained(vectors) to be fine-tuned, but "
          "from_pretrained defaults to freeze=True: the 8-dimensional vectors (from an unrelated corpus, so "
          "uninformative for these topics) never update and only the linear head trains on their fixed mean.",
      cause_pattern=r"from_pretrained|freeze ?= ?(True|False)|(embedding|word vector|vectors?)\w*.{0,60}"
                    r"(frozen|not (trained|updated)|requires_grad.{0,10}False)|frozen.{0,40}embedding")
def from_pretrained_frozen(fixed: bool = False):
    seed(0)
    x, y = topic_docs(1600, 24)
    vectors = torch.randn(400, 8, generator=gen(25))       # "pretrained" on another corpus
    model = BagClassifier(vectors, freeze=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_from_pretrained_frozen", fixed_of(from_pretrained_frozen),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# ---------------------------------------------------------------------------------------------------------------
# ai_detach_in_forward: sensor-sequence classifier with a GRU encoder


def pattern_sequences(n: int, s: int, length: int = 20):
    """3 classes: the sign pattern of two pulses (+ then -, - then +, + then +) at random times, in noise."""
    g = gen(s)
    x = 0.5 * torch.randn(n, length, 2, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    signs = torch.tensor([[1.0, -1.0], [-1.0, 1.0], [1.0, 1.0]])
    for j in range(n):
        t1 = torch.randint(0, length // 2, (1,), generator=g).item()
        t2 = torch.randint(length // 2, length, (1,), generator=g).item()
        x[j, t1, 0] += 2.0 * signs[y[j], 0]
        x[j, t2, 0] += 2.0 * signs[y[j], 1]
    return x, y


class GRUClassifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.gru = nn.GRU(2, 24, batch_first=True)
        self.head = nn.Linear(24, 3)
        self.fixed = fixed

    def forward(self, x):
        _, h = self.gru(x)
        h = h[-1]
        if not self.fixed:
            h = h.detach()          # BUG: left from a truncated-BPTT snippet; cuts the encoder off the loss
        return self.head(h)


@case("ai_detach_in_forward", "what_is_trained",
      bug="The classifier's forward calls h.detach() on the GRU's final state before the head (a line kept from a "
          "truncated-BPTT example): the graph is cut there, the GRU's weights get no gradient and stay at their "
          "random initialisation, and only the linear head trains.",
      cause_pattern=r"detach|\.data\b|(graph|gradient)s? (is |are )?(cut|broken|stopp?ed|blocked)|"
                    r"(cut|break|stop|block)s? (the )?(graph|gradient)|no grad\w*.{0,60}(GRU|gru|encoder|rnn)|"
                    r"(GRU|gru|encoder|rnn).{0,60}(no|zero|none) grad")
def detach_in_forward(fixed: bool = False):
    seed(0)
    x, y = pattern_sequences(1400, 26)
    model = GRUClassifier(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_detach_in_forward", fixed_of(detach_in_forward),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)
