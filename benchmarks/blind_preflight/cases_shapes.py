"""Shapes and broadcasting at the loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight.registry import case, loader, seed, teacher_classes, teacher_regression

BROADCAST = r"broadcast|shape|squeeze|unsqueeze|\(\s*B\s*,\s*1\s*\)|\(\s*\d+\s*,\s*1\s*\)"
SOFTMAX_DIM = (r"(log_?)?softmax[^.]*\b(dim|axis|dimension)|\b(dim|axis|dimension)\b[^.]*(log_?)?softmax"
               r"|wrong (dim|axis|dimension)|normali[sz]ed over|sum(s)? to (one|1) over|class (dim|axis|dimension)")
TIME_MAJOR = (r"batch_first|time.?major|seq(uence)?.?first|\(T, ?B|first dim\w* (is|holds) (the )?(time|sequence)"
              r"|transpose|permute")


@case("housing_mse_b1_vs_b", "shapes",
      "the MLP returns (B,1) predictions while the targets are (B,): MSELoss broadcasts them to a (B,B) matrix and "
      "fits every prediction to every target (the prediction collapses to the batch mean)", BROADCAST)
def housing_mse_b1_vs_b():
    seed()
    x, y = teacher_regression(1024, 8)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.MSELoss())


class AgeCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.regressor = nn.Linear(16, 1)

    def forward(self, x):
        return self.regressor(self.features(x).flatten(1))   # (B, 1)


def _faces(n, s):
    g = torch.Generator().manual_seed(s)
    images = torch.rand(n, 1, 24, 24, generator=g)
    age = 20 + 40 * images[:, :, 6:18, 6:18].mean((1, 2, 3)) + torch.randn(n, generator=g)  # years, (B,)
    return images, (age - 40) / 10


@case("age_cnn_l1_b1_vs_b", "shapes",
      "the CNN regressor outputs (B,1) ages while the targets are (B,): L1Loss broadcasts to (B,B) and trains "
      "towards the batch median instead of each image's age", BROADCAST)
def age_cnn_l1_b1_vs_b():
    seed()
    x, y = _faces(640, 0)
    xv, yv = _faces(128, 1)
    model = AgeCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False), loss_fn=nn.L1Loss())


class Forecaster(nn.Module):
    def __init__(self, features=3, hidden=32):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.out(h[:, -1])          # next value, (B, 1)


@case("forecast_lstm_smoothl1_b1_vs_b", "shapes",
      "the LSTM forecaster returns (B,1) next-step values against (B,) targets; SmoothL1Loss broadcasts to a (B,B) "
      "loss so each forecast is fitted to every series in the batch", BROADCAST)
def forecast_lstm_smoothl1_b1_vs_b():
    seed()
    t = torch.arange(0, 30).float()
    phase = torch.rand(768, 1) * 6.28
    freq = 0.2 + 0.3 * torch.rand(768, 1)
    series = torch.sin(freq * t + phase)                       # (N, 30)
    x = torch.stack([series[:, :-1], torch.cos(freq * t[:-1] + phase), freq.expand(-1, 29)], -1)
    y = series[:, -1]                                            # (N,)
    model = Forecaster()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 48),
                loss_fn=nn.SmoothL1Loss())


class TabularNet(nn.Module):
    """Categorical embeddings + numeric features, as in a tabular regression notebook."""

    def __init__(self, cardinalities=(12, 7, 30), numeric=5):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(c, 4) for c in cardinalities)
        self.mlp = nn.Sequential(nn.Linear(4 * len(cardinalities) + numeric, 64), nn.ReLU(),
                                 nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, batch):
        cats, nums = batch
        emb = [e(cats[:, i]) for i, e in enumerate(self.embeddings)]
        return self.mlp(torch.cat(emb + [nums], 1))     # (B, 1)


def _tabular(n, s):
    g = torch.Generator().manual_seed(s)
    cats = torch.stack([torch.randint(0, c, (n,), generator=g) for c in (12, 7, 30)], 1)
    nums = torch.randn(n, 5, generator=g)
    y = 0.3 * (cats[:, 0] % 4).float() - 0.2 * (cats[:, 1] == 3).float() + nums[:, :2].sum(1) * 0.5
    return cats, nums, y


class TabularDataset(torch.utils.data.Dataset):
    def __init__(self, n, s):
        self.cats, self.nums, self.y = _tabular(n, s)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return (self.cats[i], self.nums[i]), self.y[i]


@case("tabular_custom_mse_b1_vs_b", "shapes",
      "a hand-written ((pred - y) ** 2).mean() with pred (B,1) and y (B,) broadcasts to (B,B) without any torch "
      "warning, so the net learns the batch mean", BROADCAST)
def tabular_custom_mse_b1_vs_b():
    seed()
    model = TabularNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(model, batch):
        inputs, y = batch
        pred = model(inputs)
        return ((pred - y) ** 2).mean()

    return dict(model=model, optimizer=optimizer, train_loader=loader(TabularDataset(1024, 0), 64),
                val_loader=loader(TabularDataset(256, 1), 64, shuffle=False), loss_fn=loss_fn)


@case("churn_manual_bce_b1_vs_b", "shapes",
      "a hand-written weighted BCE on (B,1) logits and (B,) labels broadcasts to (B,B): every customer is "
      "scored against every label in the batch", BROADCAST)
def churn_manual_bce_b1_vs_b():
    seed()
    x, cls = teacher_classes(1024, 12, 4)
    y = (cls == 0).float()                                      # ~25% churners
    model = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Dropout(0.1), nn.Linear(48, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    pos_weight = 3.0

    def loss_fn(model, batch):
        features, labels = batch
        z = model(features)                                     # (B, 1)
        loss = -(pos_weight * labels * F.logsigmoid(z) + (1 - labels) * F.logsigmoid(-z))
        return loss.mean()

    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64), loss_fn=loss_fn)


class BiLSTMTagger(nn.Module):
    def __init__(self, vocab=200, tags=9, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(2 * dim, tags)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        return self.proj(h)                                      # (B, T, C)


def _tagging_data(n, length, vocab=200, tags=9, s=0):
    g = torch.Generator().manual_seed(s)
    tokens = torch.randint(1, vocab, (n, length), generator=g)
    return tokens, tokens % tags


@case("pos_tagger_log_softmax_time_dim", "shapes",
      "log_softmax is taken over dim=1 of the (B,T,C) tagger logits, i.e. over the time steps instead of the tags, "
      "before NLLLoss", SOFTMAX_DIM)
def pos_tagger_log_softmax_time_dim():
    seed()
    tokens, tags = _tagging_data(512, 20)
    model = BiLSTMTagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    nll = nn.NLLLoss()

    def loss_fn(model, batch):
        x, y = batch
        log_probs = F.log_softmax(model(x), dim=1)
        return nll(log_probs.reshape(-1, log_probs.shape[-1]), y.reshape(-1))

    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, tags), 32),
                loss_fn=loss_fn)


class FrameClassifier(nn.Module):
    """Conv1d over audio features, one phone class per frame: logits (B, C, T)."""

    def __init__(self, mels=16, classes=12):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(mels, 32, 5, padding=2), nn.ReLU(),
                                 nn.Conv1d(32, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, classes, 1))

    def forward(self, x):
        return self.net(x)


@case("frame_conv1d_log_softmax_last_dim", "shapes",
      "the conv frame classifier emits (B,C,T) logits; log_softmax(dim=-1) normalises over the T frames, "
      "not the C classes that NLLLoss reads from dim 1", SOFTMAX_DIM)
def frame_conv1d_log_softmax_last_dim():
    seed()
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 12, (384, 50), generator=g)
    prototypes = torch.randn(12, 16, generator=g)
    mels = prototypes[frames].transpose(1, 2) + 0.5 * torch.randn(384, 16, 50, generator=g)
    model = FrameClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(model, batch):
        x, y = batch
        return F.nll_loss(F.log_softmax(model(x), dim=-1), y)

    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(mels, frames), 32),
                loss_fn=loss_fn)


class TinyTextTransformer(nn.Module):
    def __init__(self, vocab=300, dim=32, classes=5, max_len=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, max_len, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens) + self.pos[:, : tokens.shape[1]])
        return self.head(h.mean(1))


def _topic_data(n, length=24, vocab=300, classes=5, s=0):
    g = torch.Generator().manual_seed(s)
    labels = torch.randint(0, classes, (n,), generator=g)
    tokens = torch.randint(0, vocab, (n, length), generator=g)
    keyword = torch.rand(n, length, generator=g) < 0.3
    tokens = torch.where(keyword, labels[:, None] * 7 + 1, tokens)     # topic keywords
    return tokens, labels


@case("topic_transformer_log_softmax_batch_dim", "shapes",
      "log_softmax(dim=0) over the (B,C) logits normalises across the examples of the batch instead of across "
      "the classes before nll_loss", SOFTMAX_DIM)
def topic_transformer_log_softmax_batch_dim():
    seed()
    tokens, labels = _topic_data(512)
    model = TinyTextTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_fn(model, batch):
        x, y = batch
        return F.nll_loss(F.log_softmax(model(x), dim=0), y)

    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, labels), 32),
                loss_fn=loss_fn)


class Sentences(Dataset):
    """Variable-length sentences with per-token tags (NER-like)."""

    def __init__(self, n, vocab=200, tags=7, s=0):
        g = torch.Generator().manual_seed(s)
        lengths = torch.randint(5, 25, (n,), generator=g)
        self.items = []
        for length in lengths.tolist():
            tokens = torch.randint(1, vocab, (length,), generator=g)
            tag = torch.where(tokens > 150, tokens % tags, torch.zeros_like(tokens))
            tag[1:] = torch.where(tokens[:-1] < 10, torch.full_like(tag[1:], tags - 1), tag[1:])  # context
            self.items.append((tokens, tag))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate_time_major(batch):
    tokens, tags = zip(*batch)
    # pad_sequence's default is batch_first=False: (T, B)
    return pad_sequence(tokens, padding_value=0), pad_sequence(tags, padding_value=-100)


class LSTMTagger(nn.Module):
    def __init__(self, vocab=200, tags=7, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, dim, num_layers=1, batch_first=True)
        self.out = nn.Linear(dim, tags)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        return self.out(h)


@case("ner_lstm_time_major_batch", "shapes",
      "the collate pads with pad_sequence's default batch_first=False, so batches are (T,B), but the LSTM is "
      "batch_first=True: it runs its recurrence across the sentences of the batch instead of along each sentence",
      TIME_MAJOR)
def ner_lstm_time_major_batch():
    seed()
    model = LSTMTagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)

    def loss_fn(model, batch):
        tokens, tags = batch
        logits = model(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tags.reshape(-1), ignore_index=-100)

    return dict(model=model, optimizer=optimizer,
                train_loader=loader(Sentences(512), 16, collate_fn=collate_time_major), loss_fn=loss_fn)


class TransformerTagger(nn.Module):
    def __init__(self, vocab=200, tags=7, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(dim, tags)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens), src_key_padding_mask=tokens == 0)
        return self.out(h)


@case("ner_transformer_time_major_batch", "shapes",
      "time-major (T,B) batches from pad_sequence reach a batch_first=True TransformerEncoder: self-attention mixes "
      "tokens of different sentences at one position instead of the tokens of one sentence", TIME_MAJOR)
def ner_transformer_time_major_batch():
    seed()
    model = TransformerTagger()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(Sentences(512, s=1), 16, collate_fn=collate_time_major),
                loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]).flatten(0, 1), batch[1].flatten()))
