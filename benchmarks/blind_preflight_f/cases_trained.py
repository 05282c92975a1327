"""Set f, family `what_is_trained`: parameters that don't train or train wrongly."""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_f.registry import case, loader, seed, teacher_classes

# --------------------------------------------------------------------------- 1: constant init


def init_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.constant_(m.weight, 0.05)
        nn.init.zeros_(m.bias)


def churn_mlp():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


@case("churn_mlp_constant_weight_init", "what_is_trained",
      "init_weights() sets every Linear weight to the constant 0.05 ('deterministic init'): all hidden units of a "
      "layer start identical, receive identical gradients and stay identical, so the 64-wide MLP behaves like one "
      "unit per layer and cannot fit the 4-class boundary",
      r"symmetr|identical (hidden )?(units|neurons|rows|columns|weights|filters|channels)|(units|neurons|rows|columns)[^.]*(identical|same (value|weight|gradient))|constant[^.]*initiali|initiali[sz]\w*[^.]*constant|constant_\(")
def churn_mlp_constant_weight_init():
    seed(0)
    x, y = teacher_classes(3000, 16, 4, s=21)
    model = churn_mlp()
    model.apply(init_weights)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 2: multi-task loss weight looked up by a wrong key


LOSS_WEIGHTS = {"species": 1.0, "age": 0.5}


def fish_records(n=3000, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, 12, generator=g)
    species = (x[:, :3] @ torch.randn(3, 3, generator=g)).argmax(1)
    age = torch.tanh(x[:, 3:8] @ torch.randn(5, generator=g) / 2) * 2 + 0.1 * torch.randn(n, generator=g)
    return x, species, (age - age[:2560].mean()) / age[:2560].std()


class FishNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.species_head = nn.Linear(64, 3)
        self.age_head = nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.species_head(h), self.age_head(h).squeeze(-1)


def fish_loss(model, batch):
    x, species, age = batch
    species_logits, age_pred = model(x)
    return (LOSS_WEIGHTS.get("species", 1.0) * F.cross_entropy(species_logits, species)
            + LOSS_WEIGHTS.get("age_years", 0.0) * F.mse_loss(age_pred, age))


@case("fish_multitask_age_loss_weight_key_missing", "what_is_trained",
      "the multi-task loss weights the age term with LOSS_WEIGHTS.get('age_years', 0.0) while the dict's key is 'age': "
      "the age weight is 0, the age head receives exactly zero gradient and keeps its random initial weights (the "
      "trunk never learns age either), so the model's age predictions are noise",
      r"(zero|0\.0|\b0\b|no) (weight|gradient|grad)|(weight|coefficient|scale|factor)[^.]*(zero|0\.0|\b0\b)|(age|head|parameters?)[^.]*\b(zero|no|none|never)\b[^.]*(grad|updat|chang|train)|never (updated|changes?|trained)|(exactly|identically) zero")
def fish_multitask_age_loss_weight_key_missing():
    seed(0)
    x, species, age = fish_records(s=22)
    model = FishNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], species[:2560], age[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], species[2560:], age[2560:]), 110, shuffle=False),
                loss_fn=fish_loss, max_steps=2000)


# --------------------------------------------------------------------------- 3: checkpoint saved from DataParallel, strict=False


def probe_task(n=2000, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, 32, generator=g)
    u = x[:, :4]
    y = ((u[:, 0] * u[:, 1] > 0).long() * 2 + (u[:, 2] + u[:, 3] > 0).long())
    return x, y


def backbone():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8), nn.ReLU())


@functools.lru_cache(maxsize=1)
def pretrained_checkpoint():
    """Stands in for a checkpoint saved from nn.DataParallel: keys carry the 'module.' prefix."""
    torch.manual_seed(123)
    net = nn.Sequential(backbone(), nn.Linear(8, 4))
    x, y = probe_task(4000, s=99)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(600):
        j = torch.randint(0, 4000, (128,))
        opt.zero_grad()
        F.cross_entropy(net(x[j]), y[j]).backward()
        opt.step()
    return {"module." + k: v.clone() for k, v in net[0].state_dict().items()}


class LinearProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = backbone()
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.backbone(x))


@case("linear_probe_checkpoint_keys_prefixed_strict_false", "what_is_trained",
      "the pretrained backbone was saved from nn.DataParallel, so every key starts with 'module.'; "
      "load_state_dict(..., strict=False) silently loads nothing (all keys missing / unexpected) and the frozen "
      "backbone the linear probe is trained on is the random initialisation (strip the prefix, load with strict=True)",
      r"strict|load_state_dict|(missing|unexpected) keys?|prefix|module\.|(not|never|nothing) (was )?loaded|random(ly)? (init|initiali[sz]ed)[^.]*(frozen|backbone|weights)|(frozen|backbone)[^.]*random")
def linear_probe_checkpoint_keys_prefixed_strict_false():
    seed(0)
    model = LinearProbe()
    model.backbone.load_state_dict(pretrained_checkpoint(), strict=False)
    model.backbone.requires_grad_(False)
    x, y = probe_task(s=23)
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 64),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 4: N(0, 1) init of a deep MLP


def deep_mlp(depth=6, width=128):
    layers, d = [], 20
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 4))


def normal_init(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, mean=0.0, std=1.0)
        nn.init.zeros_(m.bias)


@case("deep_mlp_weights_initialised_std_1", "what_is_trained",
      "init weights with nn.init.normal_(std=1.0) in a 7-layer, 128-wide ReLU MLP: each layer multiplies the "
      "activation scale by ~sqrt(128/2) = 8, so the logits are ~1e5 - 1e6, the softmax is saturated and the loss "
      "enormous; Adam's ~1e-3 steps barely change weights of size 1 (std ~ 1/sqrt(fan_in), e.g. kaiming, is the fix)",
      r"initiali[sz]|\binit\b|init_|normal_|(weights?|std|standard deviation|scale)[^.]*(too (large|big)|std\s*=?\s*1\b|fan.?in)|(activations?|logits?|outputs?|pre.?activations?)[^.]*(explod|huge|enormous|very large|too large|grow|blow|\d+e\+?\d)|exploding|saturat")
def deep_mlp_weights_initialised_std_1():
    seed(0)
    x, y = teacher_classes(3000, 20, 4, s=24)
    model = deep_mlp()
    model.apply(normal_init)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 5: batch-hard triplet, sqrt of a zero distance


def identity_embeddings(n=3000, d=32, ids=40, s=0):
    g = torch.Generator().manual_seed(s)
    protos = torch.randn(ids, d, generator=g)
    y = torch.randint(0, ids, (n,), generator=g)
    return protos[y] + 0.8 * torch.randn(n, d, generator=g), y


def batch_hard_triplet(model, batch, margin=0.5):
    x, y = batch
    z = model(x)
    dist = (z.unsqueeze(1) - z.unsqueeze(0)).pow(2).sum(-1).sqrt()
    same = y.unsqueeze(0) == y.unsqueeze(1)
    eye = torch.eye(len(y), dtype=torch.bool)
    hardest_pos = (dist * (same & ~eye)).max(1).values
    hardest_neg = (dist + 1e6 * same).min(1).values
    return F.relu(hardest_pos - hardest_neg + margin).mean()


@case("face_batch_hard_triplet_sqrt_of_zero_distance", "what_is_trained",
      "the batch-hard triplet loss builds the distance matrix as (za - zb).pow(2).sum(-1).sqrt(): the diagonal "
      "(each embedding with itself) is exactly 0, sqrt's derivative there is infinite and the masked-out diagonal "
      "multiplies it by 0, so every gradient is NaN from the first backward and the weights become NaN after one step "
      "(add an epsilon inside the sqrt or use torch.cdist)",
      r"\bnan\b[^.]*grad|grad\w*[^.]*\bnan\b|non.?finite (grad|gradient)|(grad|gradient)s?[^.]*(non.?finite|inf\b|infinite)|sqrt|square root|(distance|norm)[^.]*(zero|\b0\b)[^.]*(grad|deriv)|epsilon|\beps\b")
def face_batch_hard_triplet_sqrt_of_zero_distance():
    seed(0)
    x, y = identity_embeddings(s=25)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64, drop_last=True),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=batch_hard_triplet, max_steps=2000)


# --------------------------------------------------------------------------- 6: param groups from state_dict()


class Bars(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(c, 4)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def bar_images(n=2400, size=12, s=0):
    """Four classes: a bright bar, horizontal / vertical / diagonal / anti-diagonal, at a random offset."""
    g = torch.Generator().manual_seed(s)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    off = torch.randint(2, size - 2, (n,), generator=g)
    r = torch.arange(size)
    for i in range(n):
        k, o = int(y[i]), int(off[i])
        if k == 0:
            x[i, 0, o, :] += 1.5
        elif k == 1:
            x[i, 0, :, o] += 1.5
        elif k == 2:
            x[i, 0, r, r] += 1.5
        else:
            x[i, 0, r, size - 1 - r] += 1.5
    return x, y


@case("cnn_param_groups_built_from_state_dict", "what_is_trained",
      "the weight-decay / no-decay parameter groups are collected from model.state_dict().items() by key suffix: "
      "state_dict() returns detached tensors that share storage with the parameters but are not them (no "
      "requires_grad, never a .grad), so AdamW holds 6 tensors that never get a gradient and no model parameter is "
      "ever updated (use named_parameters())",
      r"state_dict|detach|(not|never|missing|absent|none)[^.]*(in|from) the optimi[sz]er|optimi[sz]er[^.]*(miss|not|lack|doesn't|does not|never|none of|no (model )?param)|(tensors?|param\w*)[^.]*(no|never|without)[^.]*grad|requires_grad")
def cnn_param_groups_built_from_state_dict():
    seed(0)
    x, y = bar_images(s=26)
    model = Bars()
    decay = [v for k, v in model.state_dict().items() if k.endswith("weight")]
    no_decay = [v for k, v in model.state_dict().items() if k.endswith("bias")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=2e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 7: GRUCell loop, hidden detached every step


def first_token_sequences(n=2400, T=12, vocab=12, s=0):
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(4, vocab, (n, T), generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    ids[:, 0] = y
    return ids, y


class StepwiseGRU(nn.Module):
    def __init__(self, vocab=12, d=32, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.cell = nn.GRUCell(d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        e = self.embed(ids)
        h = torch.zeros(ids.size(0), self.cell.hidden_size)
        for t in range(ids.size(1)):
            h = self.cell(e[:, t], h.detach())
        return self.head(h)


@case("session_grucell_loop_detaches_hidden_every_step", "what_is_trained",
      "the hand-unrolled GRUCell loop calls self.cell(e[:, t], h.detach()) at every time step ('so the graph does not "
      "grow'): the gradient stops after one step, the recurrence is only ever trained on one-step dependencies and the "
      "class, given by the first event of the 12-step session, cannot be learned (detach between batches, not steps)",
      r"detach|truncat\w* (bptt|backprop)|(gradient|grad)s?[^.]*(one|single|1|last) (time )?step|(hidden|recurrent) state[^.]*(cut|detach|no grad|block|stop)|(recurren\w*|hidden.to.hidden|weight_hh|cell)[^.]*(no|zero|tiny|vanish)[^.]*grad|(early|first) (steps?|tokens?|inputs?)[^.]*(no|zero) grad")
def session_grucell_loop_detaches_hidden_every_step():
    seed(0)
    ids, y = first_token_sequences(s=27)
    model = StepwiseGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(ids[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)
