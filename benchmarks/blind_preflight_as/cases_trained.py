"""Set as, family what_is_trained: part of what should learn never receives an update."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_as import domains as D
from benchmarks.blind_preflight_as.registry import case, gen, loader, seed


def _poisson_val():
    xv = torch.linspace(0, 1, 201).unsqueeze(1)
    return loader(TensorDataset(xv, D.poisson_exact(xv)), 201, shuffle=False)


@case("pinn_second_grad_no_create_graph", "what_is_trained",
      "The second derivative u_xx = autograd.grad(u_x, x) is taken without create_graph=True, so u_xx is a "
      "constant with no graph back to the weights and the PDE residual term contributes zero gradient; only the "
      "boundary term trains. Pass create_graph=True to every autograd.grad in the residual.",
      r"create_graph|(second|higher).?(order )?derivative.{0,60}(graph|detach|not differentiable)|"
      r"(residual|pde|physics) (loss|term).{0,40}(detached|no graph|constant)|"
      r"u_xx.{0,40}(detached|no graph|grad_fn|constant with no)")
def pinn_second_grad_no_create_graph(fixed: bool = False):
    seed(0)
    x = torch.rand(512, 1, generator=gen(0))
    model = D.pinn_mlp()

    def loss_fn(model, batch):
        xc = batch[0].clone().requires_grad_(True)
        u = model(xc)
        u_x = torch.autograd.grad(u, xc, torch.ones_like(u), create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, xc, torch.ones_like(u_x), create_graph=fixed)[0]
        pde = ((u_xx - D.poisson_forcing(xc)) ** 2).mean() / D.PI ** 4
        xb = torch.tensor([[0.0], [1.0]], device=xc.device)
        return pde + 10 * (model(xb) ** 2).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x), 128), loss_fn=loss_fn, val_loader=_poisson_val(),
                max_steps=300)


class InversePINN(nn.Module):
    """u(x) network plus the unknown conductivity kappa of -kappa u'' = q."""

    def __init__(self):
        super().__init__()
        self.net = D.pinn_mlp()
        self.log_kappa = nn.Parameter(torch.zeros(()))

    @property
    def kappa(self):
        return self.log_kappa.exp()

    def forward(self, x):
        return self.net(x)


KAPPA_TRUE = 2.5


@case("pinn_inverse_coeff_not_in_optimizer", "what_is_trained",
      "In the inverse problem the unknown conductivity kappa is an nn.Parameter of the model, but the optimizer is "
      "built from model.net.parameters() only, so kappa gets gradients and is never stepped and stays at its initial "
      "guess; pass model.parameters() (or add kappa as a param group).",
      r"(kappa|coefficient|conductivity|physical parameter|pde parameter|log_kappa).*(optimi[sz]er|never (stepped|updated)|"
      r"not (in|passed)|param group|initial (guess|value))|net\.parameters\(\)|inverse.*(kappa|coefficient).*(fixed|frozen|stuck)")
def pinn_inverse_coeff_not_in_optimizer(fixed: bool = False):
    seed(0)
    x = torch.rand(512, 1, generator=gen(0))
    xd = torch.linspace(0.05, 0.95, 16).unsqueeze(1)
    ud = D.poisson_exact(xd)
    model = InversePINN()
    params = model.parameters() if fixed else model.net.parameters()

    def loss_fn(model, batch):
        xc = batch[0].clone().requires_grad_(True)
        u = model(xc)
        u_xx = D.d_dx(D.d_dx(u, xc), xc)
        q = -KAPPA_TRUE * D.poisson_forcing(xc)
        pde = ((-model.kappa * u_xx - q) ** 2).mean() / D.PI ** 4
        data = ((model(xd.to(xc.device)) - ud.to(xc.device)) ** 2).mean()
        return pde + 10 * data

    return dict(model=model, optimizer=torch.optim.Adam(params, lr=1e-2),
                train_loader=loader(TensorDataset(x), 128), loss_fn=loss_fn, val_loader=_poisson_val(),
                max_steps=300)


@case("rec_item_from_pretrained_frozen", "what_is_trained",
      "The item table is warm-started with nn.Embedding.from_pretrained(vectors), whose freeze=True default sets "
      "requires_grad=False, so the item embeddings never train and only the user vectors adapt to the random "
      "warm-start; pass freeze=False.",
      r"from_pretrained|freeze(=| ?default)|(item|embedding).*(frozen|requires_grad.?=?.?false|never train|not trainable)")
def rec_item_from_pretrained_frozen(fixed: bool = False):
    seed(0)
    data = D.Interactions()
    model = D.MF(data.n_users, data.n_items)
    warm = torch.randn(data.n_items, 16, generator=gen(5)) * 0.1     # item2vec vectors from another catalogue run
    model.item = nn.Embedding.from_pretrained(warm, freeze=False) if fixed else nn.Embedding.from_pretrained(warm)

    def loss_fn(model, batch):
        u, p, q = batch
        return -F.logsigmoid(model(u, p) - model(u, q)).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(D.TripletDataset(data.train_pairs, data.n_items), 128), loss_fn=loss_fn,
                val_loader=D.ranking_val_loader(data), max_steps=300)


class FNO1d(nn.Module):
    def __init__(self, fixed, width=24, modes=12, layers=3):
        super().__init__()
        self.lift = nn.Conv1d(2, width, 1)
        spectral = [D.SpectralConv1d(width, modes) for _ in range(layers)]
        self.spectral = nn.ModuleList(spectral) if fixed else spectral
        self.pointwise = nn.ModuleList([nn.Conv1d(width, width, 1) for _ in range(layers)])
        self.proj = nn.Sequential(nn.Conv1d(width, 64, 1), nn.GELU(), nn.Conv1d(64, 1, 1))

    def forward(self, x):
        h = self.lift(x)
        for k, (sc, pw) in enumerate(zip(self.spectral, self.pointwise)):
            h = sc(h) + pw(h)
            h = F.gelu(h) if k < len(self.pointwise) - 1 else h
        return self.proj(h).squeeze(1)


def operator_data(n, s):
    a, u, x = D.elliptic_pairs(n, s=s)
    return torch.stack([a, x.expand_as(a)], 1), u


@case("fno_spectral_python_list", "what_is_trained",
      "The FNO's spectral convolution layers are kept in a plain Python list instead of nn.ModuleList, so their "
      "complex Fourier weights are not registered, not in model.parameters() and never trained; only the pointwise "
      "1x1 path learns. Wrap them in nn.ModuleList.",
      r"modulelist|python list|plain list|(not|never|aren'?t) registered|(spectral|fourier).*(not in|missing from) "
      r"(model\.)?parameters|(spectral|fourier) (weights|layers?).*(never|not) (train|updat)")
def fno_spectral_python_list(fixed: bool = False):
    seed(0)
    x, y = operator_data(1000, 5)
    xv, yv = operator_data(200, 6)
    model = FNO1d(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(xv, yv), 100, shuffle=False), max_steps=300)


class GaussianPolicy(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.mean = D.policy_mlp(6, 2)
        if fixed:
            self.log_std = nn.Parameter(torch.zeros(2))
        else:
            self.log_std = torch.zeros(2, requires_grad=True)

    def forward(self, s):
        return self.mean(s)


def gaussian_nll(model, batch):
    s, a = batch
    mu = model(s)
    log_std = model.log_std.to(mu.device)
    return (((a - mu) / log_std.exp()) ** 2 / 2 + log_std + 0.5 * math.log(2 * math.pi)).sum(-1).mean()


def noisy_expert(n, s):
    g = gen(s)
    x = torch.randn(n, 6, generator=g)
    w = torch.randn(6, 2, generator=gen(66)) / 2
    return x, x @ w + 0.1 * torch.randn(n, 2, generator=g)


@case("bc_log_std_plain_tensor", "what_is_trained",
      "The Gaussian policy's log_std is a plain tensor with requires_grad=True assigned as a module attribute, not "
      "an nn.Parameter, so it is not in model.parameters(), the optimizer never updates it and the policy's std "
      "stays 1 while the expert's noise is 0.1; wrap it in nn.Parameter.",
      r"log_?std.{0,80}(parameter|registered|optimi[sz]er|never updat|not updat)|"
      r"(policy|gaussian).{0,40}(std|standard deviation).{0,40}(fixed|never|not (learned|trained|updated))|"
      r"(plain|bare|raw) tensor.{0,60}(attribute|requires_grad|not registered)")
def bc_log_std_plain_tensor(fixed: bool = False):
    seed(0)
    x, y = noisy_expert(4000, 0)
    xv, yv = noisy_expert(1000, 1)
    model = GaussianPolicy(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=gaussian_nll,
                val_loader=loader(TensorDataset(xv, yv), 500, shuffle=False), max_steps=300)
