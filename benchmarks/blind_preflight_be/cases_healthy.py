"""Healthy cases: five corrected twins of broken cases and five unusual but correct setups of this domain."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_be.cases_data import kd_cached_logits_shuffled
from benchmarks.blind_preflight_be.cases_mechanics import ewc_anchor_by_reference
from benchmarks.blind_preflight_be.cases_shapes import structured_prune_wrong_axis
from benchmarks.blind_preflight_be.cases_targets import class_incremental_no_offset
from benchmarks.blind_preflight_be.cases_trained import qat_round_without_ste
from benchmarks.blind_preflight_be.registry import healthy, loader, seed, twin
from benchmarks.blind_preflight_be.synth import blobs, mlp, split, teacher

# --- corrected twins -----------------------------------------------------------------------------------------------------
healthy("structured_prune_rows",
        "Structured pruning of fc1 by row (per-neuron) norms, 75% of the hidden units masked in the forward.",
        )(twin(structured_prune_wrong_axis))
healthy("qat_fake_quant_with_ste",
        "4-bit per-channel fake-quant Linear layers with a straight-through estimator (w + (w_q - w).detach()).",
        )(twin(qat_round_without_ste))
healthy("class_incremental_offset_labels",
        "Class-incremental step: replay buffer of old classes plus new classes offset to 4..7 in an 8-way head.",
        )(twin(class_incremental_no_offset))
healthy("kd_cached_logits_in_order",
        "Distillation from teacher logits cached with an unshuffled loader, aligned with the samples.",
        )(twin(kd_cached_logits_shuffled))
healthy("ewc_anchor_cloned",
        "EWC on a two-head network after task A, anchor = detached clones, Fisher from squared gradients.",
        )(twin(ewc_anchor_by_reference))


def _data(s, c=5, batch=64):
    x, y = blobs(3000, 16, c, s)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    return x, y, loader(TensorDataset(xt, yt), batch), loader(TensorDataset(xv, yv), 256, False)


# --- unusual but correct ---------------------------------------------------------------------------------------------------
@healthy("kd_reverse_kl_student_first",
         "Reverse-KL (mode-seeking) distillation: KL(student || teacher) written by hand with log-probs, plus CE.")
def kd_reverse_kl_student_first():
    seed(0)
    _, _, tl, vl = _data(40)
    t = teacher(3000, 16, 5, 40)
    student = mlp(16, 32, 5)
    T = 2.0

    def loss_fn(m, batch):
        xb, yb = batch
        s = m(xb)
        log_q = F.log_softmax(s / T, -1)
        with torch.no_grad():
            log_p = F.log_softmax(t(xb) / T, -1)
        rkl = (log_q.exp() * (log_q - log_p)).sum(-1).mean() * T * T
        return 0.5 * rkl + 0.5 * F.cross_entropy(s, yb)
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=loss_fn, max_steps=300)


class GradualPruned(nn.Module):
    """Magnitude pruning on a cubic schedule; masks are buffers recomputed every 20 steps in training mode."""

    def __init__(self, final=0.8, ramp=200):
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(16, 128), nn.Linear(128, 128), nn.Linear(128, 5)
        self.register_buffer("m1", torch.ones(128, 16))
        self.register_buffer("m2", torch.ones(128, 128))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self.final, self.ramp = final, ramp

    @torch.no_grad()
    def _update(self):
        t = min(1.0, self.step.item() / self.ramp)
        sparsity = self.final * (1 - (1 - t) ** 3)
        for layer, mask in ((self.fc1, self.m1), (self.fc2, self.m2)):
            k = int(sparsity * mask.numel())
            if k > 0:
                thr = layer.weight.abs().flatten().kthvalue(k).values
                mask.copy_((layer.weight.abs() > thr).float())

    def forward(self, x):
        if self.training:
            if self.step.item() % 20 == 0:
                self._update()
            self.step += 1
        h = F.relu(F.linear(x, self.fc1.weight * self.m1, self.fc1.bias))
        h = F.relu(F.linear(h, self.fc2.weight * self.m2, self.fc2.bias))
        return self.out(h)


@healthy("gradual_magnitude_pruning_buffers",
         "Gradual (cubic) magnitude pruning to 80% with masks as registered buffers applied in the forward.")
def gradual_magnitude_pruning_buffers():
    seed(0)
    _, _, tl, vl = _data(41)
    model = GradualPruned()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


class LSQLinear(nn.Linear):
    """Learned-step-size quantisation: a trainable per-tensor step for weights and activations, STE on round."""

    def __init__(self, i, o, bits=4):
        super().__init__(i, o)
        self.qmax = 2 ** (bits - 1) - 1
        self.w_step = nn.Parameter(self.weight.detach().abs().mean() * 2 / self.qmax ** 0.5)
        self.a_step = nn.Parameter(torch.tensor(0.1))

    @staticmethod
    def _q(x, step, lo, hi):
        v = torch.clamp(x / step, lo, hi)
        return (v + (torch.round(v) - v).detach()) * step

    def forward(self, x):
        return F.linear(self._q(x, self.a_step, -self.qmax - 1, self.qmax),
                        self._q(self.weight, self.w_step, -self.qmax - 1, self.qmax), self.bias)


@healthy("qat_learned_step_size",
         "LSQ-style QAT: 4-bit weights and activations with trainable step sizes and a straight-through round.")
def qat_learned_step_size():
    seed(0)
    _, _, tl, vl = _data(42)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), LSQLinear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


class TiedAE(nn.Module):
    """Autoencoder whose decoder reuses the encoder's weight transposed (weight sharing)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(20, 6)
        self.dec_bias = nn.Parameter(torch.zeros(20))

    def forward(self, x):
        return F.linear(torch.tanh(self.enc(x)), self.enc.weight.t(), self.dec_bias)


@healthy("tied_weight_autoencoder",
         "Low-rank autoencoder with tied weights (decoder = encoder.weight.t()), nn.MSELoss on (x,) batches.")
def tied_weight_autoencoder():
    seed(0)
    g = torch.Generator().manual_seed(43)
    z = torch.randn(2400, 4, generator=g)
    x = z @ torch.randn(4, 20, generator=g) / 2 + 0.05 * torch.randn(2400, 20, generator=g)
    model = TiedAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000]), 64), val_loader=loader(TensorDataset(x[2000:]), 200, False),
                loss_fn=nn.MSELoss(), max_steps=300)


class HintStudent(nn.Module):
    """Student with a FitNets-style regressor from its hidden layer to the teacher's (part of the module)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 5)
        self.regressor = nn.Linear(32, 128)

    def forward(self, x):
        return self.head(self.body(x))


@healthy("hint_distillation_with_regressor",
         "Feature (hint) distillation: the student's regressor maps its 32-d hidden to the teacher's 128-d hidden; "
         "loss = CE + 0.5 * MSE on the hints, the regressor trained with the student.")
def hint_distillation_with_regressor():
    seed(0)
    _, _, tl, vl = _data(44)
    t = teacher(3000, 16, 5, 44)
    model = HintStudent()

    def loss_fn(m, batch):
        xb, yb = batch
        h = m.body(xb)
        with torch.no_grad():
            ht = t[:4](xb)                       # the teacher's second hidden layer (after ReLU)
        return F.cross_entropy(m.head(h), yb) + 0.5 * F.mse_loss(m.regressor(h), ht)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=loss_fn, max_steps=300)
