"""Set d: shapes and broadcasting at the loss, and targets."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_d.registry import case, loader, seed, teacher_classes, teacher_regression

BROADCAST = (r"broadcast|shape|squeeze|unsqueeze|\(\s*B\s*,\s*1\s*\)|\(\s*\d+\s*,\s*1\s*\)|\(\s*1\s*,\s*(B|\d+)\s*\)"
             r"|reshape|view\(|\bsize\b")
SOFTMAX_DIM = (r"(log_?)?softmax[^.]*\b(dim|axis|dimension)\b|\b(dim|axis|dimension)\b[^.]*(log_?)?softmax"
               r"|normali[sz]\w* (over|across|along) (the )?(batch|wrong)|wrong (dim|axis|dimension)")
ONE_CLASS = (r"one class|single class|only (one|a single) (class|label|value)|(labels?|targets?)[^.]*(all|always) "
             r"(the same|equal|identical|\d)|all (the )?(labels|targets)[^.]*(same|equal|identical)|constant"
             r"|(1|one) distinct|distinct (labels|targets|classes|values)|no (label )?variation")
MISALIGN = (r"misalign|align|shift|offset|off.by.one|sort|shuffl|permut|(labels?|targets?)[^.]*(independent|unrelated"
            r"|random|uncorrelated|not (related|aligned|predictable)|do(es)? not (match|belong))|no (signal|relation)"
            r"|cannot (be )?learn|chance")


# ---------------------------------------------------------------- shapes

def _turbine_data(n=1536, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, 4, 48, generator=g)
    wind = x[:, 0].mean(1) * 3 + 0.5 * x[:, 1, -8:].mean(1)
    y = torch.tanh(wind)
    y = (y - y.mean()) / y.std()
    return x, y


class TurbinePowerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(4, 16, 5, padding=2), nn.ReLU(),
                                      nn.Conv1d(16, 16, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1))
        self.head = nn.Conv1d(16, 1, kernel_size=1)       # a "fully convolutional" head

    def forward(self, x):
        return self.head(self.features(x))                # (B, 1, 1)


@case("turbine_conv1d_head_b11_vs_b", "shapes",
      bug="the fully convolutional power regressor ends in Conv1d(16,1,1) after AdaptiveAvgPool1d(1), so it returns "
          "(B,1,1) while the targets are (B,): MSELoss broadcasts them to (B,1,B) and each turbine's prediction is "
          "fitted to every target of the batch",
      cause_pattern=BROADCAST)
def turbine_conv1d_head_b11_vs_b():
    seed(0)
    x, y = _turbine_data()
    model = TurbinePowerNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.MSELoss())


class TinyDepthNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        return self.out(self.enc(x))                       # (B, 1, H, W)


@case("depth_net_b1hw_vs_bhw", "shapes",
      bug="the monocular depth net predicts (B,1,H,W) maps while the dataset stores depth as (B,H,W): MSELoss aligns "
          "the shapes from the right and broadcasts them to (B,B,H,W), so every prediction is fitted to every depth "
          "map of the batch",
      cause_pattern=BROADCAST)
def depth_net_b1hw_vs_bhw():
    seed(1)
    g = torch.Generator().manual_seed(1)
    img = torch.randn(512, 3, 16, 16, generator=g)
    depth = F.avg_pool2d(img[:, :1] * 0.7 + img[:, 1:2] * 0.3, 3, 1, 1).squeeze(1)   # (N, H, W)
    depth = (depth - depth.mean()) / depth.std()
    model = TinyDepthNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img, depth), 32), loss_fn=nn.MSELoss())


class AttentionPoolClassifier(nn.Module):
    def __init__(self, vocab=200, d=32, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.score = nn.Linear(d, 1)
        self.head = nn.Linear(d, classes)

    def forward(self, ids):                                 # ids (B, T)
        h = self.embed(ids)                                 # (B, T, d)
        w = torch.softmax(self.score(h).squeeze(-1), dim=0)  # (B, T): normalised over the batch
        pooled = (w.unsqueeze(-1) * h).sum(1)
        return self.head(pooled)


def _review_tokens(n=2048, t=24, vocab=200, s=2):
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(10, vocab, (n, t), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    pos = torch.randint(0, t, (n,), generator=g)
    ids[torch.arange(n), pos] = y + 1                       # one sentiment token (1, 2 or 3) somewhere
    return ids, y


@case("review_attention_pool_softmax_over_batch", "shapes",
      bug="the attention-pooling weights are softmax(scores, dim=0) over a (B,T) score matrix, i.e. normalised across "
          "the reviews of the batch instead of along each review's tokens, so each review's pooled vector depends on "
          "the other reviews in the batch (served one review at a time, its accuracy falls to chance)",
      cause_pattern=SOFTMAX_DIM + r"|(attention|pooling) weights")
def review_attention_pool_softmax_over_batch():
    seed(2)
    ids, y = _review_tokens()
    model = AttentionPoolClassifier()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids, y), 64), loss_fn=nn.CrossEntropyLoss())


class DistillStudent(nn.Module):
    def __init__(self, d=20, c=5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, c))

    def forward(self, x):
        return self.net(x)


@case("distill_student_log_softmax_batch_dim", "shapes",
      bug="the distillation loss takes F.log_softmax(student_logits / T, dim=0) of the (B,C) logits, normalising "
          "over the batch, while the teacher's softmax (and kl_div's targets) are over the classes (dim=-1)",
      cause_pattern=SOFTMAX_DIM + r"|class (dim|axis|dimension)")
def distill_student_log_softmax_batch_dim():
    seed(3)
    x, y = teacher_classes(2048, 20, 5, s=3)
    teacher = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 5))
    topt = torch.optim.Adam(teacher.parameters(), lr=1e-2)   # a "trained" teacher: fit it quickly first
    for _ in range(150):
        topt.zero_grad()
        F.cross_entropy(teacher(x), y).backward()
        topt.step()
    teacher.eval().requires_grad_(False)
    temperature = 2.0

    def distill_loss(model, batch):
        inputs, _ = batch
        with torch.no_grad():
            soft = F.softmax(teacher(inputs) / temperature, dim=-1)
        log_p = F.log_softmax(model(inputs) / temperature, dim=0)
        return F.kl_div(log_p, soft, reduction="batchmean") * temperature ** 2

    model = DistillStudent()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=distill_loss)


class LSTMClassifier(nn.Module):
    def __init__(self, feats=8, hidden=32, classes=2):
        super().__init__()
        self.lstm = nn.LSTM(feats, hidden, num_layers=1)    # batch_first left at its default (False)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):                                   # x (B, T, F) from the DataLoader
        out, _ = self.lstm(x)
        return self.head(out[:, -1])                        # "last time step", as in batch_first code


@case("sensor_lstm_missing_batch_first_last_step", "shapes",
      bug="the LSTM is built without batch_first=True but fed (B,T,F) batches and the classifier reads out[:, -1] as "
          "in batch_first code: the LSTM runs along the batch and out[:, -1] is the state of the last time step's "
          "column after reading samples 0..b, not each sample's sequence",
      cause_pattern=r"batch_first|time.?major|seq(uence)?.?first|batch.?major|\(T, ?B|\(B, ?T|transpose|permute"
                    r"|(batch|sequence|time) (dim|dimension|axis)|mix(es|ing)? (samples|the batch)")
def sensor_lstm_missing_batch_first_last_step():
    seed(4)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2048, 20, 8, generator=g)
    y = (x[:, :, 0].sum(1) > 0).long()
    model = LSTMClassifier()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64, drop_last=True), loss_fn=nn.CrossEntropyLoss())


class RankScorer(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)                                  # (B, 1)


@case("relevance_target_unsqueezed_wrong_axis", "shapes",
      bug="the relevance scorer returns (B,1) and the loss 'fixes' the (B,) targets with y.unsqueeze(0), making them "
          "(1,B): the difference broadcasts to (B,B) and every score is fitted to every target of the batch",
      cause_pattern=BROADCAST)
def relevance_target_unsqueezed_wrong_axis():
    seed(5)
    x, y = teacher_regression(2048, 16, s=5)

    def mse_loss(model, batch):
        feats, rel = batch
        pred = model(feats)
        return F.mse_loss(pred, rel.unsqueeze(0))          # meant rel.unsqueeze(1)

    model = RankScorer()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=mse_loss)


# ---------------------------------------------------------------- targets

class PetPathsDataset(Dataset):
    """Images listed by path 'data/train/<class>/<id>.png'; pixels synthesised from the class."""

    def __init__(self, n=1200, s=6):
        g = torch.Generator().manual_seed(s)
        names = ["cat", "dog", "rabbit"]
        true = torch.randint(0, 3, (n,), generator=g)
        self.paths = [f"data/train/{names[int(c)]}/{i:05d}.png" for i, c in enumerate(true)]
        self.images = torch.randn(n, 3, 16, 16, generator=g) * 0.5
        for c in range(3):
            self.images[true == c, c] += 1.0
        classes = sorted({p.split("/")[-3] for p in self.paths})      # meant [-2]: the class folder
        self.class_to_idx = {c: i for i, c in enumerate(classes)}
        self.labels = [self.class_to_idx[p.split("/")[-3]] for p in self.paths]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class SmallCNN(nn.Module):
    def __init__(self, classes=3, ch=3):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(ch, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.f(x))


@case("pets_label_from_wrong_path_component", "targets",
      bug="the class is read from path.split('/')[-3], which is the split folder 'train' for every image instead of "
          "the class folder [-2]: every label is 0 and the 3-class CNN sees a single class",
      cause_pattern=ONE_CLASS)
def pets_label_from_wrong_path_component():
    seed(6)
    model = SmallCNN(3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(PetPathsDataset(), 32), loss_fn=nn.CrossEntropyLoss())


class IncomeMLP(nn.Module):
    def __init__(self, d=24):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@case("adult_libsvm_labels_minus_one_bce", "targets",
      bug="the LIBSVM-format labels are -1/+1 and go straight into BCEWithLogitsLoss, which needs 0/1: a -1 target "
          "makes the loss unbounded below, so it falls without limit by pushing negatives' logits to -inf",
      cause_pattern=r"-1\b|\{-1|minus one|negative (targets|labels|values)|outside \[0, ?1\]|in \[0, ?1\]"
                    r"|between 0 and 1|0 (and|or) 1\b|0/1|range")
def adult_libsvm_labels_minus_one_bce():
    seed(7)
    x, c = teacher_classes(3072, 24, 2, s=7)
    y = (c.float() * 2 - 1)                                 # {-1, +1} as in the a9a .libsvm file
    model = IncomeMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.BCEWithLogitsLoss())


class TagMLP(nn.Module):
    def __init__(self, d=32, tags=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, tags))

    def forward(self, x):
        return self.net(x)


@case("product_tags_softmax_then_bce", "targets",
      bug="products carry several tags (multi-hot rows with 2-4 ones) but the loss is BCELoss on "
          "torch.softmax(logits, dim=1): the tag probabilities must sum to 1, so the tags compete and several tags "
          "can never all be predicted (sigmoid per tag is needed)",
      cause_pattern=r"softmax|sigmoid|multi.?(hot|label)|compete|sum(s)? to (one|1)|BCEWithLogits")
def product_tags_softmax_then_bce():
    seed(8)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2048, 32, generator=g)
    w = torch.randn(32, 8, generator=g)
    scores = x @ w
    y = (scores > scores.quantile(0.6, dim=1, keepdim=True)).float()   # ~3 of 8 tags per product
    bce = nn.BCELoss()

    def tag_loss(model, batch):
        feats, tags = batch
        return bce(torch.softmax(model(feats), dim=1), tags)

    model = TagMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=tag_loss)


class PosTagger(nn.Module):
    def __init__(self, vocab=300, tags=12, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * d, tags)

    def forward(self, ids):
        h, _ = self.gru(self.embed(ids))
        return self.out(h)


class TaggedSentences(Dataset):
    def __init__(self, n=1500, s=9):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(5, 20, (1,), generator=g))
            ids = torch.randint(1, 300, (length,), generator=g)
            self.items.append((ids, ids % 12))
    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def hf_style_collate(batch):
    ids = pad_sequence([b[0] for b in batch], batch_first=True, padding_value=0)
    tags = pad_sequence([b[1] for b in batch], batch_first=True, padding_value=-100)   # HF convention
    return ids, tags


@case("pos_tagger_ignore_index_minus1_pads_minus100", "targets",
      bug="the collate pads the tag sequences with -100 (the Hugging Face convention) but the loss is "
          "CrossEntropyLoss(ignore_index=-1), so the padded positions are not ignored: -100 is an out-of-range class "
          "and the step fails",
      cause_pattern=r"-100|ignore_index|pad|out of (range|bounds)|outside \[0|negative (targets|labels|class)")
def pos_tagger_ignore_index_minus1_pads_minus100():
    seed(9)
    ce = nn.CrossEntropyLoss(ignore_index=-1)

    def tag_loss(model, batch):
        ids, tags = batch
        logits = model(ids)
        return ce(logits.flatten(0, 1), tags.flatten())

    model = PosTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TaggedSentences(), 32, collate_fn=hf_style_collate), loss_fn=tag_loss)


class CTRModel(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@case("ctr_percent_targets_into_bce", "targets",
      bug="the click-through rates are exported in percent (0-100) and fed as soft targets to BCEWithLogitsLoss, "
          "which expects probabilities in [0,1]: the loss is unbounded below and the logits are driven to +inf",
      cause_pattern=r"percent|\[0, ?1\]|between 0 and 1|0 (and|to) 1\b|probabilit|scale|range|/ ?100")
def ctr_percent_targets_into_bce():
    seed(10)
    g = torch.Generator().manual_seed(10)
    x = torch.randn(2048, 16, generator=g)
    rate = torch.sigmoid(x @ torch.randn(16, generator=g) * 0.5 - 2.0)
    y = rate * 100.0                                         # CTR in percent from the reporting export
    model = CTRModel()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.BCEWithLogitsLoss())


class GRUTranslator(nn.Module):
    def __init__(self, vocab=40, d=64):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, d)
        self.tgt_embed = nn.Embedding(vocab, d)
        self.encoder = nn.GRU(d, d, batch_first=True)
        self.decoder = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src, tgt_in):
        _, h = self.encoder(self.src_embed(src))
        dec, _ = self.decoder(self.tgt_embed(tgt_in), h)
        return self.out(dec)


@case("translation_gru_decoder_fed_unshifted_targets", "targets",
      bug="teacher forcing feeds the decoder the target sequence itself (tgt) instead of [BOS] + tgt[:-1], so at "
          "every position the decoder reads the very token it must predict and learns to copy its input",
      cause_pattern=r"leak|shift|teacher.forcing|copy|BOS|\bstart token|(targets?|labels?)[^.]*(equal|same as|identical"
                    r" to)[^.]*(input|decoder)|(input|decoder)[^.]*(equal|same as|identical to)[^.]*(targets?|labels?)")
def translation_gru_decoder_fed_unshifted_targets():
    seed(11)
    g = torch.Generator().manual_seed(11)
    src = torch.randint(3, 40, (2048, 12), generator=g)
    tgt = torch.flip(src, dims=[1])                          # "translate" = reverse

    def seq2seq_loss(model, batch):
        s, t = batch
        logits = model(s, t)                                 # meant: model(s, cat([BOS], t[:, :-1]))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), t.reshape(-1))

    model = GRUTranslator()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src, tgt), 64), loss_fn=seq2seq_loss)


def _demand_series(length=6000, s=12):
    g = torch.Generator().manual_seed(s)
    t = torch.arange(length, dtype=torch.float32)
    series = torch.sin(2 * np.pi * t / 24) + 0.5 * torch.sin(2 * np.pi * t / 168) + 0.3 * torch.randn(length, generator=g)
    return (series - series.mean()) / series.std()


class DemandMLP(nn.Module):
    def __init__(self, window):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(window, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@case("demand_window_includes_target_step", "targets",
      bug="the windowing slices series[i : i + W + 1] as the input and series[i + W] as the target (off by one), so "
          "the last input value is the value to forecast and the model learns to copy it",
      cause_pattern=r"leak|(targets?|labels?)[^.]*(in|among|equal|copy|contained|present)[^.]*(input|feature|window)"
                    r"|(input|feature|window|column)[^.]*(contain|include|equal|identical|copy)[^.]*(targets?|labels?)"
                    r"|off.by.one")
def demand_window_includes_target_step():
    seed(12)
    series = _demand_series()
    window = 24
    xs = torch.stack([series[i:i + window + 1] for i in range(len(series) - window - 1)])
    ys = torch.stack([series[i + window] for i in range(len(series) - window - 1)])
    model = DemandMLP(window + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xs, ys), 64), loss_fn=nn.MSELoss())


@case("csv_features_skip_header_labels_dont", "targets",
      bug="the feature reader skips the first CSV line as a header (rows[1:]) but the labels file has no header and "
          "is read whole (labels[:-1] to match the length): every label belongs to the previous row, so labels and "
          "inputs are unrelated",
      cause_pattern=MISALIGN)
def csv_features_skip_header_labels_dont():
    seed(13)
    x, y = teacher_classes(3001, 20, 4, s=13)
    features = x[1:]                                         # "skip the header row"
    labels = y[:-1]                                          # the labels file had no header
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(features, labels), 64), loss_fn=nn.CrossEntropyLoss())
