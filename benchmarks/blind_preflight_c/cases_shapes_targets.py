"""Set b, broken: shapes/broadcasting at the loss, and targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_c.registry import case, loader, seed, teacher_classes, teacher_regression

# cause patterns, written from the mechanism before any run
BROADCAST = r"broadcast|shape|squeeze|unsqueeze|\(\s*B\s*,\s*1\s*\)|\(\s*\d+\s*,\s*1\s*\)|reshape|view\("
SOFTMAX_DIM = (r"(log_?)?softmax[^.]*\b(dim|axis|dimension)|\b(dim|axis|dimension)\b[^.]*(log_?)?softmax|"
               r"wrong (dim|axis|dimension)|normali[sz]ed over|sum(s)? to (one|1) over|class (dim|axis|dimension)")
LAYOUT = (r"batch_first|time.?major|seq(uence)?.?first|batch.?major|\(T, ?B|\(B, ?T|transpose|permute|"
          r"(batch|sequence|time) (dim|dimension|axis)")
SINGLE_CLASS = (r"one class|single class|only (one|a single) (class|label|value)|(labels?|targets?)[^.]*(all|always) "
                r"(the same|equal|identical|\d)|all (the )?(labels|targets)[^.]*(same|equal|identical)|constant|"
                r"distinct (labels|targets|classes|values)|(1|one) distinct|no (label )?variation")
MULTIHOT = (r"multi.?(hot|label)|BCEWithLogits|binary_cross_entropy|probabilit|soft (targets|labels)|"
            r"sum(s)? to (one|1)|one.?hot|distribution")
IGNORED = (r"-100|ignore_index|ignored|masked out|no (valid|unmasked|supervised|non-ignored|counted) "
           r"(target|label|token)|(most|\d+ ?%)[^.]*(labels|targets|tokens)[^.]*(skip|ignor|exclud)")
UNSCALED = r"scale|standardi[sz]|normali[sz]|magnitude|units|\bstd\b|variance"
MISALIGNED = (r"shuffl|permut|sort|misalign|align|(labels?|targets?)[^.]*(independent|unrelated|random|uncorrelated|"
              r"not (related|aligned|predictable))|no (signal|relation)|cannot (be )?learn|chance")


# ----------------------------------------------------------------------------- shapes

class LoadGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 32, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        h, _ = self.gru(x)
        return self.out(h[:, -1]).squeeze(-1)       # (B,)


@case("energy_gru_pred_b_vs_target_b1", "shapes",
      "the GRU load forecaster squeezes its output to (B,) while the dataset stores targets as (B,1) columns: "
      "MSELoss broadcasts to (B,B) and every forecast is fitted to every building's load", BROADCAST)
def energy_gru_pred_b_vs_target_b1():
    seed(1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(768, 12, 4, generator=g)
    y = (x[:, -3:, 0].mean(1) + 0.5 * x[:, -1, 1]).unsqueeze(1)    # (N, 1) from a pandas column slice
    model = LoadGRU()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.MSELoss())


class KeypointCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.head = nn.Linear(16 * 16, 2)

    def forward(self, x):
        return self.head(self.body(x))              # (B, 2): one (x, y) keypoint


class SpotImages(Dataset):
    def __init__(self, n, s=0):
        g = torch.Generator().manual_seed(s)
        self.xy = torch.rand(n, 2, generator=g) * 0.8 + 0.1
        yy, xx = torch.meshgrid(torch.linspace(0, 1, 16), torch.linspace(0, 1, 16), indexing="ij")
        d = (xx[None] - self.xy[:, 0, None, None]) ** 2 + (yy[None] - self.xy[:, 1, None, None]) ** 2
        self.img = torch.exp(-d / 0.01).unsqueeze(1)

    def __len__(self):
        return len(self.xy)

    def __getitem__(self, i):
        return self.img[i], self.xy[i].view(1, 2)   # keypoints stored as (K=1, 2) per image


@case("keypoint_cnn_b2_vs_b12", "shapes",
      "the keypoint regressor predicts (B,2) but the targets are (B,1,2) (one keypoint per image kept as K=1): "
      "MSELoss broadcasts them to (B,B,2) and each image's prediction is fitted to every keypoint in the batch",
      BROADCAST)
def keypoint_cnn_b2_vs_b12():
    seed(2)
    model = KeypointCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(SpotImages(512), 32), loss_fn=nn.MSELoss())


class TinySeg(nn.Module):
    def __init__(self, c=3):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                 nn.ReLU(), nn.Conv2d(16, c, 1))

    def forward(self, x):
        return self.net(x)                          # (B, C, H, W)


def blobs(n, s=0, c=3, size=16):
    g = torch.Generator().manual_seed(s)
    mask = torch.randint(0, c, (n, 1, size // 4, size // 4), generator=g).float()
    mask = F.interpolate(mask, size=size, mode="nearest").long().squeeze(1)
    colours = torch.tensor([[0.1, 0.2, 0.9], [0.8, 0.1, 0.1], [0.2, 0.9, 0.3]])
    img = colours[mask].permute(0, 3, 1, 2) + 0.2 * torch.randn(n, 3, size, size, generator=g)
    return img, mask


@case("segmentation_log_softmax_width_dim", "shapes",
      "the segmentation loss takes log_softmax(dim=-1) of the (B,C,H,W) logits, i.e. over the image width, "
      "before NLLLoss, which reads the classes from dim 1", SOFTMAX_DIM)
def segmentation_log_softmax_width_dim():
    seed(3)
    img, mask = blobs(256)
    model = TinySeg()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    nll = nn.NLLLoss()

    def loss_fn(model, batch):
        x, m = batch
        return nll(F.log_softmax(model(x), dim=-1), m)

    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(img, mask), 16), loss_fn=loss_fn)


class Seq2SeqTimeMajor(nn.Module):
    """Time-major GRU decoder-only 'translator': returns (T, B, V) logits."""

    def __init__(self, vocab=40):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32)
        self.gru = nn.GRU(32, 64)                   # time-major, as in the old tutorials
        self.out = nn.Linear(64, vocab)

    def forward(self, src):                         # src (T, B)
        h, _ = self.gru(self.emb(src))
        return self.out(h)                          # (T, B, V)


@case("seq2seq_time_major_softmax_over_batch", "shapes",
      "the time-major decoder returns (T,B,V) logits and the loss applies log_softmax(dim=1), which is the batch "
      "axis there, not the vocabulary", SOFTMAX_DIM)
def seq2seq_time_major_softmax_over_batch():
    seed(4)
    g = torch.Generator().manual_seed(4)
    src = torch.randint(3, 40, (512, 10), generator=g)
    tgt = (src * 7 + 1) % 37 + 3

    def collate(items):
        s = torch.stack([i[0] for i in items], 1)   # (T, B)
        t = torch.stack([i[1] for i in items], 1)
        return s, t

    model = Seq2SeqTimeMajor()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loss_fn(model, batch):
        s, t = batch
        logp = F.log_softmax(model(s), dim=1)       # meant dim=-1 (vocabulary)
        return F.nll_loss(logp.reshape(-1, logp.size(-1)), t.reshape(-1))

    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(src, tgt), 32, collate_fn=collate),
                loss_fn=loss_fn)


class ActivityGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(6, 48, batch_first=True)
        self.fc = nn.Linear(48, 5)

    def forward(self, x):                           # expects (B, T, 6)
        _, h = self.gru(x)
        return self.fc(h[-1])


@case("activity_gru_windows_stacked_time_major", "shapes",
      "the collate stacks the accelerometer windows along dim 1, giving (T,B,6) batches, while the GRU is "
      "batch_first=True: it steps across the windows of the batch instead of along time, and the head sees T rows",
      LAYOUT)
def activity_gru_windows_stacked_time_major():
    seed(5)
    g = torch.Generator().manual_seed(5)
    n, t = 640, 32
    y = torch.randint(0, 5, (n,), generator=g)
    freq = (y.float() + 1).view(n, 1, 1) * 0.3
    x = torch.sin(freq * torch.arange(t).view(1, t, 1) + torch.rand(n, 1, 6, generator=g) * 6) \
        + 0.2 * torch.randn(n, t, 6, generator=g)

    def collate(items):
        xs = torch.stack([i[0] for i in items], dim=1)   # (T, B, 6)
        ys = torch.stack([i[1] for i in items])
        return xs, ys

    model = ActivityGRU()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    # batch of 32 windows of length 32: the GRU's 'batch' (T=32) and the labels (B=32) line up in size
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 32, collate_fn=collate,
                                                                 drop_last=True),
                loss_fn=nn.CrossEntropyLoss())


class IntentEncoder(nn.Module):
    def __init__(self, vocab=200, d=32, classes=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0)   # batch_first defaults to False
        self.enc = nn.TransformerEncoder(layer, 2)
        self.cls = nn.Linear(d, classes)

    def forward(self, ids):                         # ids (B, T) from the tokenizer
        h = self.enc(self.emb(ids))                 # treated as (T, B, d): attention runs across the batch
        return self.cls(h.mean(1))


@case("intent_transformer_batch_first_default_false", "shapes",
      "(B,T) token batches go through nn.TransformerEncoderLayer built without batch_first=True, so the layer reads "
      "them as (T,B,d): self-attention mixes the sentences of a batch at each position and never looks along a "
      "sentence", LAYOUT)
def intent_transformer_batch_first_default_false():
    seed(6)
    g = torch.Generator().manual_seed(6)
    y = torch.randint(0, 6, (512,), generator=g)
    ids = torch.randint(10, 200, (512, 16), generator=g)
    ids[:, 3] = y + 1                              # the intent keyword at a fixed slot
    model = IntentEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(ids, y), 16),
                loss_fn=nn.CrossEntropyLoss())


# ----------------------------------------------------------------------------- targets

@case("spam_label_case_mismatch_single_class", "targets",
      "labels are computed as label == 'Spam' but the CSV spells it 'spam', so every message is labelled 0 (ham): "
      "the classifier sees a single class", SINGLE_CLASS)
def spam_label_case_mismatch_single_class():
    seed(7)
    g = torch.Generator().manual_seed(7)
    raw = ["spam" if r else "ham" for r in (torch.rand(800, generator=g) < 0.3).tolist()]
    x = torch.rand(800, 50, generator=g)                 # bag-of-words frequencies
    x[:, :5] += torch.tensor([r == "spam" for r in raw]).float().unsqueeze(1)
    y = torch.tensor([1 if r == "Spam" else 0 for r in raw])
    model = nn.Sequential(nn.Linear(50, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())


class AudioTagger(nn.Module):
    def __init__(self, tags=8):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(1, 16, 9, stride=4), nn.ReLU(), nn.Conv1d(16, 32, 5, stride=2), nn.ReLU(),
                                 nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(32, tags))

    def forward(self, wav):
        return self.net(wav)


@case("audio_tagger_multihot_into_cross_entropy", "targets",
      "an audio clip carries several tags (dog, rain, speech...) as a multi-hot vector, but the loss is "
      "F.cross_entropy on those float vectors, a single-label softmax where the tags compete, instead of "
      "binary_cross_entropy_with_logits", MULTIHOT)
def audio_tagger_multihot_into_cross_entropy():
    seed(8)
    g = torch.Generator().manual_seed(8)
    n, tags = 512, 8
    y = (torch.rand(n, tags, generator=g) < 0.3).float()
    y[y.sum(1) == 0, 0] = 1
    freqs = torch.linspace(0.05, 0.45, tags)
    t = torch.arange(400).float()
    wav = (y.unsqueeze(-1) * torch.sin(freqs.view(1, tags, 1) * t * 6.28)).sum(1, keepdim=True)
    wav = wav + 0.3 * torch.randn(n, 1, 400, generator=g)
    model = AudioTagger(tags)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)

    def loss_fn(model, batch):
        x, tags_ = batch
        return F.cross_entropy(model(x), tags_)

    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(wav, y), 32), loss_fn=loss_fn)


class GenreTransformer(nn.Module):
    def __init__(self, vocab=300, d=32, genres=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 64, batch_first=True, dropout=0.0), 1)
        self.head = nn.Linear(d, genres)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)).mean(1))


@case("genre_plot_soft_ce_on_multihot", "targets",
      "movie plots have several genres (multi-hot 0/1), but the hand-written loss is -(y * log_softmax(logits))"
      ".sum(1).mean(), a single-label soft cross-entropy whose softmax makes the genres compete", MULTIHOT)
def genre_plot_soft_ce_on_multihot():
    seed(9)
    g = torch.Generator().manual_seed(9)
    n = 512
    y = (torch.rand(n, 10, generator=g) < 0.25).float()
    ids = torch.randint(20, 300, (n, 24), generator=g)
    for k in range(10):
        ids[:, k] = torch.where(y[:, k] > 0, torch.tensor(k + 1), ids[:, k])
    model = GenreTransformer()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(model, batch):
        x, t = batch
        return -(t * F.log_softmax(model(x), dim=-1)).sum(1).mean()

    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(ids, y), 32), loss_fn=loss_fn)


class BiGRUTagger(nn.Module):
    def __init__(self, vocab=120, tags=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=0)
        self.rnn = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, tags)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.out(h)


@case("ner_gru_ignore_index_is_O_tag", "targets",
      "CrossEntropyLoss(ignore_index=0) was meant to skip padding, but tag id 0 is 'O', about 85% of the tokens: "
      "most real labels are ignored and the tagger never learns to predict O", IGNORED)
def ner_gru_ignore_index_is_O_tag():
    seed(10)
    g = torch.Generator().manual_seed(10)
    n, t = 512, 20
    ids = torch.randint(1, 120, (n, t), generator=g)
    tags = torch.where(ids > 100, (ids - 101) % 4 + 1, torch.zeros_like(ids))   # 0 = 'O'
    model = BiGRUTagger()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ce = nn.CrossEntropyLoss(ignore_index=0)           # padding is -100 in this pipeline, not 0

    def loss_fn(model, batch):
        x, yb = batch
        return ce(model(x).transpose(1, 2), yb)

    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(ids, tags), 32), loss_fn=loss_fn)


@case("song_year_raw_year_targets", "targets",
      "the year-of-release regressor is trained on raw years (1950-2010) with standardised audio features and an "
      "MSE loss: the initial loss is ~4e6 and the gradients are dominated by the target offset, not the features",
      UNSCALED)
def song_year_raw_year_targets():
    seed(11)
    x, y = teacher_regression(1024, 30, s=11)
    years = 1980.0 + 15.0 * y                          # 1950..2010
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, years), 64),
                loss_fn=nn.MSELoss())


class PowerLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.head(h[:, -1]).squeeze(-1)


@case("solar_lstm_targets_in_watts", "targets",
      "the solar-farm LSTM forecasts output power in watts (0-250,000 W) from standardised weather inputs with "
      "L1Loss: targets five orders of magnitude above the outputs, never rescaled", UNSCALED)
def solar_lstm_targets_in_watts():
    seed(12)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(640, 24, 3, generator=g)
    watts = 125_000.0 * (1 + torch.tanh(x[:, -6:, 0].mean(1) - 0.5 * x[:, -1, 2]))
    model = PowerLSTM()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, watts), 32), loss_fn=nn.L1Loss())


@case("loan_labels_sorted_separately", "targets",
      "the label column was sorted (np.sort) for a quick class-balance look and written back, so the default "
      "labels are in ascending order while the applicant rows are not: labels no longer belong to their inputs",
      MISALIGNED)
def loan_labels_sorted_separately():
    seed(13)
    x, y = teacher_classes(1024, 20, 2, s=13)
    y = torch.sort(y).values                           # meant: order = y.argsort(); x, y = x[order], y[order]
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())
