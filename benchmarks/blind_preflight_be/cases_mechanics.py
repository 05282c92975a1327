"""Family ``mechanics``: how the compression / continual-learning machinery updates the weights."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_be.registry import acc_of, case, fix, fixed_of, loader, plain_acc, seed
from benchmarks.blind_preflight_be.synth import blobs, mlp, split


def _data(s, c=5):
    x, y = blobs(3000, 16, c, s)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    return loader(TensorDataset(xt, yt), 64), loader(TensorDataset(xv, yv), 256, False)


# --- 1. QAT that writes the quantised weight back into .data every forward ----------------------------------------------
class QuantInPlace(nn.Linear):
    def __init__(self, i, o, inplace, bits=3):
        super().__init__(i, o)
        self.inplace, self.qmax = inplace, 2 ** (bits - 1) - 1

    def forward(self, x):
        scale = self.weight.detach().abs().amax() / self.qmax        # per-tensor
        if self.inplace:
            with torch.no_grad():       # "keep the weights on the int grid, like the deployed model"
                self.weight.data = torch.round(self.weight / scale).clamp(-self.qmax, self.qmax) * scale
            return F.linear(x, self.weight, self.bias)
        wq = torch.round(self.weight / scale).clamp(-self.qmax, self.qmax) * scale
        return F.linear(x, self.weight + (wq - self.weight).detach(), self.bias)


def qat_inplace_weight_rounding(fixed: bool = False):
    seed(0)
    tl, vl = _data(13)
    model = nn.Sequential(QuantInPlace(16, 64, not fixed), nn.ReLU(), QuantInPlace(64, 64, not fixed), nn.ReLU(),
                          QuantInPlace(64, 5, not fixed))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), train_loader=tl,
                val_loader=vl, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("qat_inplace_weight_rounding", "mechanics",
     "The fake-quant layer overwrites weight.data with its 3-bit rounded value at every forward, so each Adam update "
     "(about 1e-3, far below half a quantisation step) is rounded away before it can accumulate and the weights stay "
     "on their initial grid; keep float shadow weights and quantise only in the forward with a straight-through "
     "estimator.",
     r"weight\.data|in[- ]place|overwrit\w*|rounded away|(latent|shadow|float|master) weights?|updates? (are )?(lost|"
     r"erased|undone|discarded)|straight[- ]through|quanti[sz]ation step",
     )(qat_inplace_weight_rounding)
fix("qat_inplace_weight_rounding", fixed_of(qat_inplace_weight_rounding), plain_acc, "val acc")


# --- 2. magnitude pruning mask with the comparison the wrong way round -------------------------------------------------
class MagnitudePruned(nn.Module):
    def __init__(self, keep_large):
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(16, 128), nn.Linear(128, 128), nn.Linear(128, 5)
        self.keep_large = keep_large
        self.sparsity = 0.8

    def masked(self, layer):
        w = layer.weight
        thr = w.detach().abs().flatten().kthvalue(int(self.sparsity * w.numel())).values
        mask = (w.detach().abs() > thr) if self.keep_large else (w.detach().abs() < thr)
        return F.linear(self._x, w * mask, layer.bias)

    def forward(self, x):
        self._x = x
        self._x = F.relu(self.masked(self.fc1))
        self._x = F.relu(self.masked(self.fc2))
        return self.out(self._x)


def magnitude_mask_inverted(fixed: bool = False):
    seed(0)
    tl, vl = _data(14)
    model = MagnitudePruned(keep_large=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("magnitude_mask_inverted", "mechanics",
     "The magnitude-pruning mask is abs(w) < threshold, so it keeps the 80% smallest weights and zeroes the largest "
     "20%, recomputed every step: any weight the optimizer grows is pruned on the next forward; the mask must be "
     "abs(w) > threshold (keep the largest magnitudes).",
     r"<\s*thr|>\s*thr|inverted|wrong way|(keeps?|keeping) the small\w*|prun\w* the larg\w*|largest (weights|magnitudes)|"
     r"comparison|flipped",
     )(magnitude_mask_inverted)
fix("magnitude_mask_inverted", fixed_of(magnitude_mask_inverted), plain_acc, "val acc")


# --- 3. EWC anchor parameters kept by reference ------------------------------------------------------------------------
class TwoHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.head_a, self.head_b = nn.Linear(48, 4), nn.Linear(48, 4)

    def forward(self, x, task="b"):
        h = self.trunk(x)
        return self.head_a(h) if task == "a" else self.head_b(h)


def two_tasks(s=15):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(4000, 16, generator=g)
    ya = (torch.tanh(x @ torch.randn(16, 24, generator=g)) @ torch.randn(24, 4, generator=g)).argmax(1)
    yb = (torch.tanh(x @ torch.randn(16, 24, generator=g)) @ torch.randn(24, 4, generator=g)).argmax(1)
    return x, ya, yb


def pretrain_a(model, x, ya, steps=400):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        i = torch.randint(0, 3000, (128,), generator=g)
        loss = F.cross_entropy(model(x[i], "a"), ya[i])
        opt.zero_grad(), loss.backward(), opt.step()


def fisher_diag(model, x, ya):
    fisher = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(0, 512, 32):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 32], "a"), ya[i:i + 32]).backward()
        for n, p in model.named_parameters():
            if p.grad is not None:
                fisher[n] += p.grad.detach() ** 2 / 16
    model.zero_grad()
    return fisher


def ewc_anchor_by_reference(fixed: bool = False):
    seed(0)
    x, ya, yb = two_tasks()
    model = TwoHead()
    pretrain_a(model, x, ya)
    fisher = fisher_diag(model, x, ya)
    if fixed:
        anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    else:
        anchor = {n: p for n, p in model.named_parameters()}       # "snapshot" of the task-A solution
    lam = 5000.0

    def ewc_loss(m, batch):
        xb, yb_ = batch
        penalty = sum((fisher[n] * (p - anchor[n]) ** 2).sum() for n, p in m.named_parameters())
        return F.cross_entropy(m(xb, "b"), yb_) + lam / 2 * penalty
    xv, yav = x[3000:], ya[3000:]
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3000], yb[:3000]), 64),
                val_loader=loader(TensorDataset(xv, yav), 250, False), loss_fn=ewc_loss, max_steps=300)


task_a_acc = acc_of(lambda m, b: (m(b[0], "a").argmax(-1), b[1]))
case("ewc_anchor_by_reference", "mechanics",
     "The EWC anchor dict holds the live Parameters (p, not p.detach().clone()), so (p - anchor) is always zero, "
     "the Fisher-weighted penalty and its gradient vanish and task B overwrites task A (catastrophic forgetting); "
     "store a detached copy of the old parameters.",
     r"clone|copy|referenc\w*|same tensors?|always zero|penalty.{0,60}(zero|vanish)|(zero|vanish)\w*.{0,60}penalty|"
     r"forgett\w*|live param",
     )(ewc_anchor_by_reference)
fix("ewc_anchor_by_reference", fixed_of(ewc_anchor_by_reference), task_a_acc, "task-A val acc")


# --- 4. LwF whose "old model" is the model itself --------------------------------------------------------------------
def lwf_old_model_not_copied(fixed: bool = False):
    seed(0)
    x, ya, yb = two_tasks(16)
    model = TwoHead()
    pretrain_a(model, x, ya)
    old_model = copy.deepcopy(model).eval() if fixed else model      # the task-A network to distil from
    T, lam = 2.0, 4.0

    def lwf_loss(m, batch):
        xb, yb_ = batch
        with torch.no_grad():
            old = F.softmax(old_model(xb, "a") / T, -1)
        keep = F.kl_div(F.log_softmax(m(xb, "a") / T, -1), old, reduction="batchmean") * T * T
        return F.cross_entropy(m(xb, "b"), yb_) + lam * keep
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3000], yb[:3000]), 64),
                val_loader=loader(TensorDataset(x[3000:], ya[3000:]), 250, False), loss_fn=lwf_loss, max_steps=300)


case("lwf_old_model_not_copied", "mechanics",
     "The LwF 'old model' is the same object as the model being trained (old_model = model, no copy.deepcopy), so "
     "the recorded task-A outputs are the current outputs under no_grad, the distillation KL is at its minimum with "
     "zero gradient at every step, and task B overwrites task A; distil from a frozen deepcopy taken before task B.",
     r"deep\s*copy|copy\.|same (object|model|network)|alias|not (a )?(frozen )?copy|(moving|drifting|its own) "
     r"(targets?|outputs?)|zero grad\w*|forgett\w*|frozen (copy|snapshot)",
     )(lwf_old_model_not_copied)
fix("lwf_old_model_not_copied", fixed_of(lwf_old_model_not_copied), task_a_acc, "task-A val acc")


# --- 5. pruning masks computed before the pretrained weights are loaded -------------------------------------------------
class MaskedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(16, 128, 5)
        for i in (0, 2):
            self.register_buffer(f"mask{i}", torch.ones_like(self.net[i].weight))

    def compute_masks(self, sparsity=0.95):
        for i in (0, 2):
            w = self.net[i].weight.detach().abs()
            getattr(self, f"mask{i}").copy_((w > w.flatten().kthvalue(int(sparsity * w.numel())).values).float())

    def forward(self, x):
        h = F.relu(F.linear(x, self.net[0].weight * self.mask0, self.net[0].bias))
        h = F.relu(F.linear(h, self.net[2].weight * self.mask2, self.net[2].bias))
        return self.net[4](h)


def prune_mask_before_load(fixed: bool = False):
    seed(0)
    tl, vl = _data(28)
    from benchmarks.blind_preflight_be.synth import teacher
    state = {f"net.{k}": v for k, v in teacher(3000, 16, 5, 28).state_dict().items()}
    model = MaskedMLP()
    if fixed:
        model.load_state_dict(state, strict=False)
        model.compute_masks()
    else:
        model.compute_masks()                                   # 90% magnitude pruning ...
        model.load_state_dict(state, strict=False)              # ... of the pretrained checkpoint (no mask keys)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-4), train_loader=tl,
                val_loader=vl, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("prune_mask_before_load", "mechanics",
     "The magnitude masks are computed from the random initial weights before load_state_dict brings in the "
     "pretrained checkpoint, so the 95% mask is random with respect to the trained weights and removes most of the "
     "important ones; load the checkpoint first, then compute the masks.",
     r"before (load|loading)|load_state_dict|random (init|initial|weights)|(mask|masks).{0,80}(init|random|before)|"
     r"(compute|recompute) the masks? after|order",
     )(prune_mask_before_load)
fix("prune_mask_before_load", fixed_of(prune_mask_before_load), plain_acc, "val acc")
