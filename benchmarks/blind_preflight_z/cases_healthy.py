"""Healthy cases: five corrected twins of broken cases (the same builder with the one-line fix) and five unusual but
correct setups. None of them should raise a warning or an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_z import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_z.registry import gen, healthy, loader, seed, to_dev, twin

# --------------------------------------------------------------------------------------------------------------
# Corrected twins.

healthy("posenc_batch_first_fixed", "Twin of posenc_seq_first_on_batch_first: the positional encoding is sliced by "
        "x.size(1) and transposed to (1, seq, d) for batch-first input.")(
    twin(cases_shapes.posenc_seq_first_on_batch_first))
healthy("bce_mask_scaled_fixed", "Twin of bce_mask_values_0_255: masks divided by 255 before BCEWithLogitsLoss.")(
    twin(cases_targets.bce_mask_values_0_255))
healthy("state_dict_prefix_stripped_fixed", "Twin of state_dict_module_prefix_strict_false: the 'module.' prefix is "
        "stripped so the encoder really loads, then it is frozen and only the head trains.")(
    twin(cases_trained.state_dict_module_prefix_strict_false))
healthy("lambdalr_factor_fixed", "Twin of lambdalr_returns_lr_not_factor: the LambdaLR lambda returns the warm-up / "
        "inverse-sqrt factor.")(twin(cases_mechanics.lambdalr_returns_lr_not_factor))
healthy("dummies_aligned_fixed", "Twin of dummies_encoded_per_split: the validation city column is one-hot encoded "
        "with the training categories.")(twin(cases_data.dummies_encoded_per_split))

# --------------------------------------------------------------------------------------------------------------
# 1. A tiny ViT built from a config on 16x16 colour-blob images, dict batches (pixel_values, labels), loss from
#    the model, AdamW with a linear warm-up, clipping.


class PixelDicts(Dataset):
    def __init__(self, n, s):
        imgs, ys = cases_shapes._blob_images(n, s)
        self.x = torch.from_numpy(imgs).permute(0, 3, 1, 2).contiguous()
        self.y = torch.from_numpy(ys).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


@healthy("tiny_vit_from_config", "A ViTForImageClassification built from a small ViTConfig on 16x16 images in dict "
         "batches, loss from model(**batch).loss, AdamW with a LinearLR warm-up and clip_grad_norm=1.0.")
def tiny_vit_from_config():
    from transformers import ViTConfig, ViTForImageClassification
    seed(0)
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, num_labels=3, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    model = ViTForImageClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=20)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(PixelDicts(1000, 41), 32),
                val_loader=loader(PixelDicts(200, 42), 100, shuffle=False), loss_fn=None, clip_grad_norm=1.0,
                max_steps=300)


# --------------------------------------------------------------------------------------------------------------
# 2. Multi-label toxicity tags with BCEWithLogitsLoss(pos_weight = negatives / positives) under bf16.


@healthy("multilabel_pos_weight_bf16", "Multi-label tags (rare positives) with BCEWithLogitsLoss and pos_weight = "
         "negatives / positives per tag, trained with precision='bf16'.")
def multilabel_pos_weight_bf16():
    seed(0)
    g = gen(43)
    x = torch.randn(2000, 24, generator=g)
    w = torch.randn(24, 5, generator=gen(431))
    y = ((x @ w) / 24 ** 0.5 > 1.0).float()
    pos = y[:1600].sum(0).clamp(min=1)
    pos_weight = (1600 - pos) / pos
    model = nn.Sequential(nn.Linear(24, 64), nn.GELU(), nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 64),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pos_weight), precision="bf16")


# --------------------------------------------------------------------------------------------------------------
# 3. Heteroscedastic regression: the network predicts a mean and a log-variance, GaussianNLLLoss through a
#    callable loss, two micro-batches per optimizer step.


class MeanVar(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 2))

    def forward(self, x):
        mean, log_var = self.body(x).unbind(-1)
        return mean, log_var.clamp(-6, 6)


def gaussian_nll(model, batch):
    x, y = to_dev(model, *batch)
    mean, log_var = model(x)
    return F.gaussian_nll_loss(mean, y, log_var.exp())


@healthy("gaussian_nll_accumulated", "A mean / log-variance regressor trained with F.gaussian_nll_loss through a "
         "callable loss_fn, noise that grows with |x0|, and accumulation_steps=2.")
def gaussian_nll_accumulated():
    seed(0)
    g = gen(44)
    x = torch.randn(2000, 6, generator=g)
    y = torch.sin(x[:, 0]) + 0.5 * x[:, 1] + (0.1 + 0.4 * x[:, 0].abs()) * torch.randn(2000, generator=g)
    model = MeanVar()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=gaussian_nll, accumulation_steps=2)


# --------------------------------------------------------------------------------------------------------------
# 4. Character LSTM language model with tied input / output embeddings (deliberate weight sharing), padded
#    batches whose pad targets are -100.

CHARS, MAXLEN = 30, 24


class TiedCharLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(CHARS, 48, padding_idx=0)
        self.lstm = nn.LSTM(48, 48, batch_first=True)
        self.decoder = nn.Linear(48, CHARS)
        self.decoder.weight = self.emb.weight  # weight tying

    def forward(self, ids):
        h, _ = self.lstm(self.emb(ids))
        return self.decoder(h)


def _char_batches(n, s):
    g = gen(s)
    seqs = torch.zeros(n, MAXLEN, dtype=torch.long)
    targets = torch.full((n, MAXLEN), -100, dtype=torch.long)
    for i in range(n):
        length = torch.randint(8, MAXLEN + 1, (1,), generator=g).item()
        start = torch.randint(1, CHARS, (1,), generator=g).item()
        step = torch.randint(1, 4, (1,), generator=g).item()
        stream = (start + step * torch.arange(length + 1)) % (CHARS - 1) + 1
        seqs[i, :length] = stream[:-1]
        targets[i, :length] = stream[1:]
    return seqs, targets


def lm_loss(model, batch):
    ids, targets = to_dev(model, *batch)
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, CHARS), targets.reshape(-1), ignore_index=-100)


@healthy("tied_char_lstm_padded", "A character LSTM LM whose decoder weight is tied to the embedding on purpose, "
         "right-padded sequences with pad targets -100 and cross_entropy(ignore_index=-100).")
def tied_char_lstm_padded():
    seed(0)
    x, t = _char_batches(1500, 45)
    model = TiedCharLM()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], t[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], t[1200:]), 150, shuffle=False), loss_fn=lm_loss,
                clip_grad_norm=5.0)


# --------------------------------------------------------------------------------------------------------------
# 5. Siamese duplicate-question detector: one encoder applied to both inputs (intended sharing), a scaled cosine
#    similarity as the logit, OneCycleLR sized to max_steps.


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
        self.scale = nn.Parameter(torch.tensor(5.0))

    def forward(self, pair):
        a, b = pair.unbind(1)
        return self.scale * F.cosine_similarity(self.encoder(a), self.encoder(b), dim=-1)


def _pairs(n, s=46):
    g = gen(s)
    a = torch.randn(n, 16, generator=g)
    same = torch.randint(0, 2, (n,), generator=g)
    b = torch.where(same[:, None] == 1, a + 0.3 * torch.randn(n, 16, generator=g), torch.randn(n, 16, generator=g))
    return torch.stack([a, b], 1), same.float()


@healthy("siamese_shared_encoder_onecycle", "A siamese pair classifier that applies the same encoder to both inputs "
         "on purpose, BCEWithLogitsLoss on a learnable-scale cosine similarity, OneCycleLR with total_steps = "
         "max_steps.")
def siamese_shared_encoder_onecycle():
    seed(0)
    x, y = _pairs(2000)
    model = Siamese()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=300)
    return dict(model=model, optimizer=opt, scheduler=sched, max_steps=300,
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss())
