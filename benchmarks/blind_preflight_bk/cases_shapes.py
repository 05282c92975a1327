"""Family shapes: a tensor laid out along the wrong axis, broadcast against the wrong shape, or read in the wrong
column, in the domain's own machinery (PDE residuals, spectral layers, coordinate grids, trajectories)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bk.common import (PI, adam, gen, grad, heat_rows, heat_val, load, mlp, pendulum_f,
                                                  poisson_val, rel_l2_pct, rk4, rollout_rmse, rollout_val, seed,
                                                  simulate, initial_states)
from benchmarks.blind_preflight_bk.registry import case, fix

BC = torch.tensor([[-1.0], [1.0]])


# 1 ------------------------------------------------------------------------------------------------------------
def poisson_forcing_broadcast(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(1, 1)
    x_col = torch.rand(1024, 1, generator=gen(1)) * 2 - 1

    def loss_fn(model, batch):
        x = batch[0].clone().requires_grad_(True)
        u = model(x)                                          # (N, 1)
        f = -PI ** 2 * torch.sin(PI * x[:, 0])                # (N,)
        f = f.unsqueeze(1) if fixed else f
        residual = grad(grad(u, x), x) - f                    # (N, 1) - (N,) -> (N, N) when not fixed
        return residual.pow(2).mean() + 10 * model(BC).pow(2).mean()

    return dict(model=model, optimizer=adam(model), train_loader=load(x_col), loss_fn=loss_fn,
                val_loader=poisson_val())


case("poisson_forcing_broadcast", "shapes",
     "The Poisson PINN's source term is a 1-D (N,) tensor subtracted from the (N, 1) second derivative, so the PDE "
     "residual broadcasts to an (N, N) matrix pairing every point's u_xx with every other point's forcing.",
     r"(residual|forcing|source( term)?|pde|u_xx|second derivative|right[- ]hand side).{0,120}(broadcast|\(N, ?N\)|"
     r"outer|every pair|all pairs|pairwise|square matrix)|(broadcast|\(N, ?N\)|pairs every).{0,120}(residual|forcing|"
     r"source( term)?|pde|u_xx|second derivative|right[- ]hand side)")(poisson_forcing_broadcast)
fix("poisson_forcing_broadcast", lambda: poisson_forcing_broadcast(fixed=True), rel_l2_pct, "rel L2 % vs sin(pi x)",
    higher=False)


# 2 ------------------------------------------------------------------------------------------------------------
class SpectralConv1d(nn.Module):
    def __init__(self, ch: int, modes: int, low_modes: bool = True):
        super().__init__()
        self.modes, self.low_modes = modes, low_modes
        scale = 1.0 / (ch * ch)
        self.weight = nn.Parameter(scale * torch.randn(ch, ch, modes, dtype=torch.cfloat))

    def forward(self, x):                                   # x: (B, C, N)
        xf = torch.fft.rfft(x, dim=-1)                       # (B, C, N // 2 + 1)
        keep = slice(0, self.modes) if self.low_modes else slice(-self.modes, None)
        out = torch.zeros_like(xf)
        out[..., keep] = torch.einsum("bim,iom->bom", xf[..., keep], self.weight)
        return torch.fft.irfft(out, n=x.shape[-1], dim=-1)


class FNO1d(nn.Module):
    def __init__(self, ch: int = 16, modes: int = 12, low_modes: bool = True, layers: int = 2):
        super().__init__()
        self.lift = nn.Conv1d(2, ch, 1)
        self.spectral = nn.ModuleList(SpectralConv1d(ch, modes, low_modes) for _ in range(layers))
        self.local = nn.ModuleList(nn.Conv1d(ch, ch, 1) for _ in range(layers))
        self.proj = nn.Sequential(nn.Conv1d(ch, 32, 1), nn.GELU(), nn.Conv1d(32, 1, 1))

    def forward(self, a):                                    # a: (B, N) input field
        grid = torch.linspace(0, 1, a.shape[-1]).expand_as(a)
        h = self.lift(torch.stack([a, grid], 1))
        for s, w in zip(self.spectral, self.local):
            h = nn.functional.gelu(s(h) + w(h))
        return self.proj(h).squeeze(1)


def helmholtz_pairs(n: int, s: int, grid: int = 64):
    """Random smooth periodic fields a and the solution of u - 0.02 u'' = a (a non-local operator)."""
    g = gen(s)
    k = torch.arange(grid // 2 + 1)
    coef = torch.randn(n, grid // 2 + 1, dtype=torch.cfloat, generator=g) / (1 + k) ** 1.0
    coef[:, 9:] = 0
    a = torch.fft.irfft(coef, n=grid) * grid / 4
    u = torch.fft.irfft(torch.fft.rfft(a) / (1 + 0.02 * (2 * PI * k) ** 2 / 4), n=grid)
    return a, u


def fno_high_modes_kept(fixed: bool = False) -> dict:
    seed(0)
    model = FNO1d(low_modes=fixed)
    a, u = helmholtz_pairs(1200, 2)
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(a[:1000], u[:1000], batch_size=32),
                loss_fn=nn.MSELoss(), val_loader=load(a[1000:], u[1000:], batch_size=100, shuffle=False))


case("fno_high_modes_kept", "shapes",
     "The spectral layer slices the rfft coefficients with [..., -modes:], keeping the highest-frequency modes of the "
     "grid instead of the lowest [..., :modes], so the Fourier weights act on modes the smooth fields barely have.",
     r"(mode|frequenc|fourier coefficient|rfft).{0,120}(highest|high[- ]frequency|-modes|wrong end|last modes|"
     r"from the end|lowest|low[- ]frequency|truncat)|(highest|high[- ]frequency|wrong end).{0,80}(modes?|frequenc|"
     r"coefficient)")(fno_high_modes_kept)
fix("fno_high_modes_kept", lambda: fno_high_modes_kept(fixed=True), rel_l2_pct, "rel L2 % of u", higher=False)


# 3 ------------------------------------------------------------------------------------------------------------
def field_2d(x, y):
    return torch.sin(PI * x) * torch.exp(-y) + 0.5 * y ** 2


def grid_meshgrid_xy(fixed: bool = False) -> dict:
    seed(0)
    xs, ys = torch.linspace(-1, 1, 40), torch.linspace(-1, 1, 40)
    field = field_2d(xs[:, None], ys[None, :])               # field[i, j] = u(xs[i], ys[j])
    X, Y = torch.meshgrid(xs, ys, indexing="ij" if fixed else "xy")
    coords = torch.stack([X.reshape(-1), Y.reshape(-1)], 1)
    g = gen(5)
    val = torch.rand(500, 2, generator=g) * 2 - 1
    model = mlp(2, 1, 48)
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(coords, field.reshape(-1, 1)),
                loss_fn=nn.MSELoss(), val_loader=load(val, field_2d(val[:, :1], val[:, 1:]), batch_size=500,
                                                      shuffle=False))


case("grid_meshgrid_xy", "shapes",
     "The training coordinates come from torch.meshgrid(..., indexing='xy') while the field was tabulated as "
     "field[i, j] = u(x_i, y_j) ('ij' order), so every flattened coordinate is paired with the transposed grid value.",
     r"meshgrid|indexing ?= ?['\"]?(xy|ij)|\bij\b.{0,40}\bxy\b|\bxy\b.{0,40}\bij\b|transpos.{0,80}(grid|field|"
     r"coordinat)|(grid|field|coordinat).{0,80}transpos|(x|y)[- ]and[- ](y|x).{0,40}swapped")(grid_meshgrid_xy)
fix("grid_meshgrid_xy", lambda: grid_meshgrid_xy(fixed=True), rel_l2_pct, "rel L2 % vs u(x, y)", higher=False)


# 4 ------------------------------------------------------------------------------------------------------------
class EulerStepper(nn.Module):
    """Learned vector field f, one explicit Euler step z + dt f(z)."""

    def __init__(self, dt: float = 0.1):
        super().__init__()
        self.f, self.dt = mlp(2, 2, 64), dt

    def forward(self, z):
        return z + self.dt * self.f(z)


def trajectory_view_not_transpose(fixed: bool = False) -> dict:
    seed(0)
    traj = simulate(initial_states(200, 3), 10, 0.1)        # (T=11, N=200, 2), time-major
    per_traj = traj.transpose(0, 1) if fixed else traj.reshape(200, 11, 2)
    x, y = per_traj[:, :-1].reshape(-1, 2), per_traj[:, 1:].reshape(-1, 2)
    model = EulerStepper()
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(x, y), loss_fn=nn.MSELoss(),
                val_loader=rollout_val())


case("trajectory_view_not_transpose", "shapes",
     "The simulated trajectories are time-major (T, N, 2) but are turned into per-trajectory (N, T, 2) with "
     ".reshape/.view instead of .transpose(0, 1), so consecutive (state, next state) pairs come from different "
     "trajectories.",
     r"(reshape|view).{0,120}(transpose|permute|time[- ]major|\(T, N|axes|axis order)|(transpose|permute).{0,120}"
     r"(instead of|not|rather than).{0,40}(reshape|view)|(time[- ]major|time and (batch|trajectory) ax[ie]s).{0,120}"
     r"(mix|scrambl|interleav|reshap)|pairs?.{0,80}different trajector")(trajectory_view_not_transpose)
fix("trajectory_view_not_transpose", lambda: trajectory_view_not_transpose(fixed=True),
    rollout_rmse(lambda m, z: m(z)), "rollout RMSE (30 steps)", higher=False)


# 5 ------------------------------------------------------------------------------------------------------------
def heat_mixed_derivative(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(2, 1)
    rows = heat_rows()

    def loss_fn(model, batch):
        r = batch[0]
        xt = r[:, 0:2].clone().requires_grad_(True)
        u = model(xt)
        du = grad(u, xt)                                    # (N, 2): [u_x, u_t]
        u_t = du[:, 1:2]
        u_xx = grad(du[:, 0:1] if fixed else du, xt)[:, 0:1]
        res = u_t - 0.1 * u_xx
        bc = model(r[:, 2:4])
        ic = model(r[:, 4:6]) - torch.sin(PI * r[:, 4:5])
        return res.pow(2).mean() + bc.pow(2).mean() + ic.pow(2).mean()

    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(rows), loss_fn=loss_fn,
                val_loader=heat_val())


case("heat_mixed_derivative", "shapes",
     "The heat-equation PINN takes u_xx as autograd.grad of the whole (N, 2) gradient [u_x, u_t] (implicitly summed) "
     "instead of its u_x column, so the 'u_xx' in the residual is really u_xx + u_tx.",
     r"(u_xx|second derivative|hessian|autograd\.grad).{0,160}(u_tx|u_xt|mixed (partial|derivative)|whole (gradient|"
     r"jacobian)|both columns|all columns|summ?(ed|s)? over (both|the) (columns|inputs)|u_x column|select(ing)? the "
     r"(x|first) column|\[:, ?0)|(mixed (partial|derivative)|u_tx|u_xt).{0,120}(u_xx|residual|second derivative)")(
    heat_mixed_derivative)
fix("heat_mixed_derivative", lambda: heat_mixed_derivative(fixed=True), rel_l2_pct, "rel L2 % vs exact heat solution",
    higher=False)
