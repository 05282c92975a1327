"""Set l, healthy cases: five corrected twins of broken cases and five unusual but correct setups."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from transformers import ViTConfig, ViTForImageClassification

from benchmarks.blind_preflight_l.cases_data import seg_flip
from benchmarks.blind_preflight_l.cases_mechanics import padding_mask
from benchmarks.blind_preflight_l.cases_shapes import graph_readout
from benchmarks.blind_preflight_l.cases_targets import ner_alignment
from benchmarks.blind_preflight_l.cases_trained import from_pretrained
from benchmarks.blind_preflight_l.registry import gen, healthy, loader, seed, twin

healthy("healthy_graph_readout_with_batch_vector",
        "Twin: the plain-torch GNN's loss passes the batch assignment vector, so the readout pools per graph.")(
    twin(graph_readout))
healthy("healthy_bert_ner_labels_aligned_with_word_ids",
        "Twin: tiny BERT token classifier from a config; each word's tag on its first piece, -100 elsewhere.")(
    twin(ner_alignment))
healthy("healthy_item_embeddings_from_pretrained_unfrozen",
        "Twin: item embeddings start from content vectors with from_pretrained(freeze=False) and are fine-tuned.")(
    twin(from_pretrained))
healthy("healthy_transformer_padding_mask_true_on_pads",
        "Twin: src_key_padding_mask = attention_mask == 0, True on the padding only.")(twin(padding_mask))
healthy("healthy_segmentation_flips_image_and_mask_together",
        "Twin: the same random flips are applied to the image and its mask.")(twin(seg_flip))

# --------------------------------------------------------------------------------------------------------------------
# A tiny ViT from a config, bf16 autocast, dict batches with labels (loss from model(**batch).loss), warm-up + cosine.


def _quadrant_images(n: int, s: int):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.5 * torch.randn(n, 3, 16, 16, generator=g)
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, int(y[i]) % 3, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] += 1.5
    return [{"pixel_values": x[i], "labels": y[i]} for i in range(n)]


@healthy("healthy_tiny_vit_bf16_warmup_cosine",
         "Tiny ViTForImageClassification built from a ViTConfig, precision bf16, AdamW with a LambdaLR warm-up "
         "then cosine factor, clip_grad_norm 1.0, dict batches whose labels give model(**batch).loss.")
def tiny_vit():
    seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=48, num_hidden_layers=2,
                       num_attention_heads=3, intermediate_size=96, num_labels=4, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    model = ViTForImageClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    total, warm = 600, 50
    schedule = lambda step: min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))  # noqa: E731
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
                train_loader=loader(_quadrant_images(2048, 51), 32),
                val_loader=DataLoader(_quadrant_images(256, 52), 128), loss_fn=None, precision="bf16",
                clip_grad_norm=1.0, max_steps=total)

# --------------------------------------------------------------------------------------------------------------------
# A VAE on unlabelled 1-tuple batches, the ELBO as loss_fn(model, batch).


class VAE(nn.Module):
    def __init__(self, d: int = 20, z: int = 2):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 2 * z))
        self.dec = nn.Sequential(nn.Linear(z, 64), nn.ReLU(), nn.Linear(64, d))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        zs = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(zs), mu, logvar


def elbo_loss(model, batch):
    x = batch[0]
    recon, mu, logvar = model(x)
    rec = F.mse_loss(recon, x, reduction="sum") / x.size(0)
    kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum() / x.size(0)
    return rec + kl


@healthy("healthy_vae_elbo_on_unlabelled_batches",
         "A VAE on 1-tuple batches of a 2-D manifold embedded in 20-D; loss_fn(model, batch) returns the ELBO "
         "(summed reconstruction + KL, per sample).")
def vae():
    seed(0)
    g = gen(53)
    t = torch.rand(3072, 2, generator=g) * 2 - 1
    proj = torch.randn(4, 20, generator=g) / 2
    feats = torch.cat([t, torch.sin(3 * t)], 1)
    x = feats @ proj + 0.05 * torch.randn(3072, 20, generator=g)
    x = (x - x.mean(0)) / x.std(0)
    model = VAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x), 64), loss_fn=elbo_loss, max_steps=1500)

# --------------------------------------------------------------------------------------------------------------------
# Triplet-loss speaker embeddings with two LR groups (encoder slower than the projection).


def _triplets(n: int, s: int, protos: torch.Tensor):
    g = gen(s)
    spk = protos.size(0)
    a = torch.randint(0, spk, (n,), generator=g)
    b = (a + torch.randint(1, spk, (n,), generator=g)) % spk
    noise = lambda: 0.8 * torch.randn(n, protos.size(1), generator=g)  # noqa: E731
    return protos[a] + noise(), protos[a] + noise(), protos[b] + noise()


class TripletNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(24, 64), nn.ReLU())
        self.proj = nn.Linear(64, 16)

    def forward(self, x):
        return F.normalize(self.proj(self.encoder(x)), dim=-1)


@healthy("healthy_triplet_loss_two_lr_groups",
         "Siamese speaker embeddings trained with nn.TripletMarginLoss on (anchor, positive, negative) batches; "
         "AdamW with the encoder at lr 5e-4 and the projection at 2e-3.")
def triplet():
    seed(0)
    protos = 1.2 * torch.randn(40, 24, generator=gen(54))
    model = TripletNet()
    optimizer = torch.optim.AdamW([{"params": model.encoder.parameters(), "lr": 5e-4},
                                   {"params": model.proj.parameters(), "lr": 2e-3}])
    criterion = nn.TripletMarginLoss(margin=0.5)

    def loss_fn(m, batch):
        a, p, n = batch
        return criterion(m(a), m(p), m(n))
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(*_triplets(4096, 55, protos)), 64),
                loss_fn=loss_fn, max_steps=1500)

# --------------------------------------------------------------------------------------------------------------------
# A two-headed patient model: length-of-stay regression and a diagnosis class that is missing (-100) for 30%.


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(18, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.stay = nn.Linear(64, 1)
        self.diagnosis = nn.Linear(64, 4)

    def forward(self, x):
        h = self.trunk(x)
        return self.stay(h).squeeze(-1), self.diagnosis(h)


def two_head_loss(model, batch):
    x, stay, diag = batch
    pred_stay, logits = model(x)
    return F.mse_loss(pred_stay, stay) + F.cross_entropy(logits, diag, ignore_index=-100)


@healthy("healthy_multitask_masked_labels_accumulation",
         "Shared trunk with a regression head and a 4-class head whose missing labels are -100 (ignore_index); "
         "accumulation_steps=2 and clip_grad_norm=1.0.")
def multitask():
    seed(0)
    g = gen(56)
    x = torch.randn(3072, 18, generator=g)
    stay = torch.tanh(x @ torch.randn(18, generator=g) / 4) * 2 + 0.1 * torch.randn(3072, generator=g)
    diag = (x @ torch.randn(18, 4, generator=g)).argmax(1)
    diag[torch.rand(3072, generator=g) < 0.3] = -100
    model = TwoHeads()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, stay, diag), 32), loss_fn=two_head_loss,
                accumulation_steps=2, clip_grad_norm=1.0, max_steps=1000)

# --------------------------------------------------------------------------------------------------------------------
# A frozen random-filter front end (on purpose, requires_grad_(False), left out of the optimizer) with a trained
# GRU head over the filter-bank frames, label smoothing 0.1.


class FrozenFrontEnd(nn.Module):
    def __init__(self):
        super().__init__()
        self.filters = nn.Conv1d(1, 16, 9, stride=4, padding=4)
        self.filters.requires_grad_(False)  # a fixed random filter bank, by design
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.fc = nn.Linear(32, 3)

    def forward(self, wave):
        frames = torch.log1p(self.filters(wave).abs()).transpose(1, 2)  # (B, T, 16)
        _, h = self.gru(frames)
        return self.fc(h[-1])


def _tones(n: int, s: int, L: int = 256):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    t = torch.arange(L, dtype=torch.float32)
    freq = torch.tensor([0.03, 0.12, 0.3])[y].unsqueeze(1) * (1 + 0.1 * torch.randn(n, 1, generator=g))
    x = torch.sin(2 * math.pi * freq * t + 6.28 * torch.rand(n, 1, generator=g)) + 0.5 * torch.randn(n, L, generator=g)
    return x.unsqueeze(1), y


@healthy("healthy_frozen_random_filterbank_gru_head",
         "A deliberately frozen random Conv1d filter bank (requires_grad_(False), not in the optimizer) feeding a "
         "trained GRU classifier; CrossEntropyLoss(label_smoothing=0.1).")
def frozen_frontend():
    seed(0)
    x, y = _tones(2048, 57)
    model = FrozenFrontEnd()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                val_loader=DataLoader(TensorDataset(*_tones(512, 58)), 256),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), max_steps=1500)
