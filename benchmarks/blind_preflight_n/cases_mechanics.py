"""Set n, family mechanics: the optimisation machinery (dropout, schedules, optimizer settings, init) misbehaves."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_n.cases_targets import DictRows
from benchmarks.blind_preflight_n.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    split,
)

# --- 1. Citation graph GCN: functional dropout left on at evaluation -------------------------------------------
# Source: https://e-com-net.com/article/1601294049287897088.htm (why F.dropout() must be passed self.training: its
# training argument defaults to True, so unlike nn.Dropout it keeps dropping in eval mode).

def community_graph(n: int, s: int, groups: int = 4, d: int = 16):
    g = gen(s)
    y = torch.randint(0, groups, (n,), generator=g)
    same = y[:, None] == y[None, :]
    p = torch.where(same, torch.tensor(0.01), torch.tensor(0.002))
    upper = torch.triu((torch.rand(n, n, generator=g) < p).float(), 1)
    adj = upper + upper.T + torch.eye(n)
    deg = adj.sum(1)
    adj_norm = adj / torch.sqrt(deg[:, None] * deg[None, :])
    centers = torch.randn(groups, d, generator=g)
    x = 0.5 * centers[y] + torch.randn(n, d, generator=g)
    return x, y, adj_norm


class DenseGCN(nn.Module):
    """Transductive two-layer GCN over one fixed graph; returns (1, classes, nodes) logits for CrossEntropyLoss."""

    def __init__(self, adj, d=16, hidden=32, classes=4, pass_training=False):
        super().__init__()
        self.register_buffer("adj", adj)
        self.pass_training = pass_training
        self.lin1 = nn.Linear(d, hidden)
        self.lin2 = nn.Linear(hidden, classes)

    def forward(self, x):                        # x: (1, nodes, features)
        h = x[0]
        drop = (lambda t: F.dropout(t, 0.5, training=self.training)) if self.pass_training else \
            (lambda t: F.dropout(t, 0.5))
        h = drop(h)
        h = F.relu(self.adj @ self.lin1(h))
        h = drop(h)
        h = self.adj @ self.lin2(h)
        return h.T[None]


@case("gcn_functional_dropout_in_eval", "mechanics",
      bug="The GCN calls F.dropout(h, 0.5) without training=self.training; the functional form defaults to "
          "training=True, so unlike nn.Dropout it keeps dropping half the features after model.eval() and every "
          "validation prediction is made on a randomly thinned graph.",
      cause_pattern=r"f\.dropout|functional\.dropout|training\s*=\s*self\.training"
                    r"|dropout.{0,100}(eval|evaluation|inference|validation|test)\w*.{0,60}(active|on\b|applied|still"
                    r"|enabled)|(active|still|enabled)\w*.{0,60}dropout.{0,80}(eval|inference|validation)"
                    r"|training\s*=\s*true.{0,60}default|default\w*.{0,40}training\s*=\s*true")
def gcn_functional_dropout_in_eval(fixed: bool = False):
    seed(0)
    x, y, adj = community_graph(800, 17)
    train = torch.zeros(800, dtype=torch.bool)
    train[:400] = True
    y_train = y.masked_fill(~train, -100)
    y_val = y.masked_fill(train, -100)
    model = DenseGCN(adj, pass_training=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4),
                train_loader=loader(TensorDataset(x[None], y_train[None]), 1, shuffle=False),
                val_loader=loader(TensorDataset(x[None], y_val[None]), 1, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("gcn_functional_dropout_in_eval", fixed_of(gcn_functional_dropout_in_eval),
    acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])), "val node accuracy")


# --- 2. Traffic forecasting: an epoch-wise ExponentialLR stepped every batch --------------------------------------
# Source: https://github.com/hazdzz/stgcn/issues/18 ("the position of scheduler.step() is error ... which leads to the
# learning-rate decrease too fast": stepped per mini-batch with gamma=0.95).

def sensor_windows(n_steps: int, s: int, sensors: int = 8, window: int = 12):
    g = gen(s)
    t = torch.arange(n_steps, dtype=torch.float32)
    phase = torch.rand(sensors, generator=g) * 6.28
    speed = 50 + 10 * torch.sin(2 * math.pi * t[:, None] / 48 + phase) + 4 * torch.sin(2 * math.pi * t[:, None] / 7)
    speed = speed + 1.5 * torch.randn(n_steps, sensors, generator=g)
    z = (speed - 50) / 10
    x = torch.stack([z[i:i + window].reshape(-1) for i in range(n_steps - window)])
    y = z[window:]
    return x, y


def build_traffic(fixed: bool = False):
    seed(0)
    x, y = sensor_windows(2200, 18)
    (xt, yt), (xv, yv) = split(x, y, 1800)
    model = nn.Sequential(nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_loader = loader(TensorDataset(xt, yt), 64)
    gamma = 0.95 ** (1 / len(train_loader)) if fixed else 0.95     # 0.95 per epoch
    return dict(model=model, optimizer=optimizer, train_loader=train_loader,
                val_loader=loader(TensorDataset(xv, yv), 200, shuffle=False),
                scheduler=torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=gamma),
                loss_fn=nn.MSELoss(), max_steps=300)


@case("traffic_exponentiallr_per_batch", "mechanics",
      bug="ExponentialLR(gamma=0.95) is meant per epoch but scheduler.step() runs after every batch, so the learning "
          "rate is multiplied by 0.95 at each of the 300 steps (0.95**300 ~ 2e-7): it has all but vanished after "
          "the first 2 epochs and the forecaster stops improving.",
      cause_pattern=r"(exponentiallr|scheduler|gamma)\w*.{0,140}(every|each|per) (batch|step|iteration|optimi[sz]er step)"
                    r"|(every|each|per) (batch|step|iteration).{0,120}(scheduler|exponentiallr|gamma)"
                    r"|gamma\w*.{0,80}(per|each|every) epoch|0\.95\s*\*\*\s*\d+"
                    r"|learning rate (decays|shrinks|collapses|vanishes|drops) (to|towards) (almost |nearly )?(zero|0)")
def traffic_exponentiallr_per_batch(fixed: bool = False):
    return build_traffic(fixed)


fix("traffic_exponentiallr_per_batch", fixed_of(traffic_exponentiallr_per_batch),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


# --- 3. Surface defects: a LambdaLR warm-up returning the learning rate instead of a factor -----------------------
# Source: https://runebook.dev/en/docs/pytorch/generated/torch.optim.lr_scheduler.lambdalr/torch.optim.lr_scheduler.LambdaLR
# (LambdaLR's function must return a multiplicative factor; returning an absolute learning rate is a common mistake).

def defect_patches(n: int, s: int, size: int = 16):
    """Three defect types on a textured surface: scratch (line), pit (dot cluster), stain (smooth blob)."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    img = 0.5 * torch.randn(n, 1, size, size, generator=g)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    for i in range(n):
        cy, cx = torch.randint(4, size - 4, (2,), generator=g).tolist()
        if y[i] == 0:
            img[i, 0, cy, 2:size - 2] += 1.5
        elif y[i] == 1:
            img[i, 0, cy - 1:cy + 2, cx - 1:cx + 2] += 1.5
        else:
            img[i, 0] += 1.0 * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2).float() / 12)
    return img, y


@case("defects_lambdalr_returns_lr", "mechanics",
      bug="The warm-up is LambdaLR(optimizer, lambda step: 1e-3 * min(1.0, (step + 1) / 30)) on an Adam whose lr is "
          "already 1e-3: LambdaLR multiplies the base lr by what the lambda returns, so the learning rate peaks at "
          "1e-6 instead of 1e-3 and the CNN barely moves.",
      cause_pattern=r"lambdalr|lr_lambda|multiplicative factor|multiplier"
                    r"|(factor|scale).{0,80}(not|instead of|rather than) (an? )?(absolute|actual) (learning rate|lr)"
                    r"|(absolute|actual) (learning rate|lr).{0,80}(instead of|not|rather than) (a )?(factor|scale)"
                    r"|(multiplied|multiplies|scaled) (twice|by (the )?(base|initial) (lr|learning rate))")
def defects_lambdalr_returns_lr(fixed: bool = False):
    seed(0)
    img, y = defect_patches(1280, 19)
    (xt, yt), (xv, yv) = split(img, y, 1024)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(32, 3))
    base_lr = 1e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=base_lr)
    if fixed:
        warmup = lambda step: min(1.0, (step + 1) / 30)                 # noqa: E731
    else:
        warmup = lambda step: base_lr * min(1.0, (step + 1) / 30)       # noqa: E731
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, warmup),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("defects_lambdalr_returns_lr", fixed_of(defects_lambdalr_returns_lr),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 4. Tiny T5 translation: Adam with eps=0.1 ---------------------------------------------------------------------
# Source: https://github.com/mlpnlp/mlpnlp-nmt/pull/4 ("the default eps value of the Adam optimizer (0.1) is too large
# compared to Chainer's default 1e-08 ... the training does not work well when using eps=0.1").

def glossary_pairs(n: int, s: int, vocab: int = 40, length: int = 8):
    """Word-by-word 'translation': each source id maps to a fixed target id, and the order is reversed."""
    g = gen(s)
    src = torch.randint(3, vocab, (n, length), generator=g)
    table = torch.randperm(vocab - 3, generator=g) + 3
    tgt = table[src - 3].flip(1)
    return src, tgt


def tiny_t5(vocab: int = 40):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=vocab, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(cfg)


@case("t5_adam_eps_too_large", "mechanics",
      bug="The seq2seq model is trained with torch.optim.Adam(params, lr=3e-3, eps=0.1), a Chainer-era setting: "
          "Adam divides by sqrt(v) + eps and the gradients here are ~1e-3, so eps=0.1 dominates the denominator and "
          "shrinks every step by ~100x; the default eps=1e-8 trains.",
      cause_pattern=r"\beps(ilon)?\b.{0,80}(0\.1\b|1e-1\b|too (large|big|high)|large|dominat)"
                    r"|(0\.1|1e-1)\b.{0,40}\beps(ilon)?\b|adam\w*.{0,80}\beps(ilon)?\b"
                    r"|denominator.{0,80}\beps(ilon)?\b|sqrt\(v\)\s*\+\s*eps")
def t5_adam_eps_too_large(fixed: bool = False):
    seed(0)
    src, tgt = glossary_pairs(1280, 20)
    model = tiny_t5()
    mask = torch.ones_like(src)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, eps=1e-8 if fixed else 0.1)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(DictRows(input_ids=src[:1024], attention_mask=mask[:1024], labels=tgt[:1024]),
                                    32),
                val_loader=loader(DictRows(input_ids=src[1024:], attention_mask=mask[1024:], labels=tgt[1024:]), 128,
                                  shuffle=False),
                loss_fn=None, max_steps=300)


def teacher_forced_accuracy(model, kw):
    def fn(m, b):
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).logits
        return (logits.argmax(-1) == b["labels"]).sum().item(), b["labels"].numel()
    return mean_over(model, kw["val_loader"], fn)


fix("t5_adam_eps_too_large", fixed_of(t5_adam_eps_too_large), teacher_forced_accuracy,
    "val token accuracy (teacher forced)")


# --- 5. Credit scoring MLP: weights initialised to zero ------------------------------------------------------------
# Source: https://github.com/wagonhelm/NaNmnist/issues/2 ("Pitfall: all zero initialization": every neuron computes
# the same output and the same gradient, there is no source of asymmetry).

def credit_rows(n: int, s: int, d: int = 12):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    risk = torch.sign(x[:, 0] * x[:, 1]) + 0.8 * torch.sign(x[:, 2] * x[:, 3]) + 0.3 * torch.randn(n, generator=g)
    return x, (risk > 0).long()


def init_weights(m, zero: bool):
    if isinstance(m, nn.Linear):
        if zero:
            nn.init.zeros_(m.weight)
        else:
            nn.init.xavier_uniform_(m.weight)
        nn.init.zeros_(m.bias)


@case("credit_mlp_zero_init", "mechanics",
      bug="The MLP is initialised with model.apply(init_weights) where init_weights calls nn.init.zeros_ on every "
          "Linear weight: with ReLU every hidden unit outputs 0 and receives a zero gradient, so only the output bias "
          "ever moves and the model predicts the base rate.",
      cause_pattern=r"zeros_|zero[- ]init\w*|initiali[sz]\w* (all )?(the )?(weights )?(to|at|with) (zero|0\b|a constant)"
                    r"|(all|every) (the )?(linear )?weights? (are |is |start (at|as) )?(zero|0\b|identical|the same)"
                    r"|symmetr\w*|constant_\(|dead relu|(every|each) hidden (unit|neuron)s?.{0,60}(zero|same)")
def credit_mlp_zero_init(fixed: bool = False):
    seed(0)
    x, y = credit_rows(3000, 21)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    model.apply(lambda m: init_weights(m, zero=not fixed))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 64),
                val_loader=loader(TensorDataset(xv, yv), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("credit_mlp_zero_init", fixed_of(credit_mlp_zero_init),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")
