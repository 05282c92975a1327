"""Set n, healthy: 5 corrected twins of broken cases and 5 unusual but correct setups; each must learn."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_n.cases_data import whale_sampler_weights_per_class
from benchmarks.blind_preflight_n.cases_mechanics import traffic_exponentiallr_per_batch
from benchmarks.blind_preflight_n.cases_shapes import review_gru_last_step_is_padding
from benchmarks.blind_preflight_n.cases_targets import DictRows, gpt2_labels_shifted_twice
from benchmarks.blind_preflight_n.cases_trained import bert_tagger_head_group_not_appended
from benchmarks.blind_preflight_n.registry import gen, healthy, loader, seed, split, twin

# --- the corrected twins (the same builder with its one-line fix) ---------------------------------------------

healthy("review_gru_last_valid_step",
        "GRU over right-padded reviews read at each review's last real token (lengths - 1 from the pad mask).")(
    twin(review_gru_last_step_is_padding))

healthy("gpt2_labels_equal_input_ids",
        "Tiny GPT-2 from a config with labels = input_ids, the model shifting them itself.")(
    twin(gpt2_labels_shifted_twice))

healthy("bert_tagger_two_lr_groups",
        "Tiny BERT token classifier from a config, AdamW with an encoder group (2e-5) and a classifier group (3e-3).")(
    twin(bert_tagger_head_group_not_appended))

healthy("traffic_exponentiallr_per_step_gamma",
        "Traffic forecaster with ExponentialLR stepped per batch and gamma = 0.95 ** (1 / batches per epoch).")(
    twin(traffic_exponentiallr_per_batch))

healthy("whale_sampler_weights_per_sample",
        "Imbalanced call detector with a WeightedRandomSampler over one weight per training sample.")(
    twin(whale_sampler_weights_per_class))


# --- 1. Shopping sessions: a packed LSTM over variable-length click sequences -------------------------------------

def sessions(n: int, s: int, width: int = 20, items: int = 60):
    """Item-id sessions of 3-20 clicks (0 = pad); the intent is which category range most clicks fall in."""
    g = gen(s)
    x = torch.zeros(n, width, dtype=torch.long)
    y = torch.randint(0, 3, (n,), generator=g)
    for i in range(n):
        length = int(torch.randint(3, width + 1, (1,), generator=g))
        base = 1 + 20 * y[i]
        on_topic = torch.randint(0, 20, (length,), generator=g) + base
        noise = torch.randint(1, items + 1, (length,), generator=g)
        keep = torch.rand(length, generator=g) < 0.6
        x[i, :length] = torch.where(keep, on_topic, noise).clamp(max=items)
    return x, y


class PackedSessionLSTM(nn.Module):
    def __init__(self, items=60, dim=24, hidden=48, classes=3):
        super().__init__()
        self.emb = nn.Embedding(items + 1, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, classes)

    def forward(self, clicks):
        lengths = (clicks != 0).sum(1)
        packed = pack_padded_sequence(self.emb(clicks), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return self.out(h[-1])


@healthy("sessions_packed_lstm",
         "LSTM over right-padded shopping sessions through pack_padded_sequence (enforce_sorted=False, CPU lengths), "
         "classified from the final hidden state.")
def sessions_packed_lstm():
    seed(0)
    x, y = sessions(1280, 40)
    (xt, yt), (xv, yv) = split(x, y, 1024)
    model = PackedSessionLSTM()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


# --- 2. Crop photos: a two-head CNN (disease class + severity) under bf16 -------------------------------------

def leaf_photos(n: int, s: int, size: int = 16):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    severity = torch.rand(n, generator=g)
    img = 0.3 * torch.randn(n, 3, size, size, generator=g)
    for i in range(n):
        img[i, int(y[i])] += 0.5 + severity[i]                 # the disease tints one channel, severity its strength
    return img, y, severity


class TwoHeadCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.disease = nn.Linear(32, 3)
        self.severity = nn.Linear(32, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.disease(h), self.severity(h).squeeze(-1)


def two_head_loss(model, batch):
    img, disease, severity = batch
    logits, sev = model(img)
    return F.cross_entropy(logits.float(), disease) + 0.5 * F.mse_loss(sev.float(), severity)


@healthy("leaf_two_head_cnn_bf16",
         "CNN with a classification head and a regression head, a callable loss summing cross-entropy and "
         "0.5 x MSE, trained with precision='bf16'.")
def leaf_two_head_cnn_bf16():
    seed(0)
    img, y, sev = leaf_photos(1280, 41)
    model = TwoHeadCNN()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img[:1024], y[:1024], sev[:1024]), 32),
                val_loader=loader(TensorDataset(img[1024:], y[1024:], sev[1024:]), 128, shuffle=False),
                loss_fn=two_head_loss, precision="bf16", max_steps=300)


# --- 3. Tiny BERT intent classifier: frozen word embeddings, two LR groups, warm-up -------------------------------

def intents(n: int, s: int, length: int = 12, vocab: int = 64):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    ids = torch.randint(20, vocab, (n, length), generator=g)
    cue = 4 + 4 * y[:, None] + torch.randint(0, 4, (n, 2), generator=g)
    pos = torch.randint(1, length, (n, 2), generator=g)
    ids.scatter_(1, pos, cue)
    ids[:, 0] = 1                                                # [CLS]
    return ids, y


@healthy("tiny_bert_frozen_embeddings_two_lr_warmup",
         "Tiny BERT sequence classifier from a config with its word embeddings intentionally frozen (left out of the "
         "optimizer), AdamW groups for the encoder and the classifier, a capped linear warm-up and clipping at 1.0.")
def tiny_bert_frozen_embeddings_two_lr_warmup():
    from transformers import BertConfig, BertForSequenceClassification
    seed(0)
    ids, y = intents(1280, 42)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     num_labels=4, pad_token_id=0)
    model = BertForSequenceClassification(cfg)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    encoder = [p for n, p in model.named_parameters() if n.startswith("bert.") and p.requires_grad]
    head = [p for n, p in model.named_parameters() if not n.startswith("bert.")]
    optimizer = torch.optim.AdamW([{"params": encoder, "lr": 1e-3}, {"params": head, "lr": 3e-3}], weight_decay=0.01)
    mask = torch.ones_like(ids)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(DictRows(input_ids=ids[:1024], attention_mask=mask[:1024], labels=y[:1024]), 32),
                val_loader=loader(DictRows(input_ids=ids[1024:], attention_mask=mask[1024:], labels=y[1024:]), 128,
                                  shuffle=False),
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20)),
                loss_fn=None, clip_grad_norm=1.0, max_steps=300)


# --- 4. Loan defaults: gradient accumulation, label smoothing, Nesterov SGD and a cosine schedule ------------------

def loans(n: int, s: int, d: int = 16):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 3, generator=g)
    return x, (torch.tanh(x @ w) + 0.3 * torch.randn(n, 3, generator=g)).argmax(1)


@healthy("loans_accumulation_smoothing_cosine",
         "MLP with accumulation_steps=4 over micro-batches of 16, CrossEntropyLoss(label_smoothing=0.1), Nesterov "
         "SGD, clipping at 1.0 and a CosineAnnealingLR over the 300 optimizer steps.")
def loans_accumulation_smoothing_cosine():
    seed(0)
    x, y = loans(3000, 43)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(xt, yt), 16),
                val_loader=loader(TensorDataset(xv, yv), 300, shuffle=False),
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=300),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), accumulation_steps=4, clip_grad_norm=1.0,
                max_steps=300)


# --- 5. Machine sensors: SimCLR-style in-batch contrastive learning (NT-Xent with arange targets) ----------------

def sensor_views(n: int, s: int, d: int = 24, machines: int = 32):
    """Two noisy, rescaled views of each reading; the positive pair is the two views of the same reading."""
    g = gen(s)
    proto = torch.randn(machines, d, generator=g)
    base = proto[torch.randint(0, machines, (n,), generator=g)] + 0.5 * torch.randn(n, d, generator=g)
    view = lambda: base * (1 + 0.1 * torch.randn(n, 1, generator=g)) + 0.3 * torch.randn(n, d, generator=g)  # noqa
    return view(), view()


def nt_xent(model, batch, temperature: float = 0.2):
    a, b = batch
    za = F.normalize(model(a), dim=1)
    zb = F.normalize(model(b), dim=1)
    logits = za @ zb.T / temperature
    targets = torch.arange(len(a), device=logits.device)
    return 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets))


@healthy("sensor_views_ntxent",
         "Encoder trained without labels on pairs of views with an in-batch NT-Xent loss (positives on the diagonal, "
         "targets = arange(batch) on the logits' device).")
def sensor_views_ntxent():
    seed(0)
    a, b = sensor_views(2048, 44)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 32))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(a[:1792], b[:1792]), 64),
                val_loader=loader(TensorDataset(a[1792:], b[1792:]), 256, shuffle=False),
                loss_fn=nt_xent, max_steps=300)
