"""Set m, family targets: what the loss is asked to fit is not what the user means."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_m.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, seed

# --------------------------------------------------------------------------------------------------------------
# 1. Keyword spotting on mel-spectrogram patches; the CNN ends in nn.Softmax "so it outputs probabilities" and is
#    trained with nn.CrossEntropyLoss. Source: https://discuss.pytorch.org/t/cross-entropy-loss-is-not-decreasing/43814/16


def keyword_spectrograms(n, s, classes=10):
    g = gen(s)
    templates = torch.randn(classes, 1, 20, 40, generator=gen(100))
    templates = F.avg_pool2d(templates, 3, stride=1, padding=1) * 2.0
    y = torch.randint(0, classes, (n,), generator=g)
    shift = torch.randint(0, 9, (n,), generator=g)
    x = torch.stack([templates[y[i], :, :, shift[i]:shift[i] + 32] for i in range(n)])
    return x + 1.0 * torch.randn(x.shape, generator=g), y


class KeywordCNN(nn.Module):
    def __init__(self, softmax_out):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(32, 10))
        self.softmax_out = softmax_out
        self.prob = nn.Softmax(dim=1)

    def forward(self, x):
        logits = self.net(x)
        return self.prob(logits) if self.softmax_out else logits


@case("targets_softmax_then_cross_entropy", "targets",
      "The keyword CNN ends in nn.Softmax and its probabilities go into nn.CrossEntropyLoss, which applies "
      "log_softmax again (a double softmax), so the loss saturates and the gradients shrink.",
      r"(double|twice|two)\W{0,3}softmax|softmax.{0,60}(twice|again|already (applied|included|inside))"
      r"|CrossEntropyLoss.{0,80}(already|includes|applies|does)\W{0,3}.{0,20}(log_?softmax|softmax)"
      r"|(remove|drop|delete) (the )?(final |last |output )?(nn\.)?softmax|(outputs?|logits) (are|is|look like|sum to 1)"
      r".{0,30}(probabilit|softmax)\w*.{0,80}(CrossEntropy|cross[- ]entropy)|(probabilit|softmax)\w*.{0,60}"
      r"(CrossEntropyLoss|cross_entropy|cross[- ]entropy)")
def targets_softmax_then_cross_entropy(fixed=False):
    seed(0)
    x, y = keyword_spectrograms(1800, 11)
    model = KeywordCNN(softmax_out=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(x[1400:], y[1400:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("targets_softmax_then_cross_entropy", fixed_of(targets_softmax_then_cross_entropy),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 2. News-topic classifier (EmbeddingBag) whose forward returns F.softmax, trained with nn.NLLLoss.
#    Source: https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9


def topic_docs(n, s, vocab=600, topics=12, length=30):
    g = gen(s)
    y = torch.randint(0, topics, (n,), generator=g)
    docs = torch.randint(1, vocab, (n, length), generator=g)
    keywords = 1 + torch.arange(topics * 6).view(topics, 6)       # six topic words per topic
    for i in range(n):
        k = int(torch.randint(2, 5, (1,), generator=g))
        pos = torch.randperm(length, generator=g)[:k]
        docs[i, pos] = keywords[y[i], torch.randint(0, 6, (k,), generator=g)]
    return docs, y


class TopicBag(nn.Module):
    def __init__(self, log):
        super().__init__()
        self.bag = nn.EmbeddingBag(600, 32, mode="mean")
        self.fc = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 12))
        self.log = log

    def forward(self, tokens):
        z = self.fc(self.bag(tokens))
        return F.log_softmax(z, dim=1) if self.log else F.softmax(z, dim=1)


@case("targets_softmax_into_nllloss", "targets",
      "The topic model returns F.softmax probabilities but is trained with nn.NLLLoss, which expects "
      "log-probabilities (log_softmax), so the loss is -p[y], negative and nearly flat.",
      r"NLLLoss.{0,80}(expects?|needs?|requires?|takes?|wants?).{0,20}log|log[_ -]?softmax.{0,60}(instead of|rather than"
      r"|not)\W{0,3}.{0,10}softmax|(probabilities|softmax outputs?).{0,60}(NLLLoss|nll_loss)|(NLLLoss|nll_loss).{0,60}"
      r"(probabilities|softmax)|negative (NLL|loss).{0,40}(log|probabilit)|loss (is|goes|becomes) negative")
def targets_softmax_into_nllloss(fixed=False):
    seed(0)
    x, y = topic_docs(2400, 12)
    model = TopicBag(log=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.NLLLoss(), max_steps=1500)


fix("targets_softmax_into_nllloss", fixed_of(targets_softmax_into_nllloss),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 3. Multi-label genre tagging from plot embeddings, trained with CrossEntropyLoss on multi-hot targets.
#    Source: https://github.com/sungho-CoolG/FSCL/issues/2


def genre_rows(n, s, d=32, tags=6):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, tags, generator=gen(200)) / d ** 0.5 * 3
    prevalence = torch.tensor([-2.0, -1.2, -0.4, 0.3, 1.0, 1.8])     # some tags rare, some common
    return x, (x @ w + prevalence > 0).float()


@case("targets_multilabel_cross_entropy", "targets",
      "Independent genre tags (multi-hot targets) are trained with nn.CrossEntropyLoss, a softmax over the tags that "
      "makes them compete, instead of BCEWithLogitsLoss with one sigmoid per tag.",
      r"multi[- ]?(label|hot)|(one |a |per[- ])sigmoid (per|for each) (tag|label|output)|(tags|labels) (are )?"
      r"(independent|not mutually exclusive)|softmax.{0,40}(compete|mutually exclusive|sum to (one|1))"
      r"|CrossEntropy\w*.{0,60}(instead of|rather than).{0,20}(BCE|binary)|(BCE|binary)\w*.{0,40}(instead of|rather "
      r"than).{0,20}CrossEntropy")
def targets_multilabel_cross_entropy(fixed=False):
    seed(0)
    x, y = genre_rows(2400, 13)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=1500)


def subset_accuracy(model, kw):
    def fn(m, b):
        pred = (m(b[0]) > 0).float()
        return (pred == b[1]).all(1).sum().item(), len(b[1])
    return mean_over(model, kw["val_loader"], fn)


fix("targets_multilabel_cross_entropy", fixed_of(targets_multilabel_cross_entropy), subset_accuracy,
    "val subset accuracy (every tag right, logit > 0)")


# --------------------------------------------------------------------------------------------------------------
# 4. Signature verification, siamese MLP; the pair label says 1 = same writer, the contrastive loss is copied from
#    a write-up where Y = 0 means "similar". Source: http://www.eggie5.com/132-contrastive-loss


def signature_pairs(n, s, writers=12, d=24):
    g = gen(s)
    proto = torch.randn(writers, d, generator=gen(300)) * 1.2
    a = torch.randint(0, writers, (n,), generator=g)
    same = torch.rand(n, generator=g) < 0.5
    other = (a + torch.randint(1, writers, (n,), generator=g)) % writers
    b = torch.where(same, a, other)
    x1 = proto[a] + 0.6 * torch.randn(n, d, generator=g)
    x2 = proto[b] + 0.6 * torch.randn(n, d, generator=g)
    return x1, x2, same.float()                     # label 1.0 = same writer (genuine pair)


def contrastive_y0_similar(model, batch, margin=1.0):
    """Hadsell et al. as written in the post: Y = 0 for similar pairs, Y = 1 for dissimilar ones."""
    x1, x2, label = batch
    d = F.pairwise_distance(model(x1), model(x2))
    return (0.5 * (1 - label) * d ** 2 + 0.5 * label * F.relu(margin - d) ** 2).mean()


def contrastive_y1_similar(model, batch, margin=1.0):
    x1, x2, label = batch
    d = F.pairwise_distance(model(x1), model(x2))
    return (0.5 * label * d ** 2 + 0.5 * (1 - label) * F.relu(margin - d) ** 2).mean()


@case("targets_contrastive_label_flipped", "targets",
      "The pair labels use 1 = same writer but the contrastive loss treats label 0 as the similar pair, so genuine "
      "pairs are pushed apart past the margin and forged pairs pulled together.",
      r"(label|target|Y)s? (convention|meaning|semantics).{0,40}(flip|invert|revers|swap|opposite)|(flip|invert|revers"
      r"|swap)\w* (the )?(pair )?(label|target)s?|(similar|same|positive|genuine) pairs?.{0,60}(pushed apart|push\w* "
      r"apart|separated|repell)|1 ?- ?(label|y|target)|label (0|1) (means|for|as|is) (the )?(similar|same|dissimilar)"
      r"|label convention|(similar|same|positive|genuine) pairs?.{0,60}(farther|further|larger distance)")
def targets_contrastive_label_flipped(fixed=False):
    seed(0)
    x1, x2, y = signature_pairs(3000, 14)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x1[:2400], x2[:2400], y[:2400]), 32),
                val_loader=loader(TensorDataset(x1[2400:], x2[2400:], y[2400:]), 100, shuffle=False),
                loss_fn=contrastive_y1_similar if fixed else contrastive_y0_similar, max_steps=1500)


def verification_accuracy(model, kw):
    def fn(m, b):
        d = F.pairwise_distance(m(b[0]), m(b[1]))
        return ((d < 0.5).float() == b[2]).sum().item(), b[2].numel()
    return mean_over(model, kw["val_loader"], fn)


fix("targets_contrastive_label_flipped", fixed_of(targets_contrastive_label_flipped), verification_accuracy,
    "val verification accuracy (same writer iff distance < margin / 2)")


# --------------------------------------------------------------------------------------------------------------
# 5. Next-hour river level from the last 16 readings; the window helper's target index is off by one.
#    Source: https://stackguides.com/questions/51432661/time-series-keras-lstm-echoing-instead-of-predicting


def river_series(length, s):
    g = gen(s)
    t = torch.arange(length, dtype=torch.float32)
    return torch.sin(2 * math.pi * t / 9) + 0.6 * torch.sin(2 * math.pi * t / 4.3) + 0.05 * torch.randn(length, generator=g)


def make_windows(series, look_back, shifted):
    xs, ys = [], []
    for i in range(len(series) - look_back - 1):
        xs.append(series[i:i + look_back])
        # y = data[i + look_back] is the next reading; the notebook wrote i + look_back - 1
        ys.append(series[i + look_back] if shifted else series[i + look_back - 1])
    return torch.stack(xs).unsqueeze(-1), torch.stack(ys).unsqueeze(-1)


class LevelLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(1, 32, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.out(out[:, -1])


@case("targets_forecast_target_unshifted", "targets",
      "The window helper takes the target at index i + look_back - 1, the last reading already inside the input "
      "window, instead of the next reading at i + look_back, so the LSTM learns to echo its input.",
      r"off[- ]by[- ]one|look_?back ?- ?1|(target|label|y)s?.{0,60}(inside|within|part of|already in|contained in|"
      r"included in) (the )?(input|window)|(echo|cop(y|ies)|repeat)\w* (its |the )?(last )?(input|reading|value)"
      r"|not shifted|(shift|lag)\w* (the )?(target|label)s? (by one|forward)|next (reading|value|step).{0,40}"
      r"(instead|rather|not)|identity (map|function)|(target|label|y)s? (equals?|is|==|matches|identical to) (the )?"
      r"(last|final) (input|value|reading|element|time ?step)|x\[:, ?-1\]")
def targets_forecast_target_unshifted(fixed=False):
    seed(0)
    series = river_series(2600, 15)
    x, y = make_windows(series[:2000], 16, shifted=fixed)
    vx, vy = make_windows(series[2000:], 16, shifted=fixed)
    model = LevelLSTM()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


def next_step_rmse(model, kw):
    series = river_series(2600, 15)
    vx, vy = make_windows(series[2000:], 16, shifted=True)       # the honest next-reading targets
    batches = [(vx[i:i + 100], vy[i:i + 100]) for i in range(0, len(vx), 100)]
    return math.sqrt(mean_over(model, batches, lambda m, b: (((m(b[0]) - b[1]) ** 2).sum().item(), b[1].numel())))


fix("targets_forecast_target_unshifted", fixed_of(targets_forecast_target_unshifted), next_step_rmse,
    "next-reading RMSE on the held-out tail", higher=False)
