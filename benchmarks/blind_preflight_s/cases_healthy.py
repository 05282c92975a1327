"""Set s, healthy cases: 5 corrected twins of broken cases (the same builder with its one-line fix) and 5 unusual but
correct setups. None may raise a warning or an error.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_s import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_s.registry import DictRows, gen, healthy, loader, seed, twin

# --- corrected twins ------------------------------------------------------------------------------------------------

healthy("intent_bilstm_hidden_view_fixed",
        "bidirectional LSTM intent classifier reading torch.cat([h_n[0], h_n[1]], dim=1)")(
    twin(cases_shapes.intent_bilstm_hidden_view))
healthy("phone_ctc_blank_collides_with_symbol_fixed",
        "CTC phone recogniser with symbols 0..7 and blank=8, the extra output")(
    twin(cases_targets.phone_ctc_blank_collides_with_symbol))
healthy("ratings_mf_factors_plain_tensors_fixed",
        "matrix factorisation with nn.Parameter factor matrices and nn.Embedding biases")(
    twin(cases_trained.ratings_mf_factors_plain_tensors))
healthy("topic_gpt2_schedule_counts_epochs_fixed",
        "tiny GPT-2 classifier with a linear schedule over EPOCHS * len(train_loader) optimizer steps")(
    twin(cases_mechanics.topic_gpt2_schedule_counts_epochs))
healthy("clickstream_sorted_export_small_shuffle_buffer_fixed",
        "label-sorted export streamed through a shuffle buffer as large as the export")(
    twin(cases_data.clickstream_sorted_export_small_shuffle_buffer))

# --- unusual but correct --------------------------------------------------------------------------------------------


class GaitSeqFirstTransformer(nn.Module):
    """A sequence-first encoder (the nn.Transformer default) used as documented: the (batch, time, ch) windows are
    transposed to (time, batch, d) and pooled over time (dim 0)."""

    def __init__(self, channels: int = 4, d_model: int = 32, n_classes: int = 4, steps: int = 24):
        super().__init__()
        self.inp = nn.Linear(channels, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(steps, 1, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, x):
        h = self.encoder(self.inp(x.transpose(0, 1)) + self.pos)   # (time, batch, d)
        return self.head(h.mean(0))


@healthy("gait_transformer_seq_first_transposed",
         "nn.TransformerEncoder left at batch_first=False and fed (time, batch, d) after an explicit transpose, "
         "mean-pooled over the time dimension 0")
def gait_transformer_seq_first_transposed():
    seed(0)
    x, y = cases_shapes.vibration_windows(1600, 81)
    xv, yv = cases_shapes.vibration_windows(256, 82)
    model = GaitSeqFirstTransformer()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


def spoken_digit_features(n: int, s: int, frames: int = 64, mels: int = 16, vocab: int = 16):
    """Each of 3..7 tokens (ids 3..15) is a 16-band template held for 8 frames; labels end with EOS=2 and are padded
    with -100."""
    g = gen(s)
    templates = torch.randn(vocab, mels, generator=gen(83))
    feats = 0.3 * torch.randn(n, mels, frames, generator=g)
    labels = torch.full((n, 9), -100, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(3, 8, (1,), generator=g))
        toks = torch.randint(3, vocab, (k,), generator=g)
        for j, t in enumerate(toks.tolist()):
            feats[i, :, 8 * j:8 * j + 8] += templates[t][:, None]
        labels[i, :k] = toks
        labels[i, k] = 2
    return feats, labels


@healthy("spoken_digits_tiny_whisper_padded_labels",
         "a tiny WhisperForConditionalGeneration built from a config (16 mel bins, 64 frames) with labels padded with "
         "-100 and EOS-terminated, loss from model(**batch).loss")
def spoken_digits_tiny_whisper_padded_labels():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    seed(0)
    cfg = WhisperConfig(vocab_size=16, num_mel_bins=16, d_model=32, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_source_positions=32, max_target_positions=16, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, decoder_start_token_id=1, dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0, begin_suppress_tokens=None, suppress_tokens=None)
    model = WhisperForConditionalGeneration(cfg)
    x, y = spoken_digit_features(800, 84)
    xv, yv = spoken_digit_features(128, 85)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(DictRows(input_features=x, labels=y), 32),
                val_loader=loader(DictRows(input_features=xv, labels=yv), 64, shuffle=False),
                loss_fn=None, max_steps=300)


@healthy("tone_frozen_filterbank_head_only",
         "a deliberately frozen 'pretrained' cosine filter bank (requires_grad=False) with an optimizer over the new "
         "head's parameters only, built after the head was replaced")
def tone_frozen_filterbank_head_only():
    seed(0)
    x, y = cases_trained.tone_clips(1600, 86)
    xv, yv = cases_trained.tone_clips(256, 87)
    model = cases_trained.FilterBankNet(n_classes=12)
    model.backbone.requires_grad_(False)
    model.head = nn.Linear(24, 5)
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


class TwoTower(nn.Module):
    def __init__(self, n_users: int = 300, n_items: int = 200, d: int = 32):
        super().__init__()
        self.user = nn.Sequential(nn.Embedding(n_users, d), nn.Linear(d, d))
        self.item = nn.Sequential(nn.Embedding(n_items, d), nn.Linear(d, d))
        self.log_temp = nn.Parameter(torch.tensor(math.log(10.0)))

    def forward(self, users, items):
        u = F.normalize(self.user(users), dim=-1)
        v = F.normalize(self.item(items), dim=-1)
        return self.log_temp.exp() * u @ v.T                       # (batch, batch): in-batch negatives


def inbatch_softmax(model, batch):
    users, items = batch
    logits = model(users, items)
    return F.cross_entropy(logits, torch.arange(len(users), device=logits.device))


def clicks(n: int, s: int, n_users: int = 300, n_items: int = 200):
    """Users click items of their 'genre' (user % 10 == item % 10)."""
    g = gen(s)
    users = torch.randint(0, n_users, (n,), generator=g)
    items = (users % 10) + 10 * torch.randint(0, n_items // 10, (n,), generator=g)
    return users, items


@healthy("two_tower_inbatch_negatives_accumulated_bf16",
         "two-tower retrieval trained with an in-batch softmax (labels = arange(batch) on the logits' device), "
         "4-step gradient accumulation, bf16 autocast, clipping at 1.0 and a OneCycleLR sized in optimizer steps")
def two_tower_inbatch_negatives_accumulated_bf16():
    seed(0)
    u, i = clicks(6400, 88)
    uv, iv = clicks(512, 89)
    model = TwoTower()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    max_steps = 300
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=max_steps)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(u, i), 64), val_loader=loader(TensorDataset(uv, iv), 64, shuffle=False),
                loss_fn=inbatch_softmax, accumulation_steps=4, precision="bf16", clip_grad_norm=1.0,
                max_steps=max_steps)


def hourly_counts(n: int, s: int, window: int = 24):
    """Arrivals per hour: Poisson around a daily cycle; each window predicts the next hour's count."""
    g = gen(s)
    t = torch.arange(n + window + 1, dtype=torch.float32)
    rate = torch.exp(1.2 + 0.9 * torch.sin(2 * math.pi * t / 24))
    counts = torch.poisson(rate, generator=g)
    x = torch.stack([counts[i:i + window] for i in range(n)]).unsqueeze(-1)
    return torch.log1p(x), counts[window:window + n]


class CountGRU(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        _, h = self.gru(x)
        return self.out(h[-1]).squeeze(-1)                         # log-rate of the next hour


@healthy("arrivals_gru_poisson_log_rate",
         "count forecaster whose GRU outputs a log-rate trained with nn.PoissonNLLLoss(log_input=True) on integer "
         "counts stored as floats, inputs log1p-scaled")
def arrivals_gru_poisson_log_rate():
    seed(0)
    x, y = hourly_counts(2000, 90)
    xv, yv = hourly_counts(300, 91)
    model = CountGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 100, shuffle=False),
                loss_fn=nn.PoissonNLLLoss(log_input=True), max_steps=400)
