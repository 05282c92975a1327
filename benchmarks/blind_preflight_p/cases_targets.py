"""Targets family: five real user bugs in what the loss is asked to match (no crash)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_p.registry import case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed, split

# --------------------------------------------------------------------------------------------------------------------
# 1. Duplicate-question detection: nn.CosineEmbeddingLoss fed 0/1 pair labels (it expects 1 / -1).


def _question_pairs(n: int, s: int):
    """Bag-of-words vectors of question pairs; half are paraphrases of the same question (same latent intent)."""
    g = gen(30)
    w = torch.randn(12, 60, generator=g)
    g = gen(s)
    z1 = torch.randn(n, 12, generator=g)
    dup = (torch.rand(n, generator=g) < 0.5).float()
    z2 = torch.where(dup[:, None] > 0, z1 + 0.3 * torch.randn(n, 12, generator=g), torch.randn(n, 12, generator=g))
    q1 = torch.relu(z1 @ w / 12 ** 0.5 + 0.3 * torch.randn(n, 60, generator=g))
    q2 = torch.relu(z2 @ w / 12 ** 0.5 + 0.3 * torch.randn(n, 60, generator=g))
    return q1, q2, dup


class QuestionEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(60, 128), nn.ReLU(), nn.Linear(128, 32))

    def forward(self, q):
        return self.net(q)


COSINE_LOSS = nn.CosineEmbeddingLoss(margin=0.0)


def siamese_loss(model, batch):
    q1, q2, label = batch                            # label: 1 duplicate, -1 (or 0) not
    return COSINE_LOSS(model(q1), model(q2), label)


@case("targets_dupquestions_cosine_labels_01", "targets",
      bug="The pair labels given to nn.CosineEmbeddingLoss are 1 (duplicate) and 0 (different), but the loss only "
          "knows 1 and -1: pairs labelled 0 contribute zero loss, so different questions are never pushed apart and "
          "the encoder only learns to pull embeddings together.",
      fix_line="Encode non-duplicate pairs as -1: label = 2 * dup - 1 before nn.CosineEmbeddingLoss.",
      source="https://sachinruk.github.io/programming_tips/cosine-embedding-loss.html",
      cause_pattern=r"CosineEmbeddingLoss.{0,200}(-1|−1|minus one|labels? (of )?0\b|targets? (of )?0\b|zero loss|\{0, ?1\}|0/1|"
                    r"0 and 1)|(-1|−1).{0,100}(dissimilar|"
                    r"non-?duplicate|different|negative) pairs?|(dissimilar|non-?duplicate|different|negative) "
                    r"(question )?pairs?.{0,120}(0 instead of -1|labell?ed (as )?0|label(s|ed)? (of )?0|targets? (of )?0|"
                    r"ignored|contribute (nothing|zero|no)|zero loss|no (loss|gradient)|never pushed)",
      paraphrases=("CosineEmbeddingLoss expects targets 1 and -1; the non-duplicate pairs are labelled 0, which the "
                   "loss silently ignores.",
                   "Negative pairs carry label 0 instead of -1, so they contribute zero loss and nothing pushes "
                   "different questions apart."))
def dupquestions_cosine_labels_01(fixed: bool = False) -> dict:
    seed(0)
    q1, q2, dup = _question_pairs(6000, 31)
    label = 2 * dup - 1 if fixed else dup            # df["is_duplicate"] is 0/1
    n = 5000
    model = QuestionEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(q1[:n], q2[:n], label[:n]), 64),
                val_loader=loader(TensorDataset(q1[n:], q2[n:], label[n:]), 500, False),
                loss_fn=siamese_loss, max_steps=3000)


@torch.no_grad()
def duplicate_accuracy(model, kw) -> float:
    """Accuracy of the decision "duplicate when cosine > 0.5" on the validation pairs."""
    def fn(m, b):
        q1, q2, label = b
        pred = F.cosine_similarity(m(q1), m(q2)) > 0.5
        return (pred == (label > 0)).sum().item(), label.numel()
    return mean_over(model, kw["val_loader"], fn)


fix("targets_dupquestions_cosine_labels_01", fixed_of(dupquestions_cosine_labels_01), duplicate_accuracy,
    "val accuracy of cosine > 0.5", steps=300)

# --------------------------------------------------------------------------------------------------------------------
# 2. Crack segmentation: the image Normalize(0.5, 0.5) is applied to the mask too, so BCE targets are -1 / +1.


def _cracks(n: int, s: int):
    g = gen(s)
    img = 0.35 * torch.rand(n, 1, 32, 32, generator=g)
    mask = torch.zeros(n, 1, 32, 32)
    for i in range(n):
        r, c = torch.randint(0, 24, (2,), generator=g).tolist()
        h, w = torch.randint(3, 9, (2,), generator=g).tolist()
        mask[i, 0, r:r + h, c:c + w] = 1.0
    img = img + 0.45 * mask + 0.15 * torch.rand(n, 1, 32, 32, generator=g)
    return img, mask


def normalize(t: torch.Tensor) -> torch.Tensor:                # transforms.Normalize(mean=[0.5], std=[0.5])
    return (t - 0.5) / 0.5


class TinyFCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 1, 1))

    def forward(self, x):
        return self.net(x)


@case("targets_crack_mask_normalized", "targets",
      bug="The same Normalize(mean=0.5, std=0.5) transform is applied to the image and to the binary crack mask, so the "
          "BCEWithLogitsLoss targets are -1 (background) and +1 (crack) instead of 0 / 1: the loss goes negative and "
          "keeps pushing every logit down.",
      fix_line="Normalize the image only and keep the mask in {0, 1}: mask = mask.float() (no Normalize on the target).",
      source="https://github.com/bigmb/Unet-Segmentation-Pytorch-Nest-of-Unets/issues/18",
      cause_pattern=r"(?<![(\w])(-1|−1)\s*(and|/|,|or|to)\s*\+?1\b|(mask|target|label)s?.{0,100}(negative (values|"
                    r"targets|labels)|outside \[?0|not in \[?0|between -1|in \[-1|\{-1)|(normaliz\w*|Normalize).{0,80}"
                    r"(applied (to|on)|also|as well).{0,60}(mask|target)|(mask|target)s?.{0,60}(were|was|is|are|been|got) "
                    r"(also )?normali[sz]ed",
      paraphrases=("The segmentation targets contain -1 and 1: the mask went through the image normalisation, but "
                   "BCEWithLogitsLoss needs targets in [0, 1].",
                   "Normalize(0.5, 0.5) is also applied to the mask, so background pixels become -1 targets and the "
                   "BCE loss turns negative."))
def crack_mask_normalized(fixed: bool = False) -> dict:
    seed(0)
    img, mask = _cracks(1200, 8)
    img = normalize(img)
    mask = mask if fixed else normalize(mask)            # "same transform for image and mask so they stay aligned"
    (xt, yt), (xv, yv) = split(img, mask, 1000)
    model = TinyFCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 16), val_loader=loader(TensorDataset(xv, yv), 100, False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=2000)


def mask_iou(model, kw) -> float:
    def fn(m, b):
        pred, true = m(b[0]) > 0, b[1] > 0
        return (pred & true).sum().item(), (pred | true).sum().item()
    return mean_over(model, kw["val_loader"], fn)


fix("targets_crack_mask_normalized", fixed_of(crack_mask_normalized), mask_iou, "val crack IoU", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 3. Ad click-through: the scoring MLP ends in ReLU before BCEWithLogitsLoss, so p(click) >= 0.5 for every ad.

N_USERS, N_ADS = 300, 200


def _impressions(n: int, s: int):
    g = gen(60)
    uf, af = torch.randn(N_USERS, 6, generator=g), torch.randn(N_ADS, 6, generator=g)
    g = gen(s)
    u = torch.randint(0, N_USERS, (n,), generator=g)
    a = torch.randint(0, N_ADS, (n,), generator=g)
    ctx = torch.randn(n, 4, generator=g)
    logit = (uf[u] * af[a]).sum(1) / 1.5 + 0.5 * ctx[:, 0] - 1.6
    click = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    return torch.stack([u, a], 1), ctx, click


class ClickModel(nn.Module):
    def __init__(self, relu_out: bool):
        super().__init__()
        self.relu_out = relu_out
        self.user = nn.Embedding(N_USERS, 12)
        self.ad = nn.Embedding(N_ADS, 12)
        self.mlp = nn.Sequential(nn.Linear(12 * 2 + 12 + 4, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, ids, ctx):
        u, a = self.user(ids[:, 0]), self.ad(ids[:, 1])
        out = self.mlp(torch.cat([u, a, u * a, ctx], 1)).squeeze(1)
        return F.relu(out) if self.relu_out else out


def click_loss(model, batch):
    ids, ctx, y = batch
    return F.binary_cross_entropy_with_logits(model(ids, ctx), y)


@case("targets_ctr_relu_before_bce", "targets",
      bug="The click model's last layer is followed by F.relu, so the logit given to BCEWithLogitsLoss is never "
          "negative and the predicted click probability can never go below 0.5, although three ads in four are not "
          "clicked.",
      fix_line="Return the raw score from the last Linear layer (drop the final F.relu); the loss applies the sigmoid.",
      source="https://discuss.pytorch.org/t/output-of-the-binary-classification-model/56327",
      cause_pattern=r"relu.{0,100}(logit|output|final|last|score)|(logit|output|final|last layer|score).{0,100}relu|"
                    r"(non-?negative|>= ?0|≥ ?0|never negative|cannot be negative|clamped at (0|zero)).{0,100}"
                    r"(logit|probabilit|score)",
      paraphrases=("The output passes through ReLU before BCEWithLogitsLoss: logits are non-negative, so sigmoid(logit) "
                   ">= 0.5 for every impression.",
                   "A ReLU on the final layer clamps the logits at zero; the predicted click probability can never go "
                   "below 0.5."))
def ctr_relu_before_bce(fixed: bool = False) -> dict:
    seed(0)
    ids, ctx, y = _impressions(12000, 9)
    n = 10000
    model = ClickModel(relu_out=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:n], ctx[:n], y[:n]), 128),
                val_loader=loader(TensorDataset(ids[n:], ctx[n:], y[n:]), 500, False),
                loss_fn=click_loss, max_steps=5000)


def click_logloss(model, kw) -> float:
    def fn(m, b):
        ids, ctx, y = b
        return F.binary_cross_entropy_with_logits(m(ids, ctx), y, reduction="sum").item(), y.numel()
    return mean_over(model, kw["val_loader"], fn)


fix("targets_ctr_relu_before_bce", fixed_of(ctr_relu_before_bce), click_logloss, "val log-loss", steps=300,
    higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 4. Music tagging: multi-hot tags trained with nn.CrossEntropyLoss (softmax over tags).

N_TAGS = 10


def _clips(n: int, s: int):
    g = gen(70)
    w = torch.randn(40, N_TAGS, generator=g)
    g = gen(s)
    x = torch.randn(n, 40, generator=g)
    score = x @ w / 40 ** 0.5
    tags = (score > 0.9).float()
    tags[torch.arange(n), score.argmax(1)] = 1.0          # every clip has at least one tag
    return x, tags


@case("targets_music_multilabel_crossentropy", "targets",
      bug="Clips carry several tags at once (multi-hot targets, 2.4 tags on average) but the model is trained with "
          "nn.CrossEntropyLoss, whose softmax makes the tags compete for one unit of probability, so no clip can get "
          "two tags above 0.5.",
      fix_line="Use nn.BCEWithLogitsLoss() for multi-label targets (one sigmoid per tag).",
      source="https://discuss.pytorch.org/t/using-bcewithlogisloss-for-multi-label-classification/67011",
      cause_pattern=r"(CrossEntropyLoss|cross[- ]entropy|softmax).{0,160}(multi-?label|multi-?hot|several (tags|labels)|"
                    r"more than one (tag|label))|(multi-?label|multi-?hot).{0,160}(CrossEntropyLoss|cross[- ]entropy|"
                    r"softmax|BCEWithLogits|sigmoid)",
      paraphrases=("The targets are multi-hot (several tags per clip) yet the loss is CrossEntropyLoss; a softmax "
                   "cannot put two tags above 0.5. Use BCEWithLogitsLoss for multi-label data.",
                   "Multi-label problem trained with softmax cross-entropy: switch to one sigmoid per tag "
                   "(BCEWithLogitsLoss)."))
def music_multilabel_crossentropy(fixed: bool = False) -> dict:
    seed(0)
    x, tags = _clips(2400, 10)
    (xt, yt), (xv, yv) = split(x, tags, 2000)
    model = nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Linear(128, N_TAGS))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=2000)


def tag_micro_f1(model, kw) -> float:
    """Micro-F1 of tags whose probability passes 0.5 under the run's own output (softmax for a cross-entropy run,
    sigmoid for a BCE run)."""
    softmax = isinstance(kw["loss_fn"], nn.CrossEntropyLoss)
    was = model.training
    model.eval()
    tp = fp = fn = 0.0
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            logits = model(x)
            p = logits.softmax(-1) if softmax else torch.sigmoid(logits)
            pred = p > 0.5
            tp += (pred & (y > 0)).sum().item()
            fp += (pred & (y == 0)).sum().item()
            fn += (~pred & (y > 0)).sum().item()
    model.train(was)
    return 2 * tp / max(2 * tp + fp + fn, 1.0)


fix("targets_music_multilabel_crossentropy", fixed_of(music_multilabel_crossentropy), tag_micro_f1,
    "val micro-F1 of tags (p > 0.5)", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 5. Load forecasting: the sliding-window target is the window's own last value, not the next hour.

WINDOW = 24


def _load_series(n: int, s: int) -> torch.Tensor:
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    noise = torch.zeros(n)
    eps = 0.05 * torch.randn(n, generator=g)
    for i in range(1, n):
        noise[i] = 0.8 * noise[i - 1] + eps[i]
    return torch.sin(2 * math.pi * t / 24) + 0.4 * torch.sin(2 * math.pi * t / 168 + 1.0) + noise


def create_dataset(series: torch.Tensor, fixed: bool):
    xs, ys = [], []
    for i in range(len(series) - WINDOW - 1):
        xs.append(series[i:i + WINDOW])
        ys.append(series[i + WINDOW] if fixed else series[i + WINDOW - 1])   # "the value at the end of the window"
    return torch.stack(xs), torch.stack(ys).view(-1, 1)


@case("targets_load_window_target_not_shifted", "targets",
      bug="create_dataset takes the target as series[i + window - 1], the last value inside the input window, instead "
          "of series[i + window], so the forecaster is trained to copy its last input (the label is already in the "
          "features) and never learns to predict the next hour.",
      fix_line="Take the value after the window as the target: y = series[i + window].",
      source="https://taourl.com/read-2412086.html",
      cause_pattern=r"(target|label|\by\b)\w*.{0,100}(equals?|same as|identical to|copy of|is just|duplicates?|"
                    r"contained in|already in|part of).{0,60}(last|final|input|window|feature)|"
                    r"(last|final) (input|window|feature)s? (value|element|step|column).{0,100}(target|label)|"
                    r"off[- ]by[- ]one|(not|never|isn't) shifted|shift\w*.{0,40}(target|label)s?.{0,40}(by one|"
                    r"one step|forward|ahead)|i ?\+ ?window|\+ ?look_?back\]",
      paraphrases=("Each target equals the last value of its input window (feature 23), so the model learns the "
                   "identity; the sliding window is off by one and the target should be series[i + window].",
                   "The label is not shifted: y is the final input time step instead of the next value to forecast."))
def load_window_target_not_shifted(fixed: bool = False) -> dict:
    seed(0)
    series = _load_series(3000, 11)
    xt, yt = create_dataset(series[:2400], fixed)
    xv, yv = create_dataset(series[2400:], fixed)
    model = nn.Sequential(nn.Linear(WINDOW, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=nn.MSELoss(), max_steps=2000)


def next_hour_rmse(model, kw) -> float:
    """RMSE against the true next value on the held-out part of the series (whatever the run's val targets are)."""
    xv, yv = create_dataset(_load_series(3000, 11)[2400:], fixed=True)
    return rmse_of(lambda m, b: (m(b[0]), b[1]), "batches")(model, dict(batches=loader(TensorDataset(xv, yv), 200,
                                                                                         False)))


fix("targets_load_window_target_not_shifted", fixed_of(load_window_target_not_shifted), next_hour_rmse,
    "val RMSE of the next-hour forecast", steps=300, higher=False)
