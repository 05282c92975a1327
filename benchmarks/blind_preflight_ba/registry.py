"""Set ba's case registry: set a's Case / CaseTable and data helpers, its own case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), and the synthetic offline-RL,
imitation and multimodal data the cases share."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ba")
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


def mlp(d_in, d_out, hidden=64, depth=2):
    layers, d = [], d_in
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), nn.ReLU()]
        d = hidden
    return nn.Sequential(*layers, nn.Linear(d, d_out))


# ---------------------------------------------------------------- logged transitions for fitted-Q evaluation
Q_DIM, Q_ACTIONS, Q_GAMMA = 6, 4, 0.8


def q_world(s: int = 0):
    """Reward r(s, a) = (s @ W)[a]; a transition is terminal when s[0] > 0.3 (a function of the state); next states are
    fresh draws. The optimal Q is then Q*(s, a) = r(s, a) + gamma * (1 - done(s)) * c with c = E[max_a Q*(s', a)]."""
    g = gen(s)
    w = torch.randn(Q_DIM, Q_ACTIONS, generator=g)
    probe = torch.randn(50000, Q_DIM, generator=g)
    r = probe @ w
    d = (probe[:, 0] > 0.3).float()
    c = 0.0
    for _ in range(200):  # fixed point of c = E[max_a r + gamma (1 - d) c]
        c = float((r + Q_GAMMA * (1 - d[:, None]) * c).max(1).values.mean())
    return w, c


def q_true(states, w, c):
    d = (states[:, 0] > 0.3).float()
    return states @ w.to(states.device) + Q_GAMMA * (1 - d[:, None]) * c


def q_transitions(n: int, s: int = 0, timeouts: float = 0.0):
    """(state, action, reward, next_state, terminal, timeout) rows logged by a uniform behaviour policy."""
    w, _ = q_world(0)
    g = gen(100 + s)
    x = torch.randn(n, Q_DIM, generator=g)
    a = torch.randint(0, Q_ACTIONS, (n,), generator=g)
    r = (x @ w).gather(1, a[:, None]).squeeze(1) + 0.1 * torch.randn(n, generator=g)
    x2 = torch.randn(n, Q_DIM, generator=g)
    term = (x[:, 0] > 0.3).float()
    tout = ((torch.rand(n, generator=g) < timeouts) & (term == 0)).float()
    return x, a, r, x2, term, tout


def q_val_loader():
    g = gen(999)
    x = torch.randn(512, Q_DIM, generator=g)
    w, c = q_world(0)
    return loader(TensorDataset(x, q_true(x, w, c)), batch_size=128, shuffle=False)


def q_rmse(model, kw):
    return rmse_of(lambda m, b: (m(b[0]), b[1]))(model, kw)


# ---------------------------------------------------------------- trajectories for return-to-go regression
RTG_GAMMA = 0.9


def rollout_world(n_episodes: int, length: int, s: int = 0):
    """Deterministic linear dynamics o' = A o, reward r = w . o: the discounted return-to-go is a smooth function of
    (o_t, t). Returns obs (E, T, 4), time feature (E, T, 1), rewards (E, T)."""
    g = gen(7)
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g))
    a_mat, w = 0.95 * q, torch.randn(4, generator=g)
    g = gen(200 + s)
    o = torch.randn(n_episodes, 4, generator=g)
    obs = []
    for _ in range(length):
        obs.append(o)
        o = o @ a_mat.T
    obs = torch.stack(obs, 1)
    rewards = obs @ w
    t = (torch.arange(length).float() / length).expand(n_episodes, length)[..., None]
    return obs, t, rewards


def rtg(rewards: torch.Tensor, gamma: float = RTG_GAMMA) -> torch.Tensor:
    """Discounted return-to-go along the last (time) axis."""
    out = torch.zeros_like(rewards)
    run = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        run = rewards[..., t] + gamma * run
        out[..., t] = run
    return out


def rtg_val_loader(length: int = 20):
    obs, t, rewards = rollout_world(60, length, s=99)
    x = torch.cat([obs, t], -1).reshape(-1, 5)
    return loader(TensorDataset(x, rtg(rewards).reshape(-1)), batch_size=200, shuffle=False)


def value_rmse(model, kw):
    return rmse_of(lambda m, b: (m(b[0]).squeeze(-1), b[1]))(model, kw)


# ---------------------------------------------------------------- paired image / caption data for contrastive models
IMG_DIM, VOCAB, CAP_LEN = 32, 24, 6


def pairs(n: int, s: int = 0):
    """A shared latent z drives an 'image' feature vector and a caption of token ids (argmax of random projections)."""
    g = gen(11)
    a_img = torch.randn(8, IMG_DIM, generator=g)
    a_txt = torch.randn(CAP_LEN, 8, VOCAB, generator=g)
    g = gen(300 + s)
    z = torch.randn(n, 8, generator=g)
    img = torch.tanh(z @ a_img) + 0.1 * torch.randn(n, IMG_DIM, generator=g)
    cap = torch.einsum("nd,kdv->nkv", z, a_txt).argmax(-1)
    cls = (z[:, 0] > 0).long() + 2 * (z[:, 1] > 0).long()
    return img, cap, cls


class TinyClip(nn.Module):
    def __init__(self, dim: int = 32, scale: float = math.log(1 / 0.07)):
        super().__init__()
        self.image = mlp(IMG_DIM, dim)
        self.embed = nn.EmbeddingBag(VOCAB, 64, mode="mean")
        self.text = mlp(64, dim, depth=1)
        self.logit_scale = nn.Parameter(torch.tensor(scale))

    def encode_image(self, img):
        return nn.functional.normalize(self.image(img), dim=-1)

    def encode_text(self, cap):
        return nn.functional.normalize(self.text(self.embed(cap)), dim=-1)

    def forward(self, img, cap):
        i, t = self.encode_image(img), self.encode_text(cap)
        return self.logit_scale.exp().clamp(max=100) * i @ t.T


def clip_loss(model, batch):
    img, cap = batch[0], batch[1]
    logits = model(img, cap)
    labels = torch.arange(len(img), device=logits.device)
    return (nn.functional.cross_entropy(logits, labels) + nn.functional.cross_entropy(logits.T, labels)) / 2


def clip_val_loader():
    img, cap, cls = pairs(512, s=99)
    return loader(TensorDataset(img, cap, cls), batch_size=128, shuffle=False)


def retrieval_acc(model, kw):
    """Image -> caption top-1 within each validation batch of 128 pairs."""
    def fn(m, b):
        i, t = m.encode_image(b[0]), m.encode_text(b[1])
        hit = ((i @ t.T).argmax(1) == torch.arange(len(i), device=i.device)).sum().item()
        return hit, len(i)
    return mean_over(model, kw["val_loader"], fn)


# ---------------------------------------------------------------- logged discrete decisions (bandit-style)
BC_DIM, BC_ACTIONS = 8, 4


def logged_decisions(n: int, s: int = 0):
    """States, a uniformly logged action, its reward (r = (s @ W)[a] + noise) and the best action."""
    g = gen(21)
    w = torch.randn(BC_DIM, BC_ACTIONS, generator=g)
    g = gen(400 + s)
    x = torch.randn(n, BC_DIM, generator=g)
    a = torch.randint(0, BC_ACTIONS, (n,), generator=g)
    full = x @ w
    r = full.gather(1, a[:, None]).squeeze(1) + 0.1 * torch.randn(n, generator=g)
    return x, a, r, full.argmax(1)


def decisions_val_loader():
    x, _, _, best = logged_decisions(600, s=99)
    return loader(TensorDataset(x, best), batch_size=200, shuffle=False)
