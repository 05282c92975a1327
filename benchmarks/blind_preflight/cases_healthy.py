"""Healthy setups of real-world shapes: the preflight must raise no warning or error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler, random_split

from benchmarks.blind_preflight.registry import (
    healthy,
    loader,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
)


class Reviews(Dataset):
    def __init__(self, n, vocab=300, s=0):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(4, 30, (1,), generator=g))
            label = int(torch.randint(0, 3, (1,), generator=g))
            tokens = torch.randint(10, vocab, (length,), generator=g)
            marks = torch.rand(length, generator=g) < 0.3
            tokens[marks] = 1 + label
            self.items.append((tokens, label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate_packed(batch):
    tokens, labels = zip(*batch)
    lengths = torch.tensor([len(t) for t in tokens])
    return (pad_sequence(tokens, batch_first=True), lengths), torch.tensor(labels)


class PackedLSTM(nn.Module):
    def __init__(self, vocab=300, dim=32, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, classes)

    def forward(self, inputs):
        tokens, lengths = inputs
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return self.out(h[-1])


@healthy("packed_lstm_sentiment", "variable-length reviews through pack_padded_sequence into an LSTM classifier")
def packed_lstm_sentiment():
    seed()
    model = PackedLSTM()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(Reviews(512), 32, collate_fn=collate_packed),
                val_loader=loader(Reviews(128, s=1), 64, shuffle=False, collate_fn=collate_packed),
                loss_fn=nn.CrossEntropyLoss())


class MultiTaskCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.cls_head = nn.Linear(32, 4)
        self.box_head = nn.Linear(32, 2)

    def forward(self, x):
        h = self.trunk(x)
        return self.cls_head(h), self.box_head(h)


class Shapes(Dataset):
    def __init__(self, n, s=0):
        g = torch.Generator().manual_seed(s)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        self.centres = torch.randint(3, 13, (n, 2), generator=g)
        palette = torch.rand(4, 3, generator=torch.Generator().manual_seed(11))
        self.images = 0.1 * torch.randn(n, 3, 16, 16, generator=g)
        for i in range(n):
            r, c = self.centres[i].tolist()
            self.images[i, :, r - 2: r + 2, c - 2: c + 2] += palette[self.labels[i]][:, None, None]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], (self.labels[i], (self.centres[i].float() - 8) / 4)


@healthy("multitask_cnn_cls_plus_box", "a shared CNN trunk with a class head (CE) and a centre-regression head (MSE "
         "on (B,2) vs (B,2)), losses summed")
def multitask_cnn_cls_plus_box():
    seed()
    model = MultiTaskCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)

    def loss_fn(model, batch):
        images, (labels, centres) = batch
        logits, boxes = model(images)
        return F.cross_entropy(logits, labels) + F.mse_loss(boxes, centres)

    return dict(model=model, optimizer=optimizer, train_loader=loader(Shapes(384), 32), loss_fn=loss_fn)


class FrozenEmbeddingClassifier(nn.Module):
    def __init__(self, vectors, classes=4):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(vectors, freeze=True)     # e.g. GloVe, kept frozen
        self.conv = nn.Conv1d(vectors.shape[1], 32, 3, padding=1)
        self.out = nn.Linear(32, classes)

    def forward(self, tokens):
        h = F.relu(self.conv(self.embed(tokens).transpose(1, 2)))
        return self.out(h.amax(-1))


@healthy("frozen_pretrained_embeddings", "pretrained word vectors frozen (requires_grad=False) and left out of the "
         "optimizer on purpose; a conv text classifier on top")
def frozen_pretrained_embeddings():
    seed()
    vectors = torch.randn(400, 24, generator=torch.Generator().manual_seed(8))
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (512,), generator=g)
    tokens = torch.randint(10, 400, (512, 20), generator=g)
    tokens[:, 5] = labels + 1
    model = FrozenEmbeddingClassifier(vectors)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, labels), 32),
                loss_fn=nn.CrossEntropyLoss())


class ReverseTask(Dataset):
    def __init__(self, n, length=12, vocab=64, s=0):
        # random sequences: 64**12 possibilities, so the train and validation sets share none
        # (an earlier version used token_sequences, of which only ~180 distinct exist: the
        # preflight rightly reported 50 of 64 validation rows as training rows)
        self.src = torch.randint(3, vocab, (n, length), generator=torch.Generator().manual_seed(100 + s))

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        src = self.src[i]
        return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": src.flip(0)}


@healthy("t5_tiny_reverse", "T5ForConditionalGeneration from a tiny T5Config learning to reverse a sequence; "
         "model(**batch).loss")
def t5_tiny_reverse():
    from transformers import T5Config, T5ForConditionalGeneration
    seed()
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.1)
    model = T5ForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(ReverseTask(256), 16),
                val_loader=loader(ReverseTask(64, s=1), 32, shuffle=False), loss_fn=None)


class SentimentBatch(Dataset):
    def __init__(self, n, length=24, vocab=200, s=0):
        g = torch.Generator().manual_seed(s)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.lengths = torch.randint(8, length + 1, (n,), generator=g)
        self.ids = torch.randint(5, vocab, (n, length), generator=g)
        marks = torch.rand(n, length, generator=g) < 0.2
        self.ids = torch.where(marks, 3 + self.labels[:, None], self.ids)
        self.ids[:, 0] = 2
        self.mask = (torch.arange(length)[None] < self.lengths[:, None]).long()
        self.ids = self.ids * self.mask

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


@healthy("bert_tiny_sequence_classification", "BertForSequenceClassification from a tiny BertConfig on padded "
         "sentences with an attention mask; model(**batch).loss")
def bert_tiny_sequence_classification():
    from transformers import BertConfig, BertForSequenceClassification
    seed()
    config = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(SentimentBatch(256), 16),
                val_loader=loader(SentimentBatch(64, s=1), 32, shuffle=False), loss_fn=None)


class CausalLM(Dataset):
    def __init__(self, n, length=32, vocab=96, s=0):
        self.ids = token_sequences(n, length, vocab, s)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


@healthy("gpt2_tiny_causal_lm", "GPT2LMHeadModel from a tiny GPT2Config with labels = input_ids (the model shifts "
         "them itself), tied embeddings untouched")
def gpt2_tiny_causal_lm():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed()
    config = GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(CausalLM(256), 16), loss_fn=None)


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(32, 6)

    def forward(self, x):
        return self.classifier(self.features(x))


def _patterned(n, classes, s=0):
    g = torch.Generator().manual_seed(s)
    labels = torch.randint(0, classes, (n,), generator=g)
    palette = torch.randn(classes, 3, 1, 1, generator=torch.Generator().manual_seed(21))
    return palette[labels] + torch.randn(n, 3, 16, 16, generator=g), labels


@healthy("two_lr_finetune", "a fine-tune with two parameter groups: backbone at lr 1e-4, the new head at 1e-3")
def two_lr_finetune():
    seed()
    images, labels = _patterned(512, 6)
    model = Backbone()
    optimizer = torch.optim.AdamW([
        {"params": model.features.parameters(), "lr": 1e-4},
        {"params": model.classifier.parameters(), "lr": 1e-3},
    ], weight_decay=0.01)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(images, labels), 32),
                loss_fn=nn.CrossEntropyLoss())


@healthy("plain_cnn_shuffle", "a plain CNN classifier, DataLoader(shuffle=True), SGD with momentum, a val loader")
def plain_cnn_shuffle():
    seed()
    images, labels = _patterned(512, 6, s=1)
    vi, vl = _patterned(128, 6, s=2)
    model = Backbone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=optimizer,
                train_loader=DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True,
                                        generator=torch.Generator().manual_seed(0)),
                val_loader=DataLoader(TensorDataset(vi, vl), batch_size=64), loss_fn=nn.CrossEntropyLoss())


class ChurnMLP(nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)          # (B,) logits for (B,) labels


@healthy("tabular_bce_with_logits", "a tabular MLP with (B,) logits and (B,) float labels in BCEWithLogitsLoss")
def tabular_bce_with_logits():
    seed()
    x, cls = teacher_classes(1024, 12, 3)
    y = (cls == 0).float()
    model = ChurnMLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.BCEWithLogitsLoss())


PAD, BOS = 0, 1


class Pairs(Dataset):
    """Source sequence -> the same tokens sorted (variable length), padded target."""

    def __init__(self, n, vocab=40, s=0):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(4, 12, (1,), generator=g))
            src = torch.randint(2, vocab, (length,), generator=g)
            self.items.append((src, src.sort().values))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate_pairs(batch):
    src, tgt = zip(*batch)
    tgt_in = [torch.cat([torch.tensor([BOS]), t[:-1]]) for t in tgt]
    return (pad_sequence(src, batch_first=True, padding_value=PAD),
            pad_sequence(tgt_in, batch_first=True, padding_value=PAD),
            pad_sequence(tgt, batch_first=True, padding_value=-100))


class Seq2SeqGRU(nn.Module):
    def __init__(self, vocab=40, dim=48):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.encoder = nn.GRU(dim, dim, batch_first=True)
        self.decoder = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, src, tgt_in):
        _, h = self.encoder(self.src_embed(src))
        y, _ = self.decoder(self.tgt_embed(tgt_in), h)
        return self.out(y)


@healthy("gru_seq2seq_teacher_forcing", "a GRU encoder-decoder with teacher forcing, padded targets ignored with "
         "ignore_index=-100")
def gru_seq2seq_teacher_forcing():
    seed()
    model = Seq2SeqGRU()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loss_fn(model, batch):
        src, tgt_in, tgt_out = batch
        logits = model(src, tgt_in)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=-100)

    return dict(model=model, optimizer=optimizer, train_loader=loader(Pairs(512), 32, collate_fn=collate_pairs),
                loss_fn=loss_fn, clip_grad_norm=1.0)


class ClsTransformer(nn.Module):
    def __init__(self, vocab=300, dim=32, classes=5, max_len=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.pos[:, : tokens.shape[1]]).mean(1))


@healthy("transformer_label_smoothing", "a small transformer text classifier with CrossEntropyLoss(label_smoothing=0.1)")
def transformer_label_smoothing():
    seed()
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (512,), generator=g)
    tokens = torch.randint(0, 300, (512, 20), generator=g)
    tokens = torch.where(torch.rand(512, 20, generator=g) < 0.3, labels[:, None] * 13 + 1, tokens)
    model = ClsTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, labels), 32),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1))


@healthy("mlp_dropout_01_05", "an MLP classifier with dropout 0.1 on the input side and 0.5 before the head")
def mlp_dropout_01_05():
    seed()
    x, y = teacher_classes(1024, 20, 5, s=4)
    model = nn.Sequential(nn.Dropout(0.1), nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Dropout(0.5), nn.Linear(128, 5))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@healthy("regression_standardized_mse", "an MLP regressor with (B,) predictions on standardised (B,) targets, "
         "MSELoss, a disjoint validation split")
def regression_standardized_mse():
    seed()
    x, y = teacher_regression(1280, 8, s=2)
    y = (y - y.mean()) / y.std()
    train, val = random_split(TensorDataset(x, y), [1024, 256], generator=torch.Generator().manual_seed(0))
    model = Regressor()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(train, 64),
                val_loader=loader(val, 128, shuffle=False), loss_fn=nn.MSELoss())


@healthy("weighted_sampler_per_sample", "an imbalanced classifier with WeightedRandomSampler given one weight per "
         "sample (1 / count of its class)")
def weighted_sampler_per_sample():
    seed()
    x, cls = teacher_classes(2048, 16, 6, s=5)
    y = (cls == 0).long()
    sample_weights = (1.0 / torch.bincount(y).float())[y]
    sampler = WeightedRandomSampler(sample_weights, num_samples=len(y), generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=DataLoader(TensorDataset(x, y), batch_size=64, sampler=sampler),
                loss_fn=nn.CrossEntropyLoss())
