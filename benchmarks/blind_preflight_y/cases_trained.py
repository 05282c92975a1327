"""What is trained: the optimizer updates something it should not, or never sees something it should."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_y.registry import (
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
)


# ---------------------------------------------------------------------------------------------------------------
# Knowledge distillation of a pump-fault classifier, Keras-style Distiller holding teacher and student.
def _pump_data(n=2600, s=111):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 5, generator=g)
    y = (x @ w).argmax(1)
    noisy = y.clone()
    flip = torch.rand(n, generator=g) < 0.45  # technicians confuse each fault with the next one
    noisy[flip] = (y[flip] + 1) % 5
    return x, y, noisy, w


class Distiller(nn.Module):
    def __init__(self, teacher_w):
        super().__init__()
        self.teacher = nn.Linear(16, 5)
        with torch.no_grad():  # "pretrained" teacher
            self.teacher.weight.copy_(3.0 * teacher_w.T)
            self.teacher.bias.zero_()
        self.student = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))

    def forward(self, x):
        return self.student(x)


def y_pump_distiller_optimizes_teacher(fixed: bool = False):
    seed(111)
    x, y, noisy, w = _pump_data()
    model = Distiller(w)
    T, alpha = 4.0, 0.7

    def loss_fn(model, batch):
        xb, yb = batch
        s_logits = model.student(xb)
        t_logits = model.teacher(xb)
        soft = F.kl_div(F.log_softmax(s_logits / T, dim=1), F.softmax(t_logits / T, dim=1),
                        reduction="batchmean") * T * T
        return alpha * soft + (1 - alpha) * F.cross_entropy(s_logits, yb)

    params = model.student.parameters() if fixed else model.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=1e-2),
                train_loader=loader(TensorDataset(x[:2000], noisy[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=300, shuffle=False),
                loss_fn=loss_fn, max_steps=2000)


case("y_pump_distiller_optimizes_teacher", "what_is_trained",
     bug="The optimizer is built over the whole Distiller (model.parameters()), so the pretrained teacher's weights "
         "are in it and its logits are not detached: every step drags the teacher toward the student and the noisy "
         "labels instead of only training the student.",
     cause_pattern=r"teacher.{0,80}(optimi[sz]er|param|updated|trained|requires_grad|detach|frozen|freez|no_grad"
                   r"|gradient)|(optimi[sz]er|param\w*|gradient\w*).{0,80}teacher"
                   r"|distill\w*.{0,60}teacher.{0,40}(train|updat)")(y_pump_distiller_optimizes_teacher)
fix("y_pump_distiller_optimizes_teacher", fixed_of(y_pump_distiller_optimizes_teacher),
    lambda m, kw: mean_over(m, kw["val_loader"], lambda mm, b: (
        (mm(b[0].to(model_device(mm))).argmax(1) == b[1].to(model_device(mm))).sum().item(), len(b[1]))),
    "student val accuracy (clean labels)")


# ---------------------------------------------------------------------------------------------------------------
# Actor-critic for dynamic pricing (contextual bandit) with a shared trunk: advantage not detached.
_PRICE_M = torch.randn(10, 5, generator=gen(121)) * 0.5


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 64), nn.Tanh())
        self.pi = nn.Linear(64, 5)
        self.v = nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.pi(h), self.v(h).squeeze(-1)


def y_pricing_a2c_advantage_not_detached(fixed: bool = False):
    seed(121)
    g = gen(122)
    x = torch.randn(2600, 10, generator=g)
    model = ActorCritic()

    def loss_fn(model, batch):
        xb = batch[0]
        logits, value = model(xb)
        dist = torch.distributions.Categorical(logits=logits)
        a = dist.sample()
        mean_r = (xb @ _PRICE_M.to(xb.device)).gather(1, a[:, None]).squeeze(1)
        r = mean_r + 0.3 * torch.randn_like(mean_r)
        adv = r - value.detach() if fixed else r - value
        actor = -(dist.log_prob(a) * adv).mean()
        critic = 0.5 * ((r - value) ** 2).mean()
        return actor + critic - 0.05 * dist.entropy().mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:]), batch_size=300, shuffle=False),
                loss_fn=loss_fn, max_steps=3000)


def critic_rmse(model, kw):
    """RMSE of V(s) against the expected reward of the current policy, E_pi[r | s]."""
    def fn(m, b):
        x = b[0].to(model_device(m))
        logits, value = m(x)
        expected = (logits.softmax(-1) * (x @ _PRICE_M.to(x.device))).sum(-1)
        return ((value - expected) ** 2).sum().item(), len(x)
    return math.sqrt(mean_over(model, kw["val_loader"], fn))


case("y_pricing_a2c_advantage_not_detached", "what_is_trained",
     bug="The actor loss uses the advantage (reward - value) without .detach(), so the policy-gradient term also "
         "backpropagates into the shared critic head and trunk and pushes V(s) away from the expected reward.",
     cause_pattern=r"detach.{0,60}(value|critic|advantage|baseline)|(value|critic|advantage|baseline).{0,80}"
                   r"(detach|stop.gradient|no_grad)|(actor|policy).{0,40}(loss|gradient).{0,80}(into|through"
                   r"|reach\w*|flow\w*).{0,30}(critic|value)")(y_pricing_a2c_advantage_not_detached)
fix("y_pricing_a2c_advantage_not_detached", fixed_of(y_pricing_a2c_advantage_not_detached), critic_rmse,
    "critic RMSE vs E_pi[r|s]", higher=False)


# ---------------------------------------------------------------------------------------------------------------
# Inverse PINN for a drug-elimination ODE du/dt = -k u: the unknown rate is a plain tensor attribute.
_K_TRUE = 1.7


class EliminationPINN(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
        if fixed:
            self.k = nn.Parameter(torch.tensor(0.5))
        else:
            self.k = torch.tensor(0.5, requires_grad=True)

    def forward(self, t):
        return self.net(t)


def y_pk_pinn_rate_plain_tensor(fixed: bool = False):
    seed(131)
    g = gen(131)
    t_obs = torch.rand(400, 1, generator=g) * 2.0
    u_obs = torch.exp(-_K_TRUE * t_obs) + 0.01 * torch.randn(400, 1, generator=g)
    model = EliminationPINN(fixed)

    def loss_fn(model, batch):
        t, u_meas = batch
        t = t.clone().requires_grad_(True)
        u = model(t)
        du = torch.autograd.grad(u, t, torch.ones_like(u), create_graph=True)[0]
        k = model.k.to(t.device)
        residual = du + k * u
        u0 = model(torch.zeros(1, 1, device=t.device))
        return F.mse_loss(u, u_meas) + (residual ** 2).mean() + ((u0 - 1.0) ** 2).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(t_obs, u_obs), batch_size=64),
                val_loader=loader(TensorDataset(t_obs[:50], u_obs[:50]), batch_size=50, shuffle=False),
                loss_fn=loss_fn, max_steps=3000)


case("y_pk_pinn_rate_plain_tensor", "what_is_trained",
     bug="The unknown elimination rate k is stored as a plain tensor with requires_grad=True instead of an "
         "nn.Parameter, so it is not in model.parameters(), the optimizer never updates it, and the PINN fits the "
         "concentrations with the initial guess k = 0.5.",
     cause_pattern=r"nn\.parameter|register_parameter|not (a |an )?(registered )?param|not registered as (a |an )?(nn\.)?param|(model\.k|\bk\b|rate).{0,80}optimi[sz]er never updates|plain tensor|(not|never) in "
                   r"(model\.)?parameters\(\)|requires_grad.{0,80}(tensor|attribute).{0,60}(optimi[sz]er|param)"
                   r"|(\bk\b|coefficient|rate|log_k).{0,60}(never|not) (updated|optimi[sz]ed|trained|learn)")(
    y_pk_pinn_rate_plain_tensor)
fix("y_pk_pinn_rate_plain_tensor", fixed_of(y_pk_pinn_rate_plain_tensor),
    lambda m, kw: abs(float(m.k) - _K_TRUE), "|k - k_true|", higher=False)


# ---------------------------------------------------------------------------------------------------------------
# Metric learning of bird-call embeddings with an ArcFace head living in the loss module.
def _calls_data(n=2400, c=10, s=141):
    g = gen(s)
    centers = torch.randn(c, 20, generator=g) * 1.5
    y = torch.randint(0, c, (n,), generator=g)
    x = centers[y] + torch.randn(n, 20, generator=g)
    return x, y


class ArcFaceLoss(nn.Module):
    def __init__(self, n_classes, dim, s=16.0, m=0.3):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_classes, dim))
        self.s, self.m = s, m

    def forward(self, emb, labels):
        cos = F.normalize(emb, dim=1) @ F.normalize(self.W, dim=1).T
        theta = torch.acos(cos.clamp(-1 + 1e-6, 1 - 1e-6))
        target = torch.cos(theta + self.m)
        onehot = F.one_hot(labels, cos.shape[1]).bool()
        logits = torch.where(onehot, target, cos) * self.s
        return F.cross_entropy(logits, labels)


def y_birdcall_arcface_centres_not_optimized(fixed: bool = False):
    seed(141)
    x, y = _calls_data()
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    criterion = ArcFaceLoss(10, 2, m=0.2)
    params = list(model.parameters()) + list(criterion.parameters()) if fixed else model.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=400, shuffle=False),
                loss_fn=criterion, max_steps=3000)


@torch.no_grad()
def retrieval_at_1(model, kw):
    """1-NN accuracy of validation embeddings against the training embeddings (cosine)."""
    was = model.training
    model.eval()
    dev = model_device(model)
    gx, gy = kw["train_loader"].dataset.tensors
    gallery = F.normalize(model(gx.to(dev)), dim=1)
    right = n = 0
    for xb, yb in kw["val_loader"]:
        q = F.normalize(model(xb.to(dev)), dim=1)
        nn_idx = (q @ gallery.T).argmax(1)
        right += (gy.to(dev)[nn_idx] == yb.to(dev)).sum().item()
        n += len(yb)
    model.train(was)
    return right / n


case("y_birdcall_arcface_centres_not_optimized", "what_is_trained",
     bug="The ArcFace head (the class-centre matrix W inside the loss module) is not given to the optimizer, which "
         "only holds model.parameters(), so the 10 centres stay at their random initialisation in a 2-d embedding "
         "space and nearby centres keep their classes merged.",
     cause_pattern=r"(loss|criterion|arcface|head|class.cent\w*|proxies|proxy).{0,80}(param\w*|weight\w*|cent\w*"
                   r"|\bw\b).{0,60}(optimi[sz]er|never updated|not (updated|trained)|frozen|random init\w*)"
                   r"|optimi[sz]er.{0,80}(loss_fn|criterion|loss module|arcface|head)|loss_fn\.parameters"
                   r"|criterion\.parameters|(param|weight)\w* of the loss")(y_birdcall_arcface_centres_not_optimized)
fix("y_birdcall_arcface_centres_not_optimized", fixed_of(y_birdcall_arcface_centres_not_optimized),
    retrieval_at_1, "val 1-NN retrieval accuracy")


# ---------------------------------------------------------------------------------------------------------------
# A mixture density network for a two-regime travel-time problem: the mixing-weight layer is built in forward().
def _ik_data(n=2600, s=151):
    g = gen(s)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    congested = torch.rand(n, 1, generator=g) < torch.sigmoid(3 * x)  # the share of the slow regime grows with x
    y = torch.sin(x) + torch.where(congested, 1.0, -1.0) + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


class MDN(nn.Module):
    def __init__(self, fixed, k=2):
        super().__init__()
        self.fixed = fixed
        self.trunk = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.mu = nn.Linear(64, k)
        self.log_sigma = nn.Linear(64, k)
        if fixed:
            self.pi = nn.Linear(64, k)

    def forward(self, x):
        h = self.trunk(x)
        if self.fixed:
            logits = self.pi(h)
        else:
            logits = nn.Linear(64, self.mu.out_features).to(h.device)(h)  # added .to() after a device error
        return logits, self.mu(h), self.log_sigma(h).clamp(-5, 3)


def mdn_nll(model, batch):
    x, y = batch
    logits, mu, log_sigma = model(x)
    comp = torch.distributions.Normal(mu, log_sigma.exp()).log_prob(y)
    return -torch.logsumexp(F.log_softmax(logits, dim=1) + comp, dim=1).mean()


def y_ik_mdn_mixing_layer_in_forward(fixed: bool = False):
    seed(151)
    x, y = _ik_data()
    model = MDN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), batch_size=64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), batch_size=300, shuffle=False),
                loss_fn=mdn_nll, max_steps=3000)


case("y_ik_mdn_mixing_layer_in_forward", "what_is_trained",
     bug="The mixing-weight layer of the mixture density network is created inside forward() "
         "(nn.Linear(64, k).to(h.device)(h)), so every call builds a new random layer that is not in "
         "model.parameters(): the mixture weights are never learned.",
     cause_pattern=r"(inside|in) (the )?forward|forward\(\).{0,60}(creat|construct|new|instantiat|build)"
                   r"|(creat|construct|instantiat|defin|built|build)\w*.{0,60}(layer|linear|module).{0,60}(forward"
                   r"|each call|every call|per call)|new (random |untrained )?(layer|weights?).{0,40}(each|every) "
                   r"(call|step|forward|batch)|__init__")(y_ik_mdn_mixing_layer_in_forward)
fix("y_ik_mdn_mixing_layer_in_forward", fixed_of(y_ik_mdn_mixing_layer_in_forward),
    lambda m, kw: mean_over(m, kw["val_loader"], lambda mm, b: (
        mdn_nll(mm, (b[0].to(model_device(mm)), b[1].to(model_device(mm)))).item() * len(b[0]), len(b[0]))),
    "val NLL", higher=False)

