"""Mechanics: schedulers, custom autograd, dropout, initialisation and loss reduction configured by hand."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_x.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    seed,
    teacher_classes,
)

# --- 1. linear warm-up lambda that never stops growing ---------------------------------------------------------------


def _char_names(n, s, length=10):
    """Character ids of names (1..26); the language (5 classes) is set by which of its two suffix letters ends the
    name (letters 1..10, two per language), 10 % of the names carry another language's suffix (loan names)."""
    g = gen(s)
    x = torch.randint(11, 27, (n, length), generator=g)
    y = torch.randint(0, 5, (n,), generator=g)
    x[:, -1] = 1 + 2 * y + torch.randint(0, 2, (n,), generator=g)
    noisy = torch.rand(n, generator=g) < 0.1
    y[noisy] = torch.randint(0, 5, (int(noisy.sum()),), generator=g)
    return x, y


class CharLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(27, 16)
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.out = nn.Linear(32, 5)

    def forward(self, x):
        _, (h, _) = self.lstm(self.emb(x))
        return self.out(h[-1])


def warmup(fixed, warmup_steps=5):
    if fixed:
        return lambda step: min(1.0, (step + 1) / warmup_steps)
    return lambda step: (step + 1) / warmup_steps


@case("mx_warmup_lambda_never_caps", "mechanics",
      bug="The LambdaLR warm-up factor is (step + 1) / warmup_steps with no min(1.0, ...), so after the 5 warm-up "
          "steps the learning rate keeps growing linearly (60x the base rate by step 300) instead of holding, and "
          "SGD with momentum diverges.",
      cause_pattern=r"warm[- ]?up.{0,200}(never (stops|caps|ends|holds)|keeps? (growing|increasing|rising)|no "
                    r"(cap|min|clamp)|min\(1|unbounded|beyond|past|exceeds?)|min\(1(\.0)?, ?\(?step|lr_lambda.{0,120}"
                    r"(grows?|increas|exceed|above 1|> ?1)|(learning rate|lr) (keeps|continues) (growing|increasing|"
                    r"rising)|factor (above|over|greater than|exceeds?) 1")
def mx_warmup(fixed=False):
    seed(0)
    x, y = _char_names(2000, 41)
    model = CharLSTM()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    return dict(model=model, optimizer=opt,
                scheduler=torch.optim.lr_scheduler.LambdaLR(opt, warmup(fixed)),
                train_loader=loader(TensorDataset(x[:1700], y[:1700]), 32),
                val_loader=loader(TensorDataset(x[1700:], y[1700:]), 150, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def val_nll(model, kw):
    return mean_over(model, kw["val_loader"],
                     lambda m, b: (F.cross_entropy(m(b[0]), b[1].to(b[0].device), reduction="sum").item(), len(b[1])))


fix("mx_warmup_lambda_never_caps", fixed_of(mx_warmup), val_nll, "val cross-entropy", steps=300, higher=False)

# --- 2. custom autograd Function whose backward forgets grad_output ------------------------------------------------------


class Softsign(torch.autograd.Function):
    """x / (1 + |x|), written as a Function to save memory (the user's comment)."""

    @staticmethod
    def forward(ctx, x, fixed):
        ctx.save_for_backward(x)
        ctx.fixed = fixed
        return x / (1 + x.abs())

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        local = 1.0 / (1 + x.abs()) ** 2
        if ctx.fixed:
            return grad_output * local, None
        return local, None                         # the derivative, not multiplied by the incoming gradient


class SoftsignMLP(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.l1, self.l2, self.l3 = nn.Linear(20, 64), nn.Linear(64, 64), nn.Linear(64, 6)

    def forward(self, x):
        h = Softsign.apply(self.l1(x), self.fixed)
        h = Softsign.apply(self.l2(h), self.fixed)
        return self.l3(h)


@case("mx_custom_function_backward_ignores_grad_output", "mechanics",
      bug="The custom torch.autograd.Function for softsign returns only the local derivative 1 / (1 + |x|)^2 from "
          "backward() without multiplying it by grad_output, so the layers below it receive a gradient that does not "
          "depend on the loss (chain rule broken) and are pushed in a fixed direction.",
      cause_pattern=r"grad_output|chain rule|(custom|autograd)\.?( |\.)?function.{0,200}(backward|gradient)|"
                    r"backward\(\).{0,160}(wrong|incorrect|does not|ignores?|independent|not multipl)|gradcheck")
def mx_function(fixed=False):
    seed(0)
    x, y = teacher_classes(2400, 20, 6, 42)
    model = SoftsignMLP(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("mx_custom_function_backward_ignores_grad_output", fixed_of(mx_function),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# --- 3. nn.Dropout given the TensorFlow keep_prob -----------------------------------------------------------------------

KEEP_PROB = 0.9


class PortedFromTF(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        p = 1 - KEEP_PROB if fixed else KEEP_PROB   # tf.nn.dropout(x, keep_prob=0.9)
        self.net = nn.Sequential(nn.Linear(30, 128), nn.ReLU(), nn.Dropout(p), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Dropout(p), nn.Linear(128, 64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


@case("mx_dropout_given_tf_keep_prob", "mechanics",
      bug="The model ported from TensorFlow passes keep_prob=0.9 to nn.Dropout, whose argument p is the probability "
          "of dropping: 90 % of the activations are zeroed in each of the three dropout layers during training.",
      cause_pattern=r"keep_prob|dropout.{0,160}(0\.9|90 ?%|drop(ping)? probability|too (high|large)|most of the|"
                    r"probability of (an element to be )?(zero|drop))|p ?= ?0\.9")
def mx_dropout(fixed=False):
    seed(0)
    x, y = teacher_classes(2600, 30, 10, 43)
    model = PortedFromTF(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2200], y[:2200]), 32),
                val_loader=loader(TensorDataset(x[2200:], y[2200:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("mx_dropout_given_tf_keep_prob", fixed_of(mx_dropout), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=300)

# --- 4. custom dense layer initialised to one constant -------------------------------------------------------------------


class Dense(nn.Module):
    """A hand-written dense layer (the user's own, to control initialisation)."""

    def __init__(self, n_in, n_out, fixed):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.empty(n_out))
        if fixed:
            nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)
        else:
            nn.init.constant_(self.weight, 0.01)    # "small weights so training starts stable"
        nn.init.zeros_(self.bias)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


@case("mx_custom_dense_constant_init", "mechanics",
      bug="The hand-written Dense layers initialise every weight to the same constant (nn.init.constant_(w, 0.01)) "
          "and the biases to zero, so all hidden units of a layer compute the same function and receive the same "
          "gradient: the symmetry is never broken and each layer acts like a single unit.",
      cause_pattern=r"symmetr|constant_?\(|(same|identical|constant) (value|weights?|init\w*).{0,120}(units?|"
                    r"neurons?|rows?)|(units?|neurons?|rows?).{0,80}(identical|the same (function|gradient|output))")
def mx_constant_init(fixed=False):
    seed(0)
    x, y = teacher_classes(2400, 16, 8, 44)
    model = nn.Sequential(Dense(16, 64, fixed), nn.Tanh(), Dense(64, 64, fixed), nn.Tanh(), Dense(64, 8, fixed))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("mx_custom_dense_constant_init", fixed_of(mx_constant_init), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=300)

# --- 5. token-level loss summed (not averaged) under an SGD learning rate tuned for the mean -----------------------------


def _lang_tokens(n, s, length=16):
    """Code-switched sentences: each token id (0..59) belongs to one of 3 languages; tag every token."""
    g = gen(s)
    x = torch.randint(0, 60, (n, length), generator=g)
    return x, x % 3


class TokenLangTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(60, 32)
        self.out = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.out(self.emb(x))


def token_loss(fixed):
    criterion = nn.CrossEntropyLoss(reduction="mean" if fixed else "sum")

    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)
        return criterion(logits.reshape(-1, 3), y.reshape(-1))
    return loss_fn


@case("mx_token_loss_summed_with_sgd_lr_for_mean", "mechanics",
      bug="The token-level CrossEntropyLoss uses reduction='sum' over the 32 x 16 tokens of a batch while the SGD "
          "learning rate (0.5) was tuned for the mean, so every step is 512 times too large and the weights blow up.",
      cause_pattern=r"reduction\s*=?\s*['\"]?sum|(summed|sum) (over|of) (the )?(tokens|batch|elements)|"
                    r"(not|instead of) (averaged|the mean)|(loss|gradient) scales? with (the )?(batch|number of tokens)")
def mx_sum(fixed=False):
    seed(0)
    x, y = _lang_tokens(1600, 45)
    model = TokenLangTagger()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                train_loader=loader(TensorDataset(x[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=token_loss(fixed), max_steps=200)


fix("mx_token_loss_summed_with_sgd_lr_for_mean", fixed_of(mx_sum), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val token accuracy", steps=200)
