"""Set ak, family what_is_trained: the parameters that must learn are not the ones the optimizer moves."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ak.cases_shapes import ratings
from benchmarks.blind_preflight_ak.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --- 1. head replaced after the optimizer was built ----------------------------------------------------------------


class SmallResNetish(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                                      nn.Flatten())
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        return self.fc(self.features(x))


def colour_patches(n, classes=5, s=0):
    g = gen(s)
    protos = torch.randn(classes, 3, 8, 8, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return protos[y] + 0.8 * torch.randn(n, 3, 8, 8, generator=g), y


@case("ak_head_replaced_after_optimizer", "what_is_trained",
      "Transfer learning in the usual order gone wrong: the backbone is frozen, the optimizer is built from the "
      "parameters that require grad (the old 10-class fc), and only then is model.fc replaced by a new "
      "nn.Linear(128, 5); the new head is not in the optimizer's param groups, so nothing that trains is used and "
      "the new head stays at its random init.",
      r"(optimi[sz]er .*(before|after) .*(replac|swap|new|head|fc)|(built|created|constructed) .*(before|prior)|"
      r"(replac|swap|reassign)\w* .*(head|fc|classifier|layer)|new (head|fc|layer|classifier) .*(not|never|missing)"
      r" .*optimi|stale (param|optimi)|rebuild the optimi[sz]er)")
def head_after(fixed=False):
    seed(0)
    x, y = colour_patches(1500, s=12)
    model = SmallResNetish(classes=10)          # the "pretrained" 10-class network
    for p in model.features.parameters():
        p.requires_grad = False
    if fixed:
        model.fc = nn.Linear(128, 5)
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    else:
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
        model.fc = nn.Linear(128, 5)            # new task: 5 classes
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ak_head_replaced_after_optimizer", fixed_of(head_after), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 2. list(model.parameters())[:-1] frozen: only the last bias trains ------------------------------------------------


@case("ak_freeze_slice_leaves_bias_only", "what_is_trained",
      "To fine-tune 'only the last layer' the user freezes for p in list(model.parameters())[:-1]; the last entry of "
      "parameters() is the output layer's bias, so its weight is frozen too and the whole network trains 5 numbers "
      "(one bias per class).",
      r"(\[:-1\]|\[:-2\]|last (entry|element|item|parameter)|only the (last |output )?bias|bias (alone|only)|"
      r"weight .*(also )?frozen|(output|last|final) layer'?s? weight .*(frozen|requires_grad)|"
      r"requires_grad ?= ?False .*(weight|head|last)|(few|5|five) (trainable )?param)")
def freeze_slice(fixed=False):
    seed(0)
    g = gen(13)
    x = torch.randn(1500, 16, generator=g)
    y = (torch.tanh(x @ torch.randn(16, 5, generator=g)) + 0.3 * x[:, :5] ** 2).argmax(1)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 5))
    if fixed:
        for p in model[:-1].parameters():
            p.requires_grad = False
    else:
        for p in list(model.parameters())[:-1]:
            p.requires_grad = False
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ak_freeze_slice_leaves_bias_only", fixed_of(freeze_slice), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 3. positional embedding left out of the weight-decay param groups ----------------------------------------------------


class OrderTransformer(nn.Module):
    def __init__(self, vocab=20, dim=32, S=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, S, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(dim, 2)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens) + self.pos_embed).mean(1))


def order_data(n, S=12, s=0):
    """Label: does token 1 come before token 2 (each appears once among fillers 3..19)."""
    g = gen(s)
    x = torch.randint(3, 20, (n, S), generator=g)
    pos = torch.stack([torch.randperm(S, generator=g)[:2] for _ in range(n)])
    x[torch.arange(n), pos[:, 0]] = 1
    x[torch.arange(n), pos[:, 1]] = 2
    return x, (pos[:, 0] < pos[:, 1]).long()


@case("ak_param_groups_skip_pos_embed", "what_is_trained",
      "The AdamW param groups are built by name, decay for names ending in 'weight' and no decay for names ending "
      "in 'bias'; the bare nn.Parameter pos_embed matches neither, so it is in no group, is never updated and stays "
      "at its zeros init: the transformer has no position information and cannot tell which token came first.",
      r"(pos_embed|position\w* embedding .*(zero|not|never|frozen|untrained)|param.?groups? .*(miss|lack|skip|omit|"
      r"neither|none of)|(not|never|isn't|is not) in any (param|optimi)|no (param )?group|"
      r"(miss|omit|left out|skipp)\w* .*(optimi|group)|endswith|name filter|(frozen|stuck|stays?) at (its )?(zero|init))")
def groups_pos(fixed=False):
    seed(0)
    x, y = order_data(2000, s=14)
    model = OrderTransformer()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    if fixed:
        no_decay += [p for n, p in model.named_parameters() if not n.endswith(("weight", "bias"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=2e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("ak_param_groups_skip_pos_embed", fixed_of(groups_pos), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 4. numpy post-processing inside forward cuts the network off --------------------------------------------------


class DemandForecaster(nn.Module):
    """Window of 24 past values -> next value; normalised output clipped with numpy, then a learned rescale."""

    def __init__(self, fixed=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
        self.scale, self.shift = nn.Parameter(torch.ones(1)), nn.Parameter(torch.zeros(1))
        self.fixed = fixed

    def forward(self, x):
        z = self.net(x).squeeze(-1)
        if self.fixed:
            z = z.clamp(-4.0, 4.0)
        else:
            z = torch.from_numpy(np.clip(z.detach().cpu().numpy(), -4.0, 4.0)).to(x.device)
        return z * self.scale + self.shift


def demand_windows(n, s=0):
    g = gen(s)
    t = torch.arange(25.0)
    phase, freq = torch.rand(n, 1, generator=g) * 6.28, 0.2 + 0.3 * torch.rand(n, 1, generator=g)
    series = torch.sin(freq * t + phase) * 2 + 0.05 * torch.randn(n, 25, generator=g)
    return series[:, :24], series[:, 24]


@case("ak_numpy_clip_in_forward", "what_is_trained",
      "The forecaster clips its normalised output with np.clip(z.detach().cpu().numpy(), -4, 4) and converts back "
      "with torch.from_numpy inside forward; the round-trip through numpy leaves the autograd graph, so the whole "
      "network gets no gradient and only the final scale and shift parameters after it learn.",
      r"(numpy|np\.clip|from_numpy|\.detach\(\)|detach\w*|(leav|cut|break|drop)\w* .*(graph|autograd)|"
      r"torch\.clamp|\.clamp\(|not (connected|reach\w*) .*(loss|graph)|outside (of )?(the )?(autograd|graph))")
def numpy_forward(fixed=False):
    seed(0)
    x, y = demand_windows(2000, s=15)
    model = DemandForecaster(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1000)


fix("ak_numpy_clip_in_forward", fixed_of(numpy_forward), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)

# --- 5. item factors registered as a buffer ------------------------------------------------------------------------


class ItemTowerMF(nn.Module):
    def __init__(self, n_users=100, n_items=80, k=8, fixed=False):
        super().__init__()
        self.user = nn.Embedding(n_users, k)
        nn.init.normal_(self.user.weight, std=0.3)
        items = 0.3 * torch.randn(n_items, k)
        if fixed:
            self.item = nn.Parameter(items)
        else:
            self.register_buffer("item", items)  # "so that it follows model.to(device)"

    def forward(self, pairs):
        return (self.user(pairs[:, 0]) * self.item[pairs[:, 1]]).sum(1)


@case("ak_item_factors_register_buffer", "what_is_trained",
      "The item-factor table is stored with self.register_buffer('item', ...) so that it follows model.to(device); "
      "a buffer is not a parameter, it is not in model.parameters() nor the optimizer, and the item factors stay "
      "random while only the user factors fit around them.",
      r"(register_buffer|buffer|(wrap|register|make)\w* .*nn\.Parameter|nn\.Parameter instead|not a parameter|"
      r"(not|never) (in|part of) (the )?model\.parameters|item (factor|embedding)s? .*(random|fixed|frozen|"
      r"not (train|updat))|(fixed|frozen|constant) (item )?(table|embedding))")
def item_buffer(fixed=False):
    seed(0)
    pairs, r = ratings(s=16)
    model = ItemTowerMF(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.03),
                train_loader=loader(TensorDataset(pairs[:4000], r[:4000]), 128),
                val_loader=loader(TensorDataset(pairs[4000:], r[4000:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1000)


fix("ak_item_factors_register_buffer", fixed_of(item_buffer), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)
