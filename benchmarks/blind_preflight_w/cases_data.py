"""Data: the collate, the preprocessing or the dataset hands the model something other than what was meant.
pandas and scikit-learn are not installed here, so their idioms (cat.codes, fillna, StandardScaler, target
encoding) are written out in numpy exactly as they behave."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_w.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    knn_acc_of,
    loader,
    seed,
    view_data,
)

# ---------------------------------------------------------------------------------------------------------------
# 1. Graph classification of interaction networks with a hand-written collate: node features and edge lists are
#    concatenated, but each graph's edge_index is not shifted by the number of nodes before it.


def interaction_graphs(n_graphs, s):
    """Label 1: edges join nodes of the same sign of feature 0; label 0: nodes of opposite sign. Node features
    alone carry no label information - only the edges do."""
    g = np.random.default_rng(s)
    graphs = []
    for _ in range(n_graphs):
        k = int(g.integers(8, 14))
        x = g.normal(size=(k, 3)).astype(np.float32)
        label = int(g.random() < 0.5)
        sign = x[:, 0] > 0
        src, dst = [], []
        for i in range(k):
            pool = np.nonzero((sign == sign[i]) == bool(label))[0]
            pool = pool[pool != i]
            if len(pool) == 0:
                continue
            for j in g.choice(pool, size=min(2, len(pool)), replace=False):
                src += [i, int(j)]
                dst += [int(j), i]
        graphs.append((torch.from_numpy(x), torch.tensor([src, dst], dtype=torch.long).reshape(2, -1), label))
    return graphs


def make_collate(shift_edges):
    def collate(items):
        xs, eis, batch, ys = [], [], [], []
        offset = 0
        for i, (x, ei, label) in enumerate(items):
            xs.append(x)
            eis.append(ei + offset if shift_edges else ei)
            batch.append(torch.full((x.size(0),), i, dtype=torch.long))
            ys.append(label)
            offset += x.size(0)
        return torch.cat(xs), torch.cat(eis, 1), torch.cat(batch), torch.tensor(ys)
    return collate


class EdgeAwareGNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.msg = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x, edge_index, batch):
        src, dst = edge_index
        m = self.msg(torch.cat([x[dst], x[src]], -1))
        h = torch.zeros(x.size(0), m.size(1), device=x.device, dtype=m.dtype).index_add_(0, dst, m)
        n_graphs = int(batch.max()) + 1
        pooled = torch.zeros(n_graphs, h.size(1), device=x.device, dtype=h.dtype).index_add_(0, batch, h)
        counts = torch.bincount(batch, minlength=n_graphs).clamp(min=1).to(h.dtype)
        return self.head(pooled / counts[:, None])


def gnn_loss(model, batch):
    x, ei, b, y = batch
    return F.cross_entropy(model(x, ei, b), y)


def build_collate_no_offset(fixed: bool = False) -> dict:
    seed(0)
    graphs = interaction_graphs(1000, 211)
    collate = make_collate(shift_edges=fixed)
    model = EdgeAwareGNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:800], batch_size=32, collate_fn=collate),
                val_loader=DataLoader(graphs[800:], batch_size=50, collate_fn=collate),
                loss_fn=gnn_loss)


case("graph_collate_edges_not_offset", "data",
     "The custom collate concatenates the graphs' node features but not their edge indices' offsets: each graph's "
     "edge_index still counts from 0, so all edges of the batch land on the first graph's nodes and every other "
     "graph is seen without its edges.",
     r"(edge_?index|edges?|indices).{0,100}(offset|shift|increment|cumulative|cumsum|number of nodes before|"
     r"num_nodes)|(offset|shift|increment)\w*.{0,80}(edge_?index|edges?|node indices)|(first|same) graph'?s? nodes|"
     r"collate.{0,80}(offset|increment|shift)")(build_collate_no_offset)
fix("graph_collate_edges_not_offset", fixed_of(build_collate_no_offset),
    acc_of(lambda m, b: (m(b[0], b[1], b[2]).argmax(-1), b[3])), "val graph accuracy", steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 2. Churn prediction with a "region" column label-encoded the pandas way - df[col].astype("category").cat.codes -
#    separately on the train and on the validation frame; validation lacks a few regions, so its codes shift.

REGIONS = np.array(sorted(f"R{i:02d}" for i in range(30)))


def cat_codes(values):
    """pandas: pd.Series(values).astype("category").cat.codes (categories = the sorted unique values seen)."""
    cats, codes = np.unique(values, return_inverse=True)
    return cats, codes


def churn_frame(n, s, drop_regions=()):
    g = np.random.default_rng(s)
    effect = np.random.default_rng(221).normal(0, 1.5, size=len(REGIONS))
    allowed = np.array([r for r in REGIONS if r not in drop_regions])
    region = g.choice(allowed, size=n)
    tenure = g.normal(size=n)
    ridx = np.searchsorted(REGIONS, region)
    logit = 2.0 * effect[ridx] - 0.8 * tenure
    y = (logit + g.logistic(size=n) > 0).astype(np.int64)
    return region, tenure.astype(np.float32), y


class ChurnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.region = nn.Embedding(30, 8)
        self.mlp = nn.Sequential(nn.Linear(9, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, code, tenure):
        return self.mlp(torch.cat([self.region(code), tenure[:, None]], -1))


def churn_loss(model, batch):
    code, tenure, y = batch
    return F.cross_entropy(model(code, tenure), y)


def build_codes_refit_on_val(fixed: bool = False) -> dict:
    seed(0)
    r_tr, t_tr, y_tr = churn_frame(4000, 222)
    r_va, t_va, y_va = churn_frame(1000, 223, drop_regions=("R01", "R02", "R04"))
    train_cats, c_tr = cat_codes(r_tr)
    if fixed:
        c_va = np.searchsorted(train_cats, r_va)  # pd.Categorical(val, categories=train_cats).codes
    else:
        _, c_va = cat_codes(r_va)
    model = ChurnNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(torch.from_numpy(c_tr), torch.from_numpy(t_tr),
                                                  torch.from_numpy(y_tr)), batch_size=128),
                val_loader=DataLoader(TensorDataset(torch.from_numpy(c_va), torch.from_numpy(t_va),
                                                    torch.from_numpy(y_va)), batch_size=500),
                loss_fn=churn_loss)


case("category_codes_refit_on_validation", "data",
     "The region column is label-encoded with astype('category').cat.codes separately on the train and the "
     "validation frame; validation lacks three regions, so its sorted categories differ and most regions get "
     "another region's code: the embeddings learned for one region are applied to another.",
     r"cat\.codes|(categor\w*|codes?|label[- ]?encod\w*|mapping|vocabular\w*).{0,120}(separately|refit|re-fit|"
     r"fit(ted)? (on|to) (the )?(val|validation|test)|differ|inconsistent|mismatch|shift)|(train(ing)?) "
     r"categories|categories ?= ?train")(build_codes_refit_on_val)
fix("category_codes_refit_on_validation", fixed_of(build_codes_refit_on_val),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy", steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 3. Loan default from applicant rows: missing incomes are filled with the sentinel -999 (the tree-model habit)
#    before a StandardScaler, whose std then comes from the sentinel: real incomes shrink to one point.


def loan_rows(n, s):
    g = np.random.default_rng(s)
    income = g.normal(0, 1, size=n)
    debt = g.normal(0, 1, size=n)
    age = g.normal(0, 1, size=n)
    y = ((2.5 * income - 1.0 * debt + 0.3 * age + 0.5 * g.normal(size=n)) < 0).astype(np.int64)
    missing = g.random(n) < 0.15
    income = np.where(missing, np.nan, income)
    return np.stack([income, debt, age], 1), y


def standard_scale(train, other):
    """sklearn StandardScaler: fit on train, transform both."""
    mu, sd = train.mean(0), train.std(0) + 1e-12
    return (train - mu) / sd, (other - mu) / sd


def build_sentinel_then_scale(fixed: bool = False) -> dict:
    seed(0)
    x_tr, y_tr = loan_rows(4000, 231)
    x_va, y_va = loan_rows(1000, 232)
    if fixed:
        med = np.nanmedian(x_tr[:, 0])
        ind_tr, ind_va = np.isnan(x_tr[:, :1]), np.isnan(x_va[:, :1])
        x_tr, x_va = np.nan_to_num(x_tr, nan=med), np.nan_to_num(x_va, nan=med)
        x_tr, x_va = np.concatenate([x_tr, ind_tr], 1), np.concatenate([x_va, ind_va], 1)
    else:
        x_tr, x_va = np.nan_to_num(x_tr, nan=-999.0), np.nan_to_num(x_va, nan=-999.0)  # df.fillna(-999)
        x_tr, x_va = np.concatenate([x_tr, np.zeros((len(x_tr), 1))], 1), np.concatenate(
            [x_va, np.zeros((len(x_va), 1))], 1)
    x_tr, x_va = standard_scale(x_tr, x_va)
    f = lambda a: torch.from_numpy(a.astype(np.float32))  # noqa: E731
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(f(x_tr), torch.from_numpy(y_tr)), batch_size=64),
                val_loader=DataLoader(TensorDataset(f(x_va), torch.from_numpy(y_va)), batch_size=500),
                loss_fn=nn.CrossEntropyLoss())


case("sentinel_fill_before_scaler", "data",
     "Missing incomes are filled with the sentinel -999 before the StandardScaler, so the income column's mean "
     "and std are dominated by the sentinel (std about 360): every real income maps to nearly the same value, "
     "about 0.5 +- 0.003, and the strongest predictor is lost.",
     r"-999|sentinel|fillna|(missing|nan).{0,120}(scal|standardi[sz]|std|mean|impute|median|indicator)|"
     r"(std|standard deviation|scale).{0,80}(dominat|inflat|blown|huge|sentinel)|(impute|median).{0,60}"
     r"(missing|indicator)")(build_sentinel_then_scale)
fix("sentinel_fill_before_scaler", fixed_of(build_sentinel_then_scale),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 4. Card-fraud rows with a merchant_id of 2500 levels, target-encoded in-sample
#    (df.groupby("merchant_id")["fraud"].transform("mean")) on the training frame: each row's own label leaks in.


def fraud_rows(n, n_merchants, s):
    g = np.random.default_rng(s)
    merchant = g.integers(0, n_merchants, size=n)
    amount = g.normal(size=n)
    hour = g.normal(size=n)
    risk = np.random.default_rng(241).normal(0, 0.3, size=n_merchants)
    y = (1.0 * amount - 0.7 * hour + risk[merchant] + 0.8 * g.normal(size=n) > 0.5).astype(np.int64)
    return merchant, np.stack([amount, hour], 1), y


def group_mean(keys, values, n_keys, prior, smooth=0.0):
    s = np.bincount(keys, weights=values, minlength=n_keys)
    c = np.bincount(keys, minlength=n_keys)
    return (s + smooth * prior) / np.maximum(c + smooth, 1e-9), c


def build_target_encoding_in_sample(fixed: bool = False) -> dict:
    seed(0)
    m_tr, x_tr, y_tr = fraud_rows(4000, 2500, 242)
    m_va, x_va, y_va = fraud_rows(1000, 2500, 243)
    prior = y_tr.mean()
    if fixed:  # out-of-fold encoding on train (5 folds), full-train encoding for validation
        enc_tr = np.empty(len(m_tr))
        folds = np.random.default_rng(244).integers(0, 5, size=len(m_tr))
        for k in range(5):
            means, _ = group_mean(m_tr[folds != k], y_tr[folds != k].astype(float), 2500, prior, smooth=5.0)
            enc_tr[folds == k] = means[m_tr[folds == k]]
        means, _ = group_mean(m_tr, y_tr.astype(float), 2500, prior, smooth=5.0)
    else:
        means, counts = group_mean(m_tr, y_tr.astype(float), 2500, prior)
        means = np.where(counts > 0, means, prior)
        enc_tr = means[m_tr]  # groupby().transform("mean"): includes the row's own label
    enc_va = means[m_va]
    f = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float32))  # noqa: E731
    xt, xv = f(np.concatenate([x_tr, enc_tr[:, None]], 1)), f(np.concatenate([x_va, enc_va[:, None]], 1))
    model = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, torch.from_numpy(y_tr)), batch_size=64),
                val_loader=DataLoader(TensorDataset(xv, torch.from_numpy(y_va)), batch_size=500),
                loss_fn=nn.CrossEntropyLoss())


case("target_encoding_leaks_own_label", "data",
     "The high-cardinality merchant_id is target-encoded with the in-sample group mean of the label on the "
     "training frame; with under 2 rows per merchant each row's own label dominates its encoding, so the model "
     "learns to read the label off that column and fails on validation rows whose encoding comes from other rows.",
     r"target[- ]encod\w*|mean[- ]encod\w*|(leak\w*).{0,80}(label|target)|(own|row'?s?) (label|target).{0,80}"
     r"(encod|feature|column)|out[- ]of[- ]fold|groupby.{0,60}(mean|transform)|leave[- ]one[- ]out")(
    build_target_encoding_in_sample)
fix("target_encoding_leaks_own_label", fixed_of(build_target_encoding_in_sample),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 5. Contrastive pretraining on accelerometer windows: the Dataset makes its two views with
#    augment(x, seed=idx) "for reproducibility", and augment builds a fresh RNG from the seed - both views are
#    the same tensor, in every epoch.


class TwoViewWindows(Dataset):
    def __init__(self, x, q, fixed):
        self.x, self.q, self.fixed = x, q, fixed

    def __len__(self):
        return len(self.x)

    def augment(self, x, seed):
        g = None if seed is None else torch.Generator().manual_seed(int(seed))
        coords = x @ self.q.T
        coords[8:] = coords[8:] + 2.0 * torch.randn(coords[8:].shape, generator=g)
        return coords @ self.q

    def __getitem__(self, idx):
        seed = None if self.fixed else idx
        return self.augment(self.x[idx], seed), self.augment(self.x[idx], seed)


class WindowEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(32, 32))

    def forward(self, x):
        return self.head(self.encoder(x))


def two_view_nt_xent(model, batch):
    v1, v2 = batch
    n = v1.size(0)
    z = F.normalize(model(torch.cat([v1, v2])), dim=1)
    logits = (z @ z.T / 0.2).masked_fill(torch.eye(2 * n, dtype=torch.bool, device=v1.device), float("-inf"))
    labels = (torch.arange(2 * n, device=v1.device) + n) % (2 * n)
    return F.cross_entropy(logits, labels)


def build_views_same_seed(fixed: bool = False) -> dict:
    seed(0)
    x, y, q = view_data(2400, 6, 8, 24, 2.0, s=251)
    model = WindowEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TwoViewWindows(x[:1800], q, fixed), batch_size=128, drop_last=True),
                val_loader=DataLoader(TensorDataset(x[1800:], y[1800:]), batch_size=300),
                loss_fn=two_view_nt_xent)


case("contrastive_views_seeded_by_index", "data",
     "The Dataset draws both augmented views with augment(x, seed=idx), which builds a fresh generator from the "
     "index each call, so the two views of a sample are identical (and the same every epoch): the positives are "
     "trivially matched and the encoder never learns invariance to the augmentation.",
     r"(views?|augment\w*|positives?).{0,100}(identical|the same|same (tensor|seed|rng|random)|not (random|"
     r"different)|seeded)|seed ?= ?idx|(fixed|same|reset) (seed|rng|generator).{0,80}(view|augment)|"
     r"manual_seed.{0,60}(idx|index|__getitem__)")(build_views_same_seed)
fix("contrastive_views_seeded_by_index", fixed_of(build_views_same_seed),
    knn_acc_of(lambda m, x: m.encoder(x)), "val 5-NN accuracy", steps=120)
