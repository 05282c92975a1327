"""Data: what reaches the model is not what the user's tables hold."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_af.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed


# --------------------------------------------------------------------------------------------- epoch seconds
def meter_rows(n, s):
    """Six standardised sensor channels and the reading's Unix time in seconds (the target does not depend on it)."""
    g = gen(s)
    x = torch.randn(n, 6, generator=g)
    ts = 1.69e9 + torch.rand(n, generator=g) * 3.0e7
    y = torch.tanh(x[:, 0] + 0.5 * x[:, 1]) * 2 + 0.5 * x[:, 2] * x[:, 3] + 0.05 * torch.randn(n, generator=g)
    return x, ts, y.unsqueeze(1)


@case("af_raw_epoch_timestamp_feature", "data",
      bug="The reading's Unix timestamp in seconds (about 1.7e9) is kept as a raw input column next to six "
          "standardised sensor channels: it dominates every first-layer pre-activation by nine orders of magnitude, "
          "so the network cannot use the sensors until the timestamp's weights are driven to zero; it must be scaled "
          "(or dropped) like the other columns.",
      cause_pattern=r"timestamp|epoch (seconds|time)|unix time|1\.\d+e\+?0?9|"
                    r"(feature|column|input) \d+.{0,80}(scale|magnitude|range).{0,60}(1e\+?0?9|10\^9|billion|orders? of magnitude)|"
                    r"(one|a single) (feature|column|input).{0,60}(orders? of magnitude|dominat)")
def epoch_seconds(fixed=False):
    seed(0)
    x, ts, y = meter_rows(3000, 41)
    vx, vts, vy = meter_rows(1000, 42)
    if fixed:
        mu, sd = ts.mean(), ts.std()
        ts, vts = (ts - mu) / sd, (vts - mu) / sd
    model = nn.Sequential(nn.Linear(7, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(torch.cat([x, ts[:, None]], 1), y), 64),
                val_loader=loader(TensorDataset(torch.cat([vx, vts[:, None]], 1), vy), 250, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


fix("af_raw_epoch_timestamp_feature", fixed_of(epoch_seconds),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300, higher=False)


# --------------------------------------------------------------------------------------------- a LabelEncoder per file
STATIONS = [f"st_{i:02d}" for i in range(30)]


def station_file(n, s, stations):
    g = gen(s)
    effect = torch.randn(30, 3, generator=gen(96)) * 2.0
    sid = torch.tensor(stations)[torch.randint(0, len(stations), (n,), generator=g)]
    x = torch.randn(n, 4, generator=g)
    y = (effect[sid] + 0.5 * x[:, :3]).argmax(1)
    return [STATIONS[i] for i in sid.tolist()], x, y


def label_encode(names, classes=None):
    """sklearn's LabelEncoder.fit_transform: codes index the sorted unique names (of `classes` when given)."""
    classes = np.unique(names) if classes is None else np.asarray(classes)
    return torch.from_numpy(np.searchsorted(classes, np.asarray(names))).long()


class StationModel(nn.Module):
    def __init__(self, stations=30):
        super().__init__()
        self.station = nn.Embedding(stations, 8)
        self.mlp = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, sid, x):
        return self.mlp(torch.cat([self.station(sid), x], -1))


@case("af_labelencoder_per_file", "data",
      bug="The two monthly training files are label-encoded separately (LabelEncoder().fit_transform per file); the "
          "second file lacks stations st_00-st_09, so its codes are shifted by ten and half the training rows point at "
          "another station's embedding: one encoder must be fitted on all stations and only transform() each file.",
      cause_pattern=r"(LabelEncoder|fit_transform|encoder).{0,80}(separately|per file|each file|own|refit|re-fit)|"
                    r"(encod|cod)\w*.{0,60}(separately|per file|each file|inconsistent|"
                    r"different (mapping|codes))|(same|a) (category|station|value).{0,60}different (codes?|ids?|indices)|"
                    r"(codes?|ids?).{0,40}shifted")
def per_file_encoder(fixed=False):
    seed(0)
    n1, x1, y1 = station_file(1500, 43, list(range(30)))
    n2, x2, y2 = station_file(1500, 44, list(range(10, 30)))
    nv, xv, yv = station_file(1000, 45, list(range(30)))
    if fixed:
        c1, c2, cv = (label_encode(n, STATIONS) for n in (n1, n2, nv))
    else:
        c1, c2, cv = label_encode(n1), label_encode(n2), label_encode(nv)
    model = StationModel()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(torch.cat([c1, c2]), torch.cat([x1, x2]), torch.cat([y1, y2])), 64),
                val_loader=loader(TensorDataset(cv, xv, yv), 250, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), max_steps=2000)


fix("af_labelencoder_per_file", fixed_of(per_file_encoder),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------- FM without offsets
FIELD_DIMS = (20, 20, 20)


def ad_rows(n, s):
    g = gen(s)
    gf = gen(95)
    first = torch.randn(len(FIELD_DIMS), 20, generator=gf)
    factors = torch.randn(len(FIELD_DIMS), 20, 4, generator=gf)
    cats = torch.randint(0, 20, (n, len(FIELD_DIMS)), generator=g)
    f = torch.arange(len(FIELD_DIMS))
    v = factors[f, cats]  # (n, F, 4)
    pair = 0.5 * ((v.sum(1) ** 2).sum(-1) - (v ** 2).sum((1, 2)))
    score = first[f, cats].sum(1) + 0.5 * pair
    return cats, (score > score.median()).float()


class FactorizationMachine(nn.Module):
    """One shared table for all fields, as in pytorch-fm: a field's ids are shifted by the sizes of the fields before."""

    def __init__(self, offsets, k=8):
        super().__init__()
        self.register_buffer("offsets", offsets)
        self.linear = nn.Embedding(sum(FIELD_DIMS), 1)
        self.v = nn.Embedding(sum(FIELD_DIMS), k)
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.normal_(self.v.weight, std=0.1)

    def forward(self, cats):
        idx = cats + self.offsets
        v = self.v(idx)
        pair = 0.5 * ((v.sum(1) ** 2).sum(-1) - (v ** 2).sum((1, 2)))
        return self.bias + self.linear(idx).sum((1, 2)) + pair


@case("af_fm_shared_table_no_offsets", "data",
      bug="The factorization machine keeps one embedding table of size sum(field_dims) for all fields but the "
          "per-field label-encoded ids (each 0..19) are looked up without adding the field offsets (0, 20, 40): "
          "category 3 of every field hits the same row, so the fields' weights and factors collide.",
      cause_pattern=r"offsets?|(fields?|columns?).{0,80}(collid|share the same (row|embedding|index)|same rows?)|"
                    r"collision|(ids?|indices) (of|from) (different|all|every) fields?.{0,40}(same|overlap|collid)")
def fm_offsets(fixed=False):
    seed(0)
    (x, y), (vx, vy) = ad_rows(5000, 47), ad_rows(1500, 48)
    offsets = torch.tensor((0, *np.cumsum(FIELD_DIMS)[:-1])) if fixed else torch.zeros(len(FIELD_DIMS), dtype=torch.long)
    model = FactorizationMachine(offsets)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, y), 128), val_loader=loader(TensorDataset(vx, vy), 500, shuffle=False),
                loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), b[1]), max_steps=2000)


fix("af_fm_shared_table_no_offsets", fixed_of(fm_offsets),
    acc_of(lambda m, b: ((m(b[0]) > 0).long(), b[1])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------- string-sorted node table
def node_tables(n_graphs, s, n=20, c=3):
    """Graphs whose node table (features, label) is keyed by the node id as a string; edges use integer ids.
    A node's label is the most common type among its neighbours."""
    g = gen(s)
    types = torch.randint(0, c, (n_graphs, n), generator=g)
    a = (torch.rand(n_graphs, n, n, generator=g) < 0.2).float()
    a = ((a + a.transpose(1, 2)) > 0).float() * (1 - torch.eye(n))
    a[:, torch.arange(n), (torch.arange(n) + 1) % n] = 1.0  # a ring, so that no node is isolated
    a = ((a + a.transpose(1, 2)) > 0).float()
    counts = torch.bmm(a, F.one_hot(types, c).float()) + 0.01 * torch.rand(n_graphs, n, c, generator=g)
    x = F.one_hot(types, c).float() + 0.2 * torch.randn(n_graphs, n, c, generator=g)
    return x, a, counts.argmax(-1)


def string_sorted(n=20):
    return sorted(range(n), key=str)  # the order of a table indexed by the id as text: 0, 1, 10, 11, ..., 19, 2, 3...


class NeighbourGNN(nn.Module):
    def __init__(self, c=3, d=32):
        super().__init__()
        self.l1 = nn.Linear(2 * c, d)
        self.l2 = nn.Linear(d, c)

    def forward(self, x, adj):
        agg = torch.bmm(adj, x) / adj.sum(-1, keepdim=True).clamp_min(1.0)
        return self.l2(torch.relu(self.l1(torch.cat([x, agg], -1))))


@case("af_node_table_string_sorted", "data",
      bug="The node table (features and labels) is indexed by node ids read as strings, so its rows come in the order "
          "'0', '1', '10', ..., '19', '2', ...; the adjacency uses the integer ids, so row k of x is not node k and "
          "message passing averages the features of the wrong nodes: the table must be sorted by int(id).",
      cause_pattern=r"(string|lexicographic|text|str)\w*.{0,40}(sort|order)|sort\w*.{0,40}(as|by) (strings?|text)|"
                    r"(node|row) (order|ids?|indices).{0,80}(edge|adjacen).{0,60}(mismatch|misalign|do not match|don't match|differ)|"
                    r"(features?|rows?).{0,40}(not|don't|do not) (line up|align|correspond).{0,40}(node|edge) (ids?|index)")
def string_sorted_nodes(fixed=False):
    seed(0)
    x, a, y = node_tables(240, 49)
    vx, va, vy = node_tables(80, 50)
    if not fixed:  # the table as loaded: rows in string order, read as if row k were node k
        order = torch.tensor(string_sorted())
        x, y, vx, vy = x[:, order], y[:, order], vx[:, order], vy[:, order]
    model = NeighbourGNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, a, y), 16), val_loader=loader(TensorDataset(vx, va, vy), 40, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]).reshape(-1, 3), b[2].reshape(-1)), max_steps=1000)


fix("af_node_table_string_sorted", fixed_of(string_sorted_nodes),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val node accuracy", steps=300)


# --------------------------------------------------------------------------------------------- strided windows
def regime_series(t, s):
    """Three sensor channels whose mean and oscillation depend on a machine regime (0/1/2) that switches every
    40-120 samples."""
    g = gen(s)
    regime = torch.empty(t, dtype=torch.long)
    i = 0
    while i < t:
        d = int(torch.randint(40, 120, (1,), generator=g))
        regime[i:i + d] = int(torch.randint(0, 3, (1,), generator=g))
        i += d
    means = torch.tensor([[0.0, 0.0, 0.0], [1.0, -1.0, 0.5], [-1.0, 0.5, 1.0]])
    tt = torch.arange(t, dtype=torch.float)
    sig = means[regime] + 0.5 * torch.sin(tt * (0.2 + 0.3 * regime.float()))[:, None] + 0.6 * torch.randn(t, 3, generator=g)
    return sig, regime


def windows(sig, regime, win, stride, strided_labels):
    starts = range(0, len(sig) - win + 1, stride)
    xs = torch.stack([sig[s0:s0 + win] for s0 in starts])
    ends = [i * stride + win - 1 if strided_labels else i + win - 1 for i in range(len(xs))]
    return xs, regime[torch.tensor(ends)]


class WindowCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(3, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):  # (B, T, 3)
        return self.head(self.net(x.transpose(1, 2))[:, :, -8:].mean(-1))


@case("af_window_labels_ignore_stride", "data",
      bug="Sliding windows are cut with stride 8 (start = i * 8) but each window's label is taken as regime[i + win - 1] "
          "instead of regime[i * stride + win - 1]: only the first windows get their own label, later ones get the "
          "regime of a point far before their end, so the labels are unrelated to the signal.",
      cause_pattern=r"stride|(window|label)\w*.{0,60}(misalign|offset|shifted|do not match|don't match|out of step)|"
                    r"i\s*\*\s*stride|label (index|position).{0,60}window")
def strided_windows(fixed=False):
    seed(0)
    sig, reg = regime_series(12000, 51)
    vsig, vreg = regime_series(3000, 52)
    x, y = windows(sig, reg, 32, 8, strided_labels=fixed)
    vx, vy = windows(vsig, vreg, 32, 1, strided_labels=fixed)  # validation: every position (stride 1)
    model = WindowCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 500, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("af_window_labels_ignore_stride", fixed_of(strided_windows),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)
