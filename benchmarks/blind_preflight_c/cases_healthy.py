"""Set b, healthy: real-world shapes that must raise no warning or error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import TensorDataset, random_split

from benchmarks.blind_preflight_c.registry import (
    healthy,
    loader,
    seed,
    teacher_regression,
    token_sequences,
)


class PackedGRU(nn.Module):
    def __init__(self, vocab=100):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=0)
        self.gru = nn.GRU(32, 48, batch_first=True)
        self.fc = nn.Linear(48, 4)

    def forward(self, ids, lengths):
        packed = pack_padded_sequence(self.emb(ids), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.fc(h[-1])


@healthy("packed_gru_variable_length", "variable-length token sequences padded with pad_sequence(batch_first=True) "
         "and packed into a GRU classifier; lengths in the batch")
def packed_gru_variable_length():
    seed(40)
    g = torch.Generator().manual_seed(40)
    data = []
    for _ in range(512):
        c = torch.randint(0, 4, (1,), generator=g).item()
        n = torch.randint(5, 30, (1,), generator=g).item()
        seq = torch.randint(5, 100, (n,), generator=g)
        seq[-1] = c + 1
        data.append((seq, c))

    def collate(items):
        seqs = [s for s, _ in items]
        return (pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]),
                torch.tensor([c for _, c in items]))

    model = PackedGRU()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ce = nn.CrossEntropyLoss()

    def loss_fn(model, batch):
        ids, lengths, y = batch
        return ce(model(ids, lengths), y)

    return dict(model=model, optimizer=opt, train_loader=loader(data, 32, collate_fn=collate), loss_fn=loss_fn)


@healthy("multilabel_bce_multihot", "a multi-label tabular classifier: (B,6) logits against (B,6) multi-hot float "
         "targets in BCEWithLogitsLoss")
def multilabel_bce_multihot():
    seed(41)
    g = torch.Generator().manual_seed(41)
    x = torch.randn(1024, 20, generator=g)
    w = torch.randn(20, 6, generator=g)
    y = (x @ w > 0.5).float()
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 6))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.BCEWithLogitsLoss())


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, a, b):
        return F.normalize(self.enc(a), dim=-1), F.normalize(self.enc(b), dim=-1)


@healthy("siamese_infonce_pairs", "a siamese encoder trained with an InfoNCE loss on (anchor, positive) pairs: "
         "targets are arange(B) over the (B,B) similarity matrix")
def siamese_infonce_pairs():
    seed(42)
    g = torch.Generator().manual_seed(42)
    base = torch.randn(1024, 16, generator=g)
    a = base + 0.1 * torch.randn(1024, 16, generator=g)
    b = base + 0.1 * torch.randn(1024, 16, generator=g)
    model = Siamese()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)

    def loss_fn(model, batch):
        xa, xb = batch
        za, zb = model(xa, xb)
        logits = za @ zb.T / 0.1
        return F.cross_entropy(logits, torch.arange(len(xa)))

    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(a, b), 64, drop_last=True),
                loss_fn=loss_fn)


class TinyUNet(nn.Module):
    def __init__(self, c=3):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.mid = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.out = nn.Sequential(nn.Conv2d(32, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, c, 1))

    def forward(self, x):
        d = self.down(x)
        return self.out(torch.cat([d, self.up(self.mid(d))], 1))


@healthy("unet_segmentation_ce_bchw", "a UNet-ish segmentation CNN: (B,C,H,W) logits and (B,H,W) masks in "
         "CrossEntropyLoss")
def unet_segmentation_ce_bchw():
    seed(43)
    from benchmarks.blind_preflight_c.cases_shapes_targets import blobs
    img, mask = blobs(256, s=43)
    model = TinyUNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(img, mask), 16),
                loss_fn=nn.CrossEntropyLoss())


class TinyViT(nn.Module):
    def __init__(self, classes=4, patch=4, d=32):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 17, d) * 0.02)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True,
                                                                    norm_first=True), 2)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)            # (B, 16, d)
        h = torch.cat([self.cls.expand(len(x), -1, -1), p], 1) + self.pos
        return self.head(self.enc(h)[:, 0])


@healthy("tiny_vit_patches", "a tiny ViT (conv patch embedding, CLS token and learned positions as nn.Parameter, "
         "pre-norm batch_first encoder) on 16x16 images, CE on (B,4)")
def tiny_vit_patches():
    seed(44)
    from benchmarks.blind_preflight_c.cases_trained_data import colour_images
    x, y = colour_images(512, s=44)
    model = TinyViT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.05))


@healthy("roberta_tiny_sequence_classification", "RobertaForSequenceClassification from a tiny RobertaConfig "
         "(no download), padded batches with attention masks; model(**batch).loss")
def roberta_tiny_sequence_classification():
    seed(45)
    from transformers import RobertaConfig, RobertaForSequenceClassification
    cfg = RobertaConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=80, num_labels=3, pad_token_id=1)
    model = RobertaForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(45)
    items = []
    for _ in range(256):
        c = torch.randint(0, 3, (1,), generator=g).item()
        n = torch.randint(8, 24, (1,), generator=g).item()
        ids = torch.full((24,), 1)
        ids[:n] = torch.randint(5, 120, (n,), generator=g)
        ids[0], ids[1] = 0, c + 2
        mask = (ids != 1).long()
        items.append({"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(c)})
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=opt, train_loader=loader(items, 16), loss_fn=None)


@healthy("llama_tiny_causal_lm_tied", "LlamaForCausalLM from a tiny LlamaConfig with tie_word_embeddings=True left "
         "intact; labels = input_ids (the model shifts them)")
def llama_tiny_causal_lm_tied():
    seed(46)
    from benchmarks.blind_preflight_c.cases_trained_data import lm_batches, tiny_llama
    model = tiny_llama(tie=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, train_loader=lm_batches(s=46), loss_fn=None)


@healthy("frozen_cnn_backbone_linear_probe", "a linear probe: the CNN backbone is deliberately frozen "
         "(requires_grad_(False), kept in eval() is NOT used) and only the head is given to the optimizer")
def frozen_cnn_backbone_linear_probe():
    seed(47)
    from benchmarks.blind_preflight_c.cases_trained_data import colour_images
    x, y = colour_images(512, s=47)
    backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten())
    backbone.requires_grad_(False)
    model = nn.Sequential(backbone, nn.Linear(32, 4))
    opt = torch.optim.Adam(model[1].parameters(), lr=3e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


@healthy("imbalanced_binary_pos_weight", "an imbalanced (about 8% positive) binary classifier with (B,) logits, "
         "(B,) float labels and BCEWithLogitsLoss(pos_weight=...)")
def imbalanced_binary_pos_weight():
    seed(48)
    g = torch.Generator().manual_seed(48)
    x = torch.randn(2048, 18, generator=g)
    score = x[:, :3].sum(1) + 0.3 * torch.randn(2048, generator=g)
    y = (score > 2.4).float()
    model = nn.Sequential(nn.Linear(18, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    pos_weight = (1 - y).sum() / y.sum()
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pos_weight))


@healthy("regression_b1_vs_b1_standardised", "an MLP regressor with (B,1) predictions against (B,1) standardised "
         "targets, SmoothL1Loss, disjoint train/val split")
def regression_b1_vs_b1_standardised():
    seed(49)
    x, y = teacher_regression(1200, 10, s=49)
    y = ((y - y.mean()) / y.std()).unsqueeze(1)
    train, val = random_split(TensorDataset(x, y), [1000, 200], generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(train, 32), val_loader=loader(val, 64, shuffle=False),
                loss_fn=nn.SmoothL1Loss())


@healthy("mixup_soft_targets_cnn", "a CNN trained with mixup: mixed images and soft (B,C) targets "
         "lam*onehot(y1)+(1-lam)*onehot(y2) in CrossEntropyLoss (probability targets)")
def mixup_soft_targets_cnn():
    seed(50)
    from benchmarks.blind_preflight_c.cases_trained_data import colour_images
    x, y = colour_images(512, s=50)

    def collate(items):
        xs = torch.stack([i[0] for i in items])
        ys = F.one_hot(torch.stack([i[1] for i in items]), 4).float()
        lam = 0.7
        perm = torch.arange(len(xs)).flip(0)
        return lam * xs + (1 - lam) * xs[perm], lam * ys + (1 - lam) * ys[perm]

    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32, collate_fn=collate),
                loss_fn=nn.CrossEntropyLoss())


@healthy("lstm_seq2seq_time_major_correct", "a time-major (T,B) LSTM encoder-decoder (batch_first=False "
         "throughout, as in the classic tutorial) with log_softmax over the vocabulary (dim=-1) and NLLLoss")
def lstm_seq2seq_time_major_correct():
    seed(51)
    g = torch.Generator().manual_seed(51)
    src = token_sequences(512, 10, 40, s=51)
    tgt = src.flip(1)

    class S2S(nn.Module):
        def __init__(self, vocab=40):
            super().__init__()
            self.emb = nn.Embedding(vocab, 32)
            self.enc = nn.LSTM(32, 64)
            self.dec = nn.LSTM(32, 64)
            self.out = nn.Linear(64, vocab)

        def forward(self, s, t_in):             # (T, B) each
            _, state = self.enc(self.emb(s))
            h, _ = self.dec(self.emb(t_in), state)
            return self.out(h)                  # (T, B, V)

    def collate(items):
        s = torch.stack([i[0] for i in items], 1)
        t = torch.stack([i[1] for i in items], 1)
        t_in = torch.cat([torch.full((1, t.size(1)), 1), t[:-1]], 0)
        return s, t_in, t

    model = S2S()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loss_fn(model, batch):
        s, t_in, t = batch
        logp = F.log_softmax(model(s, t_in), dim=-1)
        return F.nll_loss(logp.reshape(-1, logp.size(-1)), t.reshape(-1))

    del g
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(src, tgt), 32, collate_fn=collate),
                loss_fn=loss_fn)
