"""Shapes: a tensor of the wrong rank or axis that broadcasts or normalises where the user did not mean it."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_y.registry import (
    MDP,
    bandit,
    best_arm_acc,
    c_index_metric,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    model_device,
    q_rmse,
    rmse_of,
    seed,
    sync_every,
)

# ---------------------------------------------------------------------------------------------------------------
# TD(0) evaluation of a battery-dispatch policy: the critic returns (N, 1), the TD target is built as (N,).
_GRID = MDP(n_states=30, n_actions=3, n_feat=10, gamma=0.9, s=11)


def _grid_v_pi():
    """V of the uniform-random dispatch policy, by iterative policy evaluation."""
    v = np.zeros(_GRID.S)
    for _ in range(500):
        vv = v.copy()
        vv[_GRID.term] = 0.0
        v = (_GRID.rew + _GRID.gamma * vv[_GRID.nxt]).mean(1)
    live = np.flatnonzero(~_GRID.term)
    return torch.tensor(_GRID.feat[live]), torch.tensor(v[live], dtype=torch.float32)


def _grid_data():
    st, a, r, nx, done = _GRID.transitions(3000, s=11)
    f = torch.tensor(_GRID.feat)
    return TensorDataset(f[st], torch.tensor(r), f[nx], torch.tensor(done))


@case("y_dispatch_td_value_column_vs_target_vector", "shapes",
      bug="The critic V(s) comes out as an (N, 1) column while the TD target reward + gamma * V_target(s') * "
          "(1 - done) is built from (N,) vectors, so F.mse_loss(value, target) broadcasts to (N, N) and every state's "
          "value is regressed to the average target of the batch.",
      cause_pattern=r"(value|v\(s\)|critic)s?.{0,60}\(n, ?1\).{0,80}(target|\(n,?\))|(td )?(target|reward)s?.{0,60}"
                    r"\(n,?\).{0,80}(\(n, ?1\)|broadcast)|\(n, ?n\)|(squeeze|unsqueeze|view\(-1\)).{0,60}(value"
                    r"|critic|v\(s\))|(value|critic)\w*.{0,40}(squeeze|unsqueeze)|(td|bootstrap\w*) target.{0,80}"
                    r"broadcast|broadcast\w*.{0,80}(critic|value|td target)")
def y_dispatch_td_value_column_vs_target_vector(fixed: bool = False):
    seed(11)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    target = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    refresh = sync_every(25)

    def loss_fn(model, batch):
        obs, rew, nobs, done = batch
        target.to(obs.device)
        if refresh():
            target.load_state_dict(model.state_dict())
        value = model(obs)
        with torch.no_grad():
            td = rew + 0.9 * target(nobs).squeeze(1) * (1.0 - done)
        return F.mse_loss(value.squeeze(1) if fixed else value, td)

    feats, v = _grid_v_pi()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_grid_data(), batch_size=64),
                val_loader=loader(TensorDataset(feats, v), batch_size=256, shuffle=False),
                loss_fn=loss_fn, max_steps=5000)


fix("y_dispatch_td_value_column_vs_target_vector", fixed_of(y_dispatch_td_value_column_vs_target_vector),
    rmse_of(lambda m, b: (m(b[0].to(model_device(m))), b[1].to(model_device(m)))), "V RMSE vs V of the policy",
    higher=False, steps=400)


# ---------------------------------------------------------------------------------------------------------------
# A warehouse-robot DQN ported from a TF1 notebook: Q(s, a) = reduce_sum(q * one_hot(a)) -- without the axis.
_WH = MDP(n_states=40, n_actions=4, n_feat=12, gamma=0.9, s=21)


def _wh_data():
    st, a, r, nx, done = _WH.transitions(3000, s=21)
    f = torch.tensor(_WH.feat)
    return TensorDataset(f[st], torch.tensor(a), torch.tensor(r), f[nx], torch.tensor(done))


@case("y_warehouse_dqn_qsa_summed_over_batch", "shapes",
      bug="Q(s, a) is picked with (q * F.one_hot(actions, 4)).sum() without dim=1, which sums over the whole batch "
          "into a single scalar; MSELoss then broadcasts that scalar against every TD target, so all Q-values get "
          "the same gradient and no state-action value is learned.",
      cause_pattern=r"sum\(\) without dim|sum\(dim\s*=\s*(1|-1)\)|without (a |the )?dim(=|ension| argument)"
                    r"|one_hot.{0,80}(sum|reduc)|gather\(1|(reduc|sum)\w* over (the )?(whole |entire )?batch"
                    r"|single scalar.{0,80}(q|target)|q.values?.{0,60}(scalar|0-d|zero-dim)"
                    r"|(scalar|0-d).{0,60}broadcast\w* .{0,40}(target|td)")
def y_warehouse_dqn_qsa_summed_over_batch(fixed: bool = False):
    seed(21)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
    target = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
    target.load_state_dict(model.state_dict())
    refresh = sync_every(25)

    def loss_fn(model, batch):
        obs, act, rew, nobs, done = batch
        target.to(obs.device)
        if refresh():
            target.load_state_dict(model.state_dict())
        q = model(obs)
        mask = F.one_hot(act, 4).float()
        q_sa = (q * mask).sum(dim=1) if fixed else (q * mask).sum()
        with torch.no_grad():
            y = rew + 0.9 * target(nobs).max(1).values * (1.0 - done)
        return F.mse_loss(q_sa, y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_wh_data(), batch_size=64), val_loader=_WH.val_loader(),
                loss_fn=loss_fn, max_steps=5000)


fix("y_warehouse_dqn_qsa_summed_over_batch", fixed_of(y_warehouse_dqn_qsa_summed_over_batch), q_rmse,
    "Q RMSE vs Q*", higher=False, steps=400)


# ---------------------------------------------------------------------------------------------------------------
# Offline policy gradient on logged recommendations: the logged actions come back as an (N, 1) column.
_REC_X, _REC_ARMS = bandit(3000, 12, 5, s=31)


def _rec_logged():
    g = gen(32)
    a = torch.randint(0, 5, (2400, 1), generator=g)  # stored as a column, like the CSV it came from
    r = (a[:, 0] == (_REC_X[:2400] @ _REC_ARMS).argmax(1)).float()
    return TensorDataset(_REC_X[:2400], a, r - r.mean())


@case("y_recsys_logprob_action_column", "shapes",
      bug="The logged actions are an (N, 1) column, so Categorical(logits=...).log_prob(actions) broadcasts to an "
          "(N, N) matrix of every context's log-probability of every logged action, and the advantage-weighted "
          "loss no longer ties an advantage to its own context's action.",
      cause_pattern=r"log_prob.{0,120}(\(n, ?n\)|\[?\d+, ?\d+\]?|n ?x ?n|shape|broadcast|squeeze)"
                    r"|(squeeze|flatten)\w*.{0,60}action|action\w*.{0,60}(\(n, ?1\)|column|trailing dim|extra dim"
                    r"|squeeze)")
def y_recsys_logprob_action_column(fixed: bool = False):
    seed(31)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 5))

    def loss_fn(model, batch):
        x, a, adv = batch
        dist = torch.distributions.Categorical(logits=model(x))
        logp = dist.log_prob(a.squeeze(1) if fixed else a)
        return -(logp * adv).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_rec_logged(), batch_size=128),
                val_loader=loader(TensorDataset(_REC_X[2400:]), batch_size=300, shuffle=False),
                loss_fn=loss_fn, max_steps=2000)


fix("y_recsys_logprob_action_column", fixed_of(y_recsys_logprob_action_column), best_arm_acc(_REC_ARMS),
    "greedy best-item accuracy")


# ---------------------------------------------------------------------------------------------------------------
# Heteroscedastic regression of battery capacity fade: the head returns (N, 1) mean and variance, the target is (N,).
def _fade_data():
    g = gen(41)
    x = torch.randn(2400, 6, generator=g)
    mu = torch.sin(x[:, 0] * 1.5) + 0.5 * x[:, 1] * x[:, 2]
    sd = 0.05 + 0.4 * torch.sigmoid(2 * x[:, 3])
    y = mu + sd * torch.randn(2400, generator=g)
    return x, y


class FadeHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU())
        self.mean = nn.Linear(64, 1)
        self.var = nn.Linear(64, 1)

    def forward(self, x):
        h = self.body(x)
        return self.mean(h), F.softplus(self.var(h)) + 1e-3


def y_battery_gaussian_nll_target_vector(fixed: bool = False):
    seed(41)
    x, y = _fade_data()
    model = FadeHead()
    nll = nn.GaussianNLLLoss()

    def loss_fn(model, batch):
        xb, yb = batch
        mean, var = model(xb)
        return nll(mean, yb.unsqueeze(1) if fixed else yb, var)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=400, shuffle=False),
                loss_fn=loss_fn, max_steps=3000)


case("y_battery_gaussian_nll_target_vector", "shapes",
     bug="GaussianNLLLoss gets the predicted mean and variance as (N, 1) columns but the target as an (N,) vector; it "
         "broadcasts them to an (N, N) loss without a warning, so every predicted mean is fitted to every target in "
         "the batch and the mean head collapses to the batch average.",
     cause_pattern=r"gaussiannllloss|gaussian_nll_loss|(target|label)s?.{0,60}\(n,?\).{0,80}(\(n, ?1\)|broadcast)"
                   r"|(\(n, ?1\)|column).{0,80}(target|label).{0,40}(\(n,?\)|broadcast)|nll.{0,60}broadcast"
                   r"|(mean|variance|var)\w*.{0,80}\(n, ?1\).{0,80}target")(y_battery_gaussian_nll_target_vector)
fix("y_battery_gaussian_nll_target_vector", fixed_of(y_battery_gaussian_nll_target_vector),
    rmse_of(lambda m, b: (m(b[0].to(model_device(m)))[0], b[1].to(model_device(m)))), "val RMSE of the mean",
    higher=False)


# ---------------------------------------------------------------------------------------------------------------
# DeepSurv-style churn model: the churn flag comes out of the feature table as an (N, 1) column.
def _churn_data(n=2400, s=51):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    hazard = torch.exp(1.2 * x[:, 0] - 0.8 * x[:, 1])
    t_event = -torch.log(torch.rand(n, generator=g)) / hazard
    # contracts of the x2 > 0 segment end early (administrative censoring tied to a feature)
    t_cens = torch.where(x[:, 2] > 0, 0.05 + 0.1 * torch.rand(n, generator=g), 3.0 * torch.rand(n, generator=g))
    time = torch.minimum(t_event, t_cens)
    event = (t_event <= t_cens).float()
    return x, time, event, t_event


def cox_sorted_loss(risk, time, event):
    """Negative Cox partial log-likelihood (Breslow, no ties) of a batch."""
    order = torch.argsort(time, descending=True)
    risk, event = risk[order], event[order]
    log_risk_set = torch.logcumsumexp(risk, dim=0)
    partial = risk - log_risk_set
    return -(partial * event).sum() / event.sum().clamp(min=1.0)


def y_churn_cox_event_column(fixed: bool = False):
    seed(51)
    x, time, event, t_true = _churn_data()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    event_col = event[:, None]  # as read from the table

    def loss_fn(model, batch):
        xb, tb, eb = batch
        risk = model(xb).squeeze(1)
        return cox_sorted_loss(risk, tb, eb.squeeze(1) if fixed else eb)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], time[:2000], event_col[:2000]), batch_size=128),
                val_loader=loader(TensorDataset(x[2000:], t_true[2000:]), batch_size=400, shuffle=False),
                loss_fn=loss_fn, max_steps=2000)


case("y_churn_cox_event_column", "shapes",
     bug="The churn flag is an (N, 1) column while the Cox partial log-likelihood terms are an (N,) vector, so "
         "partial * event broadcasts to (N, N): every subject's term is weighted by the mean event rate, which is "
         "the same as treating the censored (early-ending) contracts as churn events.",
     cause_pattern=r"(event|censor\w*|status|churn flag).{0,80}(\(n, ?1\)|column|broadcast|squeeze|shape)"
                   r"|(broadcast\w*|\(n, ?n\)).{0,80}(event|censor|partial|cox|likelihood)"
                   r"|censored.{0,60}(as|like) (\w+ )?(events|deaths|failures)")(y_churn_cox_event_column)
fix("y_churn_cox_event_column", fixed_of(y_churn_cox_event_column), c_index_metric(), "C-index vs true times")

