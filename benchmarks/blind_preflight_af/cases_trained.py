"""What is trained: parameters the user means to train that never move (or move the wrong tensors)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_af.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
    teacher_classes,
)


# --------------------------------------------------------------------------------------------- padding_idx
def ratings(n, s, users=50, items=80, k=6):
    """Matrix-factorisation ratings; user 0 (the heaviest user, a third of the rows) is as personal as the rest."""
    gf = gen(98)
    u, v = torch.randn(users, k, generator=gf), torch.randn(items, k, generator=gf)
    g = gen(s)
    uid = torch.where(torch.rand(n, generator=g) < 0.33, torch.zeros(n, dtype=torch.long),
                      torch.randint(1, users, (n,), generator=g))
    iid = torch.randint(0, items, (n,), generator=g)
    return uid, iid, (u[uid] * v[iid]).sum(1) + 0.1 * torch.randn(n, generator=g)


class MatrixFactorization(nn.Module):
    def __init__(self, padding_idx, users=50, items=80, k=16):
        super().__init__()
        self.user = nn.Embedding(users, k, padding_idx=padding_idx)
        self.item = nn.Embedding(items, k)
        self.user_bias, self.item_bias = nn.Embedding(users, 1), nn.Embedding(items, 1)
        nn.init.normal_(self.item.weight, std=0.3)
        with torch.no_grad():
            self.user.weight.normal_(std=0.3)
            if padding_idx is not None:
                self.user.weight[padding_idx].zero_()

    def forward(self, uid, iid):
        return (self.user(uid) * self.item(iid)).sum(-1) + self.user_bias(uid).squeeze(-1) + self.item_bias(iid).squeeze(-1)


def rating_mse(model, batch):
    uid, iid, r = batch
    return F.mse_loss(model(uid, iid), r)


@case("af_padding_idx_real_category", "what_is_trained",
      bug="The user embedding is nn.Embedding(n_users, k, padding_idx=0), copied from NLP code, but user ids come "
          "from a label encoder that starts at 0: user 0 is a real (and the heaviest) user, and padding_idx keeps its "
          "vector at zero with no gradient, so a third of the ratings are never personalised.",
      cause_pattern=r"padding_idx|pad(ding)? (index|row|token).{0,80}(real|actual|genuine|valid) (user|category|id|value)|"
                    r"(row|index|id) 0.{0,60}(never|not|no) (updated|trained|gradient)|"
                    r"embedding (row|vector).{0,40}(frozen|fixed|stays?) at zero")
def padding_idx(fixed=False):
    seed(0)
    (u, i, r), (vu, vi, vr) = ratings(4000, 21), ratings(1500, 22)
    model = MatrixFactorization(None if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(u, i, r), 128), val_loader=loader(TensorDataset(vu, vi, vr), 500, shuffle=False),
                loss_fn=rating_mse, max_steps=2000)


fix("af_padding_idx_real_category", fixed_of(padding_idx),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val RMSE", steps=300, higher=False)


# --------------------------------------------------------------------------------------------- head swapped after the optimizer
class EncoderClassifier(nn.Module):
    def __init__(self, d_in=12, d=128, classes=3):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU())
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


@case("af_optimizer_before_head_swap", "what_is_trained",
      bug="The encoder is frozen and the optimizer is built from the parameters that require grad, and only then is "
          "model.head replaced by a new nn.Linear for the 5 classes of the new task: the optimizer still holds the old "
          "head's weights, so the new head (the only trainable part left) is never stepped.",
      cause_pattern=r"(head|layer|module|classifier).{0,60}(replaced|swapped|re-?assigned|re-?created).{0,60}after.{0,40}optimi[sz]er|"
                    r"optimi[sz]er.{0,80}(built|created|constructed) before.{0,60}(head|layer|replac|swap)|"
                    r"(not|never|aren't|are not) in (the|any) optimi[sz]er('s)? param(eter)?.?groups?|"
                    r"optimi[sz]er.{0,60}(holds?|steps?|references?).{0,40}(old|stale|previous|different|other) "
                    r"(parameters|tensors|weights|head)|"
                    r"param(eter)?s? (of|in) the model.{0,40}(missing|absent) from.{0,20}optimi[sz]er")
def head_swap(fixed=False):
    seed(0)
    x, y = teacher_classes(4000, 12, 5, s=23)
    model = EncoderClassifier()  # stands in for an encoder pretrained on a 3-class task
    for p in model.encoder.parameters():
        p.requires_grad = False
    if fixed:
        model.head = nn.Linear(128, 5)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    if not fixed:
        model.head = nn.Linear(128, 5)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:3000], y[:3000]), 64),
                val_loader=loader(TensorDataset(x[3000:], y[3000:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("af_optimizer_before_head_swap", fixed_of(head_swap),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------- numpy in the forward
def xor_graphs(n_graphs, s, n=24):
    """A node's label: do most of its neighbours (itself included) lie in quadrants 1 or 3 (x0 * x1 > 0)?"""
    g = gen(s)
    x = torch.rand(n_graphs, n, 2, generator=g) * 2 - 1
    a = (torch.rand(n_graphs, n, n, generator=g) < 0.2).float()
    a = ((a + a.transpose(1, 2)) > 0).float() + torch.eye(n)
    adj = a / a.sum(-1, keepdim=True)
    odd = (x[..., 0] * x[..., 1] > 0).float()
    return x, adj, (torch.bmm(adj, odd[..., None]).squeeze(-1) > 0.5).long()


class NumpyPropagationGNN(nn.Module):
    def __init__(self, propagate, d=32):
        super().__init__()
        self.propagate = propagate
        self.encoder = nn.Sequential(nn.Linear(2, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU())
        self.head = nn.Linear(d, 2)

    def forward(self, x, adj):
        return self.head(self.propagate(adj, self.encoder(x)))


def numpy_propagate(adj, h):
    # h.numpy() raises on a tensor that requires grad, so it is detached first
    out = np.matmul(adj.detach().cpu().numpy(), h.detach().cpu().numpy())
    return torch.from_numpy(out).to(h.device)


@case("af_gcn_numpy_propagation", "what_is_trained",
      bug="The neighbourhood averaging is done in numpy (np.matmul(adj.numpy(), h.detach().numpy()), detached because "
          "numpy() refuses tensors that require grad) and turned back with torch.from_numpy: the result is a leaf with "
          "no graph, so no gradient reaches the node encoder before it and only the final head is trained.",
      cause_pattern=r"numpy|from_numpy|detach\w*.{0,80}(graph|gradient|encoder|layers? before)|"
                    r"(computation(al)? graph|autograd).{0,40}(cut|broken|severed|detached)|"
                    r"(encoder|layers?|parameters?).{0,60}(before|upstream).{0,60}(no|zero|never).{0,20}grad")
def numpy_gcn(fixed=False):
    seed(0)
    x, adj, y = xor_graphs(240, 25)
    vx, vadj, vy = xor_graphs(80, 26)
    model = NumpyPropagationGNN((lambda a, h: torch.bmm(a, h)) if fixed else numpy_propagate)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, adj, y), 16), val_loader=loader(TensorDataset(vx, vadj, vy), 40, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]).reshape(-1, 2), b[2].reshape(-1)), max_steps=1000)


fix("af_gcn_numpy_propagation", fixed_of(numpy_gcn),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val node accuracy", steps=300)


# --------------------------------------------------------------------------------------------- from_pretrained
def clicks(n, s, users=60, items=100, k=8):
    gf = gen(97)
    u, v = torch.randn(users, k, generator=gf), torch.randn(items, k, generator=gf)
    content = 0.3 * v @ torch.randn(k, 16, generator=gf) + torch.randn(items, 16, generator=gf)  # item metadata vectors
    g = gen(s)
    uid, iid = torch.randint(0, users, (n,), generator=g), torch.randint(0, items, (n,), generator=g)
    return uid, iid, ((u[uid] * v[iid]).sum(1) > 0).float(), content


class TwoTower(nn.Module):
    def __init__(self, content, freeze, users=60):
        super().__init__()
        self.user = nn.Embedding(users, content.shape[1])
        self.item = nn.Embedding.from_pretrained(content / content.std(), freeze=freeze)
        self.item_bias = nn.Parameter(torch.zeros(content.shape[0]))

    def forward(self, uid, iid):
        return (self.user(uid) * self.item(iid)).sum(-1) + self.item_bias[iid]


@case("af_from_pretrained_frozen_items", "what_is_trained",
      bug="The item tower is initialised from metadata vectors with nn.Embedding.from_pretrained(content), whose "
          "default is freeze=True: the item embeddings the user meant only to warm-start never train, and the weakly "
          "informative metadata vectors cap what the user vectors can fit.",
      cause_pattern=r"from_pretrained|freeze\s*=\s*(True|False)|"
                    r"(item|pretrained|initiali[sz]ed) embeddings?.{0,60}(frozen|never (train|update)|requires_grad.{0,10}False)")
def from_pretrained(fixed=False):
    seed(0)
    u, i, y, content = clicks(5000, 27)
    vu, vi, vy, _ = clicks(1500, 28)
    model = TwoTower(content, freeze=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-2),
                train_loader=loader(TensorDataset(u, i, y), 128), val_loader=loader(TensorDataset(vu, vi, vy), 500, shuffle=False),
                loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0], b[1]), b[2]), max_steps=2000)


fix("af_from_pretrained_frozen_items", fixed_of(from_pretrained),
    acc_of(lambda m, b: ((m(b[0], b[1]) > 0).long(), b[2])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------- no_grad set encoder
def point_sets(n, s, m=16):
    g = gen(s)
    x = torch.rand(n, m, 2, generator=g) * 2 - 1
    return x, ((x[..., 0] * x[..., 1] > 0).sum(1) > m // 2).long()


class DeepSets(nn.Module):
    def __init__(self, encode_without_grad, d=32):
        super().__init__()
        self.encode_without_grad = encode_without_grad
        self.phi = nn.Sequential(nn.Linear(2, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU())
        self.rho = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 2))

    def embed_elements(self, x):
        """Per-element embeddings (also used to cache them for retrieval)."""
        if self.encode_without_grad:
            with torch.no_grad():
                return self.phi(x)
        return self.phi(x)

    def forward(self, x):
        return self.rho(self.embed_elements(x).mean(1))


@case("af_set_encoder_under_no_grad", "what_is_trained",
      bug="The DeepSets model calls its element encoder phi through a helper that runs it under torch.no_grad() (written "
          "to cache embeddings for retrieval): phi's outputs carry no graph, so phi never receives a gradient and only "
          "the pooling head rho learns, on random element features.",
      cause_pattern=r"no_grad|inference_mode|"
                    r"(encoder|phi|element).{0,60}(no|zero|never).{0,20}(grad|gradient|updat)|"
                    r"(outputs?|activations?|embeddings?).{0,40}(no|without a?) (grad_fn|graph|autograd)")
def set_no_grad(fixed=False):
    seed(0)
    (x, y), (vx, vy) = point_sets(3000, 29), point_sets(1000, 30)
    model = DeepSets(encode_without_grad=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("af_set_encoder_under_no_grad", fixed_of(set_no_grad),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)
