"""Targets: the quantity the loss is asked to fit is not the one the user meant (returns, TD targets, event terms,
label encodings)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_y.registry import (
    MDP,
    acc_of,
    c_index_metric,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    model_device,
    q_rmse,
    seed,
    sync_every,
)

# ---------------------------------------------------------------------------------------------------------------
# REINFORCE on a 30-step inventory game; the discount helper was copied from a blog post.
_T, _D, _A = 30, 8, 4


def _inventory_episodes(n, s):
    g = gen(s)
    x = torch.randn(n, _T, _D, generator=g)
    phase = F.one_hot(torch.arange(_T) // 10, 3).float().expand(n, _T, 3)
    return torch.cat([x, phase], dim=-1)


_INV_W = torch.randn(3, _D, _A, generator=gen(61))


def _inv_best(obs):
    """The right order size at each step: argmax of x @ W[phase]."""
    phase = obs[..., _D:].argmax(-1)
    w = _INV_W.to(obs.device)[phase]  # (N, T, D, A)
    return torch.einsum("ntd,ntda->nta", obs[..., :_D], w).argmax(-1)


def discount_rewards_blog(rewards, gamma):
    """r_i * gamma**i with i counted from the episode start, then a reversed cumulative sum."""
    steps = torch.arange(rewards.shape[1], device=rewards.device)
    r = rewards * gamma ** steps
    return r.flip(1).cumsum(1).flip(1)


def reward_to_go(rewards, gamma):
    out, running = torch.zeros_like(rewards), torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        out[:, t] = running
    return out


@case("y_inventory_reinforce_discount_from_episode_start", "targets",
      bug="Returns are the reversed cumulative sum of gamma**i * r_i with i counted from the start of the episode, so "
          "each G_t carries an extra factor gamma**t: the last third of the 30-step episode is weighted by "
          "0.9**20..0.9**29 and its decisions are hardly trained.",
      cause_pattern=r"gamma ?\*\* ?(i|t|k|step)|discount\w*.{0,80}(start|beginning|first step|absolute|episode index"
                    r"|step 0)|(extra|spurious) (factor|gamma)|reward.to.go|g_t ?= ?r_t ?\+ ?gamma"
                    r"|discounted from (the )?(current|step t\b)|cumsum.{0,60}(discount|gamma)"
                    r"|(late|later) (steps|timesteps|decisions).{0,60}(weight|discount|vanish)")
def y_inventory_reinforce_discount_from_episode_start(fixed: bool = False):
    seed(61)
    model = nn.Sequential(nn.Linear(_D + 3, 64), nn.Tanh(), nn.Linear(64, _A))

    def loss_fn(model, batch):
        obs = batch[0]
        logits = model(obs)
        dist = torch.distributions.Categorical(logits=logits)
        actions = dist.sample()
        rewards = (actions == _inv_best(obs)).float()
        returns = reward_to_go(rewards, 0.9) if fixed else discount_rewards_blog(rewards, 0.9)
        adv = returns - returns.mean(0, keepdim=True)
        return -(dist.log_prob(actions) * adv).mean()

    def metric_loader():
        return loader(TensorDataset(_inventory_episodes(100, 62)), batch_size=100, shuffle=False)

    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                train_loader=loader(TensorDataset(_inventory_episodes(640, 63)), batch_size=32),
                val_loader=metric_loader(), loss_fn=loss_fn, max_steps=2000)


def _inv_acc(model, kw):
    """Greedy accuracy on the last third of the episode (steps 20-29)."""
    def fn(m, b):
        obs = b[0].to(model_device(m))[:, 20:]
        return (m(obs).argmax(-1) == _inv_best(obs)).sum().item(), obs.shape[0] * obs.shape[1]
    return mean_over(model, kw["val_loader"], fn)


fix("y_inventory_reinforce_discount_from_episode_start",
    fixed_of(y_inventory_reinforce_discount_from_episode_start), _inv_acc, "greedy accuracy on steps 20-29")


# ---------------------------------------------------------------------------------------------------------------
# DQN for a lunar-lander-like grid (goal pad +2, crater -2): the TD target never looks at the done flag.
_LANDER = MDP(n_states=36, n_actions=4, n_feat=10, gamma=0.8, s=71, n_terminal=3)


def _lander_data():
    st, a, r, nx, done = _LANDER.transitions(3000, s=71)
    f = torch.tensor(_LANDER.feat)
    return TensorDataset(f[st], torch.tensor(a), torch.tensor(r), f[nx], torch.tensor(done))


def y_lander_dqn_no_done_mask(fixed: bool = False):
    seed(71)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))
    target = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))
    refresh = sync_every(10)

    def loss_fn(model, batch):
        obs, act, rew, nobs, done = batch
        target.to(obs.device)
        if refresh():
            target.load_state_dict(model.state_dict())
        q_sa = model(obs).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            nxt = target(nobs).max(1).values
            y = rew + 0.8 * nxt * (1.0 - done) if fixed else rew + 0.8 * nxt
        return F.smooth_l1_loss(q_sa, y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_lander_data(), batch_size=64), val_loader=_LANDER.val_loader(),
                loss_fn=loss_fn, max_steps=5000)


case("y_lander_dqn_no_done_mask", "targets",
     bug="The TD target reward + gamma * max Q_target(s') is never multiplied by (1 - done), so transitions into the "
         "landing pad and the craters bootstrap from the made-up value of a terminal state the episode never "
         "continues from.",
     cause_pattern=r"\(1 ?- ?dones?\)|1 ?- ?dones?|dones?.{0,30}mask|mask.{0,40}(done|terminal)|terminal.{0,80}"
                   r"(bootstrap|next.state value|zero)|bootstrap\w*.{0,80}(terminal|done|end of (the )?episode)"
                   r"|(ignor|not us|never us|unused)\w*.{0,40}(done|terminal) flag")(y_lander_dqn_no_done_mask)
fix("y_lander_dqn_no_done_mask", fixed_of(y_lander_dqn_no_done_mask), q_rmse, "Q RMSE vs Q*", higher=False,
    steps=600)


# ---------------------------------------------------------------------------------------------------------------
# A Cox model of time to relapse, partial likelihood ported from a library snippet; the event column is int64.
def _relapse_data(n=2400, s=81):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    log_h = 1.0 * x[:, 0] - 0.8 * x[:, 1] + 0.6 * x[:, 2] * x[:, 3]
    t_event = -torch.log(torch.rand(n, generator=g)) / torch.exp(log_h)
    # most censoring is early drop-out (moved away, lost to follow-up), unrelated to the covariates
    t_cens = torch.where(torch.rand(n, generator=g) < 0.6, 0.15 * torch.rand(n, generator=g), torch.tensor(4.0))
    time = torch.minimum(t_event, t_cens)
    event = (t_event <= t_cens).long()
    return x, time, event, t_event


def y_relapse_cox_event_int_index(fixed: bool = False):
    seed(81)
    x, time, event, t_true = _relapse_data()
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))

    def loss_fn(model, batch):
        xb, tb, eb = batch
        order = torch.argsort(tb)
        log_hz = model(xb).squeeze(1)[order]
        event_sorted = eb[order]
        log_denominator = torch.logcumsumexp(log_hz.flip(0), dim=0).flip(0)
        terms = log_hz - log_denominator
        return -(terms[event_sorted.bool()] if fixed else terms[event_sorted]).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], time[:2000], event[:2000]), batch_size=128),
                val_loader=loader(TensorDataset(x[2000:], t_true[2000:]), batch_size=400, shuffle=False),
                loss_fn=loss_fn, max_steps=2000)


case("y_relapse_cox_event_int_index", "targets",
     bug="The per-event terms of the Cox partial likelihood are selected with the int64 0/1 event tensor "
         "(terms[event_sorted]), which indexes rows 0 and 1 over and over instead of masking, so the loss only ever "
         "sees the two earliest subjects of each batch.",
     cause_pattern=r"\[event\w*\]|(long|int\w*|0/1|integer) (event )?(tensor|index|indices|column).{0,80}(index"
                   r"|mask|bool|rows? 0 and 1|select)|(index|indexing|indexes)\w*.{0,60}(rows? 0 and 1|first (two|2))"
                   r"|event\w*\.bool\(\)|mask.{0,40}(event|censor)")(y_relapse_cox_event_int_index)
fix("y_relapse_cox_event_int_index", fixed_of(y_relapse_cox_event_int_index), c_index_metric(),
    "C-index vs true times")


# ---------------------------------------------------------------------------------------------------------------
# Multi-label tagging of lab reports with a margin loss: the label matrix is multi-hot.
def _tags_data(n=2400, c=10, s=91):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, c, generator=g)
    score = x @ w
    y = (score > score.quantile(0.8, dim=1, keepdim=True)).long()  # two tags per report
    return x, y


def multi_hot_to_indices(y):
    """[0, 1, 0, 1] -> [1, 3, -1, -1]: MultiLabelMarginLoss's target layout."""
    out = torch.full_like(y, -1)
    for i, row in enumerate(y):
        idx = row.nonzero().squeeze(1)
        out[i, : len(idx)] = idx
    return out


def y_labreport_multilabel_margin_multihot(fixed: bool = False):
    seed(91)
    x, y = _tags_data()
    target = multi_hot_to_indices(y) if fixed else y
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], target[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=400, shuffle=False),
                loss_fn=nn.MultiLabelMarginLoss(), max_steps=2000)


def r_precision(model, kw):
    def fn(m, b):
        x, y = b[0].to(model_device(m)), b[1].to(model_device(m))
        k = int(y.sum(1)[0].item())
        top = m(x).topk(k, dim=1).indices
        return y.gather(1, top).sum().item(), y.sum().item()
    return mean_over(model, kw["val_loader"], fn)


case("y_labreport_multilabel_margin_multihot", "targets",
     bug="nn.MultiLabelMarginLoss expects each row's positive class indices padded with -1, but it gets the 0/1 "
         "multi-hot tag matrix, which it reads as the indices {0, 1}: every report is trained as if its tags were "
         "the first two classes.",
     cause_pattern=r"multilabelmarginloss|multilabel_margin_loss|(class )?indices,? padded|padded with -1"
                   r"|(multi-hot|one-hot|0/1|binary) (tag |label |target )?(matrix|labels?|targets?).{0,80}"
                   r"(indices|index)|(indices|index).{0,60}(instead of|not) .{0,20}(multi-hot|0/1|binary)"
                   r"|multilabelsoftmarginloss")(y_labreport_multilabel_margin_multihot)
fix("y_labreport_multilabel_margin_multihot", fixed_of(y_labreport_multilabel_margin_multihot), r_precision,
    "val R-precision")


# ---------------------------------------------------------------------------------------------------------------
# Ordinal (cumulative-link, CORAL-style) grading of adverse-event severity; labels encoded LabelEncoder-style.
_GRADES = ["mild", "moderate", "severe", "critical"]


def _severity_data(n=2400, s=101):
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    z = x @ torch.randn(12, generator=g) / 12 ** 0.5 * 2 + 0.3 * torch.randn(n, generator=g)
    cuts = torch.quantile(z, torch.tensor([0.25, 0.5, 0.75]))
    grade = torch.bucketize(z, cuts)
    return x, [_GRADES[i] for i in grade.tolist()]


class Coral(nn.Module):
    def __init__(self, d, k):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1, bias=False))
        self.bias = nn.Parameter(torch.arange(k - 1, dtype=torch.float32).flip(0) - (k - 2) / 2)

    def forward(self, x):
        return self.body(x) + self.bias  # (N, K-1) logits of P(y > k)


def y_severity_ordinal_alphabetical_codes(fixed: bool = False):
    seed(101)
    x, labels = _severity_data()
    classes = _GRADES if fixed else sorted(set(labels))  # what LabelEncoder.fit does
    y = torch.tensor([classes.index(v) for v in labels])
    model = Coral(12, 4)

    def loss_fn(model, batch):
        xb, yb = batch
        levels = (yb[:, None] > torch.arange(3, device=yb.device)[None, :]).float()
        return F.binary_cross_entropy_with_logits(model(xb), levels)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=400, shuffle=False),
                loss_fn=loss_fn, max_steps=2000)


case("y_severity_ordinal_alphabetical_codes", "targets",
     bug="The severity grades are encoded with sorted(set(labels)), LabelEncoder's order, which is alphabetical: "
         "critical=0 < mild=1 < moderate=2 < severe=3, so the cumulative-link ordinal model is trained on ranks that "
         "do not follow the true mild < moderate < severe < critical order.",
     cause_pattern=r"alphabetic|lexicograph|labelencoder|sorted\(set|np\.unique|(encod|order|rank)\w*.{0,60}"
                   r"(mild|critical|severity|grade)|ordinalencoder|(explicit|true|natural|clinical) (order|ordering"
                   r"|rank)|categories=\[")(y_severity_ordinal_alphabetical_codes)
fix("y_severity_ordinal_alphabetical_codes", fixed_of(y_severity_ordinal_alphabetical_codes),
    acc_of(lambda m, b: ((m(b[0].to(model_device(m))) > 0).sum(1), b[1].to(model_device(m)))),
    "val grade accuracy")

