"""Set as, family mechanics: the update rule, initialisation or activation stops the loss from teaching the model."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_as import domains as D
from benchmarks.blind_preflight_as.registry import case, gen, loader, seed


@case("pinn_relu_activation", "mechanics",
      "The PINN uses ReLU activations, whose second derivative is zero almost everywhere, so u_xx of the network is "
      "identically 0, the PDE residual u_xx - f gives no gradient and the network cannot represent the solution's "
      "curvature; use a smooth activation (tanh, SiLU, sin).",
      r"relu.{0,60}(second|2nd|curvature|u_xx|derivative)|(second|2nd).?(order )?derivative.{0,40}(of|for) (the )?relu|"
      r"piecewise.?linear|(smooth|tanh|silu|sine?|softplus) activation")
def pinn_relu_activation(fixed: bool = False):
    seed(0)
    x = torch.rand(512, 1, generator=gen(0))
    model = D.pinn_mlp(nn.Tanh if fixed else nn.ReLU)

    def loss_fn(model, batch):
        xc = batch[0].clone().requires_grad_(True)
        u = model(xc)
        u_xx = D.d_dx(D.d_dx(u, xc), xc)
        pde = ((u_xx - D.poisson_forcing(xc)) ** 2).mean() / D.PI ** 4
        xb = torch.tensor([[0.0], [1.0]], device=xc.device)
        return pde + 10 * (model(xb) ** 2).mean()

    xv = torch.linspace(0, 1, 201).unsqueeze(1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x), 128), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(xv, D.poisson_exact(xv)), 201, shuffle=False), max_steps=300)


class SyncTDLoss:
    """TD regression; every ``sync_every`` calls the target network is refreshed."""

    def __init__(self, target, mode, sync_every=10):
        self.target, self.mode, self.sync_every, self.calls = target, mode, sync_every, 0

    def sync(self, model):
        if self.mode == "fixed":
            self.target.load_state_dict(model.state_dict())
        elif self.mode == "reversed":
            model.load_state_dict(self.target.state_dict())
        elif self.mode == "local":
            target = copy.deepcopy(model)      # noqa: F841  (meant to replace self.target)

    def __call__(self, model, batch):
        s, a, r, s2, done = batch
        self.calls += 1
        if self.calls % self.sync_every == 0:
            self.sync(model)
        q = model(s).gather(1, a.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            y = r + D.GAMMA * (1 - done) * self.target(s2).max(1).values
        return F.mse_loss(q, y)


def _dqn(mode):
    seed(0)
    s, a, r, s2, done = D.chain_transitions()
    model = D.q_net()
    target = copy.deepcopy(model).requires_grad_(False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(s, a, r, s2, done), 64), loss_fn=SyncTDLoss(target, mode),
                val_loader=D.q_val_loader(), max_steps=300)


@case("dqn_target_sync_reversed", "mechanics",
      "The periodic target-network sync is written model.load_state_dict(target.state_dict()), the wrong way "
      "round, so every sync resets the online Q-network to the frozen initial weights and its progress is thrown "
      "away; copy online into target: target.load_state_dict(model.state_dict()).",
      r"(sync|copy|copies|load_state_dict).{0,60}(wrong (way|direction)|reversed|backwards|overwrit|opposite)|"
      r"(online|q.?network|model).{0,60}(reset|overwritten|reverted).{0,40}(target|initial)|"
      r"model\.load_state_dict\(target")
def dqn_target_sync_reversed(fixed: bool = False):
    return _dqn("fixed" if fixed else "reversed")


@case("dqn_target_never_synced", "mechanics",
      "The sync step assigns copy.deepcopy(model) to a local variable instead of self.target, so the frozen target "
      "network keeps its random initial weights forever and the Q-network regresses on r + gamma * max Q of a random "
      "network; update self.target (target.load_state_dict(model.state_dict())).",
      r"target.{0,30}(never|not) (synced|updated|refreshed|copied)|(stale|random|initial)( weights)?.{0,20}target (net|network)|"
      r"target (net|network).{0,60}(random|initial) (init|weights)|local variable|"
      r"deepcopy.{0,40}(local|discarded)")
def dqn_target_never_synced(fixed: bool = False):
    return _dqn("fixed" if fixed else "local")


def _surrogate_data(n, s):
    a, u, x = D.elliptic_pairs(n, s=s)
    return torch.stack([a, x.expand_as(a)], 1), u


@case("surrogate_lr_decay_per_step", "mechanics",
      "ExponentialLR(gamma=0.95), meant as a per-epoch decay, is stepped after every batch, so the learning rate "
      "falls to under 1% of its value within 100 steps and the surrogate stops learning early; step it once per "
      "epoch (or use gamma ** (1 / steps_per_epoch)).",
      r"(scheduler|exponentiallr|lr_scheduler|decay).*(per (batch|step|iteration)|every (batch|step|iteration)|"
      r"too fast|to (near )?zero|collapses|vanish)|(per|once an?|each) epoch.*(scheduler|decay|step)|"
      r"(scheduler|exponentiallr|gamma).*(1%|under 1|shrinks?|falls)")
def surrogate_lr_decay_per_step(fixed: bool = False):
    seed(0)
    x, y = _surrogate_data(1000, 7)
    xv, yv = _surrogate_data(200, 8)
    model = D.conv_surrogate(2, 1)
    model.append(nn.Flatten())
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    steps_per_epoch = 1000 // 32 + 1
    gamma = 0.95 ** (1 / steps_per_epoch) if fixed else 0.95
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.ExponentialLR(opt, gamma=gamma),
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(xv, yv), 100, shuffle=False), max_steps=300)


@case("rec_zero_init_embeddings", "mechanics",
      "Both the user and item embedding tables are initialised with nn.init.zeros_, so every score is 0 and the "
      "gradient of a dot product u . v with respect to each factor is the other (zero) factor: all gradients are "
      "exactly zero and the model never leaves the symmetric starting point; use a small random init.",
      r"(zero|zeros_|constant).?(init|initiali[sz])|initiali[sz]ed (to|with|as) (all )?zeros?|"
      r"(embedding|table|factor)s?.{0,40}(all )?zeros?.{0,60}(gradient|symmetr|stuck)|"
      r"symmetr.{0,30}(init|break)")
def rec_zero_init_embeddings(fixed: bool = False):
    seed(0)
    data = D.Interactions()
    model = D.MF(data.n_users, data.n_items)
    if not fixed:
        nn.init.zeros_(model.user.weight)
        nn.init.zeros_(model.item.weight)

    def loss_fn(model, batch):
        u, p, q = batch
        return -F.logsigmoid(model(u, p) - model(u, q)).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(D.TripletDataset(data.train_pairs, data.n_items), 128), loss_fn=loss_fn,
                val_loader=D.ranking_val_loader(data), max_steps=300)
