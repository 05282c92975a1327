"""Set b, healthy setups of real-world shapes: none of them may raise a warning or an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import Dataset, TensorDataset, default_collate

from benchmarks.blind_preflight_b.cases_data import Utterances
from benchmarks.blind_preflight_b.cases_mechanics import _commands
from benchmarks.blind_preflight_b.cases_shapes import _shapes_masks
from benchmarks.blind_preflight_b.cases_trained import LMStream, PatchViT, ReviewSet, _pets
from benchmarks.blind_preflight_b.registry import decay_groups, healthy, loader, seed, teacher_classes


def packed_collate(batch):
    tokens, ys = zip(*batch)
    lengths = torch.tensor([len(t) for t in tokens])
    return pad_sequence(tokens, batch_first=True), lengths, torch.tensor(ys)


class PackedGRU(nn.Module):
    def __init__(self, vocab=200, dim=32, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.gru = nn.GRU(dim, dim, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * dim, classes)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.emb(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.out(torch.cat([h[-2], h[-1]], 1))


def packed_loss(model, batch):
    tokens, lengths, y = batch
    return F.cross_entropy(model(tokens, lengths), y)


@healthy("packed_bigru_utterances", "variable-length utterances padded per batch and packed (enforce_sorted=False) "
         "into a bidirectional GRU; final states of both directions into a 3-way classifier")
def packed_bigru_utterances():
    seed()
    model = PackedGRU()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(Utterances(640, 0), 32, collate_fn=packed_collate),
                val_loader=loader(Utterances(128, 1), 64, shuffle=False, collate_fn=packed_collate),
                loss_fn=packed_loss)


def _attributes(n, s, d=24, labels=10):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, labels, generator=torch.Generator().manual_seed(77))
    return x, ((x @ w) > 1.0).float()                          # ~30% of attributes on per row


@healthy("multilabel_attributes_bce_with_logits", "a product-attribute MLP with 10 independent outputs: multi-hot "
         "float targets (B,10) into BCEWithLogitsLoss")
def multilabel_attributes_bce_with_logits():
    seed()
    x, y = _attributes(1024, 0)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.BCEWithLogitsLoss())


class PairSet(Dataset):
    def __init__(self, n, s):
        self.x, self.y = teacher_classes(2 * n, 16, 6, s)
        g = torch.Generator().manual_seed(s + 100)
        self.a = torch.randint(0, 2 * n, (n,), generator=g)
        self.b = torch.randint(0, 2 * n, (n,), generator=g)

    def __len__(self):
        return len(self.a)

    def __getitem__(self, i):
        a, b = self.a[i], self.b[i]
        return self.x[a], self.x[b], (self.y[a] == self.y[b]).float()


class SiameseEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return self.net(x)


def contrastive_loss(model, batch, margin=1.0):
    xa, xb, same = batch
    d = F.pairwise_distance(model(xa), model(xb))
    return (same * d ** 2 + (1 - same) * F.relu(margin - d) ** 2).mean()


@healthy("siamese_pairs_contrastive", "a siamese encoder applied to both items of a pair, the classic contrastive "
         "loss on the pair distance with a (B,) same/different float label")
def siamese_pairs_contrastive():
    seed()
    model = SiameseEncoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(PairSet(1024, 0), 64), loss_fn=contrastive_loss)


class SegNet(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.up = nn.Sequential(nn.ConvTranspose2d(32, 16, 2, 2), nn.ReLU(), nn.Conv2d(16, classes, 1))

    def forward(self, x):
        return self.up(self.down(x))                     # (B, C, H, W) logits


@healthy("segnet_ce_on_bchw", "a small encoder-decoder segmentation CNN: (B,3,H,W) logits and (B,H,W) long masks "
         "into CrossEntropyLoss")
def segnet_ce_on_bchw():
    seed()
    x, mask = _shapes_masks(384, 0)
    xv, mv = _shapes_masks(96, 1)
    model = SegNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, mask), 16),
                val_loader=loader(TensorDataset(xv, mv), 32, shuffle=False), loss_fn=nn.CrossEntropyLoss())


@healthy("tiny_vit_patches", "a tiny ViT (conv patch embedding, cls token and positional embedding as nn.Parameters, "
         "pre-norm encoder, batch_first=True) on 16x16 RGB images, AdamW")
def tiny_vit_patches():
    seed()
    x, y = _pets(640, 1)
    model = PatchViT()
    optimizer = torch.optim.AdamW(decay_groups(model, 0.05), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


@healthy("distilbert_from_config_accumulated", "DistilBertForSequenceClassification built from a tiny config, "
         "model(**batch).loss, accumulation_steps=2 with the loss left undivided")
def distilbert_from_config_accumulated():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    seed()
    config = DistilBertConfig(vocab_size=120, dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=64,
                              num_labels=2, pad_token_id=0)
    model = DistilBertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(ReviewSet(512, 0), 16), loss_fn=None,
                accumulation_steps=2)


@healthy("llama_tiny_causal_lm", "LlamaForCausalLM from a tiny LlamaConfig (GQA, tied embeddings untouched) with "
         "labels = input_ids: the model shifts them itself")
def llama_tiny_causal_lm():
    from transformers import LlamaConfig, LlamaForCausalLM
    seed()
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(LMStream(256, 32, 64, s=4), 16), loss_fn=None)


class FrozenBackboneNet(nn.Module):
    def __init__(self, classes=6):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


@healthy("frozen_conv_backbone_linear_probe", "a linear probe: the conv backbone (no BatchNorm) is frozen with "
         "requires_grad_(False) on purpose and only the head is given to the optimizer")
def frozen_conv_backbone_linear_probe():
    seed()
    x, y = _pets(640, 2)
    model = FrozenBackboneNet()
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


def _rare_events(n, s):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, 18, generator=g)
    score = x[:, 0] + 0.7 * x[:, 4] - 0.4 * x[:, 11]
    y = (score > torch.quantile(score, 0.9)).float()               # 10% positives
    return x, y


class DefaultNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(18, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@healthy("imbalanced_default_pos_weight", "a loan-default MLP with 10% positives: (B,) logits and (B,) float labels "
         "into BCEWithLogitsLoss(pos_weight=9)")
def imbalanced_default_pos_weight():
    seed()
    x, y = _rare_events(2000, 0)
    xv, yv = _rare_events(400, 1)
    model = DefaultNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=torch.tensor(9.0)))


class TempLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(1, 32, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.out(h[:, -1]).squeeze(-1)


def _temperatures(n, s):
    g = torch.Generator().manual_seed(s)
    t = torch.arange(n + 24).float()
    temp_c = 12 + 8 * torch.sin(2 * torch.pi * t / 24) + torch.randn(n + 24, generator=g)
    mu, sd = temp_c.mean(), temp_c.std()
    z = (temp_c - mu) / sd                                          # inputs and targets standardised alike
    return z.unfold(0, 24, 1)[:n].unsqueeze(-1), z[24:24 + n]


@healthy("lstm_temperature_standardised_huber", "an LSTM forecaster of next-hour temperature, inputs and (B,) targets "
         "standardised with the same statistics, (B,) predictions, HuberLoss")
def lstm_temperature_standardised_huber():
    seed()
    x, y = _temperatures(1500, 0)
    model = TempLSTM()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.HuberLoss())


def mixup_collate(batch, alpha=0.4, classes=6):
    x, y = default_collate(batch)
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    perm = torch.randperm(x.size(0))
    soft = F.one_hot(y, classes).float()
    return lam * x + (1 - lam) * x[perm], lam * soft + (1 - lam) * soft[perm]


class MixCNN(nn.Module):
    def __init__(self, classes=6):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))

    def forward(self, x):
        return self.net(x)


@healthy("mixup_cnn_soft_targets", "mixup in the collate: mixed images and (B,6) soft targets (two one-hots mixed "
         "with lambda ~ Beta(0.4,0.4)) into CrossEntropyLoss's probability-target form")
def mixup_cnn_soft_targets():
    seed()
    x, y = _pets(768, 3)
    model = MixCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32, collate_fn=mixup_collate),
                loss_fn=nn.CrossEntropyLoss())


@healthy("speech_gru_plain_accumulation", "a 2-layer GRU keyword spotter over (B,T,F) batch-first frames, "
         "CrossEntropyLoss, accumulation_steps=4 with nothing else touching the gradients")
def speech_gru_plain_accumulation():
    from benchmarks.blind_preflight_b.cases_mechanics import SpeechCommandGRU
    seed()
    x, y = _commands(1024, 1)
    model = SpeechCommandGRU()
    optimizer = torch.optim.AdamW(decay_groups(model), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 16),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=4)
