"""What is trained: the parameters the optimizer updates are not the ones the user thinks."""

from __future__ import annotations

import collections

import torch
from torch import nn
from torch.utils.data import TensorDataset

from .registry import acc_of, case, first_arg, fix, fixed_of, gen, loader, rmse_of, seed


def _backbone(s):
    torch.manual_seed(s)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 16), nn.Tanh())


def _pretrained_task(n, s, classes, backbone_seed=100):
    """Labels that a linear head on the 'pretrained' backbone's features separates (and a random backbone does not)."""
    g = gen(s)
    x = torch.randn(n, 32, generator=g)
    with torch.no_grad():
        feats = _backbone(backbone_seed)(x)
    w = torch.randn(16, classes, generator=gen(101))
    return x, (feats @ w).argmax(1)


class Finetune(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.backbone = _backbone(7)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


# --- W1: the head is replaced after the optimizer was built on the old head -----------------------------------------

@case("trained_head_replaced_after_optimizer", "what_is_trained",
      bug="the backbone is frozen and the optimizer is built on model.head.parameters(), then model.head is replaced "
          "by a new nn.Linear for the 5 target classes: the optimizer still holds the old head's tensors, so the new "
          "head (the only trainable part) is never updated",
      cause_pattern=r"new (head|layer|module|classifier)[^.]{0,80}(not|never)[^.]{0,40}optimi[sz]er|"
                    r"optimi[sz]er[^.]{0,60}(old|previous|original|replaced|stale) (head|layer|module|tensors|parameters)|"
                    r"(replac\w+|swapp\w+|reassign\w*)[^.]{0,60}after[^.]{0,30}optimi[sz]er|optimi[sz]er[^.]{0,40}before[^.]{0,40}(replac\w+|swapp\w+)|"
                    r"(stale|old|previous|replaced) (head|layer|module)'?s? (parameters|tensors|weights)|"
                    r"(build|create|construct|rebuild|recreate) the optimi[sz]er after")
def trained_head_replaced_after_optimizer(fixed=False):
    seed(0)
    x, y = _pretrained_task(2048, 1, 5)
    xv, yv = _pretrained_task(512, 2, 5)
    model = Finetune(10)
    model.backbone.load_state_dict(_backbone(100).state_dict())    # the "pretrained" weights
    for p in model.backbone.parameters():
        p.requires_grad = False
    if fixed:
        model.head = nn.Linear(16, 5)
        optimizer = torch.optim.Adam(model.head.parameters(), lr=3e-3)
    else:
        optimizer = torch.optim.Adam(model.head.parameters(), lr=3e-3)
        model.head = nn.Linear(16, 5)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False), loss_fn=nn.CrossEntropyLoss(),
                max_steps=300)


fix("trained_head_replaced_after_optimizer", fixed_of(trained_head_replaced_after_optimizer), acc_of(first_arg),
    "val accuracy")


# --- W2: a "module."-prefixed checkpoint loaded with strict=False ----------------------------------------------------

@case("trained_checkpoint_prefix_mismatch_strict_false", "what_is_trained",
      bug="the pretrained backbone checkpoint was saved from a DataParallel wrapper, so every key starts with "
          "'module.'; load_state_dict(..., strict=False) matches none of them and loads nothing, and the frozen "
          "backbone stays at its random initialisation while only the head trains on random features",
      cause_pattern=r"module\.|strict ?= ?False|missing[_ ]keys|unexpected[_ ]keys|(prefix|key names?)[^.]{0,40}(mismatch|do not match|don't match|differ)|"
                    r"(nothing|no (weights|parameters|keys)) (was |were )?(loaded|matched)|"
                    r"(still|remain\w*|left) at (its|their) (random )?init\w*|not (actually )?loaded")
def trained_checkpoint_prefix_mismatch_strict_false(fixed=False):
    seed(0)
    x, y = _pretrained_task(2048, 3, 4)
    xv, yv = _pretrained_task(512, 4, 4)
    model = Finetune(4)
    ckpt = collections.OrderedDict(("module." + k, v) for k, v in _backbone(100).state_dict().items())
    if fixed:
        ckpt = {k.removeprefix("module."): v for k, v in ckpt.items()}
    model.backbone.load_state_dict(ckpt, strict=False)
    for p in model.backbone.parameters():
        p.requires_grad = False
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("trained_checkpoint_prefix_mismatch_strict_false", fixed_of(trained_checkpoint_prefix_mismatch_strict_false),
    acc_of(first_arg), "val accuracy")


# --- W3: factor tables kept as plain tensors, not nn.Parameter -------------------------------------------------------

USERS, ITEMS, K = 200, 150, 8


def _ratings(n, s):
    g = gen(s)
    pu = torch.randn(USERS, K, generator=gen(51))
    qi = torch.randn(ITEMS, K, generator=gen(52))
    u = torch.randint(0, USERS, (n,), generator=g)
    i = torch.randint(0, ITEMS, (n,), generator=g)
    r = 3.0 + (pu[u] * qi[i]).sum(1) / 2 + 0.2 * torch.randn(n, generator=g)
    return torch.stack([u, i], 1), r


class MatrixFactorization(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        wrap = nn.Parameter if fixed else (lambda t: t.requires_grad_())
        self.user_f = wrap(0.1 * torch.randn(USERS, K))
        self.item_f = wrap(0.1 * torch.randn(ITEMS, K))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, ui):
        u, i = ui[:, 0], ui[:, 1]
        uf, itf = self.user_f.to(ui.device), self.item_f.to(ui.device)
        return (uf[u] * itf[i]).sum(1) + self.bias


@case("trained_factor_tables_not_parameters", "what_is_trained",
      bug="the user and item factor tables are plain tensors with requires_grad=True assigned as module attributes "
          "instead of nn.Parameter: they are not registered, so model.parameters() (and the optimizer) holds only "
          "the global bias and the factors never move",
      cause_pattern=r"nn\.Parameter|register_parameter|(not|never) registered|plain tensors?|"
                    r"(not|never) (in|returned by|part of) (model\.)?parameters\(\)|requires_grad=True[^.]{0,60}(attribute|tensor)")
def trained_factor_tables_not_parameters(fixed=False):
    seed(0)
    x, y = _ratings(8000, 5)
    xv, yv = _ratings(2000, 6)
    model = MatrixFactorization(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(x, y), 128), val_loader=loader(TensorDataset(xv, yv), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=400)


fix("trained_factor_tables_not_parameters", fixed_of(trained_factor_tables_not_parameters),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False, steps=400)


# --- W4: the embedding is run under torch.no_grad() in forward -------------------------------------------------------

VOCAB = 300


def _reviews(n, s):
    g = gen(s)
    x = torch.randint(0, VOCAB, (n, 24), generator=g)
    polarity = torch.randn(VOCAB, generator=gen(61))
    polarity[torch.randperm(VOCAB, generator=gen(62))[:240]] = 0.0         # 60 opinion words
    return x, (polarity[x].sum(1) > 0).long()


class ReviewClassifier(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        if self.fixed:
            h = self.emb(x)
        else:
            with torch.no_grad():          # copied from a feature-extraction snippet
                h = self.emb(x)
        return self.head(h.mean(1))


@case("trained_embedding_under_no_grad", "what_is_trained",
      bug="forward computes the (randomly initialised, meant to be trained) word embeddings inside torch.no_grad(), "
          "a line copied from a frozen-feature-extraction snippet: no graph is recorded through them, the embedding "
          "gets no gradient and only the linear head learns on fixed random features",
      cause_pattern=r"no_grad|inference_mode|(no|without a) (autograd )?graph|"
                    r"(embedding|emb)\w*[^.]{0,60}(no|zero|none|never (gets?|receives?)) grad|"
                    r"(gradient|grad)s? (are|is) (None|never computed|not computed)[^.]{0,40}(embedding|emb)")
def trained_embedding_under_no_grad(fixed=False):
    seed(0)
    x, y = _reviews(3000, 7)
    xv, yv = _reviews(800, 8)
    model = ReviewClassifier(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("trained_embedding_under_no_grad", fixed_of(trained_embedding_under_no_grad), acc_of(first_arg), "val accuracy")


# --- W5: the hidden state detached at every step of a hand-written RNN loop ------------------------------------------

def _keypad(n, s):
    """Sequences of 16 digit-ish scalars; the class is set by the first three steps."""
    g = gen(s)
    x = torch.randn(n, 16, 3, generator=g)
    y = ((x[:, 0, 0] + x[:, 1, 1] + x[:, 2, 2]) > 0).long() + 2 * (x[:, 0, 1] > 0).long()
    return x, y


class LoopRNN(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.cell = nn.GRUCell(3, 48)
        self.head = nn.Linear(48, 4)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], 48)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h if self.fixed else h.detach())   # "truncated BPTT" copied into the step loop
        return self.head(h)


@case("trained_hidden_state_detached_every_step", "what_is_trained",
      bug="the hand-written GRUCell loop feeds h.detach() back at every time step (a truncated-BPTT line put inside "
          "the step loop): the gradient reaches the cell through the last step only, so nothing learns to keep the "
          "early steps that decide the class",
      cause_pattern=r"detach|truncat\w*[- ]?(bptt|backprop\w*)|(backprop\w*|gradient)s? (through|across) time|"
                    r"(gradient|grad)s? (only|never) (flow|reach|pass)\w*[^.]{0,40}(last|one|single) (time )?step|"
                    r"(cut|break|stop)s? the (graph|gradient)[^.]{0,40}(every|each) (time )?step")
def trained_hidden_state_detached_every_step(fixed=False):
    seed(0)
    x, y = _keypad(2048, 9)
    xv, yv = _keypad(512, 10)
    model = LoopRNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("trained_hidden_state_detached_every_step", fixed_of(trained_hidden_state_detached_every_step), acc_of(first_arg),
    "val accuracy")
