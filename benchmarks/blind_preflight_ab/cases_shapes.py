"""Set ab, family "shapes": the tensors line up, so nothing raises, but the wrong elements meet."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ab.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------
# 1. GPT-2 fine-tuned as a review classifier, pooled on the first token (BERT's [CLS] habit) under causal attention.
# --------------------------------------------------------------------------------------------------------------

def _review_tokens(n, s):
    """Token ids 3..63; label 1 when 'good' tokens (3..12) outnumber 'bad' tokens (13..22); right-padded with 0."""
    g = gen(s)
    length = torch.randint(10, 25, (n,), generator=g)
    ids = torch.randint(3, 64, (n, 24), generator=g)
    pos = torch.arange(24)[None, :] < length[:, None]
    ids = torch.where(pos, ids, torch.zeros_like(ids))
    good = ((ids >= 3) & (ids <= 12) & pos).sum(1)
    bad = ((ids >= 13) & (ids <= 22) & pos).sum(1)
    keep = good != bad
    ids, pos, good, bad = ids[keep], pos[keep], good[keep], bad[keep]
    return ids, pos.long(), (good > bad).long()


class GPT2ReviewClassifier(nn.Module):
    def __init__(self, pool_last: bool):
        super().__init__()
        from transformers import GPT2Config, GPT2Model
        cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=1, eos_token_id=2)
        self.gpt = GPT2Model(cfg)
        self.head = nn.Linear(48, 2)
        self.pool_last = pool_last

    def forward(self, input_ids, attention_mask):
        hidden = self.gpt(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pool_last:   # the last real token: under causal attention the only one that saw the whole review
            last = attention_mask.sum(1) - 1
            pooled = hidden[torch.arange(hidden.size(0), device=hidden.device), last]
        else:                # "take the [CLS] position" as one does with BERT
            pooled = hidden[:, 0]
        return self.head(pooled)


def _review_loss(model, batch):
    ids, mask, y = batch
    return F.cross_entropy(model(ids, mask), y)


def gpt2_review_classifier(fixed=False):
    seed(0)
    ids, mask, y = _review_tokens(1400, 0)
    model = GPT2ReviewClassifier(pool_last=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(ids[:1100], mask[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(ids[1100:], mask[1100:], y[1100:]), 64, shuffle=False),
                loss_fn=_review_loss, max_steps=300)


case("shapes_gpt2_first_token_pool", "shapes",
     "A GPT-2 (causal attention) review classifier pools hidden[:, 0], the first token's state, as one does with "
     "BERT's [CLS]; under the causal mask that position has attended to nothing but itself, so the head never sees "
     "the review; pool the last non-padding token (attention_mask.sum(1) - 1) instead.",
     r"(first|0th|initial|leading) (token|position)|\[\s*:\s*,\s*0\s*\]|\bcls\b.{0,80}(causal|gpt|decoder)|"
     r"(causal|gpt|decoder).{0,80}\bcls\b|last (non[- ]?pad(ding)?|real) token|attended to (nothing|only itself)|"
     r"(causal|autoregressive|decoder).{0,60}(pool|first token|position 0)|(pool|pooling|pooled).{0,60}"
     r"(causal|first token|position 0)")(gpt2_review_classifier)


def _review_acc(m, b):
    ids, mask, y = b
    return m(ids, mask).argmax(-1), y


fix("shapes_gpt2_first_token_pool", fixed_of(gpt2_review_classifier), acc_of(_review_acc), "val accuracy",
    steps=300)


# --------------------------------------------------------------------------------------------------------------
# 2. Matrix factorisation whose "dot product" is u @ v.T: a (B, B) matrix compared with (B,) ratings.
# --------------------------------------------------------------------------------------------------------------

def _ratings(n, n_users, n_items, s):
    g = gen(s)
    u_true = torch.randn(n_users, 4, generator=g)
    v_true = torch.randn(n_items, 4, generator=g)
    users = torch.randint(0, n_users, (n,), generator=g)
    items = torch.randint(0, n_items, (n,), generator=g)
    r = (u_true[users] * v_true[items]).sum(1) * 0.6 + 3.0 + 0.1 * torch.randn(n, generator=g)
    return users, items, r


class DotRecommender(nn.Module):
    def __init__(self, n_users, n_items, rowwise: bool, dim=16):
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        self.bias = nn.Parameter(torch.tensor(3.0))
        nn.init.normal_(self.user.weight, std=0.3)
        nn.init.normal_(self.item.weight, std=0.3)
        self.rowwise = rowwise

    def forward(self, users, items):
        u, v = self.user(users), self.item(items)
        if self.rowwise:
            return (u * v).sum(1) + self.bias
        return u @ v.T + self.bias          # "the score matrix U V^T", as the Excel sheet computes it


class RatingMSE(nn.Module):
    def forward(self, pred, target):
        return F.mse_loss(pred, target)


def mf_matmul_scores(fixed=False):
    seed(0)
    users, items, r = _ratings(6000, 120, 80, 1)
    model = DotRecommender(120, 80, rowwise=fixed)
    mse = RatingMSE()

    def loss_fn(model, batch):
        u, i, y = batch
        return mse(model(u, i), y)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(users[:5000], items[:5000], r[:5000]), 64),
                val_loader=loader(TensorDataset(users[5000:], items[5000:], r[5000:]), 128, shuffle=False),
                loss_fn=loss_fn, max_steps=400)


case("shapes_mf_matmul_scores", "shapes",
     "The recommender scores a batch with user_emb @ item_emb.T, a (B, B) matrix of every user against every item, "
     "and MSELoss broadcasts it against the (B,) ratings, so each item's embedding is fitted to its rating for all B "
     "users at once; use the row-wise dot product (u * v).sum(1).",
     r"\(\s*b\s*,\s*b\s*\)|\(batch, ?batch\)|(\[|\()\s*64\s*,\s*64\s*(\]|\))|u\s*@\s*v|@\s*\w*\.t\b|\.t\(\)|"
     r"\bmatmul\b|\bmm\b|(u \* v|u\*v)\.sum|row[- ]?wise dot|outer product|every user (against|with) every item|"
     r"(all|every) (user|row)[- ]?(x|×|by|against) ?(all |every )?(item|column)s?|square (score )?matrix")(mf_matmul_scores)


def _mf_pred(m, b):
    u, i, y = b
    p = m(u, i)
    return (p.diagonal() if p.dim() == 2 else p), y   # what the user reads off as "the prediction for each pair"


fix("shapes_mf_matmul_scores", fixed_of(mf_matmul_scores), rmse_of(_mf_pred), "val RMSE", steps=400, higher=False)


# --------------------------------------------------------------------------------------------------------------
# 3. A token tagger's (B, T, C) logits turned into CrossEntropyLoss's (B, C, T) with .view instead of .permute.
# --------------------------------------------------------------------------------------------------------------

N_TAGS = 5


def _tagging_data(n, t, vocab, s):
    g = gen(s)
    ids = torch.randint(0, vocab, (n, t), generator=g)
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.long), ids[:, :-1]], 1)
    tags = (ids + (prev % 2)) % N_TAGS       # a tag from the token and its left neighbour
    return ids, tags


class ConvTagger(nn.Module):
    def __init__(self, vocab, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, 64, kernel_size=3, padding=1)
        self.out = nn.Linear(64, N_TAGS)

    def forward(self, ids):                      # (B, T) -> (B, T, C)
        h = self.emb(ids).transpose(1, 2)
        h = torch.relu(self.conv(h)).transpose(1, 2)
        return self.out(h)


def token_tagger_view(fixed=False):
    seed(0)
    ids, tags = _tagging_data(1500, 20, 40, 2)
    model = ConvTagger(40)

    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)                                   # (B, T, C)
        b, t, c = logits.shape
        if fixed:
            logits = logits.permute(0, 2, 1)                # (B, C, T)
        else:
            logits = logits.view(b, c, t)                   # "CrossEntropyLoss wants (N, C, d1)"
        return F.cross_entropy(logits, y)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1200], tags[:1200]), 32),
                val_loader=loader(TensorDataset(ids[1200:], tags[1200:]), 64, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("shapes_token_logits_view", "shapes",
     "The tagger's (B, T, C) logits are turned into the (B, C, T) layout CrossEntropyLoss expects with "
     "logits.view(b, c, t) instead of logits.permute(0, 2, 1), which keeps the memory order and scrambles which "
     "number is which tag at which position, so the loss trains on shuffled scores; permute/transpose the axes.",
     r"\bview\b.{0,80}(permute|transpose)|(permute|transpose).{0,80}\b(view|reshape)\b|"
     r"\.view\(\s*b\s*,\s*c\s*,\s*t\s*\)|(scrambl|shuffl|reorder)\w*.{0,60}(logit|class|tag|axis|axes|dim)|"
     r"(logit|class|tag)s?.{0,60}(scrambl|interleav)|memory (order|layout)|"
     r"reshap\w* (instead of|rather than|is not a) (a )?(permut|transpos)")(token_tagger_view)


fix("shapes_token_logits_view", fixed_of(token_tagger_view), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val token accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------
# 4. A "pretrained" 40-class classifier re-targeted to 4 classes by setting head.out_features = 4.
# --------------------------------------------------------------------------------------------------------------

class Backbone(nn.Module):
    def __init__(self, d_in=16, width=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class PretrainedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.classifier = nn.Linear(64, 40)

    def forward(self, x):
        return self.classifier(self.backbone(x))


def _pretrained_40way():
    """Stands in for the downloaded checkpoint: the backbone and a 40-way head fitted to an older 40-class task."""
    g = gen(11)
    net = PretrainedNet()
    x = torch.randn(2000, 16, generator=g)
    w = torch.randn(16, 40, generator=g)
    y = (x @ w).argmax(1)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for i in range(150):
        sl = slice((i * 100) % 2000, (i * 100) % 2000 + 100)
        opt.zero_grad()
        F.cross_entropy(net(x[sl]), y[sl]).backward()
        opt.step()
    return net


def head_out_features_attr(fixed=False):
    seed(0)
    model = _pretrained_40way()
    for p in model.backbone.parameters():
        p.requires_grad = False
    if fixed:
        model.classifier = nn.Linear(64, 4)
    else:
        model.classifier.out_features = 4        # "change the number of classes"
    g = gen(3)
    x = torch.randn(1600, 16, generator=g)
    y = (x[:, :4] + 0.5 * x[:, 4:8]).argmax(1)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.Adam(trainable, lr=1e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=80)


case("shapes_head_out_features_attr", "shapes",
     "The pretrained 40-way head is re-targeted to 4 classes by assigning classifier.out_features = 4, which only "
     "changes the attribute: the weight is still (40, 64), the model still emits 40 logits, and the 36 old classes "
     "keep winning the argmax while CrossEntropyLoss slowly pushes them down; replace the layer with "
     "nn.Linear(64, 4).",
     r"out_features|40 (logits|outputs|classes|columns|scores)|(\(|\[)\s*\w+\s*,\s*40\s*(\)|\])|"
     r"(logits|output)s? (has|have|with) 40|more (logits|outputs|output units) than (the )?(classes|labels)|"
     r"(classes|labels) (never|not) (used|seen|present)|unused (logit|output|class)|"
     r"(replace|rebuild|re-?create|new) (the )?(head|classifier|layer|linear).{0,40}(4\b|num_classes|classes)")(
    head_out_features_attr)

fix("shapes_head_out_features_attr", fixed_of(head_out_features_attr), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=80)


# --------------------------------------------------------------------------------------------------------------
# 5. Two-tower candidate scoring: the query tiled with .repeat(K, 1) where each query had to be repeated K times.
# --------------------------------------------------------------------------------------------------------------

K_CAND = 6


def _candidates(n, n_users, n_items, s):
    g = gen(s)
    taste = torch.randn(n_users, 6, generator=g)
    style = torch.randn(n_items, 6, generator=g)
    users = torch.randint(0, n_users, (n,), generator=g)
    cands = torch.stack([torch.randperm(n_items, generator=g)[:K_CAND] for _ in range(n)])
    score = (taste[users][:, None, :] * style[cands]).sum(-1)
    return users, cands, score.argmax(1)          # which of the K candidates the user clicked


class TwoTower(nn.Module):
    def __init__(self, n_users, n_items, interleave: bool, dim=24):
        super().__init__()
        self.user = nn.Sequential(nn.Embedding(n_users, dim), nn.Linear(dim, dim))
        self.item = nn.Embedding(n_items, dim)
        self.interleave = interleave

    def forward(self, users, cands):               # (B,), (B, K) -> (B, K) scores
        b, k = cands.shape
        q = self.user(users)                       # (B, D)
        if self.interleave:
            q = q.repeat_interleave(k, dim=0).view(b, k, -1)
        else:
            q = q.repeat(k, 1).view(b, k, -1)      # rows come out q0..qB-1, q0..qB-1, ...
        return (q * self.item(cands)).sum(-1)


def two_tower_repeat(fixed=False):
    seed(0)
    users, cands, y = _candidates(3000, 150, 200, 4)
    model = TwoTower(150, 200, interleave=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(users[:2500], cands[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(users[2500:], cands[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), max_steps=300)


case("shapes_two_tower_repeat", "shapes",
     "The two-tower scorer tiles the (B, D) user vectors over the K candidates with q.repeat(K, 1).view(B, K, D), "
     "which lays them out q0..qB-1, q0..qB-1, ... so most candidate rows are scored against another user's vector; "
     "use q.repeat_interleave(K, dim=0) (or q.unsqueeze(1).expand(-1, K, -1)).",
     r"repeat_interleave|\.repeat\(|\brepeat\b.{0,60}(interleav|order|tile)|tile[sd]? .{0,40}(wrong|order|user)|"
     r"unsqueeze\(1\)\.expand|another user'?s?|wrong (user|query)s?\b|"
     r"(scored|matched) against (the )?(wrong|another|other) (user|query)")(two_tower_repeat)

fix("shapes_two_tower_repeat", fixed_of(two_tower_repeat), acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])),
    "val click accuracy", steps=300)
