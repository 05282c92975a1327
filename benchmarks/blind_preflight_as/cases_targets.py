"""Set as, family targets: the quantity the loss pulls towards is the wrong one."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_as import domains as D
from benchmarks.blind_preflight_as.registry import case, gen, loader, seed


class TDLoss:
    """One-step TD regression on a frozen target network synced every ``sync_every`` calls."""

    def __init__(self, target, mask_terminal=True, sync_every=10):
        self.target, self.mask_terminal, self.sync_every, self.calls = target, mask_terminal, sync_every, 0

    def __call__(self, model, batch):
        s, a, r, s2, done = batch
        self.calls += 1
        if self.calls % self.sync_every == 0:
            self.target.load_state_dict(model.state_dict())
        q = model(s).gather(1, a.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            nxt = self.target(s2).max(1).values
            y = r + D.GAMMA * (1 - done) * nxt if self.mask_terminal else r + D.GAMMA * nxt
        return F.mse_loss(q, y)


@case("dqn_no_terminal_mask", "targets",
      "The TD target r + gamma * max_a Q_target(s', a) bootstraps through terminal transitions: the done flag is "
      "loaded but never used, so episodes that end still get the value of a next state that does not exist; "
      "multiply the bootstrap by (1 - done).",
      r"(terminal|done|episode end).*(mask|ignored|never used|not used|bootstrap)|\(1 ?- ?done\)|"
      r"bootstrap.*(terminal|done|past the end|after the episode)|not.*(masked|zeroed).*(terminal|done)")
def dqn_no_terminal_mask(fixed: bool = False):
    seed(0)
    s, a, r, s2, done = D.chain_transitions()
    model = D.q_net()
    target = copy.deepcopy(model).requires_grad_(False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(s, a, r, s2, done), 64),
                loss_fn=TDLoss(target, mask_terminal=fixed), val_loader=D.q_val_loader(), max_steps=300)


class ExpertLog:
    """States from logged trajectories, continuous expert actions in [-2.5, 2.5] (two actuators)."""

    def __init__(self, s):
        states, _ = D.expert_trajectories(n_traj=80, length=40, s=s)
        self.x = states.reshape(-1, 6)
        v = torch.randn(6, 2, generator=gen(55))
        self.y = 2.5 * torch.tanh(self.x @ v / 2)


@case("bc_tanh_unscaled_actions", "targets",
      "The policy ends in tanh, so it can only output actions in [-1, 1], but the logged expert actions are in "
      "raw actuator units up to +-2.5 and are regressed unnormalised; scale the tanh by the action bound or "
      "normalise the actions to [-1, 1].",
      r"tanh.*(range|bound|\[-1, ?1\]|saturat|cannot reach|scale)|(action|target)s?.*(outside|beyond|exceed).*"
      r"(\[-1, ?1\]|range|bound)|(normali[sz]e|rescale|scale).*actions?|action (bound|range|scale|limit)")
def bc_tanh_unscaled_actions(fixed: bool = False):
    seed(0)
    tr, va = ExpertLog(0), ExpertLog(1)
    bound = 2.5 if fixed else 1.0

    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = D.policy_mlp(6, 2)

        def forward(self, s):
            return bound * torch.tanh(self.body(s))

    model = Policy()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(tr.x, tr.y), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(va.x, va.y), 400, shuffle=False), max_steps=300)


@case("bpr_sign_flipped", "targets",
      "The BPR loss is written -logsigmoid(neg_score - pos_score), the difference the wrong way round, so the "
      "model is trained to rank the sampled negatives above the user's positive items; use "
      "-logsigmoid(pos - neg) (softplus(neg - pos)).",
      r"(sign|order|wrong way|reversed|flipped|swapped|inverted).{0,40}(bpr|pairwise|ranking|score difference|pos(itive)?\W{0,3}.{0,15}neg)|"
      r"(bpr|pairwise|ranking).{0,40}(sign|reversed|flipped|swapped|invert|wrong way)|"
      r"logsigmoid\(\s*neg|neg(ative)?s? (are )?(ranked|scored) (above|higher than) (the )?(user'?s? )?pos")
def bpr_sign_flipped(fixed: bool = False):
    seed(0)
    data = D.Interactions()
    model = D.MF(data.n_users, data.n_items)

    def loss_fn(model, batch):
        u, p, q = batch
        pos, neg = model(u, p), model(u, q)
        diff = pos - neg if fixed else neg - pos
        return -F.logsigmoid(diff).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(D.TripletDataset(data.train_pairs, data.n_items), 128), loss_fn=loss_fn,
                val_loader=D.ranking_val_loader(data), max_steps=300)


def flow_fields(n, s):
    """Coefficient field -> (pressure in Pa ~ 1e3 * u, velocity magnitude ~ O(1) from the local forcing)."""
    a, u, x = D.elliptic_pairs(n, s=s)
    pressure = 2000.0 * u
    velocity = torch.tanh(a - a.mean(1, keepdim=True)) ** 2
    return torch.stack([a, x.expand_as(a)], 1), torch.stack([pressure, velocity], 1)


class TwoFieldSurrogate(nn.Module):
    def __init__(self, out_scale):
        super().__init__()
        self.net = D.conv_surrogate(2, 2)
        self.register_buffer("out_scale", out_scale.view(1, 2, 1))

    def forward(self, x):
        return self.net(x) * self.out_scale


@case("surrogate_unscaled_channels", "targets",
      "The surrogate regresses pressure (Pa, ~1e3) and velocity (~1) with one plain MSE in physical units, so the "
      "pressure channel's error is ~1e6 times larger and the velocity channel contributes almost nothing to the "
      "gradient; normalise each output channel (or weight the loss per channel by 1/variance).",
      r"(channel|output|target)s?.*(scale|magnitude|units|variance).*(differ|dominat|mismatch|orders)|"
      r"(pressure|velocity).*(dominat|swamp|ignored|negligible)|per.?channel.*(normali[sz]|weight|scale|variance)|"
      r"(normali[sz]e|standardi[sz]e).*(each|per).*(channel|output|target)|dominat.*(loss|gradient|mse)")
def surrogate_unscaled_channels(fixed: bool = False):
    seed(0)
    x, y = flow_fields(1000, 3)
    xv, yv = flow_fields(200, 4)
    scale = y.transpose(0, 1).reshape(2, -1).std(1)
    model = TwoFieldSurrogate(scale)
    if fixed:
        def loss_fn(pred, target):
            return (((pred - target) / model.out_scale) ** 2).mean()
    else:
        loss_fn = nn.MSELoss()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=(lambda m, b: loss_fn(m(b[0]), b[1])),
                val_loader=loader(TensorDataset(xv, yv), 100, shuffle=False), max_steps=300)


@case("pinn_poisson_sign", "targets",
      "The problem is posed as -u'' = q (Poisson with a positive source), but the residual is written u_xx - q, the "
      "sign convention of u'' = f, so the network converges to the negated solution -u; the residual must be "
      "u_xx + q.",
      r"sign.*(residual|pde|poisson|laplacian|source|u_xx|convention)|(residual|pde|poisson|source).*sign|"
      r"-u'' ?= ?q|u_xx ?\+ ?q|negat.*(solution|laplacian|source)|(laplacian|u_xx).*(opposite|flipped|wrong) sign")
def pinn_poisson_sign(fixed: bool = False):
    seed(0)
    x = torch.rand(512, 1, generator=gen(0))
    q = -D.poisson_forcing(x)                         # source of -u'' = q
    model = D.pinn_mlp()

    def loss_fn(model, batch):
        xc, qc = batch
        xc = xc.clone().requires_grad_(True)
        u = model(xc)
        u_xx = D.d_dx(D.d_dx(u, xc), xc)
        res = u_xx + qc if fixed else u_xx - qc
        xb = torch.tensor([[0.0], [1.0]], device=xc.device)
        return (res ** 2).mean() / D.PI ** 4 + 10 * (model(xb) ** 2).mean()

    xv = torch.linspace(0, 1, 201).unsqueeze(1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, q), 128), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(xv, D.poisson_exact(xv)), 201, shuffle=False), max_steps=300)
