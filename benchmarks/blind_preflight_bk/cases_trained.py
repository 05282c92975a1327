"""Family what_is_trained: the part of the model or of the loss the user meant to train is not what the optimizer
moves (a head swapped after the optimizer, an unregistered physical coefficient, spectral weights kept as plain
tensors, a residual cut from the graph, a sub-network left out of the optimizer)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bk.common import (PI, adam, gen, grad, heat_exact, heat_val, load, mlp, poisson_val,
                                                  rel_l2_pct, seed)
from benchmarks.blind_preflight_bk.cases_shapes import FNO1d, helmholtz_pairs
from benchmarks.blind_preflight_bk.registry import case, fix

BC = torch.tensor([[-1.0], [1.0]])


# 11 -----------------------------------------------------------------------------------------------------------
class FieldSurrogate(nn.Module):
    """Parameters (amplitude, wavenumber, decay) -> field on 32 grid points."""

    def __init__(self, out: int = 8):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.head = nn.Linear(64, out)

    def forward(self, p):
        return self.head(self.body(p))


def surrogate_fields(n: int, s: int):
    g = gen(s)
    p = torch.rand(n, 3, generator=g) * torch.tensor([1.0, 2.0, 1.0]) + torch.tensor([0.5, 1.0, 0.0])
    x = torch.linspace(0, 1, 32)
    u = p[:, :1] * torch.sin(PI * p[:, 1:2] * x) * torch.exp(-p[:, 2:3] * x)
    return p, u


def surrogate_head_swapped(fixed: bool = False) -> dict:
    seed(0)
    model = FieldSurrogate()                 # pretrained-style 8-point head, replaced by a 32-point one
    if fixed:
        model.head = nn.Linear(64, 32)
    optimizer = adam(model, 3e-3)
    if not fixed:
        model.head = nn.Linear(64, 32)
    p, u = surrogate_fields(1200, 4)
    return dict(model=model, optimizer=optimizer, train_loader=load(p[:1000], u[:1000]), loss_fn=nn.MSELoss(),
                val_loader=load(p[1000:], u[1000:], batch_size=200, shuffle=False))


case("surrogate_head_swapped", "what_is_trained",
     "The surrogate's output head is replaced by a new nn.Linear for the 32-point grid after the Adam optimizer was "
     "built, so the optimizer holds the old head's tensors and the new head stays at its random initialisation.",
     r"(head|output layer|last layer|final layer).{0,140}(replac|reassign|swapp|after the optimi[sz]er|new (nn\.)?"
     r"linear|old (head|tensors|weights)|stale)|(after the optimi[sz]er (was|is) (built|created|constructed)).{0,120}"
     r"(head|layer|replac)")(surrogate_head_swapped)
fix("surrogate_head_swapped", lambda: surrogate_head_swapped(fixed=True), rel_l2_pct, "rel L2 % of the field",
    higher=False)


# 12 -----------------------------------------------------------------------------------------------------------
def poisson_residual_no_graph(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(1, 1)
    x_col = torch.rand(1024, 1, generator=gen(1)) * 2 - 1

    def loss_fn(model, batch):
        x = batch[0].clone().requires_grad_(True)
        u = model(x)
        u_x = grad(u, x)
        u_xx = torch.autograd.grad(u_x, x, torch.ones_like(u_x), create_graph=fixed)[0]
        residual = u_xx + PI ** 2 * torch.sin(PI * x)
        return residual.pow(2).mean() + 10 * model(BC).pow(2).mean()

    return dict(model=model, optimizer=adam(model), train_loader=load(x_col), loss_fn=loss_fn,
                val_loader=poisson_val())


case("poisson_residual_no_graph", "what_is_trained",
     "The second derivative u_xx is taken with torch.autograd.grad(..., create_graph=False), so the PDE residual is a "
     "constant with no graph to the weights and only the boundary term trains the PINN.",
     r"create_graph|(residual|pde term|physics (loss|term)|u_xx|second derivative).{0,140}(no (gradient|graph)|"
     r"detached|constant|cut from the graph|not differentiable|does not (reach|train|back-?propagate)|no grad_fn)")(
    poisson_residual_no_graph)
fix("poisson_residual_no_graph", lambda: poisson_residual_no_graph(fixed=True), rel_l2_pct, "rel L2 % vs sin(pi x)",
    higher=False)


# 13 -----------------------------------------------------------------------------------------------------------
class InverseHeatPINN(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.net = mlp(2, 1)
        init = torch.tensor(0.5)
        self.alpha = nn.Parameter(init) if fixed else init.requires_grad_(True)   # the unknown diffusivity

    def forward(self, xt):
        return self.net(xt)


def heat_alpha_unregistered(fixed: bool = False) -> dict:
    seed(0)
    model = InverseHeatPINN(fixed)
    g = gen(7)
    obs = torch.cat([torch.rand(2048, 1, generator=g) * 2 - 1, torch.rand(2048, 1, generator=g)], 1)
    u_obs = heat_exact(obs[:, :1], obs[:, 1:])
    col = torch.cat([torch.rand(2048, 1, generator=g) * 2 - 1, torch.rand(2048, 1, generator=g)], 1)

    def loss_fn(model, batch):
        xo, uo, xc = batch
        xt = xc.clone().requires_grad_(True)
        du = grad(model(xt), xt)
        res = du[:, 1:2] - model.alpha * grad(du[:, 0:1], xt)[:, 0:1]
        return (model(xo) - uo).pow(2).mean() + res.pow(2).mean()

    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(obs, u_obs, col), loss_fn=loss_fn,
                val_loader=heat_val())


case("heat_alpha_unregistered", "what_is_trained",
     "The unknown diffusivity of the inverse heat problem is a plain tensor with requires_grad=True stored on the "
     "module rather than an nn.Parameter, so it is not in model.parameters(), the optimizer never updates it and the "
     "PDE residual keeps the wrong coefficient.",
     r"(diffusivity|alpha|coefficient|physical parameter|pde parameter).{0,160}(nn\.parameter|not registered|"
     r"unregistered|plain tensor|not in (model\.)?parameters|never updated|not (learned|updated|optimi[sz]ed))|"
     r"(plain tensor|not registered|nn\.parameter).{0,120}(diffusivity|alpha|coefficient)")(heat_alpha_unregistered)
fix("heat_alpha_unregistered", lambda: heat_alpha_unregistered(fixed=True), rel_l2_pct,
    "rel L2 % vs exact heat solution", higher=False)


# 14 -----------------------------------------------------------------------------------------------------------
def fno_weights_plain_tensor(fixed: bool = False) -> dict:
    seed(0)
    model = FNO1d()
    if not fixed:            # written as in a from-scratch spectral layer: plain complex tensors
        for layer in model.spectral:
            w = layer.weight.detach().clone()
            del layer.weight
            layer.weight = w.requires_grad_(True)
    a, u = helmholtz_pairs(1200, 2)
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(a[:1000], u[:1000], batch_size=32),
                loss_fn=nn.MSELoss(), val_loader=load(a[1000:], u[1000:], batch_size=100, shuffle=False))


case("fno_weights_plain_tensor", "what_is_trained",
     "The spectral layers' complex Fourier weights are plain tensors (requires_grad=True) assigned as attributes "
     "instead of nn.Parameter, so they are not in model.parameters() and the spectral convolution stays random.",
     r"(spectral|fourier|complex|fft).{0,140}(nn\.parameter|not registered|unregistered|plain tensor|not in "
     r"(model\.)?parameters|never (updated|trained)|stay(s)? random)|(plain tensor|nn\.parameter|not registered)"
     r".{0,120}(spectral|fourier|complex)")(fno_weights_plain_tensor)
fix("fno_weights_plain_tensor", lambda: fno_weights_plain_tensor(fixed=True), rel_l2_pct, "rel L2 % of u",
    higher=False)


# 15 -----------------------------------------------------------------------------------------------------------
class DeepONet(nn.Module):
    def __init__(self, sensors: int = 32, p: int = 16):
        super().__init__()
        self.branch = mlp(sensors, p, 64, 2)
        self.trunk = mlp(1, p, 64, 2)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, inp):                                  # inp: (B, sensors + 1): a at sensors, then y
        a, y = inp[:, :-1], inp[:, -1:]
        return (self.branch(a) * self.trunk(y)).sum(1, keepdim=True) + self.bias


def antiderivative_rows(n_fun: int, s: int, per: int = 20):
    g = gen(s)
    xs = torch.linspace(0, 1, 32)
    k = torch.arange(1, 4).float()
    c = torch.randn(n_fun, 3, generator=g)
    a = (c[:, :, None] * torch.cos(PI * k[None, :, None] * xs)).sum(1)       # a(x) at the sensors
    y = torch.rand(n_fun, per, generator=g)
    u = (c[:, :, None] * torch.sin(PI * k[None, :, None] * y[:, None]) / (PI * k[None, :, None])).sum(1)
    inp = torch.cat([a[:, None].expand(-1, per, -1), y[..., None]], -1).reshape(-1, 33)
    return inp, u.reshape(-1, 1)


def deeponet_trunk_left_out(fixed: bool = False) -> dict:
    seed(0)
    model = DeepONet()
    params = model.parameters() if fixed else [*model.branch.parameters(), model.bias]
    inp, u = antiderivative_rows(120, 8)
    vin, vu = antiderivative_rows(30, 9)
    return dict(model=model, optimizer=adam(model, 2e-3, params), train_loader=load(inp, u), loss_fn=nn.MSELoss(),
                val_loader=load(vin, vu, batch_size=600, shuffle=False))


case("deeponet_trunk_left_out", "what_is_trained",
     "The DeepONet's optimizer is built from the branch network's parameters (and the bias) only, so the trunk "
     "network that supplies the basis functions of the output coordinate is never trained.",
     r"trunk")(deeponet_trunk_left_out)
fix("deeponet_trunk_left_out", lambda: deeponet_trunk_left_out(fixed=True), rel_l2_pct,
    "rel L2 % of the antiderivative", higher=False)
