"""What is trained: parts of the model the optimizer never updates."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ax.registry import case, gen, loader, seed, tabular


def ctr_loss(model, batch):
    cats, nums, y = batch
    return F.binary_cross_entropy_with_logits(model(cats, nums), y)


def ctr_loaders(s, n=3000, vocab=(50, 20, 8), **kw):
    cats, nums, y = tabular(n, vocab=vocab, s=s, **kw)
    k = int(n * 0.8)
    return (loader(TensorDataset(cats[:k], nums[:k], y[:k]), 64),
            loader(TensorDataset(cats[k:], nums[k:], y[k:]), 200, shuffle=False))


class EmbMLP(nn.Module):
    def __init__(self, embs, d_num=4, dim=8):
        super().__init__()
        self.embs = nn.ModuleList(embs)
        self.mlp = nn.Sequential(nn.Linear(dim * len(embs) + d_num, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, cats, nums):
        e = [emb(cats[:, i]) for i, emb in enumerate(self.embs)]
        return self.mlp(torch.cat(e + [nums], 1)).squeeze(-1)


@case("trained_from_pretrained_frozen", "what_is_trained",
      "The categorical embedding tables are initialised with nn.Embedding.from_pretrained(init_table), whose "
      "freeze=True default sets requires_grad=False, so the category vectors stay random for the whole run.",
      r"from_pretrained|freeze ?= ?(true|false)|(embedding|categor|table)s?.{0,60}(frozen|requires_grad ?= ?"
      r"false|never (updated|trained)|not (updated|trained))|(frozen|requires_grad ?= ?false).{0,60}(embeddi"
      r"ng|table)")
def trained_from_pretrained_frozen(fixed=False):
    seed(0)
    g = gen(21)
    embs = [nn.Embedding.from_pretrained(torch.randn(v, 8, generator=g) * 0.1, freeze=not fixed) for v in (200, 20, 8)]
    model = EmbMLP(embs)
    tr, va = ctr_loaders(21, vocab=(200, 20, 8), cat_weight=(3.0, 0.5, 0.5))
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=5e-3),
                train_loader=tr, val_loader=va, loss_fn=ctr_loss, max_steps=300)


@case("trained_vocab_resized_after_optimizer", "what_is_trained",
      "After the optimizer was built, the user-id embedding is replaced by a bigger nn.Embedding to fit the "
      "vocabulary (new ids); the optimizer still holds the old table's parameters, so the table the model uses "
      "is never updated.",
      r"(replac|resiz|re-?assign|swap|new (nn\.)?embedding|grew|grow).{0,80}(after|optimizer)|after.{0,40}(t"
      r"he )?optimizer (was |is )?(built|created|constructed)|(re)?-?(build|create|construct).{0,30}optimize"
      r"r.{0,30}after|stale.{0,40}param|old (table|embedding|param)")
def trained_vocab_resized_after_optimizer(fixed=False):
    seed(0)
    model = EmbMLP([nn.Embedding(150, 8), nn.Embedding(20, 8), nn.Embedding(8, 8)])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.embs[0] = nn.Embedding(200, 8)          # the vocabulary grew to 50 ids once all the data was read
    if fixed:
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    tr, va = ctr_loaders(22, vocab=(200, 20, 8), cat_weight=(3.0, 0.5, 0.5))
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va, loss_fn=ctr_loss, max_steps=300)


class DeepCross(nn.Module):
    def __init__(self, vocab=(50, 20, 8), dim=8, d_num=4):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(v, dim) for v in vocab)
        d = dim * len(vocab) + d_num
        self.cross_w = nn.ParameterList(nn.Parameter(torch.randn(d, d) * 0.01) for _ in range(2))
        self.cross_b = nn.ParameterList(nn.Parameter(torch.zeros(d)) for _ in range(2))
        self.deep = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(d + 16, 1)

    def forward(self, cats, nums):
        x0 = torch.cat([e(cats[:, i]) for i, e in enumerate(self.embs)] + [nums], 1)
        x = x0
        for w, b in zip(self.cross_w, self.cross_b):
            x = x0 * (x @ w + b) + x
        return self.head(torch.cat([x, self.deep(x0)], 1)).squeeze(-1)


@case("trained_optimizer_misses_embeddings", "what_is_trained",
      "The DCN optimizer is built from model.deep.parameters() and model.head.parameters() only, so the embedding "
      "tables and the cross network keep their initial values.",
      r"(optimizer|optim).{0,80}(only|subset|miss|not (all|include)|deep\.param|head\.param)|model\.parameters\(\)|"
      r"not in (the )?optimizer|(embedding|cross).{0,60}(never|not) (updated|trained|optimi)|never updated|"
      r"param(eter)?s?.{0,40}(not|never|missing).{0,30}(optimi|updat)")
def trained_optimizer_misses_embeddings(fixed=False):
    seed(0)
    model = DeepCross(vocab=(200, 20, 8))
    params = model.parameters() if fixed else list(model.deep.parameters()) + list(model.head.parameters())
    tr, va = ctr_loaders(23, vocab=(200, 20, 8), cat_weight=(3.0, 0.5, 0.5))
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=5e-3), train_loader=tr, val_loader=va,
                loss_fn=ctr_loss, max_steps=300)


class TagBagMLP(nn.Module):
    def __init__(self, n_tags=12, dim=8, d_num=4):
        super().__init__()
        self.tags = nn.EmbeddingBag(n_tags + 1, dim, mode="sum", padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(dim + d_num, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, tags, nums):
        return self.mlp(torch.cat([self.tags(tags), nums], 1)).squeeze(-1)


@case("trained_padding_idx_real_category", "what_is_trained",
      "The multi-valued tag field is padded with 0 and bagged with nn.EmbeddingBag(padding_idx=0), but the tag "
      "encoder also gives id 0 to a real, informative tag (no id reserved for padding), so that tag's row is pinned "
      "at zero, never gets a gradient and the tag is invisible to the model.",
      r"padding_idx|pad(ding)?.{0,60}(real|actual|valid|informative|frequent|categor|tag|collid|clash|same id)|"
      r"(id|index|row|tag|category) ?0.{0,60}(zero|never|no grad|frozen|not (updated|trained)|invisible|pad)|"
      r"reserve.{0,30}(0|pad)|shift.{0,30}(\+ ?1|by one)")
def trained_padding_idx_real_category(fixed=False):
    seed(0)
    g = gen(24)
    n, n_tags, length = 3000, 12, 4
    count = torch.randint(1, length + 1, (n,), generator=g)
    tags = torch.stack([torch.randperm(n_tags, generator=g)[:length] for _ in range(n)])    # real tags 0..11
    present = torch.arange(length)[None, :] < count[:, None]
    effect = torch.randn(n_tags, generator=g) * 0.5
    effect[0] = 3.0
    nums = torch.randn(n, 4, generator=g)
    logit = (effect[tags] * present).sum(1) - 0.6 + nums @ torch.randn(4, generator=g) * 0.3
    y = (logit > logit.median()).float()
    ids = tags + 1 if fixed else tags
    padded = torch.where(present, ids, torch.zeros_like(ids))
    model = TagBagMLP(n_tags)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(padded[:2400], nums[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(padded[2400:], nums[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=ctr_loss, max_steps=300)


class WideDeep(nn.Module):
    def __init__(self, n_cross=1000, vocab=(50, 20, 8), dim=8, d_num=4, fixed=False):
        super().__init__()
        wide = nn.Embedding(n_cross, 1)
        nn.init.zeros_(wide.weight)
        self.parts = nn.ModuleDict({"wide": wide}) if fixed else {"wide": wide}
        self.deep = EmbMLP([nn.Embedding(v, dim) for v in vocab], d_num, dim)

    def forward(self, cats, nums):
        crossed = (cats[:, 0] * 20 + cats[:, 1]) % 1000     # hashed cross of fields 0 and 1
        return self.deep(cats, nums) + self.parts["wide"](crossed).squeeze(-1)


@case("trained_wide_part_in_plain_dict", "what_is_trained",
      "The wide (crossed-feature) part of the wide-and-deep model is kept in a plain Python dict, not an "
      "nn.ModuleDict, so its weights are not registered, not in model.parameters() and never trained.",
      r"ModuleDict|plain (python )?dict|dict.{0,60}(not|never) (registered|tracked)|not registered|register|"
      r"model\.parameters\(\).{0,60}(miss|not|exclude)|not in (the )?optimizer|wide.{0,60}(never|not) (updated|trained)")
def trained_wide_part_in_plain_dict(fixed=False):
    seed(0)
    g = gen(25)
    n = 6000
    cats = torch.stack([torch.randint(0, v, (n,), generator=g) for v in (50, 20, 8)], 1)
    nums = torch.randn(n, 4, generator=g)
    cross = torch.randn(50, 20, generator=g)
    cross = (cross - cross.mean(0, keepdim=True) - cross.mean(1, keepdim=True)) * 3     # a pure interaction
    logit = cross[cats[:, 0], cats[:, 1]] + 0.5 * nums[:, 0]
    y = (logit > logit.median()).float()
    model = WideDeep(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(cats[:5000], nums[:5000], y[:5000]), 64),
                val_loader=loader(TensorDataset(cats[5000:], nums[5000:], y[5000:]), 200, shuffle=False),
                loss_fn=ctr_loss, max_steps=300)
