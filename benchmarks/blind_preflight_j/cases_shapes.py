"""Set j, family shapes: shapes, broadcasting, axes and reductions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_j.registry import case, fix, gen, loader, mean_over, seed

# --------------------------------------------------------------------------------------------------------------------
# 1. matrix factorisation with an einsum whose output letters do not contract the factor axis


def _ratings(n_users=120, n_items=100, n=4000, k=4, s=0):
    g = gen(s)
    pu, qi = torch.randn(n_users, k, generator=g), torch.randn(n_items, k, generator=g)
    u = torch.randint(0, n_users, (n,), generator=g)
    i = torch.randint(0, n_items, (n,), generator=g)
    r = (pu[u] * qi[i]).sum(1) / k ** 0.5 + 0.1 * torch.randn(n, generator=g)
    return u, i, r


class FactorModel(nn.Module):
    def __init__(self, n_users, n_items, dim=16, subscripts="bd,bd->b"):
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        self.user_bias = nn.Embedding(n_users, 1)
        self.item_bias = nn.Embedding(n_items, 1)
        for e in (self.user, self.item):
            nn.init.normal_(e.weight, std=0.3)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)
        self.subscripts = subscripts

    def forward(self, u, i):
        dot = torch.einsum(self.subscripts, self.user(u), self.item(i))
        return dot + self.user_bias(u).squeeze(-1) + self.item_bias(i).squeeze(-1)


def rating_mse(model, batch):
    u, i, r = batch
    return F.mse_loss(model(u, i), r)


def _val_rmse(model, kw):
    def fn(m, b):
        u, i, r = (t.to(next(m.parameters()).device) for t in b)
        return ((m(u, i) - r) ** 2).sum().item(), len(r)
    return mean_over(model, kw["val_loader"], fn) ** 0.5


@case("shop_mf_einsum_factor_axis_not_contracted", "shapes",
      "the rating is torch.einsum('bd,be->b', user, item) with two different letters for the factor axis: einsum sums "
      "each factor vector on its own and multiplies the sums, sum(u) * sum(v), a rank-one product of two scalars, "
      "instead of the dot product 'bd,bd->b'; the user-item interaction cannot be fitted",
      r"einsum|subscript|sum\(u\)\s*\*\s*sum\(v\)|product of (the |their )?sums|dot product|outer (sum|product)|"
      r"contract\w*|rank.?(one|1)\b")
def shop_mf_einsum_factor_axis_not_contracted(fixed: bool = False):
    seed(0)
    u, i, r = _ratings()
    model = FactorModel(120, 100, subscripts="bd,bd->b" if fixed else "bd,be->b")
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(u[:3200], i[:3200], r[:3200]), 64),
                val_loader=loader(TensorDataset(u[3200:], i[3200:], r[3200:]), 200, shuffle=False),
                loss_fn=rating_mse, max_steps=500)


def _fact_einsum():
    u, v = torch.randn(2, 3), torch.randn(2, 3)
    print("  einsum('bd,be->b') =", torch.einsum("bd,be->b", u, v).tolist(), "= sum(u)*sum(v) =",
          (u.sum(1) * v.sum(1)).tolist(), "; dot =", (u * v).sum(1).tolist())


fix("shop_mf_einsum_factor_axis_not_contracted", lambda: shop_mf_einsum_factor_axis_not_contracted(fixed=True),
    _val_rmse, "val RMSE", _fact_einsum, steps=500, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 2. logged-action value regression that gathers along the batch axis


def _logged_actions(n=3072, d=12, n_actions=4, s=1):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(n_actions, d, generator=g) / d ** 0.5
    a = torch.randint(0, n_actions, (n,), generator=g)
    reward = torch.tanh(x @ w.T)[torch.arange(n), a] * 2 + 0.1 * torch.randn(n, generator=g)
    return x, a, reward


class QNet(nn.Module):
    def __init__(self, d=12, n_actions=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, n_actions))

    def forward(self, x):
        return self.net(x)


def _q_loss(gather_dim):
    def q_value_loss(model, batch):
        x, a, reward = batch
        q = model(x)
        q_taken = q.gather(gather_dim, a.unsqueeze(1)).squeeze(1)
        return F.smooth_l1_loss(q_taken, reward)
    return q_value_loss


def _val_q_mae(model, kw):
    def fn(m, b):
        x, a, reward = (t.to(next(m.parameters()).device) for t in b)
        return (m(x).gather(1, a.unsqueeze(1)).squeeze(1) - reward).abs().sum().item(), len(reward)
    return mean_over(model, kw["val_loader"], fn)


@case("offline_bandit_q_gather_along_batch_axis", "shapes",
      "the taken action's value is picked with q.gather(0, actions.unsqueeze(1)) on the (B, n_actions) Q matrix: "
      "gather along dim 0 (the batch) returns q[actions[i], 0], the first action's value of sample 0-3, instead of "
      "q[i, actions[i]] (gather along dim 1); every reward is regressed on the wrong sample's output",
      r"gather|dim\s*=?\s*0\b|(batch|first) (axis|dim)|wrong (axis|dim)|along (the )?(batch|dim)|"
      r"q\[\s*i\s*,\s*a|taken action|index(ed|es|ing)? (the |along )?(wrong|batch)")
def offline_bandit_q_gather_along_batch_axis(fixed: bool = False):
    seed(0)
    x, a, reward = _logged_actions()
    model = QNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2560], a[:2560], reward[:2560]), 64, drop_last=True),
                val_loader=loader(TensorDataset(x[2560:], a[2560:], reward[2560:]), 256, shuffle=False),
                loss_fn=_q_loss(1 if fixed else 0), max_steps=400)


def _fact_gather():
    q, a = torch.arange(12.).view(4, 3), torch.tensor([2, 0, 1, 1])
    print("  q.gather(0, a[:,None]) ->", q.gather(0, a[:, None]).squeeze(1).tolist(),
          "; q.gather(1, a[:,None]) ->", q.gather(1, a[:, None]).squeeze(1).tolist())


fix("offline_bandit_q_gather_along_batch_axis", lambda: offline_bandit_q_gather_along_batch_axis(fixed=True),
    _val_q_mae, "val MAE of the taken action's value", _fact_gather, steps=400, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 3. point clouds canonicalised with torch.sort's default dim=-1 (within each point)


def _clouds(n=2400, points=24, s=2):
    g = gen(s)
    axis = torch.randint(0, 3, (n,), generator=g)
    scale = torch.full((n, 3), 0.35)
    scale[torch.arange(n), axis] = 1.6
    pts = torch.randn(n, points, 3, generator=g) * scale[:, None, :] + 0.2 * torch.randn(n, 1, 3, generator=g)
    return pts, axis


class SortedSetMLP(nn.Module):
    """Canonicalise the unordered point set by sorting, then an MLP on the flattened (points * 3) tensor."""

    def __init__(self, points=24, sort_dim=1):
        super().__init__()
        self.sort_dim = sort_dim
        self.mlp = nn.Sequential(nn.Linear(points * 3, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, pts):
        if self.sort_dim is None:
            canon, _ = torch.sort(pts)
        else:
            canon, _ = torch.sort(pts, dim=self.sort_dim)
        return self.mlp(canon.flatten(1))


def _val_acc(model, kw):
    def fn(m, b):
        x, y = (t.to(next(m.parameters()).device) for t in b)
        return (m(x).argmax(-1) == y).sum().item(), len(y)
    return mean_over(model, kw["val_loader"], fn)


@case("pointcloud_sort_default_dim_sorts_coordinates", "shapes",
      "the unordered point set (B, points, 3) is canonicalised with torch.sort(pts), whose default dim=-1 sorts the "
      "x, y, z coordinates inside each point instead of ordering along the points axis (dim=1): which value was x, y "
      "or z is lost, and the elongation axis the label is about cannot be recovered",
      r"torch\.sort|sort\w*[^.]*(coordinates|within each point|inside each point|last (axis|dim))|coordinate"
      r"s? (of|in|inside|within) (each|every) point|sort\w*[^.]*dim\s*=\s*-1")

def pointcloud_sort_default_dim_sorts_coordinates(fixed: bool = False):
    seed(0)
    pts, axis = _clouds()
    model = SortedSetMLP(sort_dim=1 if fixed else None)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(pts[:2000], axis[:2000]), 64),
                val_loader=loader(TensorDataset(pts[2000:], axis[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def _fact_sort():
    p = torch.tensor([[[3.0, -1.0, 0.5], [0.1, 2.0, -4.0]]])
    print("  torch.sort(p)[0] =", torch.sort(p)[0].tolist(), "; torch.sort(p, dim=1)[0] =", torch.sort(p, dim=1)[0].tolist())


fix("pointcloud_sort_default_dim_sorts_coordinates", lambda: pointcloud_sort_default_dim_sorts_coordinates(fixed=True),
    _val_acc, "val accuracy", _fact_sort, steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 4. distillation with nn.KLDivLoss's default reduction='mean' (divides by the classes too) and an SGD lr tuned for it

C_KD, D_KD = 200, 32


def _teacher_data(n=3000, s=3):
    g = gen(s)
    x = torch.randn(n, D_KD, generator=g)
    w1 = torch.randn(D_KD, 64, generator=g) / D_KD ** 0.5
    w2 = torch.randn(64, C_KD, generator=g) * 0.6
    logits = torch.relu(x @ w1) @ w2
    return x, torch.log_softmax(logits / 2.0, dim=-1)


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D_KD, 128), nn.ReLU(), nn.Linear(128, C_KD))

    def forward(self, x):
        return torch.log_softmax(self.net(x), dim=-1)


def _val_top1_agreement(model, kw):
    def fn(m, b):
        x, t = (v.to(next(m.parameters()).device) for v in b)
        return (m(x).argmax(-1) == t.argmax(-1)).sum().item(), len(x)
    return mean_over(model, kw["val_loader"], fn)


@case("distill_kldivloss_default_mean_reduction", "shapes",
      "the distillation loss is nn.KLDivLoss() with its default reduction='mean', which averages over the batch AND "
      "the 200 classes (every element), while the KL divergence per sample is the sum over classes "
      "(reduction='batchmean'): the loss and its gradients are 200 times too small and the SGD student with lr=0.5, "
      "set for the per-sample KL, barely moves",
      r"batchmean|reduction|KLDivLoss|kl_div|(divid|averag)\w*[^.]*(class|element|support|vocab)|"
      r"(class|element|support)[^.]*(divid|averag)")
def distill_kldivloss_default_mean_reduction(fixed: bool = False):
    seed(0)
    x, teacher = _teacher_data()
    model = Student()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                train_loader=loader(TensorDataset(x[:2500], teacher[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], teacher[2500:]), 250, shuffle=False),
                loss_fn=nn.KLDivLoss(reduction="batchmean" if fixed else "mean", log_target=True), max_steps=400)


def _fact_kldiv():
    s, t = torch.log_softmax(torch.randn(4, 200), -1), torch.log_softmax(torch.randn(4, 200), -1)
    a = nn.KLDivLoss(reduction="mean", log_target=True)(s, t).item()
    b = nn.KLDivLoss(reduction="batchmean", log_target=True)(s, t).item()
    print(f"  KLDivLoss mean = {a:.4f}, batchmean = {b:.4f}, ratio = {b / a:.0f} (the number of classes)")


fix("distill_kldivloss_default_mean_reduction", lambda: distill_kldivloss_default_mean_reduction(fixed=True),
    _val_top1_agreement, "val top-1 agreement with the teacher", _fact_kldiv, steps=400)


# --------------------------------------------------------------------------------------------------------------------
# 5. transformer read-out that averages over the model dimension; a LazyLinear head hides the shape

T_TXT, VOCAB_TXT, C_TXT = 24, 40, 4


def _keyword_streams(n=2600, s=4):
    """Random filler tokens (ids 8..39) with two keywords of the class (ids 2c, 2c + 1) at random positions."""
    g = gen(s)
    tok = torch.randint(8, VOCAB_TXT, (n, T_TXT), generator=g)
    y = torch.randint(0, C_TXT, (n,), generator=g)
    for j in range(2):
        pos = torch.randint(0, T_TXT, (n,), generator=g)
        tok[torch.arange(n), pos] = 2 * y + j
    return tok, y


class KeywordEncoder(nn.Module):
    def __init__(self, d=32, pool_dim=1):
        super().__init__()
        self.emb = nn.Embedding(VOCAB_TXT, d)
        self.pos = nn.Parameter(torch.randn(1, T_TXT, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.LazyLinear(C_TXT)
        self.pool_dim = pool_dim

    def forward(self, tok):
        h = self.encoder(self.emb(tok) + self.pos)
        return self.head(h.mean(dim=self.pool_dim))


@case("keyword_transformer_mean_over_model_dim_lazy_head", "shapes",
      "the sequence read-out is h.mean(dim=-1) on the (B, T, d_model) encoder output, the Keras axis=-1 habit: it "
      "averages the model dimension away (after the post-norm LayerNorm every token's mean over d_model is about the "
      "same constant) and keeps the T positions; the nn.LazyLinear head silently takes T inputs instead of d_model, so "
      "no shape error shows it (pool over dim=1, the tokens)",
      r"mean\(dim\s*=\s*-1|axis\s*=\s*-1|(model|feature|hidden|embedding) (dim|dimension|axis)[^.]*(averag|m"
      r"ean|pool)|(averag|mean|pool)\w*[^.]*(model|feature|hidden|embedding) (dim|dimension|axis)|d_model|La"
      r"zyLinear|lazy|over the (tokens|sequence|time steps|positions)")

def keyword_transformer_mean_over_model_dim_lazy_head(fixed: bool = False):
    seed(0)
    tok, y = _keyword_streams()
    model = KeywordEncoder(pool_dim=1 if fixed else -1)
    with torch.no_grad():
        model(tok[:2])                                # dry run: materialise the lazy head before the optimizer
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(tok[:2200], y[:2200]), 64),
                val_loader=loader(TensorDataset(tok[2200:], y[2200:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


def _fact_mean_last():
    ln = nn.LayerNorm(32)
    h = ln(torch.randn(2, 5, 32) * 3 + 1)
    print("  after LayerNorm, h.mean(-1) =", [f"{v:.1e}" for v in h.mean(-1).flatten()[:5].tolist()],
          "(a constant per token); h.mean(1).shape =", tuple(h.mean(1).shape))


fix("keyword_transformer_mean_over_model_dim_lazy_head",
    lambda: keyword_transformer_mean_over_model_dim_lazy_head(fixed=True),
    _val_acc, "val accuracy", _fact_mean_last, steps=400)
