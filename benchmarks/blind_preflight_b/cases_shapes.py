"""Set b, shapes and broadcasting at the loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_b.registry import case, decay_groups, loader, seed, teacher_classes

BROADCAST = (r"broadcast|shape|squeeze|unsqueeze|\(\s*B\s*,\s*1\s*\)|\(\s*\d+\s*,\s*1\s*\)|\(\s*B\s*,\s*B"
             r"|\(\s*\d+\s*,\s*\d+\s*,\s*2\s*\)|\(\s*B\s*,\s*1\s*,\s*2\s*\)")
SOFTMAX_DIM = (r"(log_?)?softmax[^.]*\b(dim|axis|dimension)|\b(dim|axis|dimension)\b[^.]*(log_?)?softmax"
               r"|wrong (dim|axis|dimension)|normali[sz](ed|es|ing) over|sum(s)? to (one|1) over"
               r"|class (dim|axis|dimension)|size.?1 (dim|axis)|singleton")
SEQ_FIRST = (r"batch_first|time.?major|seq(uence)?.?first|\(T, ?B|\(S, ?N|first dim\w* (is|holds) (the )?(time|sequence)"
             r"|transpose|permute|across (the )?(batch|examples|samples|sentences)")


def _wine(n, s):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, 11, generator=g)
    quality = 5.6 + 0.8 * torch.tanh(x[:, 0] - 0.5 * x[:, 3] + 0.3 * x[:, 7]) + 0.1 * torch.randn(n, generator=g)
    return x, quality


class WineNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(11, 48), nn.SiLU(), nn.Linear(48, 48), nn.SiLU(), nn.Linear(48, 1))

    def forward(self, x):
        return self.body(x).squeeze(-1)          # (B,)


@case("wine_quality_targets_as_column", "shapes",
      "the model squeezes its output to (B,) but the targets were kept as a (B,1) column (df[['quality']]): "
      "MSELoss broadcasts (B,) against (B,1) to a (B,B) matrix and every wine is fitted to every score", BROADCAST)
def wine_quality_targets_as_column():
    seed()
    x, quality = _wine(1200, 0)
    y = quality[:, None]                          # df[["quality"]].values -> (N, 1)
    model = WineNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.MSELoss())


class KeypointCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 12, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(12, 24, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                                 nn.Linear(96, 2))

    def forward(self, x):
        return self.net(x)                        # (B, 2): x, y of the nose


def _blobs(n, s):
    g = torch.Generator().manual_seed(s)
    centre = torch.rand(n, 2, generator=g) * 0.6 + 0.2
    grid = torch.linspace(0, 1, 20)
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")
    img = torch.exp(-((xx - centre[:, 0, None, None]) ** 2 + (yy - centre[:, 1, None, None]) ** 2) / 0.01)
    img = img + 0.05 * torch.randn(n, 20, 20, generator=g)
    return img[:, None], centre


@case("keypoint_cnn_targets_n_1_2", "shapes",
      "the keypoint annotations are stored as (N,1,2) (a list of one keypoint per image) while the CNN predicts "
      "(B,2): HuberLoss broadcasts to (B,B,2) and each prediction is pulled towards every keypoint in the batch",
      BROADCAST)
def keypoint_cnn_targets_n_1_2():
    seed()
    x, centre = _blobs(640, 0)
    keypoints = centre[:, None, :]                # [[(x, y)] for each image] -> (N, 1, 2)
    model = KeypointCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, keypoints), 32),
                loss_fn=nn.HuberLoss(delta=0.5))


class SpamGRU(nn.Module):
    def __init__(self, vocab=500, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, 1)

    def forward(self, tokens):
        _, h = self.gru(self.emb(tokens))
        return self.out(h[-1])                    # (B, 1) logit


def _spam(n, s, vocab=500, length=20):
    g = torch.Generator().manual_seed(s)
    tokens = torch.randint(0, vocab, (n, length), generator=g)
    spam = (torch.rand(n, generator=g) < 0.3)
    tokens[spam, :3] = torch.randint(0, 10, (int(spam.sum()), 3), generator=g)  # "free money now"
    return tokens, spam.float()


class FocalLoss(nn.Module):
    """Binary focal loss (Lin et al.), written out by hand."""

    def __init__(self, gamma=2.0, alpha=0.25):
        super().__init__()
        self.gamma, self.alpha = gamma, alpha

    def forward(self, logits, target):
        p = torch.sigmoid(logits)
        ce = -(target * F.logsigmoid(logits) + (1 - target) * F.logsigmoid(-logits))
        p_t = p * target + (1 - p) * (1 - target)
        a_t = self.alpha * target + (1 - self.alpha) * (1 - target)
        return (a_t * (1 - p_t) ** self.gamma * ce).mean()


@case("spam_gru_focal_loss_b1_vs_b", "shapes",
      "a hand-written focal loss receives (B,1) logits from the GRU and (B,) labels: the elementwise terms broadcast to "
      "(B,B), so each message is scored against every label in the batch", BROADCAST)
def spam_gru_focal_loss_b1_vs_b():
    seed()
    tokens, labels = _spam(1024, 0)
    model = SpamGRU()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, labels), 64),
                loss_fn=FocalLoss())


class TinySegNet(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(16, classes, 1)

    def forward(self, x):
        return F.log_softmax(self.head(self.enc(x)), dim=-1)   # meant: over the classes


def _shapes_masks(n, s, size=24):
    g = torch.Generator().manual_seed(s)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    cx = torch.randint(6, 18, (n, 1, 1), generator=g)
    cy = torch.randint(6, 18, (n, 1, 1), generator=g)
    r = torch.randint(3, 6, (n, 1, 1), generator=g)
    disc = ((xx - cx) ** 2 + (yy - cy) ** 2) < r ** 2
    square = ((xx - (size - 1 - cx)).abs() < 3) & ((yy - (size - 1 - cy)).abs() < 3)
    mask = torch.zeros(n, size, size, dtype=torch.long)
    mask[disc] = 1
    mask[square] = 2
    img = mask.float() * 0.5 + 0.2 * torch.randn(n, size, size, generator=g)
    return img[:, None], mask


@case("segnet_log_softmax_over_width", "shapes",
      "the segmentation net ends in log_softmax(dim=-1) on (B,C,H,W) logits, normalising over the image width "
      "instead of the class dim 1 that NLLLoss reads", SOFTMAX_DIM)
def segnet_log_softmax_over_width():
    seed()
    x, mask = _shapes_masks(384, 0)
    model = TinySegNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, mask), 16),
                loss_fn=nn.NLLLoss())


class BeatDataset(Dataset):
    """Heartbeat windows; each item gets a channel axis (left from a Conv1d stem that was later removed)."""

    def __init__(self, n, s):
        self.x, self.y = teacher_classes(n, 64, 5, s)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i].unsqueeze(0), self.y[i]          # (1, 64)


class BeatMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 5), nn.LogSoftmax(dim=1))

    def forward(self, x):                                   # x: (B, 1, 64) -> (B, 1, 5)
        return self.net(x)


def beat_nll(model, batch):
    x, y = batch
    return F.nll_loss(model(x).squeeze(1), y)


@case("ecg_mlp_log_softmax_singleton_dim", "shapes",
      "the inputs carry a leftover channel axis (B,1,64), so the MLP outputs (B,1,5) and LogSoftmax(dim=1) normalises "
      "over the size-1 axis: every log-probability is 0, the NLL is constant and nothing is learned", SOFTMAX_DIM)
def ecg_mlp_log_softmax_singleton_dim():
    seed()
    model = BeatMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=optimizer, train_loader=loader(BeatDataset(1024, 0), 64),
                val_loader=loader(BeatDataset(256, 1), 128, shuffle=False), loss_fn=beat_nll)


class IntentTransformer(nn.Module):
    def __init__(self, vocab=400, dim=32, classes=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1)        # batch_first defaults to False
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.cls = nn.Linear(dim, classes)

    def forward(self, tokens):                       # tokens: (B, T) from the DataLoader
        h = self.encoder(self.emb(tokens))           # read as (T=B, B=T, E)
        return self.cls(h.mean(1))


def _intents(n, s, vocab=400, length=16, classes=6):
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, classes, (n,), generator=g)
    tokens = torch.randint(10, vocab, (n, length), generator=g)
    pos = torch.randint(0, length, (n,), generator=g)
    tokens[torch.arange(n), pos] = y + 1                      # the intent keyword somewhere in the utterance
    return tokens, y


@case("intent_transformer_default_seq_first", "shapes",
      "nn.TransformerEncoderLayer is built without batch_first=True (default: (T,B,E)) but receives (B,T,E) "
      "batches: attention runs across the utterances of the batch at each position instead of along each utterance",
      SEQ_FIRST)
def intent_transformer_default_seq_first():
    seed()
    tokens, y = _intents(1024, 0)
    model = IntentTransformer()
    optimizer = torch.optim.AdamW(decay_groups(model), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, y), 32),
                loss_fn=nn.CrossEntropyLoss())


class CharStream(Dataset):
    """The word_language_model recipe: batchify the stream into columns, then serve (bptt, batch) chunks."""

    def __init__(self, n_tokens=20000, vocab=50, bsz=16, bptt=24, s=0):
        g = torch.Generator().manual_seed(s)
        step = torch.randint(1, 4, (n_tokens // 40,), generator=g).repeat_interleave(40)
        stream = torch.cumsum(step, 0) % vocab
        nbatch = stream.numel() // bsz
        self.data = stream[: nbatch * bsz].view(bsz, -1).t().contiguous()   # (N/bsz, bsz): time-major
        self.bptt = bptt

    def __len__(self):
        return (self.data.size(0) - 1) // self.bptt

    def __getitem__(self, i):
        j = i * self.bptt
        return self.data[j:j + self.bptt], self.data[j + 1:j + 1 + self.bptt]   # (bptt, bsz) each


class CharGRU(nn.Module):
    def __init__(self, vocab=50, dim=48):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x):
        h, _ = self.gru(self.emb(x))
        return self.out(h)


def lm_loss(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


@case("char_gru_batchify_time_major", "shapes",
      "the batchify()/get_batch() recipe serves time-major (bptt, bsz) chunks but the GRU is batch_first=True: "
      "it recurs across the 16 parallel streams at each time step instead of along each stream", SEQ_FIRST)
def char_gru_batchify_time_major():
    seed()
    data = CharStream()
    model = CharGRU()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    train_loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=True,
                                               generator=torch.Generator().manual_seed(1234))
    return dict(model=model, optimizer=optimizer, train_loader=train_loader, loss_fn=lm_loss)
