"""Set ae, family what_is_trained: the weights the loss depends on are not the weights the optimizer steps."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ae.models import GRUSeq2Seq, seq2seq_batches
from benchmarks.blind_preflight_ae.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
    smooth_signals,
)


# 1. A spectrum autoencoder built for 80 bins is adapted to 96-bin spectra by replacing its output layer AFTER the
#    optimizer was created: the new nn.Linear's weights are not in the optimizer and stay at their random init.
def spectrum_ae(fixed: bool = False):
    seed(0)
    x = smooth_signals(1500, 96, rank=12, s=61)
    train, val = x[:1200], x[1200:]
    model = nn.Sequential(nn.Linear(96, 128), nn.ReLU(), nn.Linear(128, 32), nn.ReLU(), nn.Linear(32, 80))
    if fixed:
        model[-1] = nn.Linear(32, 96)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if not fixed:
        model[-1] = nn.Linear(32, 96)            # the spectra have 96 bins, not 80
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(train, train), 64),
                val_loader=loader(TensorDataset(val, val), 300, shuffle=False), loss_fn=nn.MSELoss(), max_steps=3000)


case("ae_output_layer_replaced_after_optimizer", "what_is_trained",
     bug="The autoencoder's output layer is replaced (model[-1] = nn.Linear(32, 96)) after torch.optim.Adam was "
         "constructed from model.parameters(): the new layer's weight and bias are not in the optimizer's "
         "param_groups, get gradients but are never updated, and the reconstruction stays confined to a random "
         "subspace; build the optimizer after the last change to the model.",
     cause_pattern=r"after (creating|building|constructing) the optimi[sz]er|(created|built|constructed) (after|once) the optimi[sz]er"
                   r"|optimi[sz]er (was |is )?(created|built|constructed) (before|earlier)"
                   r"|(replaced|swapped|reassigned|new) (output )?(layer|module|linear|head).{0,80}optimi[sz]er"
                   r"|param_groups?.{0,60}(stale|old|missing|do not|don't)")(spectrum_ae)
fix("ae_output_layer_replaced_after_optimizer", fixed_of(spectrum_ae),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val reconstruction RMSE", higher=False)


# 2. Knowledge distillation on a mostly unlabelled transfer set (3% labelled): the KD term is written with the teacher's logits on
#    both sides of kl_div, so it is a constant and the student learns only from the 3% labelled rows.
class Distiller(nn.Module):
    def __init__(self, teacher: nn.Module, student: nn.Module):
        super().__init__()
        self.teacher, self.student = teacher.requires_grad_(False).eval(), student

    def forward(self, x):
        return self.student(x)


def kd_loss(student_in_kd: bool, T: float = 2.0):
    def loss_fn(model, batch):
        x, y = batch
        s = model(x)
        with torch.no_grad():
            t = model.teacher(x)
        kd_input = s if student_in_kd else t
        kd = F.kl_div(F.log_softmax(kd_input / T, dim=1), F.softmax(t / T, dim=1), reduction="batchmean") * T * T
        hard = F.cross_entropy(s, y, ignore_index=-100, reduction="sum") / (y != -100).sum().clamp(min=1)
        return 0.7 * kd + 0.3 * hard
    return loss_fn


def teacher_net():
    torch.manual_seed(71)
    net = nn.Sequential(nn.Linear(20, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 5))
    with torch.no_grad():
        net[-1].weight.mul_(4.0)
    return net


def transfer_set(n: int, s: int, labelled: float):
    g = gen(s)
    x = torch.randn(n, 20, generator=g)
    with torch.no_grad():
        y = teacher_net()(x).argmax(1)
    hide = torch.rand(n, generator=g) > labelled
    return x, y.masked_fill(hide, -100), y


def distill_teacher_both_sides(fixed: bool = False):
    seed(0)
    x, y_partial, _ = transfer_set(2500, 72, labelled=0.03)
    vx, _, vy = transfer_set(600, 73, labelled=1.0)
    seed(0)
    model = Distiller(teacher_net(), nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)))
    return dict(model=model, optimizer=torch.optim.Adam(model.student.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y_partial), 64),
                val_loader=loader(TensorDataset(vx, vy), 300, shuffle=False),
                loss_fn=kd_loss(student_in_kd=fixed), max_steps=3000)


case("distill_kd_term_uses_teacher_twice", "what_is_trained",
     bug="The distillation term is F.kl_div(log_softmax(teacher_logits / T), softmax(teacher_logits / T)): the "
         "teacher's logits are on both sides, so the KD loss is a constant that does not depend on the student and "
         "the student learns only from the few (3%) labelled rows; the kl_div input must be the student's log-probabilities.",
     cause_pattern=r"teacher('s)? (logits|outputs?|probabilit\w+) (are )?on both sides|compar\w+ the teacher (with|to|against) itself"
                   r"|(KD|distill\w*) (term|loss).{0,80}(constant|does not depend|doesn't depend|independent of the student|no gradient)"
                   r"|student.{0,40}(never|not|no) (receive|get)s? .{0,30}(distill|soft|KD|teacher)"
                   r"|kl_div\(.{0,60}teacher.{0,60}teacher")(distill_teacher_both_sides)
fix("distill_kd_term_uses_teacher_twice", fixed_of(distill_teacher_both_sides),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val student accuracy (teacher labels)")


# 3. A small noise-conditioned denoiser with an EMA copy kept for sampling: the optimizer was built over the EMA copy
#    (model.ema.parameters()) instead of the trained network, so nothing the loss differentiates is ever stepped.
class EMADenoiser(nn.Module):
    def __init__(self, d: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d + 1, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU(), nn.Linear(128, d))
        self.ema = copy.deepcopy(self.net).requires_grad_(False)

    def forward(self, noisy, sigma):
        return self.net(torch.cat([noisy, sigma], 1))


def denoise_loss(model, batch):
    (clean,) = batch
    sigma = 0.2 + 0.8 * torch.rand(clean.shape[0], 1, device=clean.device)
    return F.mse_loss(model(clean + sigma * torch.randn_like(clean), sigma), clean)


def ema_denoiser(fixed: bool = False):
    seed(0)
    x = smooth_signals(1500, 64, rank=6, s=81)
    train, val = x[:1200], x[1200:]
    sigma = torch.full((len(val), 1), 0.5)
    noisy = val + 0.5 * torch.randn(val.shape, generator=gen(82))
    model = EMADenoiser()
    params = model.net.parameters() if fixed else model.ema.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=1e-3),
                train_loader=loader(TensorDataset(train), 64),
                val_loader=loader(TensorDataset(noisy, sigma, val), 300, shuffle=False),
                loss_fn=denoise_loss, max_steps=3000)


case("denoiser_optimizer_built_on_ema_copy", "what_is_trained",
     bug="The optimizer is built over the EMA (moving-average) copy, torch.optim.Adam(model.ema.parameters()), while "
         "the loss runs model.net: the EMA weights have requires_grad=False and never receive gradients, and the "
         "network that gets gradients is not in the optimizer, so no weight changes; optimize model.net.parameters().",
     cause_pattern=r"\bema\b.{0,80}optimi[sz]er|optimi[sz]er.{0,80}\b(ema|moving[- ]average|shadow)\b"
                   r"|(averaged|shadow|ema|moving[- ]average) (copy|model|weights|parameters).{0,60}(never|no|not) (receive|get|have)"
                   r"|model\.ema\.parameters")(ema_denoiser)
fix("denoiser_optimizer_built_on_ema_copy", fixed_of(ema_denoiser),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val denoising RMSE (sigma 0.5)", higher=False)


# 4. A GRU encoder-decoder written after the PyTorch seq2seq tutorial, which keeps one optimizer per network; the
#    user kept only the decoder's: the encoder (and its embedding) never trains.
def seq2seq_decoder_only_opt(fixed: bool = False):
    seed(0)
    vocab, length = 20, 10
    src, dec_in, tgt = seq2seq_batches(3000, length, vocab, "reverse", s=91)
    vs, vd, vt = seq2seq_batches(500, length, vocab, "reverse", s=92)
    model = GRUSeq2Seq(vocab, d=64)
    decoder_params = [*model.emb_tgt.parameters(), *model.decoder.parameters(), *model.out.parameters()]
    params = model.parameters() if fixed else decoder_params
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=3e-3),
                train_loader=loader(TensorDataset(src, dec_in, tgt), 64),
                val_loader=loader(TensorDataset(vs, vd, vt), 250, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]).permute(0, 2, 1), b[2]),
                max_steps=3000, clip_grad_norm=1.0)


case("seq2seq_encoder_left_out_of_optimizer", "what_is_trained",
     bug="Only the decoder's parameters (decoder GRU, target embedding, output layer) are given to the optimizer, a "
         "leftover of the tutorial's separate encoder_optimizer / decoder_optimizer: the encoder GRU and its source "
         "embedding get gradients but are never stepped and stay random; pass model.parameters() to the optimizer.",
     cause_pattern=r"encoder.{0,80}(never|not) (stepped|updated|trained|optimi[sz]ed|in the optimi[sz]er)"
                   r"|encoder_optimizer|only the decoder'?s? param\w*|(encoder|source embedding).{0,60}(missing|left out|absent) from the optimi[sz]er")(seq2seq_decoder_only_opt)
fix("seq2seq_encoder_left_out_of_optimizer", fixed_of(seq2seq_decoder_only_opt),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val teacher-forced token accuracy", steps=400)


# 5. A multi-output model (reconstruction + fault class) whose classification head is created inside forward():
#    a fresh random nn.Linear every call, never registered, never in model.parameters().
class ReconAndClassify(nn.Module):
    def __init__(self, d: int, n_classes: int, head_in_init: bool):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, d))
        self.n_classes = n_classes
        self.head = nn.Linear(16, n_classes) if head_in_init else None

    def forward(self, x):
        z = self.encoder(x)
        head = self.head if self.head is not None else nn.Linear(16, self.n_classes).to(x.device)
        return self.decoder(z), head(z)


def recon_classify_loss(model, batch):
    x, y = batch
    recon, logits = model(x)
    return F.mse_loss(recon, x) + F.cross_entropy(logits, y)


def head_in_forward(fixed: bool = False):
    seed(0)
    g = gen(101)
    centers = torch.randn(4, 24, generator=g) * 1.5
    y = torch.randint(0, 4, (2400,), generator=g)
    x = centers[y] + torch.randn(2400, 24, generator=g)
    model = ReconAndClassify(24, 4, head_in_init=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 400, shuffle=False),
                loss_fn=recon_classify_loss, max_steps=3000)


case("classifier_head_created_in_forward", "what_is_trained",
     bug="The fault-class head is created inside forward() (nn.Linear(16, 4) on every call) instead of in __init__: "
         "it is never registered as a submodule, so it is not in model.parameters() nor the optimizer, and each step "
         "uses a new random head, so the classification output never learns; create the head once in __init__.",
     cause_pattern=r"(inside|in|within) (the )?forward\(?\)?.{0,80}(nn\.Linear|layer|head|module)"
                   r"|(nn\.Linear|layer|head|module).{0,80}(created|constructed|instantiated|built) (inside|in|within) (the )?forward"
                   r"|new (random )?(layer|head|nn\.Linear|weights?) (on )?every (call|step|forward)"
                   r"|(not|never) registered( as a submodule)?|(define|create|construct)\w* (it|the head|the layer) (once )?in __init__")(head_in_forward)
fix("classifier_head_created_in_forward", fixed_of(head_in_forward),
    acc_of(lambda m, b: (m(b[0])[1].argmax(-1), b[1])), "val fault-class accuracy")
