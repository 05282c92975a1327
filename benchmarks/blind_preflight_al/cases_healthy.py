"""Set al, healthy cases: five corrected twins of broken cases and five unusual but correct setups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_al.cases_data import SpecCNN, al_image_mask_separate_random, tone_spectrograms
from benchmarks.blind_preflight_al.cases_mechanics import TwoHead, al_lambdalr_returns_lr, listings
from benchmarks.blind_preflight_al.cases_shapes import al_hwc_reshape_not_permute
from benchmarks.blind_preflight_al.cases_targets import DictDS, al_ntxent_self_positive, ner_batch, tiny_bert_tagger
from benchmarks.blind_preflight_al.cases_trained import al_head_replaced_after_optimizer
from benchmarks.blind_preflight_al.registry import adam, ds, gen, healthy, loader, seed, teacher_classes, twin

healthy("al_h_hwc_permute", "Twin of al_hwc_reshape_not_permute: channels-last tiles permuted to NCHW.")(
    twin(al_hwc_reshape_not_permute))
healthy("al_h_ntxent_masked", "Twin of al_ntxent_self_positive: diagonal masked, positive at (i + N) % 2N.")(
    twin(al_ntxent_self_positive))
healthy("al_h_head_before_optimizer", "Twin of al_head_replaced_after_optimizer: new head assigned, then the optimizer.")(
    twin(al_head_replaced_after_optimizer))
healthy("al_h_lambdalr_factor", "Twin of al_lambdalr_returns_lr: the warm-up lambda returns a factor in (0, 1].")(
    twin(al_lambdalr_returns_lr))
healthy("al_h_joint_flip", "Twin of al_image_mask_separate_random: one random draw flips image and mask together.")(
    twin(al_image_mask_separate_random))


@healthy("al_h_bert_ner_frozen_embeddings", "Tiny BERT token classifier from a config, labels on the first word-piece "
         "and -100 elsewhere, frozen word embeddings, AdamW with a no-decay group for biases and LayerNorm, warm-up.")
def al_h_bert_ner_frozen_embeddings():
    seed(0)
    ids, att, labels, _ = ner_batch(800, 61, True)
    model = tiny_bert_tagger()
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if ("bias" in n or "LayerNorm" in n) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], 3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    return dict(model=model, optimizer=opt, scheduler=sched, loss_fn=None, max_steps=300,
                train_loader=loader(DictDS(input_ids=ids, attention_mask=att, labels=labels)))


class Seq2SeqGRU(nn.Module):
    """Reverses padded digit strings: encoder GRU, decoder GRU fed [BOS] + target[:-1] (teacher forcing)."""

    def __init__(self, vocab=14, d=48):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.enc, self.dec = nn.GRU(d, d, batch_first=True), nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src, dec_in):
        _, h = self.enc(self.emb(src))
        return self.out(self.dec(self.emb(dec_in), h)[0])


def reversal_batches(n, s, max_len=8):
    g = gen(s)
    src = torch.zeros(n, max_len, dtype=torch.long)
    tgt = torch.full((n, max_len + 1), -100, dtype=torch.long)
    dec_in = torch.zeros(n, max_len + 1, dtype=torch.long)
    for i in range(n):
        L = int(torch.randint(3, max_len + 1, (1,), generator=g))
        digits = torch.randint(3, 14, (L,), generator=g)
        src[i, :L] = digits
        out = torch.cat([digits.flip(0), torch.tensor([2])])             # EOS = 2
        tgt[i, :L + 1] = out
        dec_in[i, 0], dec_in[i, 1:L + 1] = 1, out[:-1]                   # BOS = 1, shifted right
    return src, dec_in, tgt


def seq2seq_loss(model, batch):
    logits = model(batch[0], batch[1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[2].reshape(-1), ignore_index=-100)


@healthy("al_h_gru_seq2seq_reverse", "GRU encoder-decoder reversing padded strings with teacher forcing: decoder input "
         "is [BOS] + target[:-1], padded target positions are -100 and ignored.")
def al_h_gru_seq2seq_reverse():
    seed(0)
    src, dec_in, tgt = reversal_batches(1200, 63)
    model = Seq2SeqGRU()
    return dict(model=model, optimizer=adam(model, 5e-3), train_loader=loader(ds(src, dec_in, tgt)),
                loss_fn=seq2seq_loss, clip_grad_norm=1.0)


class UncertaintyWeighted(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = TwoHead()
        self.log_var = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return self.net(x)


def uncertainty_loss(model, batch):
    x, price, kind = batch
    p, k = model(x)
    s = model.log_var
    return (0.5 * torch.exp(-s[0]) * F.mse_loss(p, price) + 0.5 * s[0]
            + torch.exp(-s[1]) * F.cross_entropy(k, kind) + 0.5 * s[1])


@healthy("al_h_multitask_uncertainty", "Two-head tabular model (standardized price + property type) whose task "
         "losses are weighted by learned homoscedastic log-variances (Kendall et al.).")
def al_h_multitask_uncertainty():
    seed(0)
    x, price, kind = listings(1200, 65)
    model = UncertaintyWeighted()
    return dict(model=model, optimizer=adam(model, 3e-3), loss_fn=uncertainty_loss,
                train_loader=loader(ds(x, (price - 250_000) / 80_000, kind)))


def kd_loss(teacher, temperature=3.0, alpha=0.7):
    def loss_fn(model, batch):
        x, y = batch
        s = model(x)
        with torch.no_grad():
            t = teacher.to(x.device)(x)
        kd = F.kl_div(F.log_softmax(s.float() / temperature, -1), F.softmax(t.float() / temperature, -1),
                      reduction="batchmean") * temperature ** 2
        return alpha * kd + (1 - alpha) * F.cross_entropy(s.float(), y)
    return loss_fn


@healthy("al_h_distill_kd_bf16", "Knowledge distillation under bf16 autocast: a frozen teacher outside the model and "
         "optimizer, KL(log_softmax(s/T) || softmax(t/T), batchmean) * T^2 plus hard-label cross-entropy.")
def al_h_distill_kd_bf16():
    seed(0)
    x, y = teacher_classes(1500, 16, 5, 67)
    teacher = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
    topt = torch.optim.Adam(teacher.parameters(), 1e-2)
    for _ in range(60):                                           # a quick "pretrained" teacher
        topt.zero_grad()
        F.cross_entropy(teacher(x), y).backward()
        topt.step()
    teacher.requires_grad_(False).eval()
    student = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
    return dict(model=student, optimizer=adam(student), precision="bf16", loss_fn=kd_loss(teacher),
                train_loader=loader(ds(x, y)))


class TimeMasked(Dataset):
    """SpecAugment-style time masking on the input spectrogram only; the label is untouched."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i].clone()
        t0 = int(torch.randint(0, 12, (1,)))
        x[..., t0:t0 + 4] = 0
        return x, self.y[i]


@healthy("al_h_spec_cnn_specaugment", "Audio CNN on spectrograms resampled with F.interpolate, time masking on the "
         "inputs only, OneCycleLR over max_steps, 2 accumulation steps and gradient clipping.")
def al_h_spec_cnn_specaugment():
    seed(0)
    x, y = tone_spectrograms(900, 69, True)
    model = SpecCNN()
    opt = torch.optim.AdamW(model.parameters(), 2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=400)
    return dict(model=model, optimizer=opt, scheduler=sched, max_steps=400, accumulation_steps=2, clip_grad_norm=1.0,
                train_loader=loader(TimeMasked(x, y)), loss_fn=nn.CrossEntropyLoss())
