"""Set o, family targets: what the loss is asked to reach is not what the task needs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from transformers import BertConfig, BertForTokenClassification

from benchmarks.blind_preflight_o.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    tensors,
)

# --------------------------------------------------------------------------------------------------------------
# Cell segmentation: the image and the mask go through the same Normalize(0.5, 0.5), masks become {-1, 1}.
# Source: https://github.com/bigmb/Unet-Segmentation-Pytorch-Nest-of-Unets/issues/18


def cell_images(n: int, s: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Bright discs (cells, the mask) and dimmer, smaller specks (debris, background) on noise; values in [0, 1]."""
    g = gen(s)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    imgs = 0.15 + 0.1 * torch.rand(n, 1, size, size, generator=g)
    masks = torch.zeros(n, 1, size, size)
    for _ in range(3):
        cy, cx = torch.randint(2, size - 2, (2, n, 1, 1), generator=g)
        r = 1.5 + 2 * torch.rand(n, 1, 1, generator=g)
        disc = ((yy - cy) ** 2 + (xx - cx) ** 2 <= r ** 2).float().unsqueeze(1)
        masks = torch.maximum(masks, disc)
    for _ in range(3):
        cy, cx = torch.randint(1, size - 1, (2, n, 1, 1), generator=g)
        speck = ((yy - cy) ** 2 + (xx - cx) ** 2 <= 1).float().unsqueeze(1)
        imgs = imgs + 0.3 * speck
    imgs = (imgs + 0.5 * masks).clamp(0, 1)
    return imgs, masks


class TinyFCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                 nn.ReLU(), nn.Conv2d(16, 1, 1))

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def mask_iou(model, kw) -> float:
    def fn(m, b):
        pred, true = m(b[0]) > 0, b[1] > 0                 # foreground is the positive value in either encoding
        return (pred & true).sum().item(), (pred | true).sum().item()
    return mean_over(model, kw["val_loader"], fn)


@case("targets_bce_masks_in_minus_one_one", "targets",
      "The masks go through the same Normalize(mean=0.5, std=0.5) as the images, so the BCEWithLogitsLoss targets are "
      "-1 (background) and 1 (cell) instead of 0 and 1; with a target of -1 the background term log(sigmoid(x)) - "
      "2*log(1 - sigmoid(x)) has a gradient that never vanishes, the loss runs negative without bound and the "
      "background pulls every pixel towards 'no cell'.",
      r"(^|[\s{\[,=])-1\b(?!\d)|negative (targets?|labels?|values?)|(targets?|labels?|masks?) (outside|not in|out of)"
      r" (the range )?\[?0|\[0, ?1\]|between 0 and 1|in \{0, ?1\}|BCE\w* targets?|mask\w* (normali[sz]|scal)")
def build_cells(fixed: bool = False) -> dict:
    seed(0)
    imgs, masks = cell_images(1200, 6)
    normalize = lambda t: (t - 0.5) / 0.5                                  # noqa: E731  transforms.Normalize((0.5,), (0.5,))
    x = normalize(imgs)
    m = masks if fixed else normalize(masks)
    model = TinyFCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(tensors(x[:1000], m[:1000]), 32),
                val_loader=loader(tensors(x[1000:], m[1000:]), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


fix("targets_bce_masks_in_minus_one_one", fixed_of(build_cells), mask_iou, "val IoU")


# --------------------------------------------------------------------------------------------------------------
# Token classification with a tiny BERT from a config: word-level tags laid onto the subword positions unaligned.
# Source: https://discuss.huggingface.co/t/why-is-my-token-classification-model-performing-poorly-on-custom-data/173536

PAD, CLS, SEP, N_WORDS, MAX_TOKENS = 0, 1, 2, 60, 28
WORD_TAG = torch.randint(0, 4, (N_WORDS,), generator=gen(7))


def pieces(word: int) -> list[int]:
    """Each word is 1-3 subword pieces: ids 5 + 3*word + k, k = 0 the first piece."""
    return [5 + 3 * word + k for k in range(1 + word % 3)]


class TaggedSentences(Dataset):
    def __init__(self, n: int, s: int, aligned: bool):
        g = gen(s)
        self.rows = []
        for words in torch.randint(0, N_WORDS, (n, 8), generator=g).tolist():
            ids, labels = [CLS], [-100]
            for w in words:
                p = pieces(w)
                ids += p
                labels += [int(WORD_TAG[w])] + [-100] * (len(p) - 1)
            ids.append(SEP)
            if not aligned:                           # one tag per word, "lined up" after [CLS]
                labels = [-100] + [int(WORD_TAG[w]) for w in words]
            labels += [-100] * (MAX_TOKENS - len(labels))
            mask = [1] * len(ids) + [0] * (MAX_TOKENS - len(ids))
            ids += [PAD] * (MAX_TOKENS - len(ids))
            self.rows.append(dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                  labels=torch.tensor(labels)))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


@torch.no_grad()
def word_accuracy(model, kw) -> float:
    """Tag predicted at each word's first piece against the word's tag (read back from the piece id)."""
    def fn(m, b):
        ids = b["input_ids"]
        pred = m(input_ids=ids, attention_mask=b["attention_mask"]).logits.argmax(-1)
        first = (ids >= 5) & ((ids - 5) % 3 == 0)
        true = WORD_TAG[((ids - 5) // 3).clamp(0, N_WORDS - 1)]
        return (pred[first] == true[first]).sum().item(), first.sum().item()
    return mean_over(model, kw["val_loader"], fn)


@case("targets_word_tags_not_aligned_to_subwords", "targets",
      "The word-level tags are written straight onto token positions 1..8 after [CLS] although the words were split "
      "into 1-3 subword pieces: from the first multi-piece word on, every label sits on a piece of another word, so "
      "BertForTokenClassification learns tags that do not belong to the tokens it sees (no word_ids() alignment, "
      "no -100 on the continuation pieces).",
      r"word_ids|align\w*|subword|sub-word|word ?piece|first (sub)?token|continuation|tokeni[sz]\w* split"
      r"|labels? (do not|don't|does not) (line up|match)|shift\w*")
def build_ner(fixed: bool = False) -> dict:
    seed(0)
    config = BertConfig(vocab_size=192, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=4)
    model = BertForTokenClassification(config)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TaggedSentences(1600, 8, aligned=fixed), 32),
                val_loader=loader(TaggedSentences(300, 9, aligned=fixed), 100, shuffle=False),
                loss_fn=None, max_steps=300)


fix("targets_word_tags_not_aligned_to_subwords", fixed_of(build_ner), word_accuracy, "val word-tag accuracy")


# --------------------------------------------------------------------------------------------------------------
# Two-tower contrastive model (InfoNCE over the in-batch similarity matrix) with labels = zeros.
# Source: https://github.com/wangyuxinwhy/uniem/issues/99


def paired_views(n: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(s)
    z = torch.randn(n, 16, generator=g)
    a, b = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
    return z @ a + 0.3 * torch.randn(n, 32, generator=g), z @ b + 0.3 * torch.randn(n, 32, generator=g)


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.doc = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, a, b):
        return F.normalize(self.query(a), dim=-1), F.normalize(self.doc(b), dim=-1)


def info_nce(fixed: bool):
    def loss_fn(model, batch):
        qa, db = model(*batch)
        logits = qa @ db.t() / 0.1
        if fixed:
            labels = torch.arange(logits.size(0), device=logits.device)
        else:
            labels = torch.zeros(logits.size(0), dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits, labels)
    return loss_fn


def retrieval(m, b):
    qa, db = m(*b)
    return (qa @ db.t()).argmax(1), torch.arange(qa.size(0))


@case("targets_infonce_labels_all_zero", "targets",
      "The InfoNCE loss builds the full (B, B) query-document similarity matrix, whose positives are on the diagonal, "
      "but uses labels = torch.zeros(B) (copied from MoCo, where the positive logit is concatenated first): every "
      "query is taught that document 0 of the batch is its match, the embeddings collapse and retrieval is at chance.",
      r"zeros|torch\.arange|arange\(|diagonal|positive (pair|logit|key)s? (is|are|at|on)|labels? (should be|=) "
      r"(the )?(index|arange)|all (the )?labels? (are|=) 0|label 0")
def build_two_tower(fixed: bool = False) -> dict:
    seed(0)
    a, b = paired_views(2400, 10)
    model = TwoTower()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(tensors(a[:2000], b[:2000]), 64),
                val_loader=loader(tensors(a[2000:], b[2000:]), 200, shuffle=False),
                loss_fn=info_nce(fixed), max_steps=300)


fix("targets_infonce_labels_all_zero", fixed_of(build_two_tower), acc_of(retrieval), "val top-1 retrieval")


# --------------------------------------------------------------------------------------------------------------
# TD(0) value function on a random walk with terminal states, bootstrapped through the terminal transitions.
# Source: https://github.com/navneet-nmk/pytorch-rl/issues/2

GAMMA, WALK = 0.9, 10


def walk_transitions(n: int, s: int) -> tuple[torch.Tensor, ...]:
    """Random policy on states 1..9 of a 0..10 chain; entering 10 pays 1, 0 and 10 end the episode."""
    g = gen(s)
    state = torch.randint(1, WALK, (n,), generator=g)
    nxt = state + torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    reward = (nxt == WALK).float()
    done = ((nxt == 0) | (nxt == WALK)).float()
    return (state.float() / WALK).unsqueeze(1), reward, (nxt.float() / WALK).unsqueeze(1), done


def true_values() -> torch.Tensor:
    """V(s) for s = 1..9 under the random policy (linear system), as (9,)."""
    n = WALK - 1
    a, b = torch.eye(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        s = i + 1
        for s2 in (s - 1, s + 1):
            b[i] += 0.5 * (1.0 if s2 == WALK else 0.0)
            if 0 < s2 < WALK:
                a[i, s2 - 1] -= 0.5 * GAMMA
    return torch.linalg.solve(a, b).float()


class ValueNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, s):
        return self.net(s).squeeze(-1)


def td_loss(fixed: bool):
    def loss_fn(model, batch):
        s, r, s2, done = batch
        with torch.no_grad():
            v2 = model(s2)
            target = r + GAMMA * (1 - done) * v2 if fixed else r + GAMMA * v2
        return F.mse_loss(model(s), target)
    return loss_fn


def states_batches(kw):
    return [((torch.arange(1, WALK).float() / WALK).unsqueeze(1), true_values())]


@case("targets_td_target_ignores_done", "targets",
      "The TD target is r + gamma * V(s') for every transition, without the (1 - done) mask: on the transitions "
      "that end the episode the critic bootstraps from its own extrapolated value of the terminal state, which "
      "should be 0, so the values near the goal feed on themselves and the whole value function is inflated.",
      r"\(1 ?- ?done|\bdones?\b (mask|flag)|terminal|episode end|end of (the )?episode|bootstrap\w*")
def build_td(fixed: bool = False) -> dict:
    seed(0)
    s, r, s2, done = walk_transitions(4000, 11)
    model = ValueNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(s, r, s2, done), 64),
                loss_fn=td_loss(fixed), max_steps=300)


fix("targets_td_target_ignores_done", fixed_of(build_td), rmse_of(lambda m, b: (m(b[0]), b[1]), states_batches),
    "RMSE to the true V(s)", higher=False)


# --------------------------------------------------------------------------------------------------------------
# One-step-ahead demand forecasting whose window builder takes the window's own last value as the target.
# Source: https://stackguides.com/questions/51432661/time-series-keras-lstm-echoing-instead-of-predicting

WINDOW = 16


def demand_series(n: int = 2600, s: int = 12) -> torch.Tensor:
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    return (torch.sin(2 * torch.pi * t / 7.3) + 0.6 * torch.sin(2 * torch.pi * t / 17 + 1)
            + 0.15 * torch.randn(n, generator=g))


def create_dataset(series: torch.Tensor, fixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for i in range(len(series) - WINDOW - 1):
        xs.append(series[i:i + WINDOW])
        ys.append(series[i + WINDOW] if fixed else series[i + WINDOW - 1])
    return torch.stack(xs), torch.stack(ys)


def next_step_val(kw):
    x, y = create_dataset(demand_series()[2100:], fixed=True)
    return [(x, y)]


@case("targets_forecast_target_is_last_input", "targets",
      "The window builder appends series[i + window - 1] as the target, the last value inside the input window, "
      "instead of series[i + window]: the network learns to echo its last input, the training loss is near zero "
      "and the one-step-ahead forecast is no better than persistence.",
      r"off[- ]by[- ]one|i ?\+ ?window ?- ?1|last (value|element|step) (of|in|inside) the (input )?window|echo\w*"
      r"|target\w* (is|are|equals?) (in|part of|contained in) the input|copy of (the|an) input|identity|persistence")
def build_forecast(fixed: bool = False) -> dict:
    seed(0)
    series = demand_series()
    x, y = create_dataset(series[:2100], fixed)
    xv, yv = create_dataset(series[2100:], fixed)
    model = nn.Sequential(nn.Linear(WINDOW, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(tensors(x, y), 64),
                val_loader=loader(tensors(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("targets_forecast_target_is_last_input", fixed_of(build_forecast),
    rmse_of(lambda m, b: (m(b[0]), b[1]), next_step_val), "next-step RMSE", higher=False)
