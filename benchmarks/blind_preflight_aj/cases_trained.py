"""Set aj, family ``what_is_trained``: the parameters that should learn are not the ones the optimizer moves, or no
gradient reaches them."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import transformers  # noqa: E402
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aj.cases_shapes import box_images, box_iou, mean_iou
from benchmarks.blind_preflight_aj.registry import acc_of, auc, case, fix, fixed_of, gen, loader, rmse_of, seed

transformers.logging.set_verbosity_error()


def tiny_bert_config(num_labels: int, vocab: int = 40, max_len: int = 32) -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=max_len, num_labels=num_labels,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)


# --------------------------------------------------------------------------------------------------------------------
# 1. linear probe on a frozen tiny BERT: classifier swapped for a 3-label one AFTER the optimizer was built

def keyword_sentences(n: int, s: int, length: int = 8):
    """[CLS] + random filler tokens with exactly one of the keyword tokens 5, 6, 7; the keyword is the label."""
    g = gen(s)
    ids = torch.randint(8, 40, (n, length), generator=g)
    ids[:, 0] = 1
    y = torch.randint(0, 3, (n,), generator=g)
    pos = torch.randint(1, length, (n,), generator=g)
    ids[torch.arange(n), pos] = 5 + y
    return ids, y


class DictDataset(torch.utils.data.Dataset):
    def __init__(self, **columns):
        self.columns = columns

    def __len__(self):
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


def hf_acc(model, kw) -> float:
    was = model.training
    model.eval()
    right = n = 0
    with torch.no_grad():
        for batch in kw["val_loader"]:
            dev = next(model.parameters()).device
            batch = {k: v.to(dev) for k, v in batch.items()}
            pred = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.argmax(-1)
            right += (pred == batch["labels"]).sum().item()
            n += len(pred)
    model.train(was)
    return right / n


@case("aj_bert_probe_head_replaced_after_optimizer", "what_is_trained",
      bug="For a linear probe the tiny BERT encoder is frozen and AdamW is built on model.classifier.parameters(); "
          "the classifier is then replaced by a new nn.Linear(32, 3) for the 3 labels, so the optimizer still holds "
          "the old, unused head and the new head, the only trainable layer in the graph, is never updated.",
      cause_pattern=r"(new|replaced|swapped|re-?created) (head|classifier|layer|nn\.Linear)\W.{0,80}(not|never)|"
                    r"(old|stale|previous)\W{1,3}(unused\W{1,3})?(head|classifier|layer|parameters?)|"
                    r"(replaced|swapped|reassigned|re-?created)\W.{0,60}after\W.{0,30}optimi[sz]er|replaced by a new|"
                    r"optimi[sz]er\W.{0,60}(built|created|constructed) before|(head|classifier)\W.{0,60}not (in|held by|"
                    r"part of) the optimi[sz]er")
def bert_probe_head_swap(fixed: bool = False):
    seed(0)
    ids, y = keyword_sentences(1500, 1, length=6)
    config = tiny_bert_config(num_labels=2)
    config.initializer_range = 0.2          # stands in for pretrained weights of a realistic scale
    model = transformers.BertForSequenceClassification(config)
    model.bert.requires_grad_(False)
    if not fixed:
        optimizer = torch.optim.AdamW(model.classifier.parameters(), lr=1e-2)
    model.classifier = nn.Linear(32, 3)
    model.config.num_labels = model.num_labels = 3
    if fixed:
        optimizer = torch.optim.AdamW(model.classifier.parameters(), lr=1e-2)
    mask = torch.ones_like(ids)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(DictDataset(input_ids=ids[:1200], attention_mask=mask[:1200], labels=y[:1200]), 32),
                val_loader=loader(DictDataset(input_ids=ids[1200:], attention_mask=mask[1200:], labels=y[1200:]),
                                  100, shuffle=False),
                max_steps=400)


fix("aj_bert_probe_head_replaced_after_optimizer", fixed_of(bert_probe_head_swap), hf_acc, "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 2. a hand-written factorization machine whose factor matrix is a plain tensor, not an nn.Parameter

def interaction_clicks(n: int, s: int, d: int = 12):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    z = x[:, 0] * x[:, 1] + x[:, 2] * x[:, 3] - x[:, 4] * x[:, 5] + 0.2 * x[:, 6]
    return x, (z + 0.3 * torch.randn(n, generator=g) > 0).float()


class FactorizationMachine(nn.Module):
    def __init__(self, d: int = 12, k: int = 8, register: bool = True):
        super().__init__()
        self.linear = nn.Linear(d, 1)
        factors = torch.randn(d, k) * 0.1
        if register:
            self.V = nn.Parameter(factors)
        else:
            self.V = factors.requires_grad_()          # a leaf that wants gradients, but not a registered parameter

    def forward(self, x):
        V = self.V.to(x.device)
        inter = 0.5 * ((x @ V) ** 2 - (x ** 2) @ (V ** 2)).sum(1)
        return self.linear(x).squeeze(-1) + inter


@case("aj_fm_factors_plain_tensor", "what_is_trained",
      bug="The factorization machine stores its interaction factors as self.V = torch.randn(12, 8).requires_grad_() "
          "instead of nn.Parameter, so V is not in model.parameters(): the optimizer never updates it and only the "
          "linear term learns, which cannot fit click labels that come from feature interactions.",
      cause_pattern=r"nn\.Parameter|register_parameter|not (a |an )?(registered )?(nn\.)?parameter|not in "
                    r"(model\.)?parameters\(\)|(plain|raw|bare) tensor|requires_grad_?\(?\)?\W.{0,80}(not|never) "
                    r"(registered|updated|in the optimi[sz]er)|unregistered")
def fm_plain_tensor(fixed: bool = False):
    seed(0)
    x, y = interaction_clicks(2300, 2)
    model = FactorizationMachine(register=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=lambda model, batch: F.binary_cross_entropy_with_logits(model(batch[0]), batch[1]),
                max_steps=600)


fix("aj_fm_factors_plain_tensor", fixed_of(fm_plain_tensor),
    acc_of(lambda m, b: ((m(b[0]) > 0).float(), b[1])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 3. explicit-rating model whose forward clamps the prediction to the 1..5 star range

def star_ratings(s: int, n_users: int = 80, n_items: int = 60, n: int = 2400):
    g = gen(s)
    u, v = torch.randn(n_users, 3, generator=g), torch.randn(n_items, 3, generator=g)
    users = torch.randint(0, n_users, (n,), generator=g)
    items = torch.randint(0, n_items, (n,), generator=g)
    r = 3 + 1.6 * torch.tanh((u[users] * v[items]).sum(1) / 1.5) + 0.3 * torch.randn(n, generator=g)
    return users, items, r.clamp(1, 5)


class RatingMF(nn.Module):
    def __init__(self, squash: bool, n_users: int = 80, n_items: int = 60, d: int = 8):
        super().__init__()
        self.squash = squash
        self.user, self.item = nn.Embedding(n_users, d), nn.Embedding(n_items, d)
        self.user_bias, self.item_bias = nn.Embedding(n_users, 1), nn.Embedding(n_items, 1)
        for emb in (self.user, self.item):
            nn.init.normal_(emb.weight, std=0.05)
        for emb in (self.user_bias, self.item_bias):
            nn.init.zeros_(emb.weight)

    def forward(self, users, items):
        raw = (self.user(users) * self.item(items)).sum(-1) + (self.user_bias(users) + self.item_bias(items)).squeeze(-1)
        if self.squash:
            return 1 + 4 * torch.sigmoid(raw)
        return torch.clamp(raw, 1.0, 5.0)            # "predictions must be valid star ratings"


def rating_loss(model, batch):
    users, items, r = batch
    return F.mse_loss(model(users, items), r)


@case("aj_rating_clamp_kills_gradient", "what_is_trained",
      bug="The rating model returns torch.clamp(pred, 1.0, 5.0) in forward so that predictions are valid stars, but "
          "the raw dot products start near 0: every prediction is clamped to 1, clamp passes zero gradient outside "
          "its range, and no embedding or bias ever receives a gradient.",
      cause_pattern=r"clamp|clip\w*\W.{0,40}(output|prediction|range)|(zero|no|vanishing) gradients?\W.{0,80}"
                    r"(saturat|clamp|clip|outside|range)|saturat\w+\W.{0,40}(output|range|bound)|"
                    r"(sigmoid|squash)\w*\W.{0,40}(range|1 ?\+ ?4)")
def rating_clamp(fixed: bool = False):
    seed(0)
    users, items, r = star_ratings(3)
    model = RatingMF(squash=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(users[:2000], items[:2000], r[:2000]), 64),
                val_loader=loader(TensorDataset(users[2000:], items[2000:], r[2000:]), 100, shuffle=False),
                loss_fn=rating_loss, max_steps=600)


fix("aj_rating_clamp_kills_gradient", fixed_of(rating_clamp), rmse_of(lambda m, b: (m(b[0], b[1]), b[2])),
    "val RMSE (stars)", steps=300, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 4. detector head whose box loss (1 - IoU) is computed in numpy and wrapped back with torch.tensor

def iou_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a1, a2 = a[:, :2] - a[:, 2:] / 2, a[:, :2] + a[:, 2:] / 2
    b1, b2 = b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2
    inter = np.clip(np.minimum(a2, b2) - np.maximum(a1, b1), 0, None).prod(1)
    return inter / np.maximum(a[:, 2:].prod(1) + b[:, 2:].prod(1) - inter, 1e-6)


class TinyDetector(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(256, 128), nn.ReLU())
        self.cls = nn.Linear(128, 2)
        self.box = nn.Sequential(nn.Linear(128, 4), nn.Sigmoid())

    def forward(self, img):
        h = self.trunk(img)
        return self.cls(h), self.box(h)


def detection_loss(differentiable_iou: bool):
    def loss_fn(model, batch):
        img, box = batch
        wide = (box[:, 2] > box[:, 3]).long()
        logits, pred = model(img)
        if differentiable_iou:
            iou = box_iou(pred, box)
        else:   # .detach() was added after "Can't call numpy() on Tensor that requires grad"
            iou = torch.tensor(iou_numpy(pred.detach().cpu().numpy(), box.cpu().numpy()), device=pred.device)
        return F.cross_entropy(logits, wide) + (1 - iou).mean()
    return loss_fn


@case("aj_det_box_loss_through_numpy", "what_is_trained",
      bug="The detector's box loss 1 - IoU is computed in numpy on pred.detach().cpu().numpy() and wrapped back "
          "with torch.tensor(...): the box term is a constant for autograd, so the box head gets no gradient and "
          "only the classification head trains.",
      cause_pattern=r"numpy\W.{0,60}(loss|IoU|iou|graph|gradient|detach)|(loss|IoU|iou)\W.{0,60}numpy|detach\w*|"
                    r"torch\.tensor\(|(no|zero|none) grad\w*\W.{0,60}(box|head)|(box|head)\w*\W.{0,60}(no|zero|never"
                    r"( gets| receives)?( a)?) grad|(outside|cut (from|off)|broken)\W.{0,20}(the )?(autograd )?graph|"
                    r"not differentiable|grad_fn")
def det_numpy_iou(fixed: bool = False):
    seed(0)
    img, box = box_images(1300, 6)
    model = TinyDetector()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(img[:1000], box[:1000]), 32),
                val_loader=loader(TensorDataset(img[1000:], box[1000:]), 100, shuffle=False),
                loss_fn=detection_loss(differentiable_iou=fixed), max_steps=600)


fix("aj_det_box_loss_through_numpy", fixed_of(det_numpy_iou), mean_iou, "val mean IoU of the box head", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 5. item embeddings initialised with nn.Embedding.from_pretrained, whose freeze=True default keeps them fixed

N_U, N_I = 100, 120


def preference_clicks(s: int, n: int = 4000):
    g = gen(s)
    u, v = torch.randn(N_U, 6, generator=g), torch.randn(N_I, 6, generator=g)
    users = torch.randint(0, N_U, (n,), generator=g)
    items = torch.randint(0, N_I, (n,), generator=g)
    y = ((u[users] * v[items]).sum(1) + 0.5 * torch.randn(n, generator=g) > 0).float()
    return users, items, y


class TwoTower(nn.Module):
    def __init__(self, item_init: torch.Tensor, freeze: bool):
        super().__init__()
        self.user = nn.Embedding(N_U, item_init.shape[1])
        nn.init.normal_(self.user.weight, std=0.1)
        self.item = nn.Embedding.from_pretrained(item_init, freeze=freeze)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1)


@case("aj_item_embeddings_from_pretrained_frozen", "what_is_trained",
      bug="The item tower is initialised with nn.Embedding.from_pretrained(item_vectors) meaning to fine-tune them, "
          "but from_pretrained defaults to freeze=True: the item table has requires_grad=False and stays at its "
          "initial vectors, so only the user tower learns.",
      cause_pattern=r"from_pretrained|freeze\s*=|frozen\W.{0,60}(embedding|item)|(embedding|item)\w*\W.{0,60}"
                    r"(frozen|requires_grad\s*=?\s*False|not (trainable|updated))")
def item_emb_frozen(fixed: bool = False):
    seed(0)
    users, items, y = preference_clicks(4)
    item_vectors = torch.randn(N_I, 16, generator=gen(44)) * 0.3    # "pretrained" on another catalogue
    model = TwoTower(item_vectors, freeze=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters()], lr=1e-2),
                train_loader=loader(TensorDataset(users[:3500], items[:3500], y[:3500]), 64),
                val_loader=loader(TensorDataset(users[3500:], items[3500:], y[3500:]), 100, shuffle=False),
                loss_fn=lambda model, batch: F.binary_cross_entropy_with_logits(model(batch[0], batch[1]), batch[2]),
                max_steps=600)


def click_auc(model, kw) -> float:
    was = model.training
    model.eval()
    s, l = [], []
    with torch.no_grad():
        for u, i, y in kw["val_loader"]:
            dev = next(model.parameters()).device
            s.append(model(u.to(dev), i.to(dev)).float().cpu())
            l.append(y)
    model.train(was)
    return auc(torch.cat(s), torch.cat(l))


fix("aj_item_embeddings_from_pretrained_frozen", fixed_of(item_emb_frozen), click_auc, "val click AUC", steps=400)
