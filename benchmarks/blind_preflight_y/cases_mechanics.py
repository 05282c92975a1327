"""Mechanics: the step itself is wired wrong (signs, scalings, graph construction, target-network refreshes)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_y.registry import (
    MDP,
    bandit,
    best_arm_acc,
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
# DQN in a maze: the periodic target refresh copies the target network onto itself.
_MAZE = MDP(n_states=40, n_actions=4, n_feat=12, gamma=0.8, s=161)


def _maze_data():
    st, a, r, nx, done = _MAZE.transitions(3000, s=161)
    f = torch.tensor(_MAZE.feat)
    return TensorDataset(f[st], torch.tensor(a), torch.tensor(r), f[nx], torch.tensor(done))


def y_maze_dqn_target_copies_itself(fixed: bool = False):
    seed(161)
    policy_net = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
    target_net = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
    refresh = sync_every(10)

    def loss_fn(model, batch):
        obs, act, rew, nobs, done = batch
        target_net.to(obs.device)
        if refresh():
            if fixed:
                target_net.load_state_dict(model.state_dict())
            else:
                target_net.load_state_dict(target_net.state_dict())
        q_sa = model(obs).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            y = rew + 0.8 * target_net(nobs).max(1).values * (1.0 - done)
        return F.smooth_l1_loss(q_sa, y)

    return dict(model=policy_net, optimizer=torch.optim.Adam(policy_net.parameters(), lr=3e-3),
                train_loader=loader(_maze_data(), batch_size=64), val_loader=_MAZE.val_loader(),
                loss_fn=loss_fn, max_steps=5000)


case("y_maze_dqn_target_copies_itself", "mechanics",
     bug="The target network is refreshed with target_net.load_state_dict(target_net.state_dict()), its own weights, "
         "so it never receives the policy network's weights and every TD target comes from the randomly initialised "
         "target network for the whole run.",
     cause_pattern=r"target\w*\.load_state_dict\(\s*target\w*\.state_dict|load_state_dict.{0,60}(its own|itself)"
                   r"|(copies|copy|load\w*|sync\w*).{0,40}(from |onto )?itself|target (network|net|model).{0,80}"
                   r"(never (updated|synced|copied|changes|refreshed|receives)|stays? (at|random|frozen)|stale"
                   r"|(random|initial) (init\w*|weights))")(y_maze_dqn_target_copies_itself)
fix("y_maze_dqn_target_copies_itself", fixed_of(y_maze_dqn_target_copies_itself), q_rmse, "Q RMSE vs Q*",
    higher=False, steps=600)

# ---------------------------------------------------------------------------------------------------------------
# REINFORCE for choosing a delivery route per order; the loss was written as "log_prob * advantage".
_ROUTE_X, _ROUTE_ARMS = bandit(2600, 10, 4, s=171)


def y_route_reinforce_missing_minus(fixed: bool = False):
    seed(171)
    model = nn.Sequential(nn.Linear(10, 48), nn.ReLU(), nn.Linear(48, 4))

    def loss_fn(model, batch):
        x = batch[0]
        dist = torch.distributions.Categorical(logits=model(x))
        a = dist.sample()
        r = (a == (x @ _ROUTE_ARMS.to(x.device)).argmax(1)).float()
        adv = r - r.mean()
        pg = dist.log_prob(a) * adv
        return -pg.mean() if fixed else pg.mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(_ROUTE_X[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(_ROUTE_X[2000:]), batch_size=300, shuffle=False),
                loss_fn=loss_fn, max_steps=3000)


case("y_route_reinforce_missing_minus", "mechanics",
     bug="The REINFORCE loss is written log_prob * advantage without the minus sign, so gradient descent lowers the "
         "probability of the rewarded routes and the policy learns to pick the worst one.",
     cause_pattern=r"(minus|negative|negat\w*) sign|sign.{0,40}(loss|objective|reinforce|policy)|-\s*\(?\s*(dist\.)?"
                   r"log_?prob|gradient ascent|maximi[sz]\w*.{0,40}instead|minimi[sz]\w*.{0,40}(the )?(reward|return)"
                   r"|(lower|decreas)\w*.{0,60}probabilit\w*.{0,40}(reward|good|best)")(y_route_reinforce_missing_minus)
fix("y_route_reinforce_missing_minus", fixed_of(y_route_reinforce_missing_minus), best_arm_acc(_ROUTE_ARMS),
    "greedy best-route accuracy")


# ---------------------------------------------------------------------------------------------------------------
# PINN for a driven first-order drug-release model du/dt + 2u = 20 sin(3t), u(0) = 0: the derivative is taken
# without create_graph.
def _release(t):
    a, b = 40 / 13, -60 / 13
    return a * torch.sin(3 * t) + b * torch.cos(3 * t) - b * torch.exp(-2 * t)


def y_release_pinn_grad_without_create_graph(fixed: bool = False):
    seed(181)
    g = gen(181)
    t_col = torch.rand(2000, 1, generator=g) * 2.0
    t_val = torch.linspace(0, 2, 200)[:, None]
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))

    def loss_fn(model, batch):
        t = batch[0].clone().requires_grad_(True)
        u = model(t)
        if fixed:
            dudt = torch.autograd.grad(u, t, torch.ones_like(u), create_graph=True)[0]
        else:
            dudt = torch.autograd.grad(u, t, torch.ones_like(u), retain_graph=True)[0]
        residual = dudt + 2 * u - 20 * torch.sin(3 * t)
        u0 = model(torch.zeros(1, 1, device=t.device))
        return (residual ** 2).mean() + 10 * (u0 ** 2).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(t_col), batch_size=128),
                val_loader=loader(TensorDataset(t_val, _release(t_val)), batch_size=200, shuffle=False),
                loss_fn=loss_fn, max_steps=4000)


def _val_rmse(model, kw):
    def fn(m, b):
        p = m(b[0].to(model_device(m)))
        return ((p - b[1].to(p.device)) ** 2).sum().item(), len(p)
    return math.sqrt(mean_over(model, kw["val_loader"], fn))


case("y_release_pinn_grad_without_create_graph", "mechanics",
     bug="du/dt is taken with torch.autograd.grad(u, t, ..., retain_graph=True) but without create_graph=True, so "
         "the derivative comes back as a constant with no graph: the residual's gradient only flows through the "
         "2u term and the network never learns to match the derivative.",
     cause_pattern=r"create_graph|(no|without (a )?)graph.{0,60}(derivative|grad|du/?dt|u_t)|(derivative|du/?dt|u_t"
                   r"|autograd\.grad).{0,80}(detach\w*|constant|no grad_fn|not (differentiable|part of the graph)"
                   r"|without create|no graph)")(y_release_pinn_grad_without_create_graph)
fix("y_release_pinn_grad_without_create_graph", fixed_of(y_release_pinn_grad_without_create_graph), _val_rmse,
    "RMSE vs the analytic solution", higher=False)


# ---------------------------------------------------------------------------------------------------------------
# Distilling a sleep-stage classifier with soft targets at T=6, without the T**2 factor of Hinton et al.
def _sleep_data(n=2600, s=191):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = (x @ w).argmax(1)
    noisy = y.clone()
    flip = torch.rand(n, generator=g) < 0.6  # scorers systematically call stage k as stage k+1
    noisy[flip] = (y[flip] + 1) % 4
    return x, y, noisy, w


def y_sleep_distill_missing_t_squared(fixed: bool = False):
    seed(191)
    x, y, noisy, w = _sleep_data()
    teacher = nn.Linear(16, 4)
    with torch.no_grad():
        teacher.weight.copy_(3.0 * w.T)
        teacher.bias.zero_()
    teacher.requires_grad_(False)
    student = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    T, alpha = 6.0, 0.9

    def loss_fn(model, batch):
        xb, yb = batch
        teacher.to(xb.device)
        s_logits = model(xb)
        with torch.no_grad():
            t_probs = F.softmax(teacher(xb) / T, dim=1)
        soft = F.kl_div(F.log_softmax(s_logits / T, dim=1), t_probs, reduction="batchmean")
        if fixed:
            soft = soft * T ** 2
        return alpha * soft + (1 - alpha) * F.cross_entropy(s_logits, yb)

    return dict(model=student, optimizer=torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x[:2000], noisy[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=300, shuffle=False),
                loss_fn=loss_fn, max_steps=3000)


case("y_sleep_distill_missing_t_squared", "mechanics",
     bug="The soft-target KL term is not multiplied by T**2; at T=6 its gradients are 36 times too small next to the "
         "hard-label cross-entropy, so the student is trained almost only on the systematically mislabelled stages.",
     cause_pattern=r"t ?\*\* ?2|t\^2|\bt ?\* ?t\b|temperature.{0,30}(squared|\*\*|\^2)|(multipl|scal)\w*.{0,40}"
                   r"(\bt\b|temperature).{0,20}(squared|\*\*|\^|2)|1 ?/ ?t ?(\*\* ?2|\^2)|(soft|distill\w*|kl)"
                   r".{0,80}(too small|vanish\w*|negligible|scaled down|drowned)")(y_sleep_distill_missing_t_squared)
fix("y_sleep_distill_missing_t_squared", fixed_of(y_sleep_distill_missing_t_squared),
    lambda m, kw: mean_over(m, kw["val_loader"], lambda mm, b: (
        (mm(b[0].to(model_device(mm))).argmax(1) == b[1].to(model_device(mm))).sum().item(), len(b[1]))),
    "student val accuracy (true stages)")


# ---------------------------------------------------------------------------------------------------------------
# Policy gradient for A/B-style promotion choice with sparse conversions; the entropy bonus is added, not subtracted.
_PROMO_X, _PROMO_ARMS = bandit(2600, 10, 6, s=201)


def y_promo_entropy_bonus_wrong_sign(fixed: bool = False):
    seed(201)
    model = nn.Sequential(nn.Linear(10, 48), nn.Tanh(), nn.Linear(48, 6))
    beta = 0.1

    def loss_fn(model, batch):
        x = batch[0]
        dist = torch.distributions.Categorical(logits=model(x))
        a = dist.sample()
        best = (x @ _PROMO_ARMS.to(x.device)).argmax(1)
        r = ((a == best) & (torch.rand_like(x[:, 0]) < 0.3)).float()  # a conversion, 30% of the time
        adv = r - r.mean()
        pg = -(dist.log_prob(a) * adv).mean()
        ent = dist.entropy().mean()
        return pg - beta * ent if fixed else pg + beta * ent

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(_PROMO_X[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(_PROMO_X[2000:]), batch_size=300, shuffle=False),
                loss_fn=loss_fn, max_steps=3000)


case("y_promo_entropy_bonus_wrong_sign", "mechanics",
     bug="The entropy bonus is added to the loss (pg + beta * entropy) instead of subtracted, so training minimises "
         "the policy entropy and the policy collapses early onto whichever promotion it first favours under the "
         "sparse conversion rewards.",
     cause_pattern=r"entropy.{0,80}(sign|subtract\w*|minus|added|\+|maximi[sz]\w*|minimi[sz]\w*|collaps\w*|bonus"
                   r"|penalt\w*)|(sign|minus|subtract\w*).{0,60}entropy|-\s*(beta|self\.beta|ent_coef|entropy_coef)\w*"
                   r"\s*\*\s*entrop")(y_promo_entropy_bonus_wrong_sign)
fix("y_promo_entropy_bonus_wrong_sign", fixed_of(y_promo_entropy_bonus_wrong_sign), best_arm_acc(_PROMO_ARMS),
    "greedy best-promotion accuracy")
