"""Set am, family what_is_trained: parameters that never learn in recommenders and tabular models."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_am.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# ---------------------------------------------------------------------------------------------------------------


def popular_item_ratings(n: int, s: int):
    """Ratings from a rank-4 model; item 0 is the best seller (about 30% of the rows)."""
    g = gen(s)
    n_users, n_items, rank = 200, 60, 4
    pu, qi = torch.randn(n_users, rank, generator=g), torch.randn(n_items, rank, generator=g)
    u = torch.randint(0, n_users, (n,), generator=g)
    i = torch.randint(1, n_items, (n,), generator=g)
    i[torch.rand(n, generator=g) < 0.3] = 0
    r = (pu[u] * qi[i]).sum(1) / rank ** 0.5 + 0.1 * torch.randn(n, generator=g)
    return torch.stack([u, i], 1), r


class DotMF(nn.Module):
    def __init__(self, n_users, n_items, dim, padding_idx=None):
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim, padding_idx=padding_idx)
        self.item_bias = nn.Embedding(n_items, 1)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, x):
        return (self.user(x[:, 0]) * self.item(x[:, 1])).sum(1) + self.item_bias(x[:, 1]).squeeze(-1)


@case("am_padding_idx_real_item", "what_is_trained",
      "The item table is nn.Embedding(n_items, 8, padding_idx=0) out of NLP habit, but item id 0 is a real item (the "
      "best seller, 30% of the ratings, ids come from a 0-based label encoding): its embedding row is held at zero and "
      "never receives a gradient, so every rating of item 0 gets no user-item interaction.",
      r"padding_idx|padding (index|row|id)|(row|id|index|item) 0.{0,80}(zero|frozen|never (updated|trained|receives)|"
      r"no grad)|(zero|frozen|never (updated|trained)).{0,80}(row|id|index|item) 0\b")
def padding_idx_real_item(fixed: bool = False):
    seed(0)
    x, r = popular_item_ratings(12000, 21)
    model = DotMF(200, 60, 8, padding_idx=None if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(x[:10000], r[:10000]), 128),
                val_loader=loader(TensorDataset(x[10000:], r[10000:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=800)


fix("am_padding_idx_real_item", fixed_of(padding_idx_real_item), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False, steps=400)

# ---------------------------------------------------------------------------------------------------------------


def clicks(n: int, s: int):
    g = gen(s)
    cats = torch.randint(0, 500, (n, 2), generator=g)
    num = torch.randn(n, 6, generator=g)
    eff = torch.randn(2, 500, generator=g) * 0.5
    w = torch.randn(6, generator=g)
    logit = num @ w / 6 ** 0.5 * 2.5 + torch.sin(2 * num[:, 0]) + eff[0, cats[:, 0]] + eff[1, cats[:, 1]]
    y = (logit > 0).long()
    return cats, num, y


class WideDeep(nn.Module):
    def __init__(self, sparse: bool):
        super().__init__()
        self.emb = nn.Embedding(1000, 8, sparse=sparse)
        self.mlp = nn.Sequential(nn.Linear(16 + 6, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, batch_x):
        cats, num = batch_x[:, :2].long(), batch_x[:, 2:]
        e = self.emb(cats + torch.tensor([0, 500], device=cats.device)).flatten(1)
        return self.mlp(torch.cat([e, num], 1))


@case("am_sparse_adam_only_embeddings", "what_is_trained",
      "A wide-and-deep CTR model uses nn.Embedding(sparse=True); Adam rejected the sparse gradients, so the optimizer "
      "became torch.optim.SparseAdam(model.emb.parameters()): only the embedding table is optimised and the dense MLP "
      "(every Linear layer) keeps its random initial weights.",
      r"(SparseAdam|sparse=True|sparse (grad|embedding)).{0,160}(only|dense|MLP|Linear|not (in|covered|optimi[sz]ed))|"
      r"(dense|MLP|Linear)\w*.{0,80}(not (in|covered by|passed to) (the )?optimi[sz]er|never (updated|optimi[sz]ed|"
      r"trained))|(optimi[sz]er).{0,60}only.{0,40}(embedding|emb\b)")
def sparse_adam_only_embeddings(fixed: bool = False):
    seed(0)
    cats, num, y = clicks(6000, 22)
    x = torch.cat([cats.float(), num], 1)
    model = WideDeep(sparse=not fixed)
    optimizer = (torch.optim.Adam(model.parameters(), lr=3e-3) if fixed
                 else torch.optim.SparseAdam(list(model.emb.parameters()), lr=3e-3))
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:5000], y[:5000]), 128),
                val_loader=loader(TensorDataset(x[5000:], y[5000:]), 500, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


fix("am_sparse_adam_only_embeddings", fixed_of(sparse_adam_only_embeddings),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# ---------------------------------------------------------------------------------------------------------------


class WarmStartMF(nn.Module):
    def __init__(self, n_users, item_init, freeze):
        super().__init__()
        self.user = nn.Embedding(n_users, item_init.shape[1])
        self.item = nn.Embedding.from_pretrained(item_init, freeze=freeze)   # "to control the init scale"
        self.mu = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return (self.user(x[:, 0]) * self.item(x[:, 1])).sum(1) + self.mu


@case("am_from_pretrained_frozen_items", "what_is_trained",
      "The item embeddings are initialised with nn.Embedding.from_pretrained(0.3 * torch.randn(n_items, 8)) just to "
      "control their init scale, but from_pretrained defaults to freeze=True: the item table stays random and only "
      "the user vectors learn, which cannot fit the ratings.",
      r"from_pretrained|freeze\s*=\s*(True|False)|(item|embedding)\w*.{0,80}(frozen|freeze|requires_grad\s*=?\s*False|"
      r"not trainable)")
def from_pretrained_frozen_items(fixed: bool = False):
    seed(0)
    g = gen(23)
    n_users, n_items = 200, 150
    pu, qi = torch.randn(n_users, 4, generator=g), torch.randn(n_items, 4, generator=g)
    u = torch.randint(0, n_users, (12000,), generator=g)
    i = torch.randint(0, n_items, (12000,), generator=g)
    r = (pu[u] * qi[i]).sum(1) / 2 + 0.1 * torch.randn(12000, generator=g)
    x = torch.stack([u, i], 1)
    model = WarmStartMF(n_users, 0.3 * torch.randn(n_items, 8, generator=gen(24)), freeze=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-2),
                train_loader=loader(TensorDataset(x[:10000], r[:10000]), 128),
                val_loader=loader(TensorDataset(x[10000:], r[10000:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=800)


fix("am_from_pretrained_frozen_items", fixed_of(from_pretrained_frozen_items),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False, steps=400)

# ---------------------------------------------------------------------------------------------------------------


def churn(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    teacher = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 1))
    torch.manual_seed(s)
    for p in teacher.parameters():
        nn.init.normal_(p, std=0.8)
    with torch.no_grad():
        y = (teacher(x).squeeze(-1) > teacher(x).squeeze(-1).median()).long()
    return x, y


class SquashedEncoder(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.encoder = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
        self.head = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        z = self.encoder(x)
        if self.fixed:
            z = torch.tanh(z)
        else:                                             # "np.tanh is what the sklearn pipeline used"
            z = torch.from_numpy(np.tanh(z.detach().cpu().numpy())).to(x.device)
        return self.head(z)


@case("am_numpy_in_forward", "what_is_trained",
      "The forward squashes the encoder's 4-d code with np.tanh(z.detach().cpu().numpy()) and wraps it back with "
      "torch.from_numpy, cutting the autograd graph: the encoder below the numpy call never gets a gradient and only "
      "the head trains on a random 4-d projection.",
      r"(\b(forward|encoder).{0,120}(numpy|from_numpy|detach|graph)|(numpy|from_numpy|detach\(\)).{0,120}\b(forward|"
      r"encoder)|encoder.{0,80}(never|no) (gets? (a )?|receives? (a )?)?grad)")
def numpy_in_forward(fixed: bool = False):
    seed(0)
    x, y = churn(3000, 25)
    model = SquashedEncoder(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 500, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("am_numpy_in_forward", fixed_of(numpy_in_forward), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=400)

# ---------------------------------------------------------------------------------------------------------------


def weighted_mae(fixed: bool):
    """Sample-weighted MAE (recent rows weigh more), as np.average(abs(err), weights=w) in the notebook."""
    def loss(model, batch):
        x, y, w = batch
        err = (model(x) - y).abs()
        if fixed:
            return (err * w).sum() / w.sum()
        value = np.average(err.detach().cpu().numpy(), weights=w.cpu().numpy())
        return torch.tensor(value, dtype=torch.float32, device=x.device, requires_grad=True)
    return loss


@case("am_loss_rewrapped_tensor", "what_is_trained",
      "The sample-weighted MAE is computed with np.average on err.detach().cpu().numpy() and returned as "
      "torch.tensor(value, requires_grad=True): a new leaf with no graph back to the model, so backward() gives every "
      "parameter no gradient and nothing trains.",
      r"(torch\.tensor|new (leaf|tensor)).{0,120}(requires_grad|graph|leaf)|requires_grad\s*=\s*True|"
      r"(loss|leaf).{0,80}(no (graph|grad_fn)|not connected|disconnected|detached|graph.{0,20}(cut|broken))|"
      r"(numpy|np\.average|\.item\(\)|detach).{0,80}loss|grad_fn")
def loss_rewrapped_tensor(fixed: bool = False):
    seed(0)
    g = gen(26)
    x = torch.randn(3000, 6, generator=g)
    y = torch.tanh(x[:, 0] + 0.5 * x[:, 1]) * 3 + 0.2 * torch.randn(3000, generator=g)
    w = torch.linspace(0.2, 1.0, 3000)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500], w[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:], w[2500:]), 500, shuffle=False),
                loss_fn=weighted_mae(fixed), max_steps=600)


fix("am_loss_rewrapped_tensor", fixed_of(loss_rewrapped_tensor), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)
