"""Set as, family shapes: a tensor of the wrong shape or layout that broadcasts or reinterprets silently."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_as import domains as D
from benchmarks.blind_preflight_as.registry import case, gen, loader, seed


@case("pinn_forcing_broadcast", "shapes",
      "The PDE residual subtracts a forcing term of shape (N,) from the second derivative u_xx of shape (N, 1), so "
      "broadcasting makes an (N, N) residual that compares every point's u_xx with every other point's f(x); the "
      "forcing must be (N, 1) (unsqueeze(1) / keepdim) like u_xx.",
      r"(\(N, ?N\)|\(B, ?B\)|\(128, ?128\)|pairwise|every other point|all pairs).*(residual|forcing|u_xx|source)|"
      r"(residual|forcing|u_xx|source term).*(broadcast|\(N, ?1\).*\(N,?\)|\(N,?\).*\(N, ?1\)|\[128, 1\].*\[128\]|"
      r"\[128\].*\[128, 1\])|unsqueeze.*(forcing|source)|(forcing|source).*(unsqueeze|keepdim)")
def pinn_forcing_broadcast(fixed: bool = False):
    seed(0)
    x = torch.rand(512, 1, generator=gen(0))
    f = D.poisson_forcing(x).squeeze(1)          # stored per point as a flat column of the table
    if fixed:
        f = f.unsqueeze(1)
    model = D.pinn_mlp()

    def loss_fn(model, batch):
        xc, fc = batch
        xc = xc.clone().requires_grad_(True)
        u = model(xc)
        u_xx = D.d_dx(D.d_dx(u, xc), xc)
        pde = ((u_xx - fc) ** 2).mean() / D.PI ** 4
        xb = torch.tensor([[0.0], [1.0]], device=xc.device)
        return pde + 10 * (model(xb) ** 2).mean()

    xv = torch.linspace(0, 1, 201).unsqueeze(1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, f), 128), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(xv, D.poisson_exact(xv)), 201, shuffle=False), max_steps=300)


class ChannelsLastSurrogate(nn.Module):
    """Conv surrogate fed (B, N, C) grids: field and coordinate as the last axis."""

    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.net = D.conv_surrogate(2, 1)

    def forward(self, grid):
        b, n, c = grid.shape
        h = grid.permute(0, 2, 1) if self.fixed else grid.view(b, c, n)   # Conv1d wants (B, C, N)
        return self.net(h).squeeze(1)


@case("operator_channels_last_view", "shapes",
      "The (B, N, C) channels-last grid is turned into Conv1d's (B, C, N) with view / reshape instead of "
      "permute / transpose, which reinterprets memory and interleaves grid points and channels, scrambling the "
      "field's spatial layout; use grid.permute(0, 2, 1).",
      r"\bview\b.*(permute|transpose|channels|layout|interleav|scrambl)|reshape.*(instead of|rather than|not).*(permute|transpose)|"
      r"(permute|transpose).*(instead of|rather than|not).*(view|reshape)|channels.?last.*(view|reshape)|"
      r"(scrambl|interleav|reinterpret).*(grid|channel|spatial|memory)")
def operator_channels_last_view(fixed: bool = False):
    seed(0)
    a, u, x = D.elliptic_pairs(1200, s=1)
    grid = torch.stack([a, x.expand_as(a)], -1)          # (n, N, 2)
    model = ChannelsLastSurrogate(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(grid[:1000], u[:1000]), 32), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(grid[1000:], u[1000:]), 100, shuffle=False), max_steps=300)


class TDLossGather:
    def __init__(self, target, fixed, sync_every=10):
        self.target, self.fixed, self.sync_every, self.calls = target, fixed, sync_every, 0

    def __call__(self, model, batch):
        s, a, r, s2, done = batch
        self.calls += 1
        if self.calls % self.sync_every == 0:
            self.target.load_state_dict(model.state_dict())
        q = model(s).gather(1, a.unsqueeze(1))
        if self.fixed:
            q = q.squeeze(1)
        with torch.no_grad():
            y = r + D.GAMMA * (1 - done) * self.target(s2).max(1).values
        return ((q - y) ** 2).mean()


@case("dqn_gather_broadcast", "shapes",
      "Q(s, a) is taken with gather(1, a.unsqueeze(1)) and kept as (B, 1) while the TD target r + gamma * max Q' is "
      "(B,), so (q - y) broadcasts to (B, B) and every transition's Q is regressed on every other transition's "
      "target; squeeze(1) the gathered Q values.",
      r"(gather|q.?values?|Q\(s, ?a\)).{0,60}(\(B, ?1\)|\[\d+, 1\]|squeeze|broadcast)|"
      r"(\(B, ?B\)|\[64, 64\]).{0,60}(q.?values?|td|bellman|target)|(td|bellman) target.{0,60}(broadcast|\(B,?\))|"
      r"squeeze\(1\).{0,30}(gather|q)|broadcast.{0,40}(td|q.?value|bellman)")
def dqn_gather_broadcast(fixed: bool = False):
    seed(0)
    import copy
    s, a, r, s2, done = D.chain_transitions()
    model = D.q_net()
    target = copy.deepcopy(model).requires_grad_(False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(s, a, r, s2, done), 64), loss_fn=TDLossGather(target, fixed),
                val_loader=D.q_val_loader(), max_steps=300)


class ClickLog(D.TripletDataset):
    """Triplets read row by row from the click table: the user id comes out as a one-element column tensor."""

    def __getitem__(self, i):
        u, p, q = super().__getitem__(i)
        return (torch.tensor([u]) if not self.fixed else torch.tensor(u)), torch.tensor(p), torch.tensor(q)


@case("bpr_user_column_broadcast", "shapes",
      "The Dataset returns each user id as a one-element tensor, so the batch of users is (B, 1), the user "
      "embeddings are (B, 1, D) and (user_emb * item_emb).sum(-1) broadcasts against the (B, D) item embeddings to a "
      "(B, B) score matrix: every user is trained to prefer every other row's positive item over every other row's "
      "negative; return the user id as a scalar (or squeeze(1) the ids).",
      r"(user|id)s?.{0,40}\(B, ?1\)|\(B, ?1, ?D\)|(score|embedding)s?.{0,60}(\(B, ?B\)|\[128, 128\]|broadcast)|"
      r"(\(B, ?B\)|\[128, 128\]) score|broadcast.{0,40}(score|embedding|user|item)|"
      r"(user|id)s?.{0,40}(column|one.?element|extra dim)|every other (row|user)")
def bpr_user_column_broadcast(fixed: bool = False):
    seed(0)
    data = D.Interactions()
    model = D.MF(data.n_users, data.n_items)
    ds = ClickLog(data.train_pairs, data.n_items)
    ds.fixed = fixed

    def loss_fn(model, batch):
        u, p, q = batch
        return -F.logsigmoid(model(u, p) - model(u, q)).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(ds, 128), loss_fn=loss_fn, val_loader=D.ranking_val_loader(data), max_steps=300)


class HistoryPolicy(nn.Module):
    """GRU over the last T sensor readings (B, T, d) -> action logits."""

    def __init__(self, fixed, d=6, n_actions=4):
        super().__init__()
        self.gru = nn.GRU(d, 64, batch_first=fixed)
        self.head = nn.Linear(64, n_actions)

    def forward(self, window):
        out, _ = self.gru(window)
        return self.head(out[:, -1])


def velocity_windows(n, s):
    """Windows of 4 readings; the expert acts on the last velocity (reading[-1] - reading[-2])."""
    g = gen(s)
    w = torch.randn(6, 4, generator=gen(77))
    win = torch.randn(n, 4, 6, generator=g)
    return win, ((win[:, -1] - win[:, -2]) @ w).argmax(1)


@case("bc_gru_seq_first", "shapes",
      "The behaviour-cloning GRU is built with the default batch_first=False but fed (B, T, d) windows, so it "
      "recurs across the batch (samples as time steps) and out[:, -1] mixes different samples' readings; the policy "
      "never sees one window's time order. Build nn.GRU(..., batch_first=True) or permute to (T, B, d).",
      r"batch_first|(seq|sequence|time).?(first|major)|\(T, ?B|\(B, ?T|recur.*(across|over) the batch|"
      r"(batch|sample)s?.*(as|treated as) (time|sequence)|time.*(as|treated as) batch")
def bc_gru_seq_first(fixed: bool = False):
    seed(0)
    x, y = velocity_windows(4000, 0)
    xv, yv = velocity_windows(1000, 1)
    model = HistoryPolicy(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(xv, yv), 250, shuffle=False), max_steps=300)
