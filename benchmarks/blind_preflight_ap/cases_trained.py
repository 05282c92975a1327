"""Set ap, family what_is_trained: part of the model the objective needs is never updated."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .registry import (
    Views,
    accuracy,
    case,
    fix,
    fixed_of,
    gen,
    graph_loader,
    loader,
    lowrank_images,
    node_acc,
    rmse_of,
    sbm_graph,
    seed,
)


# ---------------------------------------------------------------------------------------------------------
class ConvLikeAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 6))
        self.decoder = nn.Sequential(nn.Linear(6, 48), nn.ReLU(), nn.Linear(48, 64), nn.Sigmoid())

    def forward(self, x):
        return self.decoder(self.encoder(x))


@case("w_ae_optimizer_encoder_only", "what_is_trained",
      "The optimizer is built on model.encoder.parameters() only, so the autoencoder's decoder keeps its random "
      "initial weights and the reconstructions stay poor; it must get model.parameters() (encoder and decoder).",
      r"encoder\.parameters\(\)|decoder (keeps|stays|is never|never)|decoder .*random (initial )?weights|"
      r"optimi[sz]er .*only .*encoder")
def w_ae_optimizer_encoder_only(fixed: bool = False):
    seed(0)
    x, xv = lowrank_images(2048, 11), lowrank_images(512, 12)
    model = ConvLikeAE()
    params = model.parameters() if fixed else model.encoder.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=3e-3),
                train_loader=loader(TensorDataset(x, x), 64),
                val_loader=loader(TensorDataset(xv, xv), 256, shuffle=False), loss_fn=nn.MSELoss(), max_steps=300)


fix("w_ae_optimizer_encoder_only", fixed_of(w_ae_optimizer_encoder_only), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val reconstruction RMSE", higher=False)


# ---------------------------------------------------------------------------------------------------------
class ListGCN(nn.Module):
    """Two hand-written propagation layers whose weights sit in a plain Python list of nn.Parameter."""

    def __init__(self, fixed: bool, d=16, h=6, c=4):
        super().__init__()
        ws = [nn.Parameter(torch.randn(d, h) / d ** 0.5), nn.Parameter(torch.randn(h, h) / h ** 0.5)]
        self.weights = nn.ParameterList(ws) if fixed else ws
        self.out = nn.Linear(h, c)

    def forward(self, x, adj):
        a = adj + torch.eye(len(adj), device=adj.device)
        dinv = a.sum(1).rsqrt()
        a = dinv[:, None] * a * dinv[None, :]
        h = x
        for w in self.weights:
            h = F.relu(a @ h @ w)
        return self.out(h)


@case("w_gnn_weights_in_python_list", "what_is_trained",
      "The GCN keeps its propagation weights in a plain Python list of nn.Parameter, which nn.Module does not "
      "register: model.parameters() and the optimizer only see the output layer, so the graph layers stay random; "
      "use nn.ParameterList.",
      r"python list|plain list|ParameterList|not registered|unregistered|register_parameter")
def w_gnn_weights_in_python_list(fixed: bool = False):
    seed(0)
    x, adj, y, train, val = sbm_graph(s=2)
    model = ListGCN(fixed)

    def node_loss(model, batch):
        x, adj, y, mask = batch
        return F.cross_entropy(model(x, adj)[mask], y[mask])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=graph_loader(x, adj, y, train), val_loader=graph_loader(x, adj, y, val),
                loss_fn=node_loss, max_steps=200)


fix("w_gnn_weights_in_python_list", fixed_of(w_gnn_weights_in_python_list), node_acc, "val node accuracy", steps=200)


# ---------------------------------------------------------------------------------------------------------
class TwoTower(nn.Module):
    """A pseudo-siamese pair: query tower and candidate tower, same input space."""

    def __init__(self):
        super().__init__()
        self.query = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))
        self.cand = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return self.query(x)


@case("w_two_tower_one_optimized", "what_is_trained",
      "Only model.query.parameters() are passed to the optimizer: the candidate tower of the two-tower contrastive "
      "model stays at its random init, so the query tower is trained to match random projections dominated by "
      "nuisance features.",
      r"cand(idate)? tower|query\.parameters|only the query tower|second tower|one tower")
def w_two_tower_one_optimized(fixed: bool = False):
    seed(0)
    train, val = Views(2048, 13), Views(512, 14)
    model = TwoTower()

    def two_tower_nce(model, batch, tau=0.2):
        a, b, _ = batch
        q, k = F.normalize(model.query(a), dim=-1), F.normalize(model.cand(b), dim=-1)
        return F.cross_entropy(q @ k.T / tau, torch.arange(len(a), device=a.device))
    params = model.parameters() if fixed else model.query.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=2e-3),
                train_loader=loader(train, 128, drop_last=True), val_loader=loader(val, 256, shuffle=False),
                loss_fn=two_tower_nce, max_steps=300)


@torch.no_grad()
def cross_tower_top1(model, kw):
    """Query view 1 against the candidate tower's embeddings of every view 2 of the validation set: how often the
    nearest candidate is the same instance (top-1 retrieval)."""
    was = model.training
    model.eval()
    qs, ks = [], []
    for a, b, _ in kw["val_loader"]:
        qs.append(F.normalize(model.query(a), dim=-1))
        ks.append(F.normalize(model.cand(b), dim=-1))
    model.train(was)
    q, k = torch.cat(qs), torch.cat(ks)
    return ((q @ k.T).argmax(1) == torch.arange(len(q))).float().mean().item()


fix("w_two_tower_one_optimized", fixed_of(w_two_tower_one_optimized), cross_tower_top1,
    "val query-to-candidate top-1 retrieval")


# ---------------------------------------------------------------------------------------------------------
class TwoTask(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.trunk = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 6), nn.ReLU())
        self.reg_head = nn.Linear(6, 3)
        self.cls_head = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        h = self.trunk(x)
        return self.reg_head(h), self.cls_head(h if self.fixed else h.detach())


def two_task_data(n, s):
    g = gen(s)
    x = torch.randn(n, 20, generator=g)
    reg = x[:, :3] * 2
    w = torch.randn(6, 4, generator=gen(41))
    cls = (x[:, 10:16] @ w).argmax(-1)
    return x, reg, cls


def cls_acc(model, kw):
    return accuracy(model, kw["val_loader"], fwd=lambda m, b: (m(b[0])[1].argmax(-1), b[2]))


@case("w_multitask_trunk_detached_for_cls", "what_is_trained",
      "The classification head reads h.detach() of the shared trunk, so the classification loss never reaches the "
      "trunk: the trunk is shaped by the regression task alone and the 6-unit bottleneck drops what the "
      "classifier needs.",
      r"detach|stop[- ]?grad|no gradient .*trunk|trunk .*(no|never).*gradient|shared trunk")
def w_multitask_trunk_detached_for_cls(fixed: bool = False):
    seed(0)
    x, reg, cls = two_task_data(3072, 1)
    xv, regv, clsv = two_task_data(768, 2)
    model = TwoTask(fixed)

    def joint(model, batch):
        x, reg, cls = batch
        r, c = model(x)
        return F.mse_loss(r, reg) + F.cross_entropy(c, cls)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, reg, cls), 64),
                val_loader=loader(TensorDataset(xv, regv, clsv), 256, shuffle=False), loss_fn=joint, max_steps=300)


fix("w_multitask_trunk_detached_for_cls", fixed_of(w_multitask_trunk_detached_for_cls), cls_acc,
    "val accuracy of the classification task")


# ---------------------------------------------------------------------------------------------------------
class NoGradEncVAE(nn.Module):
    def __init__(self, fixed: bool, d=64, z=6):
        super().__init__()
        self.fixed = fixed
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 2 * z))
        self.dec = nn.Sequential(nn.Linear(z, 64), nn.ReLU(), nn.Linear(64, d), nn.Sigmoid())

    def encode(self, x):
        if self.fixed:
            return self.enc(x).chunk(2, -1)
        with torch.no_grad():                                # "to save memory" while encoding
            return self.enc(x).chunk(2, -1)

    def forward(self, x):
        mu, logvar = self.encode(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return self.dec(z), mu, logvar


@case("w_vae_encoder_under_no_grad", "what_is_trained",
      "The VAE runs its encoder inside torch.no_grad(), so mu and logvar carry no graph: neither the reconstruction "
      "nor the KL term trains the encoder, and the decoder has to work from a random encoding.",
      r"no_grad|inference_mode|(mu|logvar) .*(no|without) (grad|graph)|encoder .*(no|without) (autograd )?graph")
def w_vae_encoder_under_no_grad(fixed: bool = False):
    seed(0)
    x, xv = lowrank_images(2048, 13), lowrank_images(512, 14)
    model = NoGradEncVAE(fixed)

    def elbo(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        rec = F.binary_cross_entropy(recon, x, reduction="sum") / len(x)
        kl = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp()) / len(x)
        return rec + kl
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x), 128), val_loader=loader(TensorDataset(xv), 256, shuffle=False),
                loss_fn=elbo, max_steps=300)


fix("w_vae_encoder_under_no_grad", fixed_of(w_vae_encoder_under_no_grad),
    rmse_of(lambda m, b: (m(b[0])[0], b[0])), "val reconstruction RMSE (z = mu)", higher=False)
