"""Set r, family what_is_trained: the parameters that should learn are not the ones that do."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_r.registry import case, eval_acc, eval_rmse, fix, fixed_of, gen, loader, seed


def teacher(n, s, d=32, c=4):
    g = gen(s)
    w = torch.randn(d, c, generator=gen(123))
    x = torch.randn(n, d, generator=g)
    return x, (x @ w).argmax(1), w


def acc(m, kw):
    return eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1]))


def pretrained_backbone(w, width=16):
    """A 'pretrained' feature extractor: its first features are the teacher's directions (what pretraining learned)."""
    lin = nn.Linear(w.shape[0], width)
    with torch.no_grad():
        lin.weight.zero_()
        lin.weight[:w.shape[1]] = w.T
        lin.weight[w.shape[1]:2 * w.shape[1]] = -w.T
        lin.bias.zero_()
    return nn.Sequential(lin, nn.ReLU())


# --- 1. chest x-ray features: head swapped after the optimizer was built ------------------------------------------


class XrayNet(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.backbone = pretrained_backbone(w)
        self.head = nn.Linear(16, 10)        # the original 10-class head

    def forward(self, x):
        return self.head(self.backbone(x))


def xray(fixed=False):
    seed(0)
    x, y, w = teacher(1200, 21)
    vx, vy, _ = teacher(400, 22)
    model = XrayNet(w)
    for p in model.backbone.parameters():
        p.requires_grad = False
    if fixed:
        model.head = nn.Linear(16, 4)
        optimizer = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    else:
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        model.head = nn.Linear(16, 4)        # "adapt to our 4 findings"
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("xray_head_replaced_after_optimizer", "what_is_trained",
     "The classifier head is replaced (model.head = nn.Linear(16, 4)) after the optimizer was created, so the optimizer "
     "still holds the old head's parameters and the new head, the only trainable layer, is never updated.",
     r"(after|before) (the )?optimi[sz]er (was |is )?(created|built|constructed|instantiated|made)|(replac|reassign|swap)\w*.{0,80}"
     r"after.{0,40}optimi[sz]er|optimi[sz]er (still )?(holds|has|references|points to|contains) (the )?(old|previous|stale|original)|"
     r"(new|replaced) (head|layer|classifier|module)\w*.{0,80}(not|never|isn't|is not) (in|part of|registered with|updated by) the optimi[sz]er")(xray)
fix("xray_head_replaced_after_optimizer", fixed_of(xray), acc, "val accuracy")

# --- 2. ECG encoder: DataParallel checkpoint loaded with strict=False --------------------------------------------


def ecg(fixed=False):
    seed(0)
    x, y, w = teacher(1200, 23)
    vx, vy, _ = teacher(400, 24)
    trained = pretrained_backbone(w, 8)
    checkpoint = {"module." + k: v for k, v in trained.state_dict().items()}   # saved from nn.DataParallel
    encoder = nn.Sequential(nn.Linear(32, 8), nn.ReLU())
    if fixed:
        checkpoint = {k.removeprefix("module."): v for k, v in checkpoint.items()}
    encoder.load_state_dict(checkpoint, strict=False)     # strict=True raised "Unexpected key(s) ... module.0.weight"
    for p in encoder.parameters():
        p.requires_grad = False
    model = nn.Sequential(encoder, nn.Linear(8, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model[1].parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("ecg_checkpoint_module_prefix_strict_false", "what_is_trained",
     "The pretrained encoder checkpoint was saved from nn.DataParallel (keys prefixed 'module.') and is loaded with "
     "load_state_dict(strict=False), which silently loads nothing; the frozen encoder stays at its random init.",
     r"module\.|strict ?= ?false|(no|none of the) (keys|weights) (were |was )?(loaded|matched)|(missing|unexpected)[_ ]keys|"
     r"(checkpoint|pretrained|state_dict).{0,80}(not loaded|never loaded|silently|did not load|didn't load)|"
     r"(frozen|freez)\w*.{0,60}random(ly)?[- ]init")(ecg)
fix("ecg_checkpoint_module_prefix_strict_false", fixed_of(ecg), acc, "val accuracy")

# --- 3. citation-graph GCN: a numpy row-normalisation inside forward -----------------------------------------------


def citation_graph(n=600, s=25):
    g = np.random.default_rng(s)
    y = g.integers(0, 4, n)
    protos = g.standard_normal((4, 32))
    feats = protos[y] * 0.35 + g.standard_normal((n, 32))
    adj = np.zeros((n, n), dtype=np.float32)
    for i in range(n):
        same = np.flatnonzero(y == y[i])
        nb = np.concatenate([g.choice(same, 4), g.choice(n, 2)])
        adj[i, nb] = adj[nb, i] = 1
    adj += np.eye(n, dtype=np.float32)
    adj /= adj.sum(1, keepdims=True)
    idx = g.permutation(n)
    return (torch.tensor(feats, dtype=torch.float32), torch.tensor(adj), torch.tensor(y), torch.tensor(idx[:400]),
            torch.tensor(idx[400:]))


class GCN(nn.Module):
    def __init__(self, feats, adj, fixed):
        super().__init__()
        self.register_buffer("feats", feats)
        self.register_buffer("adj", adj)
        self.fixed = fixed
        self.l1 = nn.Linear(32, 4)
        self.l2 = nn.Linear(4, 4)

    def forward(self, nodes):
        h = F.relu(self.adj @ self.l1(self.feats))
        if self.fixed:
            h = h / (h.norm(dim=1, keepdim=True) + 1e-6)
        else:   # sklearn-style row normalisation; .detach() because .numpy() complained about requires_grad
            arr = h.detach().cpu().numpy()
            arr = arr / (np.linalg.norm(arr, axis=1, keepdims=True) + 1e-6)
            h = torch.tensor(arr, device=h.device)
        return self.l2(self.adj @ h)[nodes]


def gcn(fixed=False):
    seed(0)
    feats, adj, y, tr, va = citation_graph()
    model = GCN(feats, adj, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(tr, y[tr]), 64), val_loader=loader(TensorDataset(va, y[va]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("citation_gcn_numpy_roundtrip_in_forward", "what_is_trained",
     "Inside forward the hidden features go through .detach().numpy() for a numpy row-normalisation and back with "
     "torch.tensor, which cuts the autograd graph: the first GCN layer (l1) never gets a gradient and stays random.",
     r"numpy|\.detach\(\)|torch\.tensor\(.{0,40}(graph|grad)|(cuts?|breaks?|detach\w*) (from )?(the )?(autograd|computation(al)?) graph|"
     r"graph (is )?(cut|broken|detached)")(gcn)
fix("citation_gcn_numpy_roundtrip_in_forward", fixed_of(gcn), acc, "val node accuracy")

# --- 4. movie recommender: user factors as a plain tensor attribute ---------------------------------------------

N_USERS, N_ITEMS, K = 150, 120, 6


def ratings(s):
    g = gen(s)
    u, v = torch.randn(N_USERS, K, generator=gen(31)), torch.randn(N_ITEMS, K, generator=gen(32))
    pairs = torch.stack([torch.randint(0, N_USERS, (6000,), generator=g), torch.randint(0, N_ITEMS, (6000,), generator=g)], 1)
    r = (u[pairs[:, 0]] * v[pairs[:, 1]]).sum(1) / K ** 0.5 + 0.1 * torch.randn(6000, generator=g)
    return pairs, r


class MF(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        if fixed:
            self.user = nn.Parameter(torch.randn(N_USERS, K) * 0.1)
        else:
            self.user = (torch.randn(N_USERS, K) * 0.1).requires_grad_()   # a learnable table, or so it seems
        self.item = nn.Embedding(N_ITEMS, K)
        nn.init.normal_(self.item.weight, std=0.1)

    def forward(self, pairs):
        u = self.user.to(pairs.device)[pairs[:, 0]]
        return (u * self.item(pairs[:, 1])).sum(1)


def recsys(fixed=False):
    seed(0)
    pairs, r = ratings(33)
    model = MF(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(pairs[:5000], r[:5000]), 64),
                val_loader=loader(TensorDataset(pairs[5000:], r[5000:]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=400)


case("recsys_user_table_plain_tensor", "what_is_trained",
     "The user-factor table is a plain tensor attribute (torch.randn(..., requires_grad=True)), not an nn.Parameter or "
     "nn.Embedding, so it is not registered in model.parameters(), never reaches the optimizer, and stays random.",
     r"nn\.parameter|not (a |an )?(registered )?(parameter|nn\.embedding)|plain (torch\.)?tensor|(not |isn't |is not )"
     r"registered|register_parameter|(tensor )?attribute.{0,60}(not|never).{0,40}(parameters\(\)|optimi[sz]er)")(recsys)
fix("recsys_user_table_plain_tensor", fixed_of(recsys), lambda m, kw: eval_rmse(m, kw["val_loader"], lambda mm, b: (mm(b[0]), b[1])),
    "val RMSE", higher=False, steps=400)

# --- 5. sensor transformer-ish MLP: "unfreeze the head" with module.requires_grad = True -----------------------------


class TunedNet(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.backbone = pretrained_backbone(w)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.norm(self.backbone(x)))


def tuned(fixed=False):
    seed(0)
    x, y, w = teacher(1200, 35)
    vx, vy, _ = teacher(400, 36)
    model = TunedNet(w)
    for p in model.parameters():
        p.requires_grad = False
    for p in model.norm.parameters():           # BitFit-style: tune the norm ...
        p.requires_grad = True
    if fixed:
        model.head.requires_grad_(True)
    else:
        model.head.requires_grad = True         # ... and the new head
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("sensor_head_requires_grad_attribute", "what_is_trained",
     "The head is 'unfrozen' with model.head.requires_grad = True, which only sets a plain attribute on the Module; its "
     "weight and bias keep requires_grad=False, so the randomly initialised head never trains (use requires_grad_(True)).",
     r"requires_grad_\(|(module|head)\.requires_grad ?= ?true|(sets?|setting) (only )?(a )?(plain |python )?attribute|"
     r"attribute on the (module|layer|head)|(head|classifier|fc)\w*.{0,80}(still |remains? |stays? )(frozen|requires_grad ?= ?false)")(tuned)
fix("sensor_head_requires_grad_attribute", fixed_of(tuned), acc, "val accuracy")
