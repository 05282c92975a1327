"""Set e: healthy recipes (no bug). Several are the correct twin of a broken case of this set."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Subset, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_e.cases_data import NEG, POS, Windows, fraud_table, load_series, reviews
from benchmarks.blind_preflight_e.cases_shapes import (
    PairEncoder,
    bar_orientations,
    keyword_sequences,
    noisy_views,
    road_marking_scenes,
)
from benchmarks.blind_preflight_e.cases_targets import (
    T5_PAD,
    DictDataset,
    TinyCharGPT,
    intent_batches,
    keyphrase_pairs,
    markov_text,
    next_token_loss,
    tiny_t5,
)
from benchmarks.blind_preflight_e.cases_trained import BarNet
from benchmarks.blind_preflight_e.registry import healthy, loader, seed, teacher_classes, teacher_regression


def bars(n=2500, s=0, batch=64):
    x, y = bar_orientations(n, s=s)
    return (loader(TensorDataset(x[:2048], y[:2048]), batch),
            loader(TensorDataset(x[2048:], y[2048:]), 128, shuffle=False))


# --------------------------------------------------------------------------- 1


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return F.relu(x + self.body(x))


class TinyResNet(nn.Module):
    def __init__(self, c=16, classes=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.Sequential(ResBlock(c), ResBlock(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def warmup_cosine(optimizer, warmup, total):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@healthy("resnet_bn_sgd_nesterov_warmup_cosine",
         "a tiny residual CNN with BatchNorm on 3x16x16 images, SGD(momentum=0.9, nesterov, weight_decay=5e-4), a "
         "LambdaLR linear warmup (10 steps) then cosine decay over max_steps, shuffled loader, disjoint val split")
def resnet_bn_sgd_nesterov_warmup_cosine():
    seed(0)
    model = TinyResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    train, val = bars(s=51)
    return dict(model=model, optimizer=optimizer, scheduler=warmup_cosine(optimizer, 10, 640), train_loader=train,
                val_loader=val, loss_fn=nn.CrossEntropyLoss(), max_steps=640)


# --------------------------------------------------------------------------- 2


def churn_bce(model, batch):
    x, y = batch
    return F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)


@healthy("tabular_mlp_standardised_bce_logits",
         "a churn MLP on features standardised with the training split's mean/std, (B,) logits (squeeze(-1)) against "
         "(B,) float 0/1 labels in binary_cross_entropy_with_logits, AdamW")
def tabular_mlp_standardised_bce_logits():
    seed(0)
    x, y = teacher_classes(3000, 12, 2, s=52)
    x = x * torch.linspace(0.5, 30, 12) + torch.linspace(-5, 100, 12)      # raw units
    mean, std = x[:2560].mean(0), x[:2560].std(0)
    x = (x - mean) / std
    y = y.float()
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=churn_bce, max_steps=2000)


# --------------------------------------------------------------------------- 3


def review_vocab(texts):
    return {w: i + 2 for i, w in enumerate(sorted({w for t in texts for w in t.split()}))}


class ReviewSeqs(torch.utils.data.Dataset):
    def __init__(self, texts, labels, vocab):
        self.seqs = [torch.tensor([vocab.get(w, 1) for w in t.split()]) for t in texts]
        self.labels = labels

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i], self.labels[i]


def pad_collate(batch):
    seqs = [b[0] for b in batch]
    return (pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]),
            torch.stack([b[1] for b in batch]))


class PackedGRU(nn.Module):
    def __init__(self, vocab, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, 2)

    def forward(self, ids, lengths):
        packed = pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.head(h[-1])


def packed_loss(model, batch):
    ids, lengths, y = batch
    return F.cross_entropy(model(ids, lengths), y)


@healthy("packed_gru_reviews_enforce_sorted_false",
         "variable-length reviews padded per batch with pad_sequence(batch_first=True), lengths in the batch, "
         "pack_padded_sequence(enforce_sorted=False) into a GRU; the final hidden state into a 2-way head")
def packed_gru_reviews_enforce_sorted_false():
    seed(0)
    texts, y = reviews(3000, s=53)
    vocab = review_vocab(texts[:2560])
    ds = ReviewSeqs(texts, y, vocab)
    model = PackedGRU(len(vocab) + 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(Subset(ds, range(2560)), 32, collate_fn=pad_collate),
                val_loader=loader(Subset(ds, range(2560, 3000)), 128, shuffle=False, collate_fn=pad_collate),
                loss_fn=packed_loss, max_steps=2000)


# --------------------------------------------------------------------------- 4


def gpt2_batches(n=1200, T=32, s=0):
    seq, _ = markov_text(n, T, vocab=24, s=s)
    seq = seq + 3                                   # ids 0-2 reserved; 0 pads
    lengths = torch.randint(12, T + 1, (n,), generator=torch.Generator().manual_seed(s + 1))
    att = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids = seq * att
    labels = ids.masked_fill(att == 0, -100)
    return ids, att, labels


@healthy("gpt2_tiny_causal_lm_right_padded",
         "GPT2LMHeadModel from a tiny GPT2Config (no download, tied embeddings untouched): right-padded token "
         "streams with attention_mask, labels = input_ids with -100 on the padding (the model shifts them itself)")
def gpt2_tiny_causal_lm_right_padded():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed(0)
    ids, att, labels = gpt2_batches(s=54)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=28, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       pad_token_id=0, bos_token_id=1, eos_token_id=2))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(DictDataset(input_ids=ids[:1024], attention_mask=att[:1024],
                                                labels=labels[:1024]), 32),
                val_loader=loader(DictDataset(input_ids=ids[1024:], attention_mask=att[1024:], labels=labels[1024:]),
                                  64, shuffle=False),
                loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- 5


@healthy("distilbert_tiny_intent_four_labels",
         "DistilBertForSequenceClassification from a tiny DistilBertConfig with num_labels=4 on padded utterances "
         "with attention_mask and integer intent labels 0-3; model(**batch).loss (single-label cross-entropy)")
def distilbert_tiny_intent_four_labels():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    seed(0)
    ids, att, y = intent_batches(s=55)
    model = DistilBertForSequenceClassification(DistilBertConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32, num_labels=4,
        pad_token_id=0))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(DictDataset(input_ids=ids[:1280], attention_mask=att[:1280], labels=y[:1280]), 32),
                val_loader=loader(DictDataset(input_ids=ids[1280:], attention_mask=att[1280:], labels=y[1280:]), 64,
                                  shuffle=False),
                loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- 6


@healthy("t5_tiny_keyphrase_labels_minus100",
         "T5ForConditionalGeneration from a tiny T5Config: source ids with attention_mask, labels = the reversed "
         "first three tokens + EOS, right-padded with -100 (ignored by the loss); model(**batch).loss")
def t5_tiny_keyphrase_labels_minus100():
    seed(0)
    src, att, tgt = keyphrase_pairs(s=56)
    labels = tgt.masked_fill(tgt == T5_PAD, -100)
    model = tiny_t5()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(DictDataset(input_ids=src[:1280], attention_mask=att[:1280],
                                                labels=labels[:1280]), 32),
                val_loader=loader(DictDataset(input_ids=src[1280:], attention_mask=att[1280:], labels=labels[1280:]),
                                  64, shuffle=False),
                loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- 7


def pretrained_barnet_state(steps=80):
    """Stands in for a checkpoint: a BarNet trained briefly on other bar images."""
    torch.manual_seed(99)
    net = BarNet()
    x, y = bar_orientations(1024, s=99)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for i in range(steps):
        j = torch.randint(0, 1024, (64,))
        opt.zero_grad()
        F.cross_entropy(net(x[j]), y[j]).backward()
        opt.step()
    return net.state_dict()


@healthy("two_lr_cnn_finetune_backbone_and_head",
         "a pretrained BatchNorm CNN (state_dict from a short pre-training, loaded strictly) with a re-initialised head: backbone at lr "
         "3e-4, the new head at 3e-3, two AdamW groups covering every parameter exactly once")
def two_lr_cnn_finetune_backbone_and_head():
    seed(0)
    state = pretrained_barnet_state()
    model = BarNet()
    model.load_state_dict(state, strict=True)
    model.head = nn.Linear(16, 4)
    optimizer = torch.optim.AdamW([{"params": model.features.parameters(), "lr": 3e-4},
                                   {"params": model.head.parameters(), "lr": 3e-3}], weight_decay=0.01)
    train, val = bars(s=57)
    return dict(model=model, optimizer=optimizer, train_loader=train, val_loader=val,
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 8


class SegAndPresence(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.seg = nn.Conv2d(c, 2, 1)
        self.presence = nn.Linear(c, 1)

    def forward(self, x):
        h = self.encoder(x)
        return self.seg(h), self.presence(h.amax(dim=(2, 3))).squeeze(-1)


def seg_presence_loss(model, batch):
    x, mask, present = batch
    seg_logits, pres_logit = model(x)
    return F.cross_entropy(seg_logits, mask) + 0.5 * F.binary_cross_entropy_with_logits(pres_logit, present)


@healthy("multitask_marking_segmentation_plus_presence",
         "a shared conv encoder with a segmentation head (CE on (B,2,H,W) logits vs (B,H,W) masks, images correctly "
         "permuted from NHWC with permute(0,3,1,2)) and an image-level presence head (BCE on (B,) vs (B,)), summed")
def multitask_marking_segmentation_plus_presence():
    seed(0)
    imgs, masks = road_marking_scenes(1200, s=58)
    imgs = imgs.permute(0, 3, 1, 2).contiguous()
    empty = torch.rand(1200, generator=torch.Generator().manual_seed(5)) < 0.3       # some scenes without markings
    imgs[empty, 0] = 0.15 * torch.rand(int(empty.sum()), 16, 16, generator=torch.Generator().manual_seed(6))
    masks[empty] = 0
    present = (masks.flatten(1).amax(1) > 0).float()
    model = SegAndPresence()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(imgs[:1024], masks[:1024], present[:1024]), 32),
                val_loader=loader(TensorDataset(imgs[1024:], masks[1024:], present[1024:]), 64, shuffle=False),
                loss_fn=seg_presence_loss, max_steps=1500)


# --------------------------------------------------------------------------- 9


class TextCNN(nn.Module):
    def __init__(self, vectors, classes=2):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(vectors, freeze=True, padding_idx=0)   # frozen on purpose
        self.conv = nn.Conv1d(vectors.size(1), 32, 3, padding=1)
        self.head = nn.Linear(32, classes)

    def forward(self, ids):
        h = F.relu(self.conv(self.embed(ids).transpose(1, 2)))     # (B, 32, T)
        return self.head(h.amax(dim=2))


@healthy("textcnn_frozen_pretrained_vectors",
         "word vectors loaded with nn.Embedding.from_pretrained(freeze=True) on purpose (the 'pretrained' vectors "
         "separate the sentiment words), a Conv1d over (B,d,T) and max-pool; the optimizer holds the trainable "
         "parameters only")
def textcnn_frozen_pretrained_vectors():
    seed(0)
    texts, y = reviews(3000, s=59)
    vocab = review_vocab(texts)
    g = torch.Generator().manual_seed(9)
    vectors = torch.randn(len(vocab) + 2, 16, generator=g) * 0.5
    vectors[0] = 0
    for w in POS:
        vectors[vocab[w], 0] += 2.0
    for w in NEG:
        vectors[vocab[w], 0] -= 2.0
    ids = pad_sequence([torch.tensor([vocab[w] for w in t.split()]) for t in texts], batch_first=True)
    model = TextCNN(vectors)
    return dict(model=model,
                optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)




# --------------------------------------------------------------------------- 10


def huber_loss(model, batch):
    x, y = batch
    return F.huber_loss(model(x).squeeze(-1), y, delta=1.0)


@healthy("regression_huber_b_vs_b_standardised",
         "an MLP regressor with (B,) predictions (squeeze(-1)) on (B,) targets standardised with the training "
         "mean/std, Huber loss, disjoint validation split")
def regression_huber_b_vs_b_standardised():
    seed(0)
    x, y = teacher_regression(3000, 16, s=60)
    y = y * 40 + 300
    y = (y - y[:2560].mean()) / y[:2560].std()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=huber_loss, max_steps=2000)


# --------------------------------------------------------------------------- 11


def ntxent(model, batch, tau=0.1):
    a, b = batch
    z = F.normalize(model(torch.cat([a, b])), dim=1)            # each embedding to unit length
    sim = z @ z.t() / tau
    sim.fill_diagonal_(float("-inf"))
    n = a.size(0)
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, targets)


@healthy("simclr_ntxent_unit_normalised_rows",
         "a SimCLR-style NT-Xent loss on two noisy views: embeddings F.normalize(dim=1), a (2B,2B) similarity "
         "matrix with the diagonal masked, targets pointing at each sample's other view, temperature 0.1")
def simclr_ntxent_unit_normalised_rows():
    seed(0)
    a, b = noisy_views(s=61)
    model = PairEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(a, b), 64, drop_last=True), loss_fn=ntxent, max_steps=2000)


# --------------------------------------------------------------------------- 12


class IntentTransformer(nn.Module):
    def __init__(self, vocab=40, d=32, T=24):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Embedding(T, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        pad = ids == 0
        h = self.embed(ids) + self.pos(torch.arange(ids.size(1)))
        return self.head(self.encoder(h, src_key_padding_mask=pad)[:, 0])


@healthy("transformer_keyword_label_smoothing_key_padding_mask",
         "a batch_first pre-norm TransformerEncoder over padded (B,T) ids with src_key_padding_mask (B,T), a [CLS] "
         "read-out and CrossEntropyLoss(label_smoothing=0.1)")
def transformer_keyword_label_smoothing_key_padding_mask():
    seed(0)
    ids, y = keyword_sequences(3000, s=62)
    model = IntentTransformer()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 32),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), max_steps=2000)


# --------------------------------------------------------------------------- 13


@healthy("cnn_gradient_accumulation_4_micro_batches",
         "a CNN trained with micro-batches of 16 and accumulation_steps=4 (an effective batch of 64), mean "
         "CrossEntropyLoss per micro-batch, Adam")
def cnn_gradient_accumulation_4_micro_batches():
    seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
    train, val = bars(s=63, batch=16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3), train_loader=train,
                val_loader=val, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=4, max_steps=500)


# --------------------------------------------------------------------------- 14


@healthy("fraud_sampler_inverse_class_frequency",
         "an imbalanced (about 5% fraud) classifier with WeightedRandomSampler(1 / class_counts[labels], "
         "num_samples=len, replacement=True): one weight per row, classes drawn about equally")
def fraud_sampler_inverse_class_frequency():
    seed(0)
    x, y = fraud_table(s=64)
    tx, ty = x[:5000], y[:5000]
    weights = 1.0 / torch.bincount(ty).float()[ty]
    sampler = WeightedRandomSampler(weights, num_samples=len(ty), replacement=True,
                                    generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=DataLoader(TensorDataset(tx, ty), batch_size=64, sampler=sampler),
                val_loader=loader(TensorDataset(x[5000:], y[5000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 15


@healthy("char_gpt_encoder_stack_with_causal_mask",
         "a hand-written decoder-only LM (nn.TransformerEncoder, pre-norm) with a causal mask "
         "(generate_square_subsequent_mask, is_causal=True), inputs seq[:, :-1] and targets seq[:, 1:]")
def char_gpt_encoder_stack_with_causal_mask():
    seed(0)
    seq, _ = markov_text(s=65)
    model = TinyCharGPT(causal=True)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(seq[:1024]), 32),
                val_loader=loader(TensorDataset(seq[1024:]), 64, shuffle=False),
                loss_fn=next_token_loss, max_steps=2000)


# --------------------------------------------------------------------------- 16


class CheckpointedResNet(TinyResNet):
    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False)
        return self.head(h.mean(dim=(2, 3)))


@healthy("resnet_non_reentrant_activation_checkpointing",
         "a tiny residual CNN whose residual blocks run under torch.utils.checkpoint.checkpoint(use_reentrant=False); "
         "Adam, shuffled loader")
def resnet_non_reentrant_activation_checkpointing():
    seed(0)
    model = CheckpointedResNet()
    train, val = bars(s=66)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=train,
                val_loader=val, loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 17


def forecast_mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y)


@healthy("load_forecast_chronological_split_with_gap",
         "next-hour load forecasting from 48-hour windows: the series is split chronologically (first 80% train, "
         "then a 48-hour gap, then validation), windows cut inside each part; MLP, (B,) vs (B,) MSE")
def load_forecast_chronological_split_with_gap():
    seed(0)
    series = load_series(s=67)
    cut = int(0.8 * len(series))
    train, val = Windows(series[:cut]), Windows(series[cut + 48:])
    model = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 256, shuffle=False),
                loss_fn=forecast_mse, max_steps=2000)
