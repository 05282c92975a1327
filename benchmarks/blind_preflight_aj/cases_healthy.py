"""Set aj, healthy cases: 5 corrected twins of broken cases and 5 unusual but correct setups. None may raise a
warning or an error."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import transformers  # noqa: E402
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_aj.cases_data import listdir_order, speaker_vectors
from benchmarks.blind_preflight_aj.cases_mechanics import vae_kl_sum
from benchmarks.blind_preflight_aj.cases_shapes import imu_conv1d_view
from benchmarks.blind_preflight_aj.cases_targets import har_ignore_index, tagged_clips
from benchmarks.blind_preflight_aj.cases_trained import DictDataset, rating_clamp
from benchmarks.blind_preflight_aj.registry import gen, healthy, loader, seed, token_sequences, twin

# ---- corrected twins ---------------------------------------------------------------------------------------------

healthy("aj_h_imu_conv1d_permute", "IMU windows (batch, time, axes) permuted to (batch, axes, time) for Conv1d "
        "(twin of aj_imu_conv1d_view_not_permute)")(twin(imu_conv1d_view))
healthy("aj_h_har_default_ignore_index", "activity classifier with the default ignore_index=-100, class 0 "
        "'walking' trained like the others (twin of aj_har_ignore_index_real_class)")(twin(har_ignore_index))
healthy("aj_h_rating_sigmoid_range", "rating model mapping scores into 1..5 with 1 + 4 * sigmoid instead of clamp "
        "(twin of aj_rating_clamp_kills_gradient)")(twin(rating_clamp))
healthy("aj_h_vae_per_sample_elbo", "VAE with summed reconstruction and KL, both divided by the batch size "
        "(twin of aj_vae_kl_sum_recon_mean)")(twin(vae_kl_sum))
healthy("aj_h_folder_sorted_listing", "keyword Dataset reading sorted(os.listdir()) so files and CSV labels line "
        "up (twin of aj_listdir_order_vs_sorted_labels)")(twin(listdir_order))


# ---- 1. multi-label tagging with per-tag pos_weight under bf16 autocast and clipping --------------------------------

@healthy("aj_h_multilabel_pos_weight_bf16", "multi-label sound-event tagger, BCEWithLogitsLoss with per-tag "
         "pos_weight = n_neg / n_pos, bf16 autocast, AdamW with weight decay and grad clipping")
def multilabel_pos_weight_bf16():
    seed(0)
    x, y = tagged_clips(1500, 11)
    ytr = y[:1200]
    pos_weight = ((1 - ytr).sum(0) / ytr.sum(0).clamp(min=1)).clamp(max=20)
    model = nn.Sequential(nn.Linear(24, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 8))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(x[:1200], ytr), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pos_weight), precision="bf16", clip_grad_norm=1.0,
                max_steps=400)


# ---- 2. triplet metric learning on L2-normalised embeddings, Nesterov SGD and a cosine schedule --------------------

class TripletSet(Dataset):
    def __init__(self, x, spk, s: int = 0):
        self.x, self.spk = x, spk
        self.by = {int(c): torch.nonzero(spk == c).flatten() for c in spk.unique()}
        self.g = torch.Generator().manual_seed(s)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        c = int(self.spk[i])
        same = self.by[c][self.by[c] != i]
        p = int(same[torch.randint(len(same), (1,), generator=self.g)])
        n = int(torch.randint(len(self.x), (1,), generator=self.g))
        while int(self.spk[n]) == c:
            n = int(torch.randint(len(self.x), (1,), generator=self.g))
        return self.x[i], self.x[p], self.x[n]


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


@healthy("aj_h_triplet_normalized_cosine", "speaker embeddings trained with nn.TripletMarginLoss on L2-normalised "
         "vectors, batches of (anchor, positive, negative), Nesterov SGD and CosineAnnealingLR over max_steps")
def triplet_normalized():
    seed(0)
    x, spk = speaker_vectors(1200, 21)
    model = Embedder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    criterion = nn.TripletMarginLoss(margin=0.3)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=400),
                train_loader=loader(TripletSet(x, spk), 32),
                loss_fn=lambda model, batch: criterion(model(batch[0]), model(batch[1]), model(batch[2])),
                max_steps=400)


# ---- 3. GRU forecaster: gradient accumulation, clipping and OneCycleLR counted in optimizer steps -----------------

def load_windows(n: int, s: int, T: int = 24):
    g = gen(s)
    t = torch.arange(T + 1).float()
    period = 8 + 8 * torch.rand(n, 1, generator=g)
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    level = torch.randn(n, 1, generator=g) * 0.3
    series = level + torch.sin(2 * math.pi * t / period + phase) + 0.05 * torch.randn(n, T + 1, generator=g)
    return series[:, :T, None], series[:, T]


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(1, 32, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        return self.out(self.gru(x)[1][-1]).squeeze(-1)


@healthy("aj_h_gru_forecast_accumulation", "GRU next-value forecaster of household load windows with "
         "accumulation_steps=4 over micro-batches of 16, clip_grad_norm=0.5 and OneCycleLR(total_steps=max_steps)")
def gru_forecast():
    seed(0)
    x, y = load_windows(1600, 31)
    model = Forecaster()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=200),
                train_loader=loader(TensorDataset(x[:1300], y[:1300]), 16),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=lambda model, batch: F.mse_loss(model(batch[0]), batch[1]),
                accumulation_steps=4, clip_grad_norm=0.5, max_steps=200)


# ---- 4. tiny GPT-2 from a config on padded batches, -100 labels on padding, linear warm-up -------------------------

def padded_lm_batch(rows):
    lengths = [int(r[1]) for r in rows]
    ids = [r[0][:n] for r, n in zip(rows, lengths)]
    input_ids = pad_sequence(ids, batch_first=True, padding_value=0)
    attention_mask = pad_sequence([torch.ones(n, dtype=torch.long) for n in lengths], batch_first=True)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@healthy("aj_h_tiny_gpt2_padded_warmup", "GPT2LMHeadModel built from a tiny config on right-padded sequences with "
         "an attention_mask and labels = input_ids with -100 on padding, AdamW and a LambdaLR linear warm-up factor")
def tiny_gpt2_padded():
    seed(0)
    seqs = token_sequences(800, 20, 40, s=41)
    lengths = torch.randint(10, 21, (800,), generator=gen(42))
    config = transformers.GPT2Config(vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 30)),
                train_loader=loader(TensorDataset(seqs, lengths), 32, collate_fn=padded_lm_batch),
                max_steps=300)


# ---- 5. tiny BERT regression head (num_labels=1) with frozen word embeddings and two LR groups --------------------

@healthy("aj_h_bert_regression_frozen_embeddings", "BertForSequenceClassification(num_labels=1) regressing a review "
         "score from float labels, word embeddings frozen on purpose, encoder and head in two AdamW groups")
def bert_regression():
    seed(0)
    g = gen(51)
    ids = torch.randint(5, 40, (1200, 12), generator=g)
    ids[:, 0] = 1
    score = ((ids >= 30).float().sum(1) - (ids < 12).float().sum(1)) / 3.0
    config = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=1,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    model = transformers.BertForSequenceClassification(config)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    encoder = [p for n, p in model.named_parameters() if n.startswith("bert.") and p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": encoder, "lr": 1e-3},
                                   {"params": model.classifier.parameters(), "lr": 3e-3}], weight_decay=0.01)
    mask = torch.ones_like(ids)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(DictDataset(input_ids=ids[:1000], attention_mask=mask[:1000], labels=score[:1000]),
                                    32),
                val_loader=loader(DictDataset(input_ids=ids[1000:], attention_mask=mask[1000:], labels=score[1000:]),
                                  100, shuffle=False),
                max_steps=300)
