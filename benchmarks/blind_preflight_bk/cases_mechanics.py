"""Family mechanics: the training machinery of physics-informed models computes something else than intended
(ReLU second derivatives, derivatives taken with respect to normalised coordinates, zero padding on a periodic
domain, Fourier features that lost their sine half, a residual averaged before squaring)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bk.common import (PI, adam, gen, grad, load, mlp, poisson_val, rel_l2_pct, seed)
from benchmarks.blind_preflight_bk.registry import case, fix

BC = torch.tensor([[-1.0], [1.0]])


def poisson_loss(model, batch):
    x = batch[0].clone().requires_grad_(True)
    residual = grad(grad(model(x), x), x) + PI ** 2 * torch.sin(PI * x)
    return residual.pow(2).mean() + 10 * model(BC).pow(2).mean()


# 16 -----------------------------------------------------------------------------------------------------------
def poisson_relu_pinn(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(1, 1, act=nn.Tanh if fixed else nn.ReLU)
    x_col = torch.rand(1024, 1, generator=gen(1)) * 2 - 1
    return dict(model=model, optimizer=adam(model), train_loader=load(x_col), loss_fn=poisson_loss,
                val_loader=poisson_val())


case("poisson_relu_pinn", "mechanics",
     "The PINN uses ReLU activations, whose second derivative is zero almost everywhere, so autograd's u_xx is "
     "identically zero and the Poisson residual cannot be reduced by the network.",
     r"relu.{0,160}(second derivative|u_xx|piecewise linear|zero curvature|tanh|smooth activation|vanish|zero almost "
     r"everywhere)|(second derivative|u_xx).{0,120}(relu|identically zero|zero almost everywhere)")(poisson_relu_pinn)
fix("poisson_relu_pinn", lambda: poisson_relu_pinn(fixed=True), rel_l2_pct, "rel L2 % vs sin(pi x)", higher=False)


# 17 -----------------------------------------------------------------------------------------------------------
class NormalisedPINN(nn.Module):
    """Physical coordinate x in [0, 4] scaled to [-1, 1] before the MLP."""

    def __init__(self):
        super().__init__()
        self.net = mlp(1, 1)

    def normalise(self, x):
        return (x - 2.0) / 2.0

    def forward(self, x):
        return self.net(self.normalise(x))


def pinn_grad_normalised_coords(fixed: bool = False) -> dict:
    seed(0)
    model = NormalisedPINN()
    x_col = torch.rand(1024, 1, generator=gen(1)) * 4
    ends = torch.tensor([[0.0], [4.0]])

    def loss_fn(model, batch):
        x = batch[0].clone().requires_grad_(True)
        xn = model.normalise(x)
        u = model.net(xn)
        wrt = x if fixed else xn
        u_xx = grad(grad(u, wrt), wrt)
        residual = u_xx + (PI / 2) ** 2 * torch.sin(PI / 2 * x)       # u = sin(pi x / 2) on [0, 4]
        return residual.pow(2).mean() + 10 * model(ends).pow(2).mean()

    xv = torch.linspace(0, 4, 201).unsqueeze(1)
    return dict(model=model, optimizer=adam(model), train_loader=load(x_col), loss_fn=loss_fn,
                val_loader=load(xv, torch.sin(PI / 2 * xv), batch_size=256, shuffle=False))


case("pinn_grad_normalised_coords", "mechanics",
     "The PDE derivatives are taken with autograd.grad with respect to the normalised coordinate (x - 2) / 2 instead "
     "of the physical x, so u_xx misses the chain-rule factor 1/4 and the PINN solves a rescaled equation.",
     r"(normali[sz]ed|scaled|standardi[sz]ed).{0,120}(coordinate|input|x\b).{0,160}(chain[- ]rule|physical|"
     r"derivative|autograd|scale factor|rescal)|chain[- ]rule.{0,120}(normali[sz]|scal|factor)|"
     r"(derivative|autograd\.grad|u_xx).{0,120}(with respect to|w\.r\.t\.?|wrt) the (normali[sz]ed|scaled)")(
    pinn_grad_normalised_coords)
fix("pinn_grad_normalised_coords", lambda: pinn_grad_normalised_coords(fixed=True), rel_l2_pct,
    "rel L2 % vs sin(pi x / 2)", higher=False)


# 18 -----------------------------------------------------------------------------------------------------------
def periodic_pairs(n: int, s: int, grid: int = 32):
    """Random periodic fields a and a local periodic operator: u = a^2 + central second difference of a."""
    g = gen(s)
    k = torch.arange(grid // 2 + 1)
    coef = torch.randn(n, grid // 2 + 1, dtype=torch.cfloat, generator=g) / (1 + k) ** 1.5
    coef[:, 6:] = 0
    a = torch.fft.irfft(coef, n=grid) * grid / 4
    lap = torch.roll(a, 1, -1) - 2 * a + torch.roll(a, -1, -1)
    return a.unsqueeze(1), (0.5 * a ** 2 + 4 * lap).unsqueeze(1)


def periodic_cnn_zero_padding(fixed: bool = False) -> dict:
    seed(0)
    mode = "circular" if fixed else "zeros"
    model = nn.Sequential(nn.Conv1d(1, 32, 5, padding=2, padding_mode=mode), nn.GELU(),
                          nn.Conv1d(32, 32, 5, padding=2, padding_mode=mode), nn.GELU(),
                          nn.Conv1d(32, 1, 5, padding=2, padding_mode=mode))
    a, u = periodic_pairs(1200, 3)
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(a[:1000], u[:1000], batch_size=32),
                loss_fn=nn.MSELoss(), val_loader=load(a[1000:], u[1000:], batch_size=200, shuffle=False))


case("periodic_cnn_zero_padding", "mechanics",
     "The convolutional surrogate on a periodic domain pads with zeros (padding_mode='zeros') instead of "
     "padding_mode='circular', so points near the two ends see a wall of zeros instead of the wrapped field.",
     r"(circular|periodic|wrap).{0,140}(pad|boundar)|pad.{0,140}(circular|periodic|wrap)|padding_mode")(
    periodic_cnn_zero_padding)
fix("periodic_cnn_zero_padding", lambda: periodic_cnn_zero_padding(fixed=True), rel_l2_pct, "rel L2 % of u",
    higher=False)


# 19 -----------------------------------------------------------------------------------------------------------
class FourierFeatureNet(nn.Module):
    def __init__(self, sine_half: bool, m: int = 32, scale: float = 1.0):
        super().__init__()
        self.register_buffer("B", torch.randn(1, m, generator=gen(11)) * scale)
        self.sine_half = sine_half
        self.net = mlp(2 * m, 1, 64, 2)

    def forward(self, x):
        proj = 2 * PI * x @ self.B
        second = torch.sin(proj) if self.sine_half else torch.cos(proj)
        return self.net(torch.cat([torch.cos(proj), second], -1))


def target_1d(x):
    return torch.sin(3 * x) + 0.5 * x + 0.3 * torch.cos(7 * x)


def fourier_features_cos_only(fixed: bool = False) -> dict:
    seed(0)
    model = FourierFeatureNet(sine_half=fixed)
    x = torch.rand(1024, 1, generator=gen(2)) * 2 - 1
    xv = torch.linspace(-1, 1, 301).unsqueeze(1)
    return dict(model=model, optimizer=adam(model, 2e-3), train_loader=load(x, target_1d(x)), loss_fn=nn.MSELoss(),
                val_loader=load(xv, target_1d(xv), batch_size=301, shuffle=False))


case("fourier_features_cos_only", "mechanics",
     "The Fourier-feature embedding concatenates cos(2 pi x B) with cos(2 pi x B) again instead of sin(2 pi x B), so "
     "the features are even in x and the network can only represent the even part of the field.",
     r"(fourier[- ]feature|embedding|positional encoding).{0,160}(sin|cosine only|cos only|even (function|in x)|"
     r"duplicat|twice)|(even (function|in x)|symmetric in x).{0,120}(feature|embedding|cos)|cos\b.{0,60}"
     r"(instead of|not|twice).{0,40}sin")(fourier_features_cos_only)
fix("fourier_features_cos_only", lambda: fourier_features_cos_only(fixed=True), rel_l2_pct, "rel L2 % of the field",
    higher=False)


# 20 -----------------------------------------------------------------------------------------------------------
def ode_residual_mean_then_square(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(1, 1)
    t_col = torch.rand(1024, 1, generator=gen(1)) * 1.5
    t0 = torch.zeros(1, 1)

    def loss_fn(model, batch):
        t = batch[0].clone().requires_grad_(True)
        u = model(t)
        residual = grad(u, t) + 2.0 * u                      # u' = -2 u, u(0) = 1
        physics = residual.pow(2).mean() if fixed else residual.mean().pow(2)
        return physics + (model(t0) - 1).pow(2).mean()

    tv = torch.linspace(0, 1.5, 151).unsqueeze(1)
    return dict(model=model, optimizer=adam(model), train_loader=load(t_col), loss_fn=loss_fn,
                val_loader=load(tv, torch.exp(-2 * tv), batch_size=151, shuffle=False))


case("ode_residual_mean_then_square", "mechanics",
     "The ODE residual loss is residual.mean() ** 2, the square of the batch mean, instead of (residual ** 2).mean(), "
     "so positive and negative residuals cancel and only their average is driven to zero.",
     r"(mean\(\) ?\*\* ?2|square of the (batch )?mean|mean before (squar|the square)|averag(ed|es|ing) before "
     r"squar|cancel)|(residual).{0,120}(mean.{0,20}then.{0,20}squar|\(residual ?\*\* ?2\)\.mean|squared? (after|"
     r"outside)|signed)")(ode_residual_mean_then_square)
fix("ode_residual_mean_then_square", lambda: ode_residual_mean_then_square(fixed=True), rel_l2_pct,
    "rel L2 % vs exp(-2t)", higher=False)
