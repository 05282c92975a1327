"""Healthy setups that must raise no warning or error: 5 corrected twins of broken cases (the same builder with
its one-line fix) and 5 unusual but correct setups of real-world shape."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_ah.cases_data import mask_flip
from benchmarks.blind_preflight_ah.cases_mechanics import bn_micro_batches
from benchmarks.blind_preflight_ah.cases_shapes import seg_flatten
from benchmarks.blind_preflight_ah.cases_targets import tagging
from benchmarks.blind_preflight_ah.cases_trained import shared_heads
from benchmarks.blind_preflight_ah.registry import gen, healthy, loader, seed, twin

# --------------------------------------------------------------------------------------------------------------
# Corrected twins.

healthy("ah_h_seg_logits_permuted_then_flattened",
        "The segmentation loss moves the class axis last (permute(0, 2, 3, 1)) before flattening NCHW logits to "
        "(pixels, classes).")(twin(seg_flatten))
healthy("ah_h_tagger_labels_padded_minus_100",
        "The tagger pads label sequences with -100 and uses CrossEntropyLoss(ignore_index=-100); tag 0 is trained "
        "like any other.")(twin(tagging))
healthy("ah_h_multitask_distinct_heads",
        "Three task heads built with a list comprehension: three Linear modules, one per task.")(twin(shared_heads))
healthy("ah_h_layernorm_with_micro_batches_of_2",
        "Micro-batches of 2 with 16-step gradient accumulation through LayerNorm (no batch statistics).")(
    twin(bn_micro_batches))
healthy("ah_h_image_and_mask_flipped_together",
        "One random horizontal flip applied jointly to the image and its mask.")(twin(mask_flip))

# --------------------------------------------------------------------------------------------------------------
# A tiny BERT built from a config for support-ticket routing, loss from model(**batch).loss, AdamW with a linear
# warm-up written as a LambdaLR multiplier.


def tickets(n: int, s: int, length: int = 16, vocab: int = 96):
    """Token ids 5..95 with [CLS]=1 / [SEP]=2 / pad 0; the route (3 classes) is set by which keyword group appears."""
    g = gen(s)
    labels = torch.randint(0, 3, (n,), generator=g)
    lengths = torch.randint(8, length + 1, (n,), generator=g)
    ids = torch.randint(20, vocab, (n, length), generator=g)
    slot = (torch.rand(n, generator=g) * (lengths - 2).float()).long() + 1
    ids[torch.arange(n), slot] = 5 + 5 * labels + torch.randint(0, 5, (n,), generator=g)
    ids[:, 0] = 1
    pos = torch.arange(length)
    ids[torch.arange(n), lengths - 1] = 2
    mask = (pos.unsqueeze(0) < lengths.unsqueeze(1)).long()
    ids = ids * mask
    return ids, mask, labels


class DictDataset(torch.utils.data.Dataset):
    def __init__(self, ids, mask, labels):
        self.ids, self.mask, self.labels = ids, mask, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


@healthy("ah_h_tiny_bert_routing_with_warmup",
         "A tiny BertForSequenceClassification built from a BertConfig (no download) routes tickets into 3 queues; "
         "the loss is model(**batch).loss (loss_fn=None), AdamW with weight decay on the matrices only, and a linear "
         "warm-up then decay written as a LambdaLR factor.")
def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    seed(0)
    config = BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=2e-3)
    total, warmup = 600, 30
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * max(0.05, (total - step) / total))
    ids, mask, labels = tickets(768, 801)
    vids, vmask, vlabels = tickets(256, 802)
    return dict(model=model, optimizer=optimizer, scheduler=schedule,
                train_loader=DataLoader(DictDataset(ids, mask, labels), batch_size=32, shuffle=True,
                                        generator=torch.Generator().manual_seed(1234)),
                val_loader=DataLoader(DictDataset(vids, vmask, vlabels), batch_size=128),
                loss_fn=None, max_steps=total)

# --------------------------------------------------------------------------------------------------------------
# Implicit-feedback recommender done right: 4 sampled negatives per click, BCE, and a loss returning (loss, count).


@healthy("ah_h_recommender_with_sampled_negatives",
         "A two-tower recommender on implicit clicks with 4 uniformly sampled negatives per click; the loss function "
         "returns (summed BCE, number of pairs), as the loss contract allows.")
def sampled_negatives():
    seed(0)
    g = gen(811)
    users, items = 150, 120
    taste_u, taste_i = torch.randn(users, 6, generator=g), torch.randn(items, 6, generator=g)
    top = (taste_u @ taste_i.T).topk(25, dim=1).indices
    u = torch.arange(users).repeat_interleave(12)
    i = top[u, torch.randint(0, 25, (len(u),), generator=g)]
    un = u.repeat(4)
    ineg = torch.randint(0, items, (len(un),), generator=g)
    uu, ii = torch.cat([u, un]), torch.cat([i, ineg])
    yy = torch.cat([torch.ones(len(u)), torch.zeros(len(un))])

    class TwoTower(nn.Module):
        def __init__(self):
            super().__init__()
            self.user, self.item = nn.Embedding(users, 16), nn.Embedding(items, 16)
            self.item_bias = nn.Embedding(items, 1)
            nn.init.normal_(self.user.weight, std=0.1)
            nn.init.normal_(self.item.weight, std=0.1)
            nn.init.zeros_(self.item_bias.weight)

        def forward(self, us, its):
            return (self.user(us) * self.item(its)).sum(-1) + self.item_bias(its).squeeze(-1)

    model = TwoTower()

    def click_loss(model, batch):
        us, its, clicked = batch
        loss = F.binary_cross_entropy_with_logits(model(us, its), clicked, reduction="sum")
        return loss, clicked.numel()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(uu, ii, yy), 128), loss_fn=click_loss, max_steps=1500)

# --------------------------------------------------------------------------------------------------------------
# VOC-style segmentation: a 255 'void' border around each object is ignored, and rare classes are up-weighted by
# inverse frequency.


@healthy("ah_h_segmentation_void_255_and_class_weights",
         "Segmentation with VOC-style 255 'void' pixels on object borders, CrossEntropyLoss(ignore_index=255) and "
         "inverse-frequency class weights for the two rare object classes.")
def voc_void():
    seed(0)

    def tiles(n, s, size=16):
        g = gen(s)
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        masks = torch.zeros(n, size, size, dtype=torch.long)
        for cls in (1, 2):
            cy = torch.randint(3, size - 3, (n, 1, 1), generator=g)
            cx = torch.randint(3, size - 3, (n, 1, 1), generator=g)
            d2 = (yy - cy) ** 2 + (xx - cx) ** 2
            masks[(d2 <= 4) & (masks == 0)] = cls
            masks[(d2 > 4) & (d2 <= 8) & (masks == 0)] = 255     # the void ring
        level = torch.tensor([0.0, 2.0, -2.0])[masks.clamp(max=2) * (masks != 255)]
        images = (level + 0.7 * torch.randn(n, size, size, generator=g)).unsqueeze(1)
        return images, masks

    x, m = tiles(400, 821)
    valid = m[m != 255]
    counts = torch.bincount(valid, minlength=3).float()
    weights = counts.sum() / (3 * counts)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 3, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, m), 16),
                loss_fn=nn.CrossEntropyLoss(weight=weights, ignore_index=255), max_steps=1500)

# --------------------------------------------------------------------------------------------------------------
# Review sentiment with frozen pretrained word vectors (Embedding.from_pretrained(freeze=True)), a packed GRU and two
# learning-rate groups.


@healthy("ah_h_frozen_pretrained_vectors_packed_gru",
         "Sentiment classification with frozen 'pretrained' word vectors (nn.Embedding.from_pretrained(..., "
         "freeze=True)), a GRU over pack_padded_sequence batches with CPU lengths, and two AdamW groups (GRU 3e-3, "
         "head 1e-2).")
def frozen_vectors():
    seed(0)
    vocab, dim = 80, 12
    g = gen(831)
    vectors = torch.randn(vocab, dim, generator=g)
    vectors[0] = 0
    polarity = torch.zeros(vocab)
    polarity[3:23], polarity[23:43] = 1.0, -1.0
    vectors[:, 0] = 2.0 * polarity                           # the 'pretrained' vectors already carry sentiment

    def reviews(n, s, max_len=20):
        g = gen(s)
        lengths = torch.randint(4, max_len + 1, (n,), generator=g)
        tokens = torch.randint(3, vocab, (n, max_len), generator=g)
        tokens[torch.arange(max_len).unsqueeze(0) >= lengths.unsqueeze(1)] = 0
        score = polarity[tokens].sum(1)
        return tokens, (score > 0).long()

    class Sentiment(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding.from_pretrained(vectors, freeze=True, padding_idx=0)
            self.gru = nn.GRU(dim, 32, batch_first=True)
            self.head = nn.Linear(32, 2)

        def forward(self, tokens):
            lengths = (tokens != 0).sum(1).cpu()
            packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
            _, h = self.gru(packed)
            return self.head(h[-1])

    x, y = reviews(1024, 832)
    model = Sentiment()
    optimizer = torch.optim.AdamW([{"params": model.gru.parameters(), "lr": 3e-3},
                                   {"params": model.head.parameters(), "lr": 1e-2}])
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)

# --------------------------------------------------------------------------------------------------------------
# Multi-horizon load forecasting: a causal Conv1d over (batch, time, features) transposed to (batch, features,
# time), Huber loss, clipping and a OneCycleLR sized to max_steps.


@healthy("ah_h_causal_conv_forecast_onecycle",
         "6-hour-ahead load forecasting with a causal Conv1d (inputs transposed to (batch, features, time), left "
         "padding only), HuberLoss, clip_grad_norm=1.0 and OneCycleLR(total_steps=max_steps), stepped every batch.")
def causal_forecast():
    seed(0)
    g = gen(841)
    hours = 2400
    t = torch.arange(hours).float()
    load = torch.sin(2 * math.pi * t / 24) + 0.4 * torch.sin(2 * math.pi * t / 168) \
        + 0.1 * torch.randn(hours, generator=g)
    temp = torch.cos(2 * math.pi * t / 24) + 0.1 * torch.randn(hours, generator=g)
    series = torch.stack([load, temp], 1)                               # (time, 2 features)
    window, horizon = 48, 6
    starts = torch.arange(0, hours - window - horizon)
    x = torch.stack([series[s:s + window] for s in starts])            # (N, 48, 2)
    y = torch.stack([load[s + window:s + window + horizon] for s in starts])

    class CausalConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv1d(2, 16, 5)
            self.c2 = nn.Conv1d(16, 16, 5, dilation=2)
            self.out = nn.Linear(16 * 8, horizon)

        def forward(self, x):
            h = x.transpose(1, 2)                                        # (B, features, time)
            h = F.relu(self.c1(F.pad(h, (4, 0))))
            h = F.relu(self.c2(F.pad(h, (8, 0))))
            return self.out(h[:, :, -8:].flatten(1))

    model = CausalConv()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps = 1200
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, total_steps=steps),
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.HuberLoss(delta=0.5),
                clip_grad_norm=1.0, max_steps=steps)
