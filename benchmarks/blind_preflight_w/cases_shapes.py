"""Shapes: a tensor of the wrong layout that broadcasts, reshapes or reduces without an error."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_w.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    sbm_graph,
    seed,
    val_mean,
)

# ---------------------------------------------------------------------------------------------------------------
# 1. Node classification on a citation-style graph: the edge list comes out of a CSV as (E, 2) rows of
#    (src, dst) and is turned into the (2, E) edge_index the GCN wants with .view(2, -1) instead of .t().


class FullGraph(torch.utils.data.Dataset):
    """One transductive graph: every batch is the whole graph."""

    def __init__(self, *tensors):
        self.tensors = tensors

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return self.tensors


def first(items):
    return items[0]


class GCN(nn.Module):
    def __init__(self, d_in, d_hidden, n_classes):
        super().__init__()
        self.lin1 = nn.Linear(d_in, d_hidden)
        self.lin2 = nn.Linear(d_hidden, n_classes)

    @staticmethod
    def propagate(h, edge_index):
        n = h.size(0)
        loops = torch.arange(n, device=h.device)
        src = torch.cat([edge_index[0], loops])
        dst = torch.cat([edge_index[1], loops])
        deg = torch.zeros(n, device=h.device, dtype=h.dtype).index_add_(0, dst, torch.ones_like(dst, dtype=h.dtype))
        norm = deg.rsqrt()[src] * deg.rsqrt()[dst]
        return torch.zeros_like(h).index_add_(0, dst, h[src] * norm[:, None])

    def forward(self, x, edge_index):
        h = F.relu(self.propagate(self.lin1(x), edge_index))
        h = F.dropout(h, 0.3, self.training)
        return self.propagate(self.lin2(h), edge_index)


def node_loss(model, batch):
    x, edge_index, y, mask = batch
    return F.cross_entropy(model(x, edge_index)[mask], y[mask])


def node_pred(model, batch):
    x, edge_index, y, mask = batch
    return model(x, edge_index).argmax(-1)[mask], y[mask]


def build_edge_list_view(fixed: bool = False) -> dict:
    seed(0)
    g = sbm_graph(n=600, classes=4, dim=16, homophily=0.9, degree=8, signal=0.45, noise=1.0, s=11)
    edge_rows = g["edges"].numpy()  # what pd.read_csv("cites.csv")[["src", "dst"]].values gives: (E, 2)
    if fixed:
        edge_index = torch.from_numpy(edge_rows).t().contiguous()
    else:
        edge_index = torch.from_numpy(edge_rows).view(2, -1)  # "needs shape [2, num_edges]"
    train = FullGraph(g["x"], edge_index, g["y"], g["train_mask"])
    val = FullGraph(g["x"], edge_index, g["y"], g["val_mask"])
    model = GCN(16, 32, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4),
                train_loader=DataLoader(train, batch_size=1, collate_fn=first),
                val_loader=DataLoader(val, batch_size=1, collate_fn=first),
                loss_fn=node_loss, max_steps=200)


case("gnn_edge_list_view", "shapes",
     "The (E, 2) edge list from the CSV is reshaped to the (2, E) edge_index with .view(2, -1) instead of transposed "
     "(.t()), so row 0 and row 1 are the first and second half of the flattened pairs: every edge joins two "
     "unrelated nodes and message passing averages in random neighbours.",
     r"edge_?index.{0,80}(view|reshape)|(view|reshape)\(2, ?-1\)|\.t\(\)|transpos\w*.{0,60}edge|edge.{0,80}transpos|"
     r"\(E, ?2\)|\[E, ?2\]|"
     r"(num_edges|E), ?2\).{0,40}(2, ?(num_edges|E))|edge list.{0,60}(scrambl|wrong|unrelated|random|flatten)|"
     r"edges? (join|connect|link)s? (random|unrelated)")(build_edge_list_view)
fix("gnn_edge_list_view", fixed_of(build_edge_list_view), acc_of(node_pred), "val node accuracy", steps=200)


# ---------------------------------------------------------------------------------------------------------------
# 2. Graph classification with graphs batched into one big disjoint graph: the readout averages over dim 0 of the
#    whole batch instead of per graph (no batch vector), then .expand()s to the batch size "to fix the shape error".


def make_molecules(n_graphs: int, s: int):
    g = gen(s)
    graphs = []
    protos = torch.randn(3, 6, generator=g)
    for _ in range(n_graphs):
        k = int(torch.randint(6, 13, (1,), generator=g))
        label = int(torch.randint(0, 3, (1,), generator=g))
        x = torch.randn(k, 6, generator=g)
        marked = torch.rand(k, generator=g) < 0.5
        x[marked] += 0.9 * protos[label]
        ring = torch.arange(k)
        src = torch.cat([ring, (ring + 1) % k])
        dst = torch.cat([(ring + 1) % k, ring])
        graphs.append((x, torch.stack([src, dst]), label))
    return graphs


def collate_graphs(items):
    xs, eis, batch, ys, offset = [], [], [], [], 0
    for i, (x, ei, label) in enumerate(items):
        xs.append(x)
        eis.append(ei + offset)
        batch.append(torch.full((x.size(0),), i, dtype=torch.long))
        ys.append(label)
        offset += x.size(0)
    return torch.cat(xs), torch.cat(eis, 1), torch.cat(batch), torch.tensor(ys)


class GraphClassifier(nn.Module):
    def __init__(self, pool_per_graph: bool):
        super().__init__()
        self.pool_per_graph = pool_per_graph
        self.conv1 = nn.Linear(6, 32)
        self.conv2 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 3)

    def mp(self, h, edge_index):
        src, dst = edge_index
        agg = torch.zeros_like(h).index_add_(0, dst, h[src])
        return h + 0.5 * agg

    def forward(self, x, edge_index, batch):
        h = F.relu(self.conv1(self.mp(x, edge_index)))
        h = F.relu(self.conv2(self.mp(h, edge_index)))
        num_graphs = int(batch.max()) + 1
        if self.pool_per_graph:
            sums = torch.zeros(num_graphs, h.size(1), device=h.device, dtype=h.dtype).index_add_(0, batch, h)
            counts = torch.bincount(batch, minlength=num_graphs).clamp(min=1).to(h.dtype)
            hg = sums / counts[:, None]
        else:
            hg = h.mean(dim=0, keepdim=True).expand(num_graphs, -1)  # global_mean_pool(h) without batch
        return self.head(hg)


def graph_loss(model, batch):
    x, ei, b, y = batch
    return F.cross_entropy(model(x, ei, b), y)


def graph_pred(model, batch):
    x, ei, b, y = batch
    return model(x, ei, b).argmax(-1), y


def build_pool_batch_mean(fixed: bool = False) -> dict:
    seed(0)
    graphs = make_molecules(900, 21)
    model = GraphClassifier(pool_per_graph=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:700], batch_size=32, collate_fn=collate_graphs),
                val_loader=DataLoader(graphs[700:], batch_size=64, collate_fn=collate_graphs),
                loss_fn=graph_loss)


case("graph_readout_whole_batch", "shapes",
     "The graph readout averages node embeddings over dim 0 of the whole mini-batch (global mean pool without the "
     "batch assignment vector) and expands that one vector to num_graphs rows, so every graph in a batch gets the "
     "same prediction.",
     r"batch (assignment )?vector|global_(mean|add|max)_pool|per[- ]graph|(pool|readout|mean).{0,60}(whole|entire|all) "
     r"(the )?(mini-?)?batch|same (prediction|output|logits|embedding) for (every|all|each) graph|"
     r"\.expand\(|scatter[_ ](mean|add)|segment[_ ]mean|(pool\w*|readout).{0,80}(dim(ension)? ?=? ?0|over (the )?(mini-?)?batch)")(build_pool_batch_mean)
fix("graph_readout_whole_batch", fixed_of(build_pool_batch_mean), acc_of(graph_pred), "val graph accuracy", steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 3. A VAE on binary glyphs: the KL term is summed over dim=0 (the batch) and then averaged over the latent
#    dimensions, i.e. batch_size / latent_dim times the per-sample KL the reconstruction term is weighed against.


def glyphs(n: int, s: int):
    g = gen(s)
    protos = (torch.rand(12, 64, generator=g) < 0.35).float()
    idx = torch.randint(0, 12, (n,), generator=g)
    flips = (torch.rand(n, 64, generator=g) < 0.05).float()
    return (protos[idx] - flips).abs()


class GlyphVAE(nn.Module):
    def __init__(self, d=64, z=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 128), nn.ReLU())
        self.mu = nn.Linear(128, z)
        self.logvar = nn.Linear(128, z)
        self.dec = nn.Sequential(nn.Linear(z, 128), nn.ReLU(), nn.Linear(128, d))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def vae_kl_loss(sum_dim: int):
    def loss_fn(model, batch):
        x = batch[0]
        logits, mu, logvar = model(x)
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / x.size(0)
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=sum_dim).mean()
        return rec + kl
    return loss_fn


def glyph_recon_mse(model, batch):
    x = batch[0]
    mu = model.mu(model.enc(x))
    return ((torch.sigmoid(model.dec(mu)) - x) ** 2).sum().item(), x.numel()


def build_kl_sum_dim0(fixed: bool = False) -> dict:
    seed(0)
    data = glyphs(2400, 31)
    model = GlyphVAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(data[:2000]), batch_size=128),
                val_loader=DataLoader(TensorDataset(data[2000:]), batch_size=200),
                loss_fn=vae_kl_loss(1 if fixed else 0))


case("vae_kl_summed_over_batch", "shapes",
     "The VAE's KL term is summed over dim=0 (the batch) and averaged over the latent dimensions, so it weighs "
     "batch_size / latent_dim times the per-sample KL against a per-sample reconstruction: the posterior collapses "
     "to the prior and reconstructions ignore the input.",
     r"(kl|kullback).{0,120}(dim ?= ?0|dim(ension)? 0|axis ?= ?0|over the batch|batch (dim|axis))|"
     r"(sum|reduc).{0,40}(wrong|batch) (dim|axis).{0,80}kl|sum\(.{0,30}dim ?= ?1\)|posterior collapse|"
     r"kl.{0,80}(batch_size|batch size) ?/ ?(latent|z)")(build_kl_sum_dim0)
fix("vae_kl_summed_over_batch", fixed_of(build_kl_sum_dim0), val_mean(glyph_recon_mse), "val recon MSE",
    steps=300, higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 4. DDPM on 1-D spectra of 32 bins, batch size 32: alphas_cumprod[t] has shape (B,) and multiplies x0 of shape
#    (B, 32) without [:, None], so the noise level broadcasts along the bins (column j gets sample j's level).

T_STEPS = 100


def spectra(n: int, s: int):
    g = gen(s)
    grid = torch.linspace(0, 1, 32)
    c1 = 0.2 + 0.6 * torch.rand(n, 1, generator=g)
    c2 = 0.2 + 0.6 * torch.rand(n, 1, generator=g)
    a = 0.5 + torch.rand(n, 1, generator=g)
    return a * torch.exp(-((grid - c1) ** 2) / 0.004) + (1.5 - a) * torch.exp(-((grid - c2) ** 2) / 0.01) - 0.3


def timestep_features(t, dim=16):
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    ang = t.float()[:, None] * freqs[None] * (1000.0 / T_STEPS)
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


class SpectrumDenoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - torch.linspace(1e-4, 0.05, T_STEPS), 0))
        self.net = nn.Sequential(nn.Linear(32 + 16, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(),
                                 nn.Linear(256, 32))

    def forward(self, x_t, t):
        return self.net(torch.cat([x_t, timestep_features(t)], dim=-1))


def ddpm_loss(unsqueeze: bool):
    def loss_fn(model, batch):
        x0 = batch[0]
        t = torch.randint(0, T_STEPS, (x0.size(0),), device=x0.device)
        noise = torch.randn_like(x0)
        ab = model.alphas_cumprod[t]
        if unsqueeze:
            ab = ab[:, None]
        x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        return F.mse_loss(model(x_t, t), noise)
    return loss_fn


def spectrum_eps_mse(model, batch):
    x0 = batch[0]
    g = gen(7)
    t = torch.randint(0, T_STEPS, (x0.size(0),), generator=g).to(x0.device)
    noise = torch.randn(x0.shape, generator=g).to(x0.device)
    ab = model.alphas_cumprod[t][:, None]
    x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
    return ((model(x_t, t) - noise) ** 2).sum().item(), noise.numel()


def build_coef_broadcast(fixed: bool = False) -> dict:
    seed(0)
    data = spectra(2560, 41)
    model = SpectrumDenoiser()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(data[:2048]), batch_size=32, drop_last=True),
                val_loader=DataLoader(TensorDataset(data[2048:]), batch_size=32, drop_last=True),
                loss_fn=ddpm_loss(fixed))


case("ddpm_alpha_bar_broadcast", "shapes",
     "In the DDPM forward process alphas_cumprod[t] has shape (B,) and multiplies x0 of shape (B, 32) without "
     "[:, None]; since the batch size equals the 32 bins it broadcasts along the bins, so each column gets another "
     "sample's noise level and the model is told the wrong timestep for the noise it must predict.",
     r"(alphas?_cumprod|alpha_bar|alpha_t|sqrt_ab|noise level|coefficient).{0,120}(\[:, ?None\]|unsqueeze|"
     r"view\(-1, ?1|reshape\(-1, ?1|broadcast)|broadcast.{0,80}(timestep|noise level|alphas?_cumprod|bins|"
     r"last (dim|axis))|\(B,\) .{0,40}\(B, ?32\)")(build_coef_broadcast)
fix("ddpm_alpha_bar_broadcast", fixed_of(build_coef_broadcast), val_mean(spectrum_eps_mse), "val eps MSE",
    steps=300, higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 5. Multiple-instance learning on bags of sensor readings: attention pooling normalises the instance scores with
#    softmax over dim=0, the bags of the batch, instead of dim=1, the instances of each bag.


def make_bags(n: int, s: int):
    g = np.random.default_rng(s)
    key = g.normal(size=8).astype(np.float32)
    x = g.normal(size=(n, 12, 8)).astype(np.float32)
    y = (g.random(n) < 0.5).astype(np.int64)
    for i in np.nonzero(y)[0]:
        j = g.integers(0, 12)
        x[i, j] = key * 1.5 + 0.5 * g.normal(size=8)
    return torch.from_numpy(x), torch.from_numpy(y)


class AttentionMIL(nn.Module):
    def __init__(self, softmax_dim: int):
        super().__init__()
        self.softmax_dim = softmax_dim
        self.embed = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.score = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))
        self.head = nn.Linear(32, 2)

    def forward(self, bags):  # (B, K, 8)
        h = self.embed(bags)
        a = torch.softmax(self.score(h), dim=self.softmax_dim)  # (B, K, 1)
        return self.head((a * h).sum(1))


def build_mil_softmax_dim(fixed: bool = False) -> dict:
    seed(0)
    x, y = make_bags(1400, 51)
    model = AttentionMIL(softmax_dim=1 if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), batch_size=32),
                val_loader=DataLoader(TensorDataset(x[1000:], y[1000:]), batch_size=1),
                loss_fn=nn.CrossEntropyLoss())


case("mil_attention_softmax_over_bags", "shapes",
     "The attention-MIL pooling applies softmax over dim=0, across the bags of the batch, instead of dim=1 over the "
     "instances of each bag, so the weights inside a bag do not sum to one and depend on the other bags: the "
     "model learns a batch-dependent pooling that fails on bags scored one at a time.",
     r"softmax.{0,80}(dim ?= ?0|dim(ension)? 0|batch (dim|axis)|across (the )?(bags|batch|samples))|"
     r"(dim ?= ?1|instances?).{0,60}softmax|attention (weights|scores).{0,80}(sum to|normali[sz]).{0,60}"
     r"(bag|instance)")(build_mil_softmax_dim)
fix("mil_attention_softmax_over_bags", fixed_of(build_mil_softmax_dim),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val bag accuracy", steps=300)
