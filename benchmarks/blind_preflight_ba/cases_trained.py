"""What is trained: the parameters that should learn are not the ones the optimizer updates."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ba.registry import (
    BC_ACTIONS,
    BC_DIM,
    Q_ACTIONS,
    Q_DIM,
    Q_GAMMA,
    case,
    decisions_val_loader,
    gen,
    loader,
    logged_decisions,
    mean_over,
    mlp,
    q_transitions,
    q_val_loader,
    seed,
)


class DQNAgent(nn.Module):
    def __init__(self):
        super().__init__()
        self.online = mlp(Q_DIM, Q_ACTIONS)
        self.target = copy.deepcopy(self.online).requires_grad_(False)

    def forward(self, s):
        return self.online(s)


@case("fqe_optimizer_holds_target_net", "what_is_trained",
      "the optimizer is built over agent.target.parameters() (the frozen target network) instead of the online "
      "Q-network, so the online network never changes and the target sync just copies it back",
      r"target(_net| net|work)?\.parameters|optimi[sz]er.{0,60}target (net|network|q)|target (net|network).{"
      r"0,60}optimi[sz]er|online (q.?)?(net|network|model).{0,40}(never|not|isn.t) (updated|trained|optimi[s"
      r"z]ed|in the optimi)|wrong (module|network)'?s? param")
def fqe_optimizer_holds_target_net(fixed: bool = False):
    seed(0)
    x, a, r, x2, term, _ = q_transitions(3000)
    agent = DQNAgent()
    calls = [0]

    def td_loss(model, batch):
        s, act, rew, s2, done = batch
        calls[0] += 1
        if calls[0] % 20 == 0:
            model.target.load_state_dict(model.online.state_dict())
        q = model(s).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            y = rew + Q_GAMMA * (1 - done) * model.target(s2).max(1).values
        return nn.functional.mse_loss(q, y)

    params = agent.online.parameters() if fixed else agent.target.parameters()
    return dict(model=agent, optimizer=torch.optim.Adam(params, lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r, x2, term), batch_size=64), loss_fn=td_loss,
                val_loader=q_val_loader(), max_steps=300)


def product_listings(n, s):
    """A photo feature vector and a tokenised title; the category needs both (photo says shape, title says material)."""
    g = gen(900 + s)
    shape = torch.randint(0, 3, (n,), generator=g)
    material = torch.randint(0, 3, (n,), generator=g)
    protos = torch.randn(3, 24, generator=gen(51))
    photo = protos[shape] + 0.5 * torch.randn(n, 24, generator=g)
    title = torch.randint(3, 40, (n, 5), generator=g)
    title[:, 0] = material  # material word ids 0..2 somewhere in the title
    title = title[:, torch.randperm(5, generator=g)]
    return photo, title, 3 * shape + material


class ListingClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 32))  # "pretrained" photo encoder
        self.text_encoder = nn.EmbeddingBag(40, 4, mode="sum")  # new, random
        self.head = nn.Sequential(nn.Linear(36, 64), nn.ReLU(), nn.Linear(64, 9))

    def forward(self, batch):
        photo, title = batch
        return self.head(torch.cat([self.backbone(photo), self.text_encoder(title)], 1))


@case("fusion_freeze_filter_freezes_text_encoder", "what_is_trained",
      "the 'freeze everything but the head' loop (requires_grad=False for every name without 'head') also freezes the "
      "newly initialised text encoder, so the title branch stays random",
      r"text.?encoder|(new|newly|randomly).{0,30}(initiali[sz]ed|random|added).{0,60}(frozen|freez|requires_"
      r"grad)|freez\w*.{0,40}(new|random|untrained) (layer|module|encoder|branch)|'head' not in|name filter|"
      r"(title|text) branch")
def fusion_freeze_filter_freezes_text_encoder(fixed: bool = False):
    seed(0)
    photo, title, y = product_listings(2000, 0)
    pv, tv, yv = product_listings(500, 99)
    model = ListingClassifier()
    for name, p in model.named_parameters():
        if "head" not in name and not (fixed and name.startswith("text_encoder")):
            p.requires_grad = False

    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch[:2]), batch[2])

    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3),
                train_loader=loader(TensorDataset(photo, title, y), batch_size=64), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(pv, tv, yv), batch_size=250, shuffle=False), max_steps=300)


@case("bc_head_replaced_after_optimizer", "what_is_trained",
      "the action head is swapped for a new nn.Linear with the right number of actions after the optimizer was "
      "built, so the optimizer keeps the old head's parameters and the new head is never updated",
      r"after (the )?optimi[sz]er (was |is )?(built|created|constructed)|optimi[sz]er (was |is )?(built|crea"
      r"ted|constructed) before|stale (param|optimi)|(new|replaced|swapped) (action )?head.{0,60}(not|never)"
      r"|not in (the )?optimi[sz]er|re-?(create|build) the optimi[sz]er|old head")
def bc_head_replaced_after_optimizer(fixed: bool = False):
    seed(0)
    x, _, _, best = logged_decisions(3000)  # expert demonstrations: the best action is logged
    policy = nn.Sequential(nn.Linear(BC_DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    for p in policy[:4].parameters():  # keep the pretrained encoder, probe a new action head
        p.requires_grad = False
    opt = torch.optim.Adam(policy[4].parameters(), lr=1e-3)
    policy[4] = nn.Linear(64, BC_ACTIONS)  # the env has 4 actions, not 2
    if fixed:
        opt = torch.optim.Adam(policy[4].parameters(), lr=1e-3)
    return dict(model=policy, optimizer=opt, train_loader=loader(TensorDataset(x, best), batch_size=64),
                loss_fn=nn.CrossEntropyLoss(), val_loader=decisions_val_loader(), max_steps=300)


class LateFusion(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.photo = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 32))
        self.words = nn.EmbeddingBag(40, 32, mode="sum")
        self.text_proj = nn.Linear(32, 32) if fixed else None
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 9))

    def forward(self, batch):
        photo, title = batch
        t = self.words(title)
        if not self.fixed:  # project the text to the photo width (built where the width is known)
            self.text_proj = nn.Linear(t.shape[1], 32).to(t.device)
        return self.head(torch.cat([self.photo(photo), self.text_proj(t)], 1))


@case("fusion_projection_built_in_forward", "what_is_trained",
      "the text projection nn.Linear is created inside forward, so a fresh randomly initialised layer is used at every "
      "call: it is never in the optimizer and the head sees a different random text projection each step",
      r"(inside|in) (the )?forward|creat\w* (in|inside|during) forward|(new|fresh) (layer|module|linear)|"
      r"__init__|re.?initiali[sz]|not (registered|in the optimi[sz]er)|never (trained|updated)|not (trained|updated)")
def fusion_projection_built_in_forward(fixed: bool = False):
    seed(0)
    photo, title, y = product_listings(2000, 0)
    pv, tv, yv = product_listings(500, 99)
    model = LateFusion(fixed)

    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch[:2]), batch[2])

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(photo, title, y), batch_size=64), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(pv, tv, yv), batch_size=250, shuffle=False), max_steps=300)


def arm_demos(n, s):
    g = gen(950 + s)
    w = torch.randn(12, 3, generator=gen(61)) / 12 ** 0.5
    x = torch.randn(n, 12, generator=g)
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(n, 3, generator=g)


class GaussianPolicy(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.mu = mlp(12, 3)
        if fixed:
            self.log_std = nn.Parameter(torch.zeros(3))
        else:
            self.log_std = torch.zeros(3, requires_grad=True)

    def forward(self, x):
        return self.mu(x)

    def dist(self, x):
        mu = self.mu(x)
        return torch.distributions.Normal(mu, self.log_std.to(mu.device).exp().expand_as(mu))


@case("bc_log_std_not_a_parameter", "what_is_trained",
      "the Gaussian policy's log_std is a plain tensor with requires_grad=True, not an nn.Parameter, so it is not in "
      "model.parameters(), the optimizer never updates it and the action NLL is stuck with std = 1",
      r"nn\.Parameter|log_std|not (a|an) (nn\.)?parameter|register|not in (model\.)?parameters|"
      r"not in the optimi[sz]er|never (updated|trained)|not (updated|trained)|std")
def bc_log_std_not_a_parameter(fixed: bool = False):
    seed(0)
    x, a = arm_demos(2000, 0)
    xv, av = arm_demos(500, 99)
    policy = GaussianPolicy(fixed)

    def nll(m, batch):
        return -m.dist(batch[0]).log_prob(batch[1]).sum(-1).mean()

    return dict(model=policy, optimizer=torch.optim.Adam(policy.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a), batch_size=64), loss_fn=nll,
                val_loader=loader(TensorDataset(xv, av), batch_size=250, shuffle=False), max_steps=300)


def gaussian_nll(model, kw):
    def fn(m, b):
        return -m.dist(b[0]).log_prob(b[1]).sum().item(), len(b[0])
    return mean_over(model, kw["val_loader"], fn)
