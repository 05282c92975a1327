"""What is trained: heads, thresholds and trunks of probabilistic models that the optimizer never moves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bi.cases_shapes import K
from benchmarks.blind_preflight_bi.registry import (
    TAUS, adam, case, coral_ranks, fix, fixed_of, gaussian_nll_metric, hetero, loader, mlp, ordinal, pinball,
    pinball_metric, rank_mae_metric, seed, tds,
)


class TwoNets(nn.Module):
    """A mean network and a separate softplus-scale network."""

    def __init__(self, d: int):
        super().__init__()
        self.mean_net = mlp(d, 1)
        self.scale_net = mlp(d, 1)

    def forward(self, x):
        return torch.cat([self.mean_net(x), F.softplus(self.scale_net(x)) + 1e-3], 1)


def gnll_var(m, batch):
    out = m(batch[0])
    return F.gaussian_nll_loss(out[:, 0], batch[1], out[:, 1] ** 2)


def mean_std(m, x):
    out = m(x)
    return out[:, 0], out[:, 1]


@case("scale_net_not_in_optimizer", "what_is_trained",
      bug="The optimizer is built over model.mean_net.parameters() only, so the separate scale network that "
          "predicts the Gaussian standard deviation keeps its random initial weights.",
      cause_pattern=r"(scale|std|variance|sigma|uncertainty).{0,40}(net|head|branch|network).{0,150}(not|never|"
                    r"missing|left out|absent).{0,40}(optimi|updated|trained)|optimi\w*.{0,100}(only|mean_net).{0,"
                    r"100}(scale|std|variance|sigma)")
def scale_net_not_in_optimizer(fixed: bool = False) -> dict:
    seed(0)
    x, y = hetero(s=8)
    model = TwoNets(x.shape[1])
    optimizer = torch.optim.Adam(model.parameters() if fixed else model.mean_net.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=gnll_var)


fix("scale_net_not_in_optimizer", fixed_of(scale_net_not_in_optimizer), gaussian_nll_metric(mean_std),
    "val Gaussian NLL", higher=False)


class DetachedMean(nn.Module):
    def __init__(self, d: int, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.trunk = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.mean_head = nn.Linear(16, 1)
        self.logvar_head = nn.Linear(16, 1)

    def forward(self, x):
        h = self.trunk(x)
        mu = self.mean_head(h if self.fixed else h.detach())
        return torch.cat([mu, self.logvar_head(h)], 1)


def nll_logvar(m, batch):
    out = m(batch[0])
    mu, logvar = out[:, 0], out[:, 1]
    return (0.5 * (logvar + (batch[1] - mu) ** 2 * torch.exp(-logvar))).mean()


@case("mean_head_on_detached_trunk", "what_is_trained",
      bug="The mean head reads the shared trunk through h.detach(), so the trunk is trained only by the "
          "log-variance head and the predicted mean is a linear read-out of features never fit to it.",
      cause_pattern=r"detach.{0,150}(mean|trunk|shared|feature)|(mean|trunk|shared).{0,150}detach|(trunk|shared "
                    r"(layers|features)).{0,120}(only|solely).{0,60}(variance|log.?var)")
def mean_head_on_detached_trunk(fixed: bool = False) -> dict:
    seed(0)
    x, y = hetero(s=9)
    model = DetachedMean(x.shape[1], fixed)
    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=nll_logvar)


fix("mean_head_on_detached_trunk", fixed_of(mean_head_on_detached_trunk),
    gaussian_nll_metric(lambda m, x: (m(x)[:, 0], (0.5 * m(x)[:, 1]).exp())), "val Gaussian NLL", higher=False)


class CoralBuffer(nn.Module):
    def __init__(self, d: int, fixed: bool, k: int = K):
        super().__init__()
        self.body = mlp(d, 1)
        if fixed:
            self.bias = nn.Parameter(torch.zeros(k - 1))
        else:
            self.register_buffer("bias", torch.zeros(k - 1))

    def forward(self, x):
        return self.body(x) + self.bias


def coral_loss(m, batch):
    xb, yb = batch
    return F.binary_cross_entropy_with_logits(m(xb), (yb[:, None] > torch.arange(K - 1)[None, :]).float())


@case("coral_thresholds_buffer", "what_is_trained",
      bug="The CORAL rank thresholds are registered with register_buffer instead of as an nn.Parameter, so all K-1 "
          "thresholds stay at zero and the ordinal levels cannot be told apart.",
      cause_pattern=r"register_buffer|buffer.{0,100}(threshold|bias|cutpoint)|(threshold|cutpoint|bias)e?s?.{0,150}"
                    r"(not|never) (a )?(learn|train|param|updat)|(threshold|cutpoint)s?.{0,80}(stay|remain|fixed|"
                    r"frozen|constant)")
def coral_thresholds_buffer(fixed: bool = False) -> dict:
    seed(0)
    x, y = ordinal(s=10)
    model = CoralBuffer(x.shape[1], fixed)
    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=coral_loss)


fix("coral_thresholds_buffer", fixed_of(coral_thresholds_buffer), rank_mae_metric(lambda m, x: coral_ranks(m(x))),
    "val rank MAE", higher=False)


class NoGradTrunk(nn.Module):
    def __init__(self, d: int, fixed: bool, taus=TAUS):
        super().__init__()
        self.fixed, self.taus = fixed, tuple(taus)
        self.trunk = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.heads = nn.Linear(16, len(taus))

    def forward(self, x):
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.fixed):
            h = self.trunk(x)
        return self.heads(h)


def quantile_loss(m, batch):
    return pinball(m(batch[0]), batch[1], m.taus)


@case("quantile_trunk_no_grad", "what_is_trained",
      bug="The quantile model runs its shared trunk under torch.set_grad_enabled(False) in forward, so only the "
          "linear quantile heads learn on top of random trunk features.",
      cause_pattern=r"(no_grad|set_grad_enabled|grad(ient)?s? (disabled|off)|inference_mode).{0,150}(trunk|feature|"
                    r"encoder|shared|forward)|(trunk|shared|encoder).{0,150}(no_grad|set_grad_enabled|no gradient|"
                    r"never (train|updat|learn)|random (weights|features))")
def quantile_trunk_no_grad(fixed: bool = False) -> dict:
    seed(0)
    x, y = hetero(s=11)
    model = NoGradTrunk(x.shape[1], fixed)
    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=quantile_loss)


fix("quantile_trunk_no_grad", fixed_of(quantile_trunk_no_grad), pinball_metric(lambda m, x: m(x)), "val pinball",
    higher=False)


class ResizableQuantiles(nn.Module):
    def __init__(self, d: int, taus=(0.5,)):
        super().__init__()
        self.d = d
        self.taus = tuple(taus)
        self.net = mlp(d, len(self.taus))

    def set_quantiles(self, taus):
        """A new set of quantile levels changes the output width: the network is rebuilt."""
        if tuple(taus) != self.taus:
            self.taus = tuple(taus)
            self.net = mlp(self.d, len(self.taus))

    def forward(self, x):
        return self.net(x)


@case("quantile_net_rebuilt_after_optimizer", "what_is_trained",
      bug="set_quantiles rebuilds the quantile network (new layers for the new output width) after the optimizer "
          "was built, so the optimizer holds the discarded layers and the network that runs is never updated.",
      cause_pattern=r"(rebuil|replac|recreat|re-creat|new (network|layers|modules?|mlp)|set_quantiles).{0,150}"
                    r"after.{0,60}optimi|optimi\w*.{0,100}(built|created|constructed) before.{0,120}(rebuil|replac|"
                    r"set_quantiles|new)|(old|stale|discarded|previous) (network|layers|modules|parameters)")
def quantile_net_rebuilt_after_optimizer(fixed: bool = False) -> dict:
    seed(0)
    x, y = hetero(s=12)
    model = ResizableQuantiles(x.shape[1], taus=TAUS if fixed else (0.5,))
    optimizer = adam(model)
    model.set_quantiles(TAUS)
    return dict(model=model, optimizer=optimizer, train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=quantile_loss)


fix("quantile_net_rebuilt_after_optimizer", fixed_of(quantile_net_rebuilt_after_optimizer),
    pinball_metric(lambda m, x: m(x)), "val pinball", higher=False)
