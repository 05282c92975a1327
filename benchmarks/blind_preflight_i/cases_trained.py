"""Set i, what_is_trained: which parameters really learn (6 broken cases)."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_i.cases_targets import _bars
from benchmarks.blind_preflight_i.registry import case, fix, gen, loader, seed, val_acc


def _nonlinear_table(n: int, s: int, d: int = 12, teacher_seed: int = 600):
    """Binary labels from a random 2-layer tanh teacher: needs a hidden layer to learn."""
    g = gen(teacher_seed)
    w1, w2 = torch.randn(d, 16, generator=g), torch.randn(16, generator=g)
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    score = torch.tanh(x @ w1 / d ** 0.5 * 2) @ w2
    return x, (score > score.median()).long()


def _radial_table(n: int, s: int, d: int = 12):
    """Binary labels: is the first four features' squared norm above its median (no linear model can tell)."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    r = (x[:, :4] ** 2).sum(1)
    return x, (r > 3.36).long()


# --------------------------------------------------------------------------------------------------------------------
# 1. ECG beat classifier whose global max pooling is `_, pooled = torch.max(h, dim=2)` (the `_, predicted =
#    torch.max(outputs, 1)` idiom): it keeps the argmax POSITIONS, cast to float, and throws the values away. Indices
#    carry no gradient, so the conv stack never learns, and the head sees where each random filter peaked.
# --------------------------------------------------------------------------------------------------------------------
ECG_T = 128


def _beats(n: int, s: int):
    g = gen(s)
    t = torch.arange(ECG_T).float()
    y = torch.randint(0, 3, (n,), generator=g)
    centre = torch.randint(20, ECG_T - 20, (n,), generator=g).float()
    x = 0.3 * torch.randn(n, ECG_T, generator=g)
    x += 0.5 * torch.sin(2 * math.pi * (t / ECG_T + torch.rand(n, 1, generator=g)))      # baseline wander
    d = t[None, :] - centre[:, None]
    narrow, wide = torch.exp(-(d / 1.5) ** 2), torch.exp(-(d / 6) ** 2)
    biphasic = torch.exp(-((d + 2) / 1.5) ** 2) - torch.exp(-((d - 2) / 1.5) ** 2)
    x += torch.where(y[:, None] == 0, 3 * narrow, torch.where(y[:, None] == 1, 1.5 * wide, 3 * biphasic))
    return x.unsqueeze(1), y


class BeatCNN(nn.Module):
    def __init__(self, keep_values: bool):
        super().__init__()
        self.keep_values = keep_values
        self.conv = nn.Sequential(nn.Conv1d(1, 16, 7, padding=3), nn.ReLU(), nn.Conv1d(16, 16, 5, padding=2), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.conv(x)                              # (B, 16, T)
        if self.keep_values:
            pooled, _ = torch.max(h, dim=2)
        else:
            _, pooled = torch.max(h, dim=2)           # global max pooling
        return self.head(pooled.float())


@case("ecg_cnn_global_max_pool_keeps_argmax_indices", "what_is_trained",
      bug="the global max pooling is written `_, pooled = torch.max(h, dim=2)` (the `_, predicted = "
          "torch.max(outputs, 1)` idiom), which keeps the argmax indices and drops the max values; with .float() "
          "the head runs, but indices carry no gradient, so the conv layers never receive one and stay random, and "
          "the head only sees where each random filter peaked (pooled, _ = torch.max(h, dim=2) was meant)",
      cause_pattern=r"torch\.max|\.max\(|argmax (indices|positions)|indices[^.]*(max|pool)|(max|"
                    r"pool)\w*[^.]*indices|max (values|positions)|(conv\w*|encoder|feature|backbone|earlier|lower|"
                    r"first)[^.]*(no|zero|none|never)[^.]*grad|grad\w*[^.]*(none|zero|never|no)[^.]*(conv|encoder|"
                    r"feature|backbone|earlier|lower|first)|non-?differentiable|(cut|break)s? the graph")
def ecg_cnn_global_max_pool_keeps_argmax_indices(keep_values=False):
    seed(0)
    train = TensorDataset(*_beats(1500, 1))
    val = TensorDataset(*_beats(400, 2))
    model = BeatCNN(keep_values)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _beat_fact():
    h = torch.tensor([[[0.1, 0.9, 0.3]]], requires_grad=True)
    values, indices = torch.max(h, dim=2)
    print(f"  torch.max(h, dim=2) returns (values={values.tolist()}, indices={indices.tolist()}); indices "
          f"requires_grad={indices.requires_grad}")


fix("ecg_cnn_global_max_pool_keeps_argmax_indices",
    partial(ecg_cnn_global_max_pool_keeps_argmax_indices, keep_values=True), val_acc, "val accuracy", _beat_fact)


# --------------------------------------------------------------------------------------------------------------------
# 2. Tabular MLP with forward hooks that keep each ReLU's activations for dead-unit monitoring; the hook returns the
#    detached copy it stored, and a forward hook's return value REPLACES the module's output: the graph is cut at
#    every ReLU, and only the last Linear learns.
# --------------------------------------------------------------------------------------------------------------------
class FraudMLP(nn.Module):
    def __init__(self, d: int = 12):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 2))
        self.activations = {}

    def forward(self, x):
        return self.net(x)


def watch_dead_units(model: FraudMLP, return_stored: bool):
    def keep(name):
        def hook(module, inputs, output):
            model.activations[name] = output.detach()
            if return_stored:
                return model.activations[name]
        return hook
    for name, module in model.named_modules():
        if isinstance(module, nn.ReLU):
            module.register_forward_hook(keep(name))


@case("fraud_mlp_activation_hook_returns_detached_output", "what_is_trained",
      bug="the forward hooks that keep each ReLU's activations for dead-unit monitoring end with `return "
          "activations[name]`, the detached copy they stored: a forward hook's return value replaces the module's "
          "output, so the graph is cut after every ReLU and only the last Linear layer ever gets a gradient (the "
          "hook must return None)",
      cause_pattern=r"hook|detach\w*[^.]*(output|activation|relu|layer)|(output|activation|relu|"
                    r"layer)s?[^.]*detach|(cut|break)s? the graph|(no|zero|none|never)[^.]*grad\w*[^.]*(first|"
                    r"earlier|lower|hidden|other) layers?|(first|earlier|lower|hidden|other) layers?[^.]*(no|zero|"
                    r"none|never)[^.]*grad|only the (last|final|output) (layer|linear)[^.]*(learn|train|grad|"
                    r"updat)")
def fraud_mlp_activation_hook_returns_detached_output(return_stored=True):
    seed(0)
    x, y = _radial_table(2000, 1)
    xv, yv = _radial_table(500, 2)
    model = FraudMLP()
    watch_dead_units(model, return_stored)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.CrossEntropyLoss())


def _hook_fact():
    model = FraudMLP()
    watch_dead_units(model, True)
    F.cross_entropy(model(torch.randn(8, 12)), torch.zeros(8, dtype=torch.long)).backward()
    print("  grad is None: " + ", ".join(f"{n}={p.grad is None}" for n, p in model.named_parameters()))


fix("fraud_mlp_activation_hook_returns_detached_output",
    partial(fraud_mlp_activation_hook_returns_detached_output, return_stored=False), val_acc, "val accuracy",
    _hook_fact)


# --------------------------------------------------------------------------------------------------------------------
# 3. "Freeze the BatchNorm scales" helper written with hasattr(m, 'weight') instead of isinstance(m, BatchNorm2d):
#    every Conv2d and Linear has a .weight too, so all weights are frozen and only the biases train.
# --------------------------------------------------------------------------------------------------------------------
def bn_cnn(classes: int = 4):
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, classes))


def freeze_bn_scale(model: nn.Module, by_type: bool):
    for m in model.modules():
        if (isinstance(m, nn.BatchNorm2d) if by_type else hasattr(m, "weight")) and m.weight is not None:
            m.weight.requires_grad_(False)


@case("bars_cnn_freeze_bn_helper_freezes_every_weight", "what_is_trained",
      bug="the helper meant to freeze the BatchNorm scales tests hasattr(m, 'weight') instead of isinstance(m, "
          "nn.BatchNorm2d): every Conv2d and Linear has a .weight too, so all convolution and classifier weights "
          "are frozen (requires_grad=False) and only the biases train",
      cause_pattern=r"hasattr|isinstance|only (the )?bias(es)?|bias(es)? only|(every|all)[^.]*(conv\w*|linear|"
                    r"classifier|layer)?[^.]*weights?[^.]*(frozen|requires_grad=False|not trainable)|(conv\w*|"
                    r"linear|classifier|head) weights?[^.]*(frozen|requires_grad=False|not trainable)|"
                    r"(batch.?norm|BN)[^.]*freez\w*[^.]*(every|all|other|conv|linear)")
def bars_cnn_freeze_bn_helper_freezes_every_weight(by_type=False):
    seed(0)
    train = TensorDataset(*_bars(1600, 1))
    val = TensorDataset(*_bars(400, 2))
    model = bn_cnn()
    freeze_bn_scale(model, by_type)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _freeze_fact():
    model = bn_cnn()
    freeze_bn_scale(model, False)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    print(f"  after freeze_bn_scale: trainable {trainable}")


fix("bars_cnn_freeze_bn_helper_freezes_every_weight",
    partial(bars_cnn_freeze_bn_helper_freezes_every_weight, by_type=True), val_acc, "val accuracy", _freeze_fact)


# --------------------------------------------------------------------------------------------------------------------
# 5. Embedding dropout ("drop whole words", AWD-LSTM style) implemented by multiplying self.emb.weight.data by the
#    row mask in place: instead of a masked copy for this forward, the trained table itself is zeroed, row by row,
#    at every training step.
# --------------------------------------------------------------------------------------------------------------------
VOCAB = 60


def _intents(n: int, s: int):
    g = gen(s)
    ids = torch.randint(12, VOCAB, (n, 20), generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    for k in range(3):
        pos = torch.randint(0, 20, (n,), generator=g)
        keep = torch.rand(n, generator=g) < 0.7
        ids[torch.arange(n)[keep], pos[keep]] = (2 + 3 * y + k)[keep] % 12
    return ids, y


class BagClassifier(nn.Module):
    def __init__(self, inplace_dropout: bool, p: float = 0.2):
        super().__init__()
        self.inplace, self.p = inplace_dropout, p
        self.emb = nn.Embedding(VOCAB, 32)
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, ids):
        if self.training:
            keep = (torch.rand(VOCAB, 1) > self.p).float()
            if self.inplace:
                self.emb.weight.data.mul_(keep)                      # drop whole words
                e = self.emb(ids)
            else:
                e = F.embedding(ids, self.emb.weight * keep / (1 - self.p))
        else:
            e = self.emb(ids)
        return self.head(e.mean(1))


@case("intent_embedding_dropout_zeroes_the_weight_table_in_place", "what_is_trained",
      bug="word-level embedding dropout is implemented as self.emb.weight.data.mul_(mask) in forward: instead of a "
          "masked copy for this step, the trained embedding table itself is zeroed row by row on every training "
          "forward, so each word vector is wiped every few steps and the embeddings never accumulate what they learn",
      cause_pattern=r"\.data[^.]*(mul|zero|embedding|weight)|weight\.data|in.?place[^.]*(embedding|weight|"
                    r"parameter)|(embedding|weight|parameter)s?[^.]*in.?place|mul_|embedding[^.]*(zero|overwrit|"
                    r"reset|wip|destroy)|(zero|overwrit|reset|wip)\w*[^.]*(embedding|weight table|"
                    r"parameters? in forward)|forward[^.]*(modif|overwrit|chang)\w*[^.]*(weight|parameter)|"
                    r"(weight|parameter)s?[^.]*(modif|overwrit|chang)\w*[^.]*forward")
def intent_embedding_dropout_zeroes_the_weight_table_in_place(inplace_dropout=True):
    seed(0)
    train = TensorDataset(*_intents(1500, 1))
    val = TensorDataset(*_intents(400, 2))
    model = BagClassifier(inplace_dropout)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _embdrop_fact():
    torch.manual_seed(0)
    model = BagClassifier(True)
    for _ in range(10):
        model(torch.zeros(1, 20, dtype=torch.long))
    print(f"  after 10 training forwards (no optimizer step): {(model.emb.weight.abs().sum(1) == 0).float().mean():.0%}"
          f" of the embedding rows are exactly zero")


fix("intent_embedding_dropout_zeroes_the_weight_table_in_place",
    partial(intent_embedding_dropout_zeroes_the_weight_table_in_place, inplace_dropout=False), val_acc,
    "val accuracy", _embdrop_fact)


# --------------------------------------------------------------------------------------------------------------------
# 4. argparse's type=bool: `--freeze-encoder False` is bool("False"), which is True, so the from-scratch GRU encoder
#    (embedding + GRU, randomly initialised) is frozen and only the linear head trains on its random states.
# --------------------------------------------------------------------------------------------------------------------
def parse_args(argv):
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--freeze-encoder", type=bool, default=False)       # for the later fine-tuning runs
    parser.add_argument("--lr", type=float, default=2e-3)
    return parser.parse_args(argv)


def parse_args_fixed(argv):
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--freeze-encoder", type=lambda v: v.lower() in ("1", "true", "yes"), default=False)
    parser.add_argument("--lr", type=float, default=2e-3)
    return parser.parse_args(argv)


class TicketGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleDict(dict(emb=nn.Embedding(VOCAB, 32), gru=nn.GRU(32, 64, batch_first=True)))
        self.head = nn.Linear(64, 4)

    def forward(self, ids):
        _, h = self.encoder["gru"](self.encoder["emb"](ids))
        return self.head(h[-1])


@case("ticket_gru_argparse_type_bool_freezes_random_encoder", "what_is_trained",
      bug="the training script declares --freeze-encoder with argparse type=bool and is launched with "
          "`--freeze-encoder False`; bool('False') is True, so the randomly initialised embedding + GRU encoder of "
          "this from-scratch run is frozen (requires_grad_(False)) and only the linear head learns, on random "
          "recurrent features",
      cause_pattern=r"type=bool|bool\(|argparse|truthy|non-?empty string|\bstring\b[^.]*(true|false)|'False'|\"False\"|"
                    r"(random|untrained|randomly initiali[sz]ed|from scratch)[^.]*(frozen|requires_grad)|(frozen|"
                    r"requires_grad=False)[^.]*(random|untrained|from scratch|never (trained|pretrained))")
def ticket_gru_argparse_type_bool_freezes_random_encoder(parse=parse_args):
    seed(0)
    args = parse(["--freeze-encoder", "False"])
    train = TensorDataset(*_intents(1500, 1))
    val = TensorDataset(*_intents(400, 2))
    model = TicketGRU()
    model.encoder.requires_grad_(not args.freeze_encoder)
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.lr),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _argparse_fact():
    print(f"  argparse type=bool on 'False': {parse_args(['--freeze-encoder', 'False']).freeze_encoder}; "
          f"bool('False') = {bool('False')}")


fix("ticket_gru_argparse_type_bool_freezes_random_encoder",
    partial(ticket_gru_argparse_type_bool_freezes_random_encoder, parse=parse_args_fixed), val_acc, "val accuracy",
    _argparse_fact)


# --------------------------------------------------------------------------------------------------------------------
# 6. Residual MLP whose forward computes h = self.blocks(x) and then returns self.out(x): the blocks never reach the
#    output, get no gradient, and the model is the linear input projection followed by the linear output layer.
# --------------------------------------------------------------------------------------------------------------------
class ResidualBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm, self.ff = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class ResMLP(nn.Module):
    def __init__(self, use_blocks: bool, d_in: int = 12, d: int = 48):
        super().__init__()
        self.use_blocks = use_blocks
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.Sequential(*[ResidualBlock(d) for _ in range(3)])
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        x = self.inp(x)
        h = self.blocks(x)
        return self.out(h if self.use_blocks else x)


@case("credit_resmlp_forward_returns_head_of_input_projection", "what_is_trained",
      bug="the residual MLP's forward computes h = self.blocks(x) and then returns self.out(x) (a variable-name "
          "slip): the three residual blocks never reach the output, receive no gradient and never train, and the "
          "model is the linear input projection followed by the linear head, a linear classifier",
      cause_pattern=r"blocks?[^.]*(no|zero|none|never)[^.]*grad|(no|zero|none)[^.]*grad\w*[^.]*blocks?|"
                    r"blocks?[^.]*(unused|never used|not used)|(unused|never used|not used) (in|"
                    r"by) (the )?forward|(does not|doesn't|never) reach (the )?(output|loss)|self\.out\(x\)|(not|"
                    r"never) (part of|in) the (graph|forward|computation)|bypass|dead (code|branch)|linear (model|"
                    r"classifier)")
def credit_resmlp_forward_returns_head_of_input_projection(use_blocks=False):
    seed(0)
    x, y = _radial_table(2000, 1)
    xv, yv = _radial_table(500, 2)
    model = ResMLP(use_blocks)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.CrossEntropyLoss())


def _resmlp_fact():
    model = ResMLP(False)
    F.cross_entropy(model(torch.randn(8, 12)), torch.zeros(8, dtype=torch.long)).backward()
    none = sorted({n.split(".")[0] for n, p in model.named_parameters() if p.grad is None})
    print(f"  after one backward: modules whose parameters have grad None: {none}")


fix("credit_resmlp_forward_returns_head_of_input_projection",
    partial(credit_resmlp_forward_returns_head_of_input_projection, use_blocks=True), val_acc, "val accuracy",
    _resmlp_fact)
