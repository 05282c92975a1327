"""Set bb, healthy: five corrected twins of broken cases and five unusual but correct setups."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_bb.cases_data import kws_train_audio_not_resampled
from benchmarks.blind_preflight_bb.cases_mechanics import (
    DotRec,
    PaddedSASRec,
    left_padded,
    popular_next,
    popularity_sampled_softmax,
    sasrec_no_causal_mask,
)
from benchmarks.blind_preflight_bb.cases_shapes import FrameTagger, nextitnet_readout_at_padding, sed_data
from benchmarks.blind_preflight_bb.cases_targets import sampled_softmax_positive_last_column
from benchmarks.blind_preflight_bb.cases_trained import (
    ProbeNet,
    item_embeddings_frozen_from_pretrained,
    pretrained_frontend_state,
)
from benchmarks.blind_preflight_bb.registry import healthy, loader, seed, twin
from benchmarks.blind_preflight_bb.synth import log_spec, nuisance_mels, tensors, tone_clips

healthy("nextitnet_readout_at_padding_fixed",
        "Twin: the causal CNN reads each right-padded session at its last real item (index lengths - 1).")(
    twin(nextitnet_readout_at_padding))
healthy("sampled_softmax_positive_last_column_fixed",
        "Twin: the sampled-softmax logits put the positive in column 0, matching the all-zeros target.")(
    twin(sampled_softmax_positive_last_column))
healthy("item_embeddings_frozen_from_pretrained_fixed",
        "Twin: nn.Embedding.from_pretrained(..., freeze=False) so the category-initialised item vectors train.")(
    twin(item_embeddings_frozen_from_pretrained))
healthy("sasrec_no_causal_mask_fixed",
        "Twin: the self-attention next-item model trains every position under a causal mask.")(
    twin(sasrec_no_causal_mask))
healthy("kws_train_audio_not_resampled_fixed",
        "Twin: the 16 kHz training clips are resampled to the pipeline's 8 kHz before the STFT.")(
    twin(kws_train_audio_not_resampled))


def warmup_cosine(optimizer, warmup, total):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@healthy("probe_frozen_frontend_warmup_cosine",
         "A linear-probe-style run: the DataParallel checkpoint's 'module.' prefix is stripped and loaded strictly, "
         "the front end is frozen on purpose, AdamW trains the head with decay on weights only, under a 20-step warm-up "
         "and a cosine schedule sized for its 200 steps.")
def probe_frozen_frontend_warmup_cosine():
    seed(0)
    x, y = nuisance_mels(1800, 8, 61)
    model = ProbeNet(8)
    model.load_state_dict({k.removeprefix("module."): v for k, v in pretrained_frontend_state().items()}
                          | {k: v for k, v in model.state_dict().items() if k.startswith("head.")})
    model.frontend.requires_grad_(False)
    decay = [p for n, p in model.head.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.head.named_parameters() if n.endswith("bias")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-3)
    return dict(model=model, optimizer=optimizer, scheduler=warmup_cosine(optimizer, 20, 200),
                train_loader=tensors(x[:1400], y[:1400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1400:], y[1400:], shuffle=False), max_steps=200)


@healthy("sasrec_left_padded_bf16",
         "A self-attention next-item model on left-padded sessions, src_key_padding_mask True on the padding, read at "
         "the last position (always a real item), trained under bf16 autocast.")
def sasrec_left_padded_bf16():
    seed(0)
    seq, target = left_padded(3000, 30, 62)
    model = PaddedSASRec(30, mask_is_padding=True)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), 1e-3),
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), precision="bf16", max_steps=200)


@healthy("sampled_softmax_logq_accumulation",
         "Popularity-sampled negatives with the log Q correction, a custom loss_fn(model, batch), 2-step gradient "
         "accumulation and clipping at 5.")
def sampled_softmax_logq_accumulation():
    seed(0)
    last, nxt, q = popular_next(6000, 200, 63)
    model = DotRec(200)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(last[:5000], nxt[:5000], batch_size=64),
                loss_fn=popularity_sampled_softmax(q, True),
                val_loader=tensors(last[5000:], nxt[5000:], shuffle=False), accumulation_steps=2,
                clip_grad_norm=5.0, max_steps=200)


class SpecAugmented(Dataset):
    """Standardised log-mel clips; in training, one frequency mask (<= 4 bands) and one time mask (<= 6 frames)
    filled with 0, the dataset mean after standardisation."""

    def __init__(self, x, y, augment):
        self.x, self.y, self.augment = x, y, augment

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i].clone()
        if self.augment:
            f0, fw = int(torch.randint(0, 28, ())), int(torch.randint(0, 5, ()))
            t0, tw = int(torch.randint(0, 26, ())), int(torch.randint(0, 7, ()))
            x[f0:f0 + fw] = 0.0
            x[:, t0:t0 + tw] = 0.0
        return x, self.y[i]


class KWSConv(nn.Module):
    def __init__(self, n_cls):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(32, 64, 3, padding=1), nn.BatchNorm1d(64), nn.ReLU(),
                                 nn.Conv1d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                                 nn.Dropout(0.1), nn.Linear(64, n_cls))

    def forward(self, x):
        return self.net(x)


@healthy("kws_specaugment_onecycle",
         "Keyword spotting with SpecAugment masks (filled with the dataset mean) in the training Dataset only, "
         "BatchNorm and dropout, OneCycleLR with total_steps = max_steps and clipping at 1.")
def kws_specaugment_onecycle():
    seed(0)
    wav, y = tone_clips(1600, 10, 64)
    x = log_spec(wav)
    x = (x - x[:1200].mean()) / x[:1200].std()
    model = KWSConv(10)
    optimizer = torch.optim.AdamW(model.parameters(), 2e-3)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=200),
                train_loader=loader(SpecAugmented(x[:1200], y[:1200], True), batch_size=64),
                loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(SpecAugmented(x[1200:], y[1200:], False), batch_size=64, shuffle=False),
                clip_grad_norm=1.0, max_steps=200)


class AttentionPoolTagger(nn.Module):
    """Frame logits (B, T, C) and a per-frame, per-class attention; clip logits = attention-weighted sum over time."""

    def __init__(self, n_cls):
        super().__init__()
        self.frames = FrameTagger(n_cls)
        self.att = nn.Linear(32, n_cls)

    def forward(self, x):
        logits = self.frames(x)                                   # (B, T, C)
        w = torch.softmax(self.att(x.transpose(1, 2)), dim=1)     # over time
        return (w * logits).sum(1)                                # (B, C)


@healthy("sed_attention_pooling_pos_weight",
         "Multi-label sound events: frame logits pooled over time by a learned attention (softmax over dim=1), "
         "BCEWithLogitsLoss with pos_weight for the rare positives.")
def sed_attention_pooling_pos_weight():
    seed(0)
    x, y = sed_data(1600, 65)
    pos = y[:1200].mean(0)
    model = AttentionPoolTagger(16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(x[:1200], y[:1200]),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=((1 - pos) / pos).clamp(max=10)),
                val_loader=tensors(x[1200:], y[1200:], shuffle=False), max_steps=200)


_ = F
