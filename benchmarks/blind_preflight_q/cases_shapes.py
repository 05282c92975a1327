"""Set q, family "shapes": a tensor laid out, normalized or reduced along the wrong axis (no crash)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_q.registry import broken, loader, rng, seed

# ---------------------------------------------------------------------------------------------------------------
# 1. LED indicator colour from inspection photos: HWC numpy images turned into NCHW with reshape, not permute.


def led_images(n: int, s: int):
    """Photos of a control panel (H, W, 3) in [0, 1]: one 3x3 indicator lamp, red / green / blue = class 0 / 1 / 2."""
    g = rng(s)
    imgs = g.uniform(0.0, 0.3, size=(n, 16, 16, 3)).astype(np.float32)
    labels = g.integers(0, 3, size=n)
    for i in range(n):
        r, c = g.integers(0, 14), g.integers(0, 14)
        lamp = np.full(3, 0.15, np.float32)
        lamp[labels[i]] = 0.95
        imgs[i, r:r + 3, c:c + 3, :] = lamp + g.normal(0, 0.03, size=(3, 3, 3))
    return imgs, labels


class LampNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(16, 3)

    def forward(self, x):
        return self.classifier(self.features(x))


def to_torch_images(imgs: np.ndarray, fixed: bool) -> torch.Tensor:
    if fixed:
        return torch.from_numpy(imgs).permute(0, 3, 1, 2).contiguous()
    # "PyTorch wants (N, C, H, W)"
    return torch.from_numpy(imgs).reshape(-1, 3, 16, 16)


@broken("led_color_reshape_hwc", "shapes",
        "The HWC numpy photos are turned into NCHW with torch.from_numpy(imgs).reshape(-1, 3, 16, 16) instead of "
        "permute(0, 3, 1, 2): each 'channel' holds interleaved R, G, B values of a band of rows, so the lamp colour "
        "becomes a one-pixel shift the translation-invariant CNN cannot read.",
        "x = torch.from_numpy(imgs).permute(0, 3, 1, 2)",
        "https://github.com/Selen-Suyue/DensePolicy2D/issues/3",
        r"reshape\W.{0,80}(instead of|rather than|not|without) .{0,30}(permute|transpose|moveaxis)"
        r"|(permute|transpose)\(0, ?3, ?1, ?2\)|moveaxis|(hwc|nhwc|channels?[- ]last|\(n, ?h, ?w, ?c\))"
        r".{0,120}(reshape|view)|(reshape|view)\W.{0,120}(hwc|nhwc|channels?[- ]last|\(n, ?h, ?w, ?c\))"
        r"|(colou?r )?channels? (are |is )?(scrambled|interleaved|mixed)|(reshape|view)\W.{0,60}(does not|doesn't|"
        r"cannot|can't) (move|reorder|permute|transpose)")
def led_color_reshape_hwc(fixed: bool = False):
    seed(0)
    imgs, labels = led_images(1400, 11)
    x, y = to_torch_images(imgs, fixed), torch.from_numpy(labels)
    model = LampNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), 64),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 2. Shopping-session sentiment: an HF-style attention_mask (1 = real) passed as src_key_padding_mask.

POSITIVE, NEGATIVE = (2, 3, 4), (5, 6, 7)


def session_tokens(n: int, s: int, max_len: int = 20):
    """[CLS]=1 then 6..15 event tokens (2..13), right-padded with 0; label 1 when positive events outnumber negative."""
    g = rng(s)
    ids = np.zeros((n, max_len), np.int64)
    mask = np.zeros((n, max_len), np.int64)
    labels = np.zeros(n, np.int64)
    i = 0
    while i < n:
        length = g.integers(6, 16)
        toks = g.integers(2, 14, size=length)
        pos, neg = np.isin(toks, POSITIVE).sum(), np.isin(toks, NEGATIVE).sum()
        if pos == neg:
            continue
        ids[i, 0], ids[i, 1:length + 1] = 1, toks
        mask[i, :length + 1] = 1
        labels[i] = int(pos > neg)
        i += 1
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(labels)


class SessionEncoder(nn.Module):
    def __init__(self, hf_mask_fixed: bool, vocab: int = 14, d: int = 32, max_len: int = 20):
        super().__init__()
        self.hf_mask_fixed = hf_mask_fixed
        self.tok = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, ids, attention_mask):
        h = self.tok(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        if self.hf_mask_fixed:
            h = self.encoder(h, src_key_padding_mask=attention_mask == 0)
        else:
            h = self.encoder(h, src_key_padding_mask=attention_mask.bool())
        return self.head(h[:, 0])  # the [CLS] position


def session_loss(model, batch):
    ids, mask, y = batch
    return F.cross_entropy(model(ids, mask), y)


@broken("clickstream_padding_mask_inverted", "shapes",
        "The HF-style attention_mask (1 = real event, 0 = padding) is passed as src_key_padding_mask, where True "
        "means 'ignore this key': every real event is masked out and the [CLS] position attends only to padding.",
        "src_key_padding_mask=(attention_mask == 0)",
        "https://github.com/pytorch/pytorch/pull/39321",
        r"(src_)?key_padding_mask.{0,160}(invert|revers|flip|opposite|true (means|marks|=|is) (ignore|pad|mask)"
        r"|1 (for|=|marks|means) (real|valid|kept)|real (tokens|events|positions)|== ?0|~|logical_not)"
        r"|(attend|attention)\w* only (to )?(the )?(pad|padding)|(real|non-pad\w*|valid|actual) (tokens|events|"
        r"positions) (are |get )?(masked|ignored|hidden)|(padding )?mask (is |was )?(inverted|reversed|flipped|"
        r"the wrong way)|attention_mask.{0,80}(1 = real|1 for real|convention)")
def clickstream_padding_mask_inverted(fixed: bool = False):
    seed(1)
    ids, mask, y = session_tokens(1600, 21)
    model = SessionEncoder(hf_mask_fixed=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(ids[:1200], mask[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(ids[1200:], mask[1200:], y[1200:]), 200, shuffle=False),
                loss_fn=session_loss, max_steps=300, clip_grad_norm=1.0)


# ---------------------------------------------------------------------------------------------------------------
# 3. Gearbox vibration windows: nn.LSTM without batch_first fed (batch, time, features).


def vibration_windows(n: int, s: int, t: int = 30):
    """3-axis accelerometer windows (n, t, 3): class = dominant shaft frequency (1, 2 or 3.5 cycles a window)."""
    g = rng(s)
    labels = g.integers(0, 3, size=n)
    freqs = np.array([1.0, 2.0, 3.5])[labels]
    tt = np.arange(t)[None, :, None]
    phase = g.uniform(0, 2 * np.pi, size=(n, 1, 1))
    amp = g.uniform(0.5, 1.5, size=(n, 1, 3))
    x = amp * np.sin(2 * np.pi * freqs[:, None, None] * tt / t + phase + np.array([0.0, 0.3, 0.6]))
    x = x + g.normal(0, 0.2, size=x.shape)
    return torch.tensor(x, dtype=torch.float32), torch.from_numpy(labels)


class GearboxLSTM(nn.Module):
    def __init__(self, batch_first: bool):
        super().__init__()
        if batch_first:
            self.lstm = nn.LSTM(input_size=3, hidden_size=32, num_layers=1, batch_first=True)
        else:
            self.lstm = nn.LSTM(input_size=3, hidden_size=32, num_layers=1)
        self.head = nn.Linear(32, 3)

    def forward(self, x):  # x: (batch, time, 3)
        out, _ = self.lstm(x)
        return self.head(out[:, -1, :])  # last time step


@broken("vibration_lstm_not_batch_first", "shapes",
        "nn.LSTM(input_size=3, hidden_size=32) is built without batch_first=True but fed (batch, time, features) "
        "windows: it reads the batch as the time axis, runs its recurrence across samples, and out[:, -1] returns "
        "one time step per window instead of the window's summary.",
        "nn.LSTM(input_size=3, hidden_size=32, num_layers=1, batch_first=True)",
        "https://theneuralbase.com/pytorch/learn/intermediate/input-shape-for-rnns-seq-batch-features/",
        r"batch_first|(time|seq(uence)?)[- ](first|major)|\(seq(_len)?, ?batch|\(l, ?n, ?h|(batch|samples?) "
        r"(dimension |axis )?(is |are )?(treated|read|used|interpreted|taken) as (the )?(time|sequence)|recurren\w* "
        r"(runs |is run |goes )?(over|across) (the )?(batch|samples)")
def vibration_lstm_not_batch_first(fixed: bool = False):
    seed(2)
    x, y = vibration_windows(1500, 31)
    model = GearboxLSTM(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1100], y[:1100]), 64),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 4. Card sessions: attention pooling whose softmax runs over the size-1 score axis.


def card_sessions(n: int, s: int, t: int = 10):
    """(n, t, 8) transactions: standardized log-amount, merchant category one-hot (6), hour / 24.
    Label: the merchant category of the session's largest transaction."""
    g = rng(s)
    amount = g.lognormal(3.0, 1.0, size=(n, t))
    cats = g.integers(0, 6, size=(n, t))
    x = np.zeros((n, t, 8), np.float32)
    x[..., 0] = (np.log(amount) - 3.0) / 1.0
    x[np.arange(n)[:, None], np.arange(t)[None, :], 1 + cats] = 1.0
    x[..., 7] = g.integers(0, 24, size=(n, t)) / 24.0
    labels = cats[np.arange(n), amount.argmax(1)]
    return torch.from_numpy(x), torch.from_numpy(labels)


class SessionAttentionPool(nn.Module):
    def __init__(self, softmax_dim: int):
        super().__init__()
        self.softmax_dim = softmax_dim
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32))
        self.score = nn.Linear(32, 1)
        self.head = nn.Linear(32, 6)

    def forward(self, x):  # (batch, transactions, 8)
        h = self.encoder(x)
        weights = torch.softmax(self.score(h), dim=self.softmax_dim)  # (batch, transactions, 1)
        return self.head((weights * h).sum(dim=1))


@broken("transactions_attention_softmax_singleton", "shapes",
        "The attention pooling computes torch.softmax(self.score(h), dim=-1) on scores of shape (batch, "
        "transactions, 1): the softmax runs over the size-1 axis, every weight is exactly 1.0 and the pooling is an "
        "unweighted sum over the session's transactions.",
        "weights = torch.softmax(self.score(h), dim=1)",
        "https://github.com/DEEP-PolyU/KEQA_WSDM19/issues/2",
        r"softmax.{0,100}(size[- ]1|singleton|length[- ]1|single[- ]element|last (dim|axis)|dim ?= ?-1|wrong "
        r"(dim|axis))|(attention )?weights (are )?(all )?(exactly )?(1(\.0)?|one)\b|all (attention )?weights "
        r"(equal|are) (1|one)|softmax (should run |must run )?(over|along|across) (the )?(transaction|time|sequence|"
        r"instance|session)s? (axis|dim)")
def transactions_attention_softmax_singleton(fixed: bool = False):
    seed(3)
    x, y = card_sessions(3000, 41)
    model = SessionAttentionPool(softmax_dim=1 if fixed else -1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 5. Image-caption retrieval (CLIP-style): embeddings L2-normalized across the batch, F.normalize(dim=0).


def paired_views(n: int, s: int):
    """Paired 'image' (32-d) and 'caption' (24-d) features generated from a shared 8-d latent."""
    g = rng(s)
    z = g.normal(size=(n, 8))
    a, b = g.normal(size=(8, 32)) / np.sqrt(8), g.normal(size=(8, 24)) / np.sqrt(8)
    img = np.tanh(z @ a + 0.1 * g.normal(size=(n, 32)))
    txt = np.tanh(z @ b) + 0.1 * g.normal(size=(n, 24))
    return torch.tensor(img, dtype=torch.float32), torch.tensor(txt, dtype=torch.float32)


class DualEncoder(nn.Module):
    def __init__(self, norm_dim: int, temperature: float = 0.07):
        super().__init__()
        self.norm_dim = norm_dim
        self.temperature = temperature
        self.image_tower = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        self.text_tower = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, img, txt):
        zi = F.normalize(self.image_tower(img), dim=self.norm_dim)
        zt = F.normalize(self.text_tower(txt), dim=self.norm_dim)
        return zi @ zt.t() / self.temperature


def clip_loss(model, batch):
    img, txt = batch
    logits = model(img, txt)
    target = torch.arange(logits.size(0), device=logits.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


@broken("clip_normalize_batch_dim", "shapes",
        "Both towers' embeddings are L2-normalized with F.normalize(z, dim=0), i.e. across the batch instead of per "
        "embedding (dim=-1): rows are not unit vectors, the similarity logits are capped near 0 and depend on the "
        "other pairs in the batch.",
        "zi = F.normalize(self.image_tower(img), dim=-1) (and the same for the text tower)",
        "https://github.com/tensorflow/similarity/issues/237",
        r"normali[sz]\w*.{0,100}(dim ?= ?0|across (the )?batch|over (the )?batch|along (the )?batch|batch "
        r"(dim|axis|dimension))|dim ?= ?0.{0,60}normali[sz]|(not|aren't|are not|isn't|is not) unit[- ](norm|length|"
        r"vectors?)|l2[- ]norm\w* .{0,60}(wrong|batch) (dim|axis)")
def clip_normalize_batch_dim(fixed: bool = False):
    seed(4)
    img, txt = paired_views(2048, 51)
    model = DualEncoder(norm_dim=-1 if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img[:1536], txt[:1536]), 128, drop_last=True),
                val_loader=loader(TensorDataset(img[1536:], txt[1536:]), 128, shuffle=False),
                loss_fn=clip_loss, max_steps=300)
