"""Set d: healthy setups of real-world shapes (must raise no warning or error)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split

from benchmarks.blind_preflight_d.registry import healthy, loader, seed, teacher_classes, teacher_regression


def _quadrant_images(n=1536, classes=4, s=0, ch=1):
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, ch, 16, 16, generator=g) * 0.3
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, :, r * 8 + 2:r * 8 + 6, c * 8 + 2:c * 8 + 6] += 1.5
    return x, y


class CNN(nn.Module):
    def __init__(self, ch=1, classes=4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(ch, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(128, classes))

    def forward(self, x):
        return self.head(self.features(x))


@healthy("plain_cnn_quadrants_shuffle", "a small BatchNorm CNN on 1x16x16 images, DataLoader(shuffle=True, "
         "drop_last=True), CrossEntropyLoss on (B,4) logits and (B,) labels, a disjoint validation split")
def plain_cnn_quadrants_shuffle():
    seed(100)
    x, y = _quadrant_images(s=100)
    train, val = random_split(TensorDataset(x, y), [1280, 256], generator=torch.Generator().manual_seed(0))
    model = CNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=DataLoader(train, batch_size=32, shuffle=True, drop_last=True),
                val_loader=DataLoader(val, batch_size=64), loss_fn=nn.CrossEntropyLoss())


class Reviews(Dataset):
    def __init__(self, n=1500, s=101):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(3, 30, (1,), generator=g))
            label = int(torch.randint(0, 2, (1,), generator=g))
            ids = torch.randint(5, 200, (length,), generator=g)
            ids[torch.randint(0, length, (2,), generator=g)] = label + 1
            self.items.append((ids, label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def pack_collate(batch):
    seqs = [b[0] for b in batch]
    return (pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]),
            torch.tensor([b[1] for b in batch]))


class PackedLSTM(nn.Module):
    def __init__(self, vocab=200, d=32, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, d, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * d, classes)

    def forward(self, ids, lengths):
        packed = pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return self.head(torch.cat([h[-2], h[-1]], dim=1))


@healthy("packed_bilstm_reviews_unsorted", "variable-length reviews padded with pad_sequence(batch_first=True) and "
         "packed with pack_padded_sequence(enforce_sorted=False) into a bidirectional LSTM; final states of both "
         "directions into the head")
def packed_bilstm_reviews_unsorted():
    seed(101)

    def review_loss(model, batch):
        ids, lengths, labels = batch
        return F.cross_entropy(model(ids, lengths), labels)

    model = PackedLSTM()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(Reviews(), 32, collate_fn=pack_collate), loss_fn=review_loss)


class ChurnValueNet(nn.Module):
    def __init__(self, d=20):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.churn = nn.Linear(64, 2)
        self.value = nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.churn(h), self.value(h).squeeze(-1)


@healthy("multitask_churn_ce_plus_value_mse", "a shared tabular trunk with a churn classification head (CE) and a "
         "customer-value regression head (MSE on standardised (B,) targets vs squeezed (B,) predictions), loss = "
         "ce + 0.5 * mse")
def multitask_churn_ce_plus_value_mse():
    seed(102)
    x, c = teacher_classes(3072, 20, 2, s=102)
    _, v = teacher_regression(3072, 20, s=102)
    v = (v - v.mean()) / v.std()

    def multitask_loss(model, batch):
        feats, churn, value = batch
        logits, pred = model(feats)
        return F.cross_entropy(logits, churn) + 0.5 * F.mse_loss(pred, value)

    model = ChurnValueNet()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(x, c, v), 64), loss_fn=multitask_loss)


class FrozenEmbeddingBag(nn.Module):
    def __init__(self, vectors, classes=2):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(vectors, freeze=True, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(vectors.shape[1], 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1).float()
        pooled = (self.embed(ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.mlp(pooled)


@healthy("frozen_pretrained_vectors_mean_pool", "word vectors loaded with nn.Embedding.from_pretrained(freeze=True) "
         "on purpose; the optimizer holds only the parameters with requires_grad (the MLP), masked mean pooling")
def frozen_pretrained_vectors_mean_pool():
    seed(103)
    g = torch.Generator().manual_seed(103)
    vectors = torch.randn(200, 32, generator=g)
    vectors[0] = 0
    ids = torch.randint(1, 200, (2048, 16), generator=g)
    ids[:, 12:][torch.rand(2048, 4, generator=g) < 0.5] = 0          # some right padding
    w = torch.randn(32, generator=g)
    y = ((vectors[ids] * (ids != 0).unsqueeze(-1)).sum(1) @ w > 0).long()
    model = FrozenEmbeddingBag(vectors)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.Adam(trainable, lr=2e-3),
                train_loader=loader(TensorDataset(ids, y), 64), loss_fn=nn.CrossEntropyLoss())


@healthy("t5_tiny_sort_digits", "T5ForConditionalGeneration from a tiny T5Config (no download, dropout 0.1): "
         "input_ids/attention_mask/labels dicts, labels = the sorted input (the model shifts them into "
         "decoder_input_ids itself); model(**batch).loss")
def t5_tiny_sort_digits():
    from transformers import T5Config, T5ForConditionalGeneration
    seed(104)
    g = torch.Generator().manual_seed(104)
    ids = torch.randint(3, 40, (256, 8), generator=g)
    labels = torch.sort(ids, dim=1).values
    batches = [{"input_ids": ids[i:i + 16], "attention_mask": torch.ones_like(ids[i:i + 16]),
                "labels": labels[i:i + 16]} for i in range(0, 256, 16)]
    config = T5Config(vocab_size=40, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3), train_loader=batches)


@healthy("bert_tiny_token_classification_padded", "BertForTokenClassification from a tiny BertConfig: right-padded "
         "sentences with attention_mask, labels -100 on the padding (the HF default ignore index), model(**batch).loss")
def bert_tiny_token_classification_padded():
    from transformers import BertConfig, BertForTokenClassification
    seed(105)
    g = torch.Generator().manual_seed(105)
    batches = []
    for _ in range(16):
        lengths = torch.randint(6, 17, (16,), generator=g)
        ids = torch.zeros(16, 16, dtype=torch.long)
        labels = torch.full((16, 16), -100, dtype=torch.long)
        mask = torch.zeros(16, 16, dtype=torch.long)
        for i, n in enumerate(lengths.tolist()):
            toks = torch.randint(5, 120, (n,), generator=g)
            ids[i, :n], mask[i, :n], labels[i, :n] = toks, 1, toks % 5
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    config = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=32, num_labels=5)
    model = BertForTokenClassification(config)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), train_loader=batches)


@healthy("gpt2_tiny_padded_causal_lm", "GPT2LMHeadModel from a tiny GPT2Config (tied embeddings intact): right-padded "
         "sequences with attention_mask, labels = input_ids with -100 on the padding (the model shifts them)")
def gpt2_tiny_padded_causal_lm():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed(106)
    g = torch.Generator().manual_seed(106)
    batches = []
    for _ in range(16):
        ids = torch.full((16, 24), 0, dtype=torch.long)
        mask = torch.zeros(16, 24, dtype=torch.long)
        for i in range(16):
            n = int(torch.randint(12, 25, (1,), generator=g))
            start, step = int(torch.randint(3, 90, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
            ids[i, :n] = (start + step * torch.arange(n)) % 93 + 3
            mask[i, :n] = 1
        labels = ids.masked_fill(mask == 0, -100)
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    config = GPT2Config(vocab_size=96, n_positions=32, n_embd=64, n_layer=2, n_head=4, pad_token_id=0,
                        bos_token_id=2, eos_token_id=2)
    model = GPT2LMHeadModel(config)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3), train_loader=batches)


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())

    def forward(self, x):
        return self.body(x)


class FineTuneNet(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.backbone = Backbone()
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


@healthy("two_lr_cnn_finetune", "a 'pretrained' CNN backbone (its state_dict loaded strictly) fine-tuned at lr 2e-4 "
         "and a new head at lr 2e-3, two AdamW param groups covering every parameter once")
def two_lr_cnn_finetune():
    seed(107)
    x, y = _quadrant_images(s=107, ch=3)
    pretrained = Backbone()
    model = FineTuneNet()
    model.backbone.load_state_dict(pretrained.state_dict())
    optimizer = torch.optim.AdamW([{"params": model.backbone.parameters(), "lr": 2e-4},
                                   {"params": model.head.parameters(), "lr": 2e-3}], weight_decay=0.01)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.CrossEntropyLoss())


@healthy("cnn_label_smoothing_010", "a CNN on 3-channel images trained with CrossEntropyLoss(label_smoothing=0.1)")
def cnn_label_smoothing_010():
    seed(108)
    x, y = _quadrant_images(s=108, ch=3)
    model = CNN(ch=3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1))


@healthy("class_weighted_ce_imbalanced_tabular", "an imbalanced 3-class tabular problem (about 75/20/5%) with "
         "CrossEntropyLoss(weight=inverse class frequency)")
def class_weighted_ce_imbalanced_tabular():
    seed(109)
    g = torch.Generator().manual_seed(109)
    x = torch.randn(4000, 16, generator=g)
    score = x @ torch.randn(16, generator=g)
    y = torch.zeros(4000, dtype=torch.long)
    y[score > score.quantile(0.75)] = 1
    y[score > score.quantile(0.95)] = 2
    counts = torch.bincount(y, minlength=3).float()
    weight = counts.sum() / (3 * counts)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.CrossEntropyLoss(weight=weight))


class GRUForecaster(nn.Module):
    def __init__(self, feats=3, d=32):
        super().__init__()
        self.gru = nn.GRU(feats, d, batch_first=True)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1]).squeeze(-1)             # (B,)


@healthy("gru_forecast_standardised_targets", "a batch_first GRU forecasting the next hour's load from 24 past hours "
         "of 3 standardised features; targets standardised with the training mean/std, (B,) vs (B,) MSELoss")
def gru_forecast_standardised_targets():
    seed(110)
    g = torch.Generator().manual_seed(110)
    t = torch.arange(6000, dtype=torch.float32)
    load = 500 + 120 * torch.sin(2 * torch.pi * t / 24) + 15 * torch.randn(6000, generator=g)
    temp = 15 + 8 * torch.sin(2 * torch.pi * (t - 3) / 24) + torch.randn(6000, generator=g)
    hour = torch.cos(2 * torch.pi * t / 24)
    feats = torch.stack([load, temp, hour], dim=1)
    feats = (feats - feats.mean(0)) / feats.std(0)
    target = (load - load.mean()) / load.std()
    xs = torch.stack([feats[i:i + 24] for i in range(6000 - 25)])
    ys = target[24:6000 - 1]
    model = GRUForecaster()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xs, ys), 64), loss_fn=nn.MSELoss())


class Embedder(nn.Module):
    def __init__(self, d=24, out=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, out))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


@healthy("triplet_margin_product_embeddings", "a product embedder trained with TripletMarginLoss(margin=0.2) on "
         "(anchor, positive, negative) triplets: positives are noisy views of the anchor's item, negatives other items")
def triplet_margin_product_embeddings():
    seed(111)
    g = torch.Generator().manual_seed(111)
    items = torch.randn(500, 24, generator=g) * 0.5
    a_idx = torch.randint(0, 500, (3000,), generator=g)
    n_idx = (a_idx + torch.randint(1, 500, (3000,), generator=g)) % 500
    anchor = items[a_idx] + 1.0 * torch.randn(3000, 24, generator=g)
    positive = items[a_idx] + 1.0 * torch.randn(3000, 24, generator=g)
    negative = items[n_idx] + 1.0 * torch.randn(3000, 24, generator=g)
    triplet = nn.TripletMarginLoss(margin=0.2)

    def triplet_loss(model, batch):
        a, p, n = batch
        return triplet(model(a), model(p), model(n))

    model = Embedder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(anchor, positive, negative), 128), loss_fn=triplet_loss)


class TinySeq2SeqTransformer(nn.Module):
    def __init__(self, vocab=32, d=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(32, d)
        self.transformer = nn.Transformer(d, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                          dim_feedforward=128, dropout=0.1, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def _emb(self, ids):
        return self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))

    def forward(self, src, tgt_in):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        h = self.transformer(self._emb(src), self._emb(tgt_in), tgt_mask=causal, tgt_is_causal=True)
        return self.out(h)


@healthy("transformer_seq2seq_causal_shifted", "a batch_first nn.Transformer reversing token sequences: decoder "
         "input = [BOS] + target[:-1], a causal tgt_mask, CE over the vocabulary")
def transformer_seq2seq_causal_shifted():
    seed(112)
    g = torch.Generator().manual_seed(112)
    src = torch.randint(3, 32, (2048, 10), generator=g)
    tgt = torch.flip(src, dims=[1])
    bos = 1

    def seq2seq_loss(model, batch):
        s, t = batch
        t_in = torch.cat([torch.full_like(t[:, :1], bos), t[:, :-1]], dim=1)
        logits = model(s, t_in)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))

    model = TinySeq2SeqTransformer()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(src, tgt), 64), loss_fn=seq2seq_loss)
