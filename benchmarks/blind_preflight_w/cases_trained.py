"""What is trained: a part of the model that should learn or be used never is."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_w.cases_shapes import FullGraph, first, node_pred
from benchmarks.blind_preflight_w.cases_targets import set_requires_grad
from benchmarks.blind_preflight_w.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    sbm_graph,
    seed,
    val_mean,
    wasserstein_1d,
)

# ---------------------------------------------------------------------------------------------------------------
# 1. A GAN for sensor latencies in one module: the two optimizers of the tutorial were merged into one for the
#    training script, built from model.generator.parameters() only - the discriminator stays at its init.


class LatencyGAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
        self.discriminator = nn.Sequential(nn.Linear(1, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def forward(self, z):
        return self.generator(z)


def latency_loss(model, batch):
    real = batch[0]
    fake = model.generator(torch.randn(real.size(0), 8, device=real.device))
    d_loss = (F.binary_cross_entropy_with_logits(model.discriminator(real), torch.ones_like(real))
              + F.binary_cross_entropy_with_logits(model.discriminator(fake.detach()), torch.zeros_like(real)))
    set_requires_grad(model.discriminator, False)
    g_loss = F.binary_cross_entropy_with_logits(model.discriminator(fake), torch.ones_like(real))
    set_requires_grad(model.discriminator, True)
    return d_loss + g_loss


def latency_w1(model, kw):
    real = torch.cat([b[0] for b in kw["val_loader"]])
    z = torch.randn(real.size(0), 8, generator=gen(9))
    dev = next(model.parameters()).device
    with torch.no_grad():
        fake = model.generator(z.to(dev)).float().cpu()
    return wasserstein_1d(fake, real)


def latencies(n, s):
    g = np.random.default_rng(s)
    fast = g.normal(1.0, 0.25, size=n)
    slow = g.normal(3.5, 0.5, size=n)
    pick = g.random(n) < 0.7
    return torch.from_numpy(np.where(pick, fast, slow).astype(np.float32)[:, None])


def build_disc_not_optimized(fixed: bool = False) -> dict:
    seed(0)
    data = latencies(3000, 111)
    model = LatencyGAN()
    params = model.parameters() if fixed else model.generator.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=1e-3, betas=(0.5, 0.999)),
                train_loader=loader(TensorDataset(data[:2000]), batch_size=128),
                val_loader=DataLoader(TensorDataset(data[2000:]), batch_size=500),
                loss_fn=latency_loss)


case("gan_discriminator_not_in_optimizer", "what_is_trained",
     "The single Adam is built from model.generator.parameters() only, so the discriminator's weights get "
     "gradients from the discriminator loss but are never stepped: the generator learns to fool a fixed random "
     "discriminator instead of matching the data.",
     r"discriminator.{0,120}(optimi[sz]er|never (stepped|updated|trained)|not (updated|trained|stepped)|frozen|"
     r"fixed|random init)|(optimi[sz]er|param(eter)?s?).{0,80}(only|just).{0,40}generator|"
     r"(never|not) (stepped|updated).{0,60}discriminator|generator\.parameters\(\)")(build_disc_not_optimized)
fix("gan_discriminator_not_in_optimizer", fixed_of(build_disc_not_optimized), latency_w1, "W1 to real", steps=300,
    higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 2. A RealNVP density model of (speed, heading) pairs: every coupling layer gets the same mask [1, 0], so the
#    first coordinate is always the conditioner and never transformed - its marginal stays the N(0, 1) prior.


class Coupling(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):  # data -> latent
        xm = x * self.mask
        s, t = self.net(xm).chunk(2, dim=-1)
        s = torch.tanh(s) * (1 - self.mask)
        t = t * (1 - self.mask)
        return xm + (1 - self.mask) * (x * torch.exp(s) + t), s.sum(-1)


class RealNVP(nn.Module):
    def __init__(self, alternate: bool, n_layers: int = 6):
        super().__init__()
        masks = [torch.tensor([1.0, 0.0]) if (i % 2 == 0 or not alternate) else torch.tensor([0.0, 1.0])
                 for i in range(n_layers)]
        self.layers = nn.ModuleList(Coupling(m) for m in masks)

    def forward(self, x):
        logdet = torch.zeros(x.size(0), device=x.device)
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        return x, logdet


def flow_nll(model, x):
    z, logdet = model(x)
    log_pz = -0.5 * (z.float() ** 2).sum(-1) - math.log(2 * math.pi)
    return -(log_pz + logdet.float())


def flow_loss(model, batch):
    return flow_nll(model, batch[0]).mean()


def flow_val_nll(model, batch):
    nll = flow_nll(model, batch[0])
    return nll.sum().item(), nll.numel()


def speed_heading(n, s):
    g = np.random.default_rng(s)
    mode = g.random(n) < 0.5
    speed = np.where(mode, -1.6, 1.6) + 0.25 * g.normal(size=n)
    heading = 0.8 * np.sin(1.5 * speed) + 0.2 * g.normal(size=n)
    return torch.from_numpy(np.stack([speed, heading], 1).astype(np.float32))


def build_flow_same_mask(fixed: bool = False) -> dict:
    seed(0)
    data = speed_heading(3000, 121)
    model = RealNVP(alternate=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(data[:2400]), batch_size=128),
                val_loader=DataLoader(TensorDataset(data[2400:]), batch_size=300),
                loss_fn=flow_loss)


case("realnvp_mask_never_flips", "what_is_trained",
     "Every RealNVP coupling layer is built with the same mask [1, 0] instead of alternating it, so the first "
     "coordinate is only ever the conditioner and never transformed: its density stays the N(0, 1) prior however "
     "long the flow trains.",
     r"mask.{0,100}(alternat|flip|same|never (changes|transformed)|identical|1 ?- ?mask|permut|revers)|"
     r"(alternat|flip|permut|revers|swap).{0,60}mask|(coordinate|dimension|dim)s?.{0,80}never (transformed|"
     r"updated|modell?ed)|coupling layers?.{0,80}same (half|partition|split)")(build_flow_same_mask)
fix("realnvp_mask_never_flips", fixed_of(build_flow_same_mask), val_mean(flow_val_nll), "val NLL (nats)", steps=300,
    higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 3. A GCN on a product co-purchase graph where 40% of the products are new and have no edges yet: the normalised
#    adjacency is built without the self-loops of the GCN renormalisation (A + I), so a node's own features never
#    reach its output and an isolated node's output is the bias alone.


class PlainGCN(nn.Module):
    def __init__(self, self_loops: bool):
        super().__init__()
        self.self_loops = self_loops
        self.w1 = nn.Linear(16, 32)
        self.w2 = nn.Linear(32, 4)

    def adj(self, edge_index, n, device):
        src, dst = edge_index
        if self.self_loops:
            loops = torch.arange(n, device=device)
            src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
        deg = torch.zeros(n, device=device).index_add_(0, dst, torch.ones(dst.numel(), device=device))
        norm = deg.clamp(min=1).rsqrt()
        return src, dst, norm[src] * norm[dst]

    def forward(self, x, edge_index):
        src, dst, w = self.adj(edge_index, x.size(0), x.device)

        def prop(h):
            return torch.zeros_like(h).index_add_(0, dst, h[src] * w[:, None].to(h.dtype))

        h = F.relu(prop(self.w1(x)))
        return prop(self.w2(h))


def build_no_self_loops(fixed: bool = False) -> dict:
    seed(0)
    g = sbm_graph(n=700, classes=4, dim=16, homophily=0.8, degree=6, signal=0.8, noise=1.0, s=131)
    new_items = torch.rand(700, generator=gen(132)) < 0.4  # listed this month: no co-purchases yet
    edges = g["edges"][~(new_items[g["edges"][:, 0]] | new_items[g["edges"][:, 1]])]
    ei = edges.t().contiguous()
    model = PlainGCN(self_loops=fixed)

    def loss_fn(model, batch):
        x, ei, y, m = batch
        return F.cross_entropy(model(x, ei)[m], y[m])

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4),
                train_loader=DataLoader(FullGraph(g["x"], ei, g["y"], g["train_mask"]), batch_size=1,
                                        collate_fn=first),
                val_loader=DataLoader(FullGraph(g["x"], ei, g["y"], g["val_mask"]), batch_size=1, collate_fn=first),
                loss_fn=loss_fn, max_steps=200)


case("gcn_without_self_loops", "what_is_trained",
     "The GCN's normalised adjacency D^-1/2 A D^-1/2 is built from the edge list without adding self-loops (A + I), "
     "so each layer replaces a node's features by its neighbours' only: the 40% of products without "
     "co-purchase edges get an all-zero aggregate and the same prediction, whatever their own features.",
     r"self[- ]?loops?|a ?\+ ?i\b|add_(remaining_)?self_loops|(own|its) (node )?features?.{0,60}(dropped|ignored|"
     r"never|lost|excluded)|renormali[sz]ation trick|identity (matrix )?(to|added)|isolated (nodes?|products?).{0,100}"
     r"(zero|bias|same|constant)")(build_no_self_loops)
fix("gcn_without_self_loops", fixed_of(build_no_self_loops), acc_of(node_pred), "val node accuracy", steps=200)


# ---------------------------------------------------------------------------------------------------------------
# 4. Basket-value regression with a store-id embedding warm-started from "store2vec" vectors through
#    nn.Embedding.from_pretrained, whose freeze=True default keeps the 4-d vectors as they were loaded.


def stores(n, n_stores, s):
    g = np.random.default_rng(s)
    effect = g.normal(0, 1.0, size=n_stores)
    sid = g.integers(0, n_stores, size=n)
    num = g.normal(size=(n, 4))
    y = effect[sid] + 0.5 * num[:, 0] - 0.3 * num[:, 1] + 0.1 * g.normal(size=n)
    return (torch.from_numpy(sid), torch.from_numpy(num.astype(np.float32)),
            torch.from_numpy(y.astype(np.float32)))


class BasketModel(nn.Module):
    def __init__(self, store_vectors, freeze):
        super().__init__()
        self.store = nn.Embedding.from_pretrained(store_vectors, freeze=freeze)
        self.mlp = nn.Sequential(nn.Linear(store_vectors.size(1) + 4, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, sid, num):
        return self.mlp(torch.cat([self.store(sid), num], -1)).squeeze(-1)


def basket_loss(model, batch):
    sid, num, y = batch
    return F.mse_loss(model(sid, num), y)


def build_from_pretrained_frozen(fixed: bool = False) -> dict:
    seed(0)
    sid, num, y = stores(6000, 300, 141)
    vectors = torch.randn(300, 4, generator=gen(142)) * 0.1  # "store2vec" export, 4 dims
    model = BasketModel(vectors, freeze=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(sid[:5000], num[:5000], y[:5000]), batch_size=64),
                val_loader=DataLoader(TensorDataset(sid[5000:], num[5000:], y[5000:]), batch_size=500),
                loss_fn=basket_loss)


case("store_embedding_from_pretrained_frozen", "what_is_trained",
     "The store-id embedding is created with nn.Embedding.from_pretrained(vectors), whose freeze=True default sets "
     "requires_grad=False, so the 300 store vectors stay the small warm-start values and the per-store effect, "
     "most of the target's variance, is never learned.",
     r"from_pretrained|freeze ?= ?(true|false)|(embedding|store).{0,80}(frozen|requires_grad ?= ?false|not "
     r"trainable|never (learn|train|updat))|requires_grad ?= ?false.{0,80}embedding")(build_from_pretrained_frozen)
fix("store_embedding_from_pretrained_frozen", fixed_of(build_from_pretrained_frozen),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val RMSE", steps=300, higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 5. A score model for 2-D GPS fixes: the residual blocks take (h, temb), but they sit in an nn.Sequential, which
#    calls each with h only - temb is None in every block and the time MLP never enters the graph.


class TimeResBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.temb_proj = nn.Linear(d, d)
        self.fc2 = nn.Linear(d, d)

    def forward(self, h, temb=None):
        out = self.fc1(F.silu(h))
        if temb is not None:
            out = out + self.temb_proj(temb)
        return h + self.fc2(F.silu(out))


class GPSDenoiser(nn.Module):
    def __init__(self, pass_time: bool, steps: int = 200, d: int = 128):
        super().__init__()
        self.pass_time = pass_time
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - torch.linspace(1e-4, 0.04, steps), 0))
        self.time_mlp = nn.Sequential(nn.Linear(32, d), nn.SiLU(), nn.Linear(d, d))
        self.inp = nn.Linear(2, d)
        self.blocks = nn.Sequential(*[TimeResBlock(d) for _ in range(3)])
        self.out = nn.Linear(d, 2)

    def forward(self, x_t, t):
        freqs = torch.exp(-math.log(10000.0) * torch.arange(16, device=x_t.device) / 16)
        ang = t.float()[:, None] * freqs[None]
        temb = self.time_mlp(torch.cat([ang.sin(), ang.cos()], -1))
        h = self.inp(x_t)
        if self.pass_time:
            for block in self.blocks:
                h = block(h, temb)
        else:
            h = self.blocks(h)
        return self.out(F.silu(h))


def gps_fixes(n, s):
    g = np.random.default_rng(s)
    k = g.integers(0, 8, size=n)
    ang = 2 * np.pi * k / 8
    pts = np.stack([2 * np.cos(ang), 2 * np.sin(ang)], 1) + 0.1 * g.normal(size=(n, 2))
    return torch.from_numpy(pts.astype(np.float32))


def gps_loss(model, batch):
    x0 = batch[0]
    t = torch.randint(0, 200, (x0.size(0),), device=x0.device)
    noise = torch.randn_like(x0)
    ab = model.alphas_cumprod[t][:, None]
    return F.mse_loss(model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t), noise)


def gps_eps_mse(model, batch):
    x0 = batch[0]
    g = gen(13)
    t = torch.randint(0, 200, (x0.size(0),), generator=g).to(x0.device)
    noise = torch.randn(x0.shape, generator=g).to(x0.device)
    ab = model.alphas_cumprod[t][:, None]
    return ((model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t) - noise) ** 2).sum().item(), noise.numel()


def build_sequential_drops_temb(fixed: bool = False) -> dict:
    seed(0)
    data = gps_fixes(4000, 151)
    model = GPSDenoiser(pass_time=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(data[:3000]), batch_size=128),
                val_loader=DataLoader(TensorDataset(data[3000:]), batch_size=500),
                loss_fn=gps_loss)


case("denoiser_sequential_drops_timestep", "what_is_trained",
     "The residual blocks take (h, temb) but are held in an nn.Sequential, which calls each block with h alone, so "
     "temb is None everywhere: the timestep embedding MLP gets no gradient and the denoiser never knows the noise "
     "level it is removing.",
     r"(timestep|time|temb|t_?emb).{0,100}(never|not|unused|ignored|dropped|none|no gradient)|nn\.Sequential.{0,80}"
     r"(temb|timestep|time|second argument|extra argument|only (one|h))|time_mlp|TimestepEmbedSequential|"
     r"(noise level|timestep) (is )?(unknown|not (passed|given|used))")(build_sequential_drops_temb)
fix("denoiser_sequential_drops_timestep", fixed_of(build_sequential_drops_temb), val_mean(gps_eps_mse),
    "val eps MSE", steps=300, higher=False)
