"""Set y's case registry: set a's Case / CaseTable and data helpers, its own case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), and the small simulators the
reinforcement-learning, survival and scientific cases share (tabular MDPs, contextual bandits, the C-index)."""

from __future__ import annotations

import math

import numpy as np
import torch

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_y")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


# ---------------------------------------------------------------- tabular MDPs (DQN cases)

class MDP:
    """A small deterministic MDP: ``nxt[s, a]`` next state, ``rew[s, a]`` reward, ``term[s]`` absorbing goal/trap
    states, ``feat[s]`` the observation vector of state s, ``q`` the optimal Q-values by value iteration."""

    def __init__(self, n_states: int, n_actions: int, n_feat: int, gamma: float, s: int, n_terminal: int = 2):
        rng = np.random.default_rng(s)
        self.S, self.A, self.gamma = n_states, n_actions, gamma
        self.nxt = rng.integers(0, n_states, size=(n_states, n_actions))
        self.rew = rng.normal(0.0, 0.3, size=(n_states, n_actions)).astype(np.float32)
        self.term = np.zeros(n_states, dtype=bool)
        goals = rng.choice(n_states, size=n_terminal, replace=False)
        self.term[goals] = True
        # entering a goal pays +2 (the first) or -2 (the others): the done flag decides what comes after
        for k, g in enumerate(goals):
            self.rew[self.nxt == g] += 2.0 if k == 0 else -2.0
        self.feat = rng.normal(0.0, 1.0, size=(n_states, n_feat)).astype(np.float32)
        q = np.zeros((n_states, n_actions), dtype=np.float64)
        for _ in range(500):
            v = q.max(1)
            v[self.term] = 0.0
            q = self.rew + gamma * v[self.nxt]
        self.q = q.astype(np.float32)

    def transitions(self, n: int, s: int):
        """n uniformly drawn (s, a) pairs from non-terminal states: (obs, action, reward, next_obs, done)."""
        rng = np.random.default_rng(s + 1)
        live = np.flatnonzero(~self.term)
        st = rng.choice(live, size=n)
        a = rng.integers(0, self.A, size=n)
        nx = self.nxt[st, a]
        return st, a, self.rew[st, a], nx, self.term[nx].astype(np.float32)

    def val_loader(self):
        live = np.flatnonzero(~self.term)
        data = torch.utils.data.TensorDataset(torch.tensor(self.feat[live]), torch.tensor(self.q[live]))
        return loader(data, batch_size=256, shuffle=False)


def q_rmse(model, kw) -> float:
    """RMSE of the network's Q-values against the optimal ones over every live state (val_loader: obs, Q*)."""
    def fn(m, b):
        obs, q = b
        dev = model_device(m)
        pred = m(obs.to(dev)).float()
        return ((pred - q.to(dev)) ** 2).sum().item(), q.numel()
    return math.sqrt(mean_over(model, kw["val_loader"], fn))


def sync_every(n: int):
    """A step counter for the loss closures (target-network refreshes)."""
    state = {"step": 0}

    def tick() -> bool:
        state["step"] += 1
        return state["step"] % n == 1 or n == 1
    return tick


# ---------------------------------------------------------------- contextual bandits (policy-gradient cases)

def bandit(n: int, d: int, k: int, s: int):
    """Contexts and a hidden arm matrix: the best arm of x is argmax(x @ arms)."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    arms = torch.randn(d, k, generator=g)
    return x, arms


def best_arm_acc(arms: torch.Tensor, fwd=None):
    """Greedy accuracy of the policy on the validation contexts (val_loader yields (x,))."""
    def metric(model, kw):
        def fn(m, b):
            x = b[0].to(model_device(m))
            out = m(x) if fwd is None else fwd(m, x)
            return (out.argmax(-1) == (x @ arms.to(x.device)).argmax(-1)).sum().item(), x.shape[0]
        return mean_over(model, kw["val_loader"], fn)
    return metric


# ---------------------------------------------------------------- survival

def c_index(risk: torch.Tensor, time: torch.Tensor) -> float:
    """Harrell's C on uncensored validation times: higher risk should mean an earlier event."""
    risk, time = risk.reshape(-1).float().cpu(), time.reshape(-1).float().cpu()
    earlier = time[:, None] < time[None, :]
    conc = ((risk[:, None] > risk[None, :]) & earlier).sum().item()
    ties = ((risk[:, None] == risk[None, :]) & earlier).sum().item()
    return (conc + 0.5 * ties) / max(earlier.sum().item(), 1)


def c_index_metric(fwd=None):
    """C-index of model(x) (a risk score) on val_loader batches (x, true_time, ...)."""
    @torch.no_grad()
    def metric(model, kw):
        was = model.training
        model.eval()
        risks, times = [], []
        for b in kw["val_loader"]:
            x = b[0].to(model_device(model))
            risks.append((model(x) if fwd is None else fwd(model, x)).reshape(-1).float().cpu())
            times.append(b[1])
        model.train(was)
        return c_index(torch.cat(risks), torch.cat(times))
    return metric
