"""Family ``what_is_trained``: which weights actually receive gradients / optimizer updates."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_be.registry import case, fix, fixed_of, loader, plain_acc, seed
from benchmarks.blind_preflight_be.synth import blobs, mlp, split, teacher


def _data(s, c=5):
    x, y = blobs(3000, 16, c, s)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    return loader(TensorDataset(xt, yt), 64), loader(TensorDataset(xv, yv), 256, False)


# --- 1. QAT fake-quant with torch.round and no straight-through estimator -----------------------------------------------
class FakeQuantLinear(nn.Linear):
    def __init__(self, i, o, ste, bits=4):
        super().__init__(i, o)
        self.ste, self.qmax = ste, 2 ** (bits - 1) - 1

    def forward(self, x):
        scale = self.weight.detach().abs().amax(dim=1, keepdim=True) / self.qmax   # per output channel
        wq = torch.clamp(torch.round(self.weight / scale), -self.qmax, self.qmax) * scale
        if self.ste:
            wq = self.weight + (wq - self.weight).detach()
        return F.linear(x, wq, self.bias)


def qat_round_without_ste(fixed: bool = False):
    seed(0)
    tl, vl = _data(9)
    model = nn.Sequential(FakeQuantLinear(16, 64, fixed), nn.ReLU(), FakeQuantLinear(64, 64, fixed), nn.ReLU(),
                          FakeQuantLinear(64, 5, fixed))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("qat_round_without_ste", "what_is_trained",
     "The fake-quant forward uses torch.round(weight / scale) * scale with no straight-through estimator: round has "
     "zero gradient almost everywhere, so the quantised layers' weights get zero gradients and only the biases train; "
     "pass the gradient straight through with w + (w_q - w).detach().",
     r"straight[- ]through|\bSTE\b|round\w*.{0,80}(zero|no) grad|(zero|no) grad\w*.{0,80}round|detach\(\)|"
     r"weights? (get|receive)s? (no|zero) grad|gradient of round",
     )(qat_round_without_ste)
fix("qat_round_without_ste", fixed_of(qat_round_without_ste), plain_acc, "val acc")


# --- 2. low-rank factorisation done after the optimizer was built ----------------------------------------------------
class LowRank(nn.Module):
    def __init__(self, layer: nn.Linear, rank: int):
        super().__init__()
        U, S, Vh = torch.linalg.svd(layer.weight.detach(), full_matrices=False)
        self.v = nn.Linear(layer.in_features, rank, bias=False)
        self.u = nn.Linear(rank, layer.out_features)
        with torch.no_grad():
            self.v.weight.copy_(S[:rank, None].sqrt() * Vh[:rank])
            self.u.weight.copy_(U[:, :rank] * S[:rank].sqrt())
            self.u.bias.copy_(layer.bias)

    def forward(self, x):
        return self.u(self.v(x))


def lowrank_after_optimizer(fixed: bool = False):
    seed(0)
    tl, vl = _data(10)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 5))
    if fixed:
        model[0], model[2] = LowRank(model[0], 8), LowRank(model[2], 16)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        model[0], model[2] = LowRank(model[0], 8), LowRank(model[2], 16)   # compress the big layers
    return dict(model=model, optimizer=optimizer, train_loader=tl, val_loader=vl,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("lowrank_after_optimizer", "what_is_trained",
     "The two big Linear layers are replaced by their low-rank U/V factorisation after the Adam optimizer was built, "
     "so the optimizer holds the old, now unused weights and the new factor parameters are never updated; only the "
     "last layer trains. Build the optimizer after the factorisation.",
     r"(built|created|constructed) before|before the (layers|factori|replace)|rebuild the optimi[sz]er|buil"
     r"d the optimi[sz]er after|(not|never) in the optimi[sz]er|optimi[sz]er holds (the )?(old|stale)|stale"
     r" param|(not|never) (passed to|registered with) the optimi[sz]er",
     )(lowrank_after_optimizer)
fix("lowrank_after_optimizer", fixed_of(lowrank_after_optimizer), plain_acc, "val acc")


# --- 3. weight sharing through .data -------------------------------------------------------------------------------------
class SharedDeep(nn.Module):
    """One hidden matrix shared by three residual blocks (ALBERT-style cross-layer sharing)."""

    def __init__(self, use_data):
        super().__init__()
        self.inp, self.out = nn.Linear(16, 64), nn.Linear(64, 5)
        self.shared = nn.Parameter(torch.randn(64, 64) * 0.1)
        self.use_data = use_data

    def forward(self, x):
        h = F.relu(self.inp(x))
        w = self.shared.data if self.use_data else self.shared   # "same tensor for all blocks"
        for _ in range(3):
            h = h + F.relu(h @ w)
        return self.out(h)


def weight_sharing_through_data(fixed: bool = False):
    seed(0)
    tl, vl = _data(11)
    model = SharedDeep(use_data=not fixed)
    for p in model.inp.parameters():
        p.requires_grad_(False)                 # input projection kept from the uncompressed model
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3),
                train_loader=tl, val_loader=vl, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("weight_sharing_through_data", "what_is_trained",
     "The shared block matrix is used as self.shared.data in forward, which detaches it from autograd, so the one "
     "weight all blocks share never gets a gradient and stays at its random init; use the Parameter itself.",
     r"\.data\b|detach\w*|outside (of )?autograd|stays? at (its )?(random )?init|(shared|tied) (weight|matr"
     r"ix|parameter).{0,80}(never|not)",
     )(weight_sharing_through_data)
fix("weight_sharing_through_data", fixed_of(weight_sharing_through_data), plain_acc, "val acc")


# --- 4. distillation wrapper whose optimizer also updates the teacher -------------------------------------------------
class Distiller(nn.Module):
    def __init__(self, student, teacher):
        super().__init__()
        self.student, self.teacher = student, teacher

    def forward(self, x):
        return self.student(x)


def kd_teacher_in_optimizer(fixed: bool = False):
    seed(0)
    tl, vl = _data(26)
    t = teacher(3000, 16, 5, 26).requires_grad_(True)           # loaded from the checkpoint
    model = Distiller(mlp(16, 32, 5), t)
    params = model.student.parameters() if fixed else model.parameters()
    T = 3.0

    def kd_loss(m, batch):
        xb, _ = batch
        p_t = F.softmax(m.teacher(xb) / T, -1)
        return F.kl_div(F.log_softmax(m(xb) / T, -1), p_t, reduction="batchmean") * T * T
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=3e-3), train_loader=tl, val_loader=vl,
                loss_fn=kd_loss, max_steps=300)


case("kd_teacher_in_optimizer", "what_is_trained",
     "The optimizer is built on the Distiller wrapper's parameters(), which include the teacher, and the teacher's "
     "logits are not detached, so the KL loss also trains the teacher toward the untrained student and the soft "
     "targets collapse; freeze the teacher (requires_grad_(False), no_grad) and optimize student.parameters() only.",
     r"teacher.{0,80}(optimi[sz]er|trained|updated|detach)|(freeze|frozen|detach\w*|no_grad).{0,60}teacher|"
     r"student\.parameters",
     )(kd_teacher_in_optimizer)
fix("kd_teacher_in_optimizer", fixed_of(kd_teacher_in_optimizer),
    plain_acc, "val acc")


# --- 5. low-rank factors both initialised to zero ------------------------------------------------------------------------
class Factorised(nn.Module):
    """W ~ U V with rank r: 64*64 -> 2*64*8 weights."""

    def __init__(self, n, r, zero_both):
        super().__init__()
        init = torch.zeros if zero_both else (lambda *shape: torch.randn(*shape) / shape[-1] ** 0.5)
        self.U = nn.Parameter(init(n, r))                        # start the factorised layer "empty"
        self.V = nn.Parameter(init(r, n))
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return x @ self.V.T @ self.U.T + self.bias


def lowrank_factors_zero_init(fixed: bool = False):
    seed(0)
    tl, vl = _data(27)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), Factorised(64, 8, zero_both=not fixed), nn.ReLU(),
                          nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("lowrank_factors_zero_init", "what_is_trained",
     "Both low-rank factors U and V are initialised to zeros, so the gradient of U is (grad) x V = 0 and of V is "
     "U^T x (grad) = 0: neither factor ever moves, the factorised layer outputs only its bias and the input layer "
     "behind it gets no gradient either; initialise the factors randomly (as nn.Linear does).",
     r"zero[s-]? ?init\w*|init\w* (both )?(to )?zeros?|both (low-rank )?(factors )?(are )?(initiali[sz]ed t"
     r"o )?zeros?|zeros\(|U and V|dead (layer|factori)",
     )(lowrank_factors_zero_init)
fix("lowrank_factors_zero_init", fixed_of(lowrank_factors_zero_init),
    plain_acc, "val acc")
