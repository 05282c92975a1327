"""Set n, family what_is_trained: the weights that should learn are not the ones the optimizer updates (no crash)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_n.cases_targets import DictRows
from benchmarks.blind_preflight_n.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    split,
)

# --- 1. Tiny BERT tagger: the classifier's parameter group is built but never appended -----------------------------
# Source: https://github.com/zjunlp/HVPNeT/issues/5 (the crf and fc parameter groups are not added to the optimizer,
# "otherwise crf and fc will not be trained").

def entity_tokens(n: int, s: int, length: int = 16, vocab: int = 64):
    """Token ids 4-63; the tag is the id's range (O, PER, LOC, ORG), as a gazetteer-driven tagger would learn."""
    g = gen(s)
    ids = torch.randint(4, vocab, (n, length), generator=g)
    tags = ((ids - 4) // 15).clamp(max=3)
    return ids, tags


def tiny_bert_tagger(vocab: int = 64, tags: int = 4):
    from transformers import BertConfig, BertForTokenClassification
    cfg = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, num_labels=tags, pad_token_id=0)
    return BertForTokenClassification(cfg)


def build_bert_tagger(fixed: bool = False):
    seed(0)
    ids, tags = entity_tokens(1280, 12)
    model = tiny_bert_tagger()
    parameters = []
    encoder = {"params": [p for n, p in model.named_parameters() if n.startswith("bert.")], "lr": 2e-5}
    parameters.append(encoder)
    head = {"params": [p for n, p in model.named_parameters() if n.startswith("classifier.")], "lr": 3e-3}
    if fixed:
        parameters.append(head)
    mask = torch.ones_like(ids)
    return dict(model=model, optimizer=torch.optim.AdamW(parameters, weight_decay=0.01),
                train_loader=loader(DictRows(input_ids=ids[:1024], attention_mask=mask[:1024], labels=tags[:1024]),
                                    32),
                val_loader=loader(DictRows(input_ids=ids[1024:], attention_mask=mask[1024:], labels=tags[1024:]),
                                  128, shuffle=False),
                loss_fn=None, max_steps=300)


@case("bert_tagger_head_group_not_appended", "what_is_trained",
      bug="The AdamW parameter groups are built as a list: the encoder group (lr 2e-5) is appended, but the "
          "classifier's group (lr 3e-3) is built and never appended, so the randomly initialised token classifier "
          "(classifier.weight / classifier.bias) is not in the optimizer and is never updated.",
      cause_pattern=r"classifier\w*.{0,100}(not|never|missing|absent|left out)\w*.{0,60}(optimi[sz]er|param(eter)?"
                    r"[ _]groups?)|(optimi[sz]er|param(eter)?[ _]groups?).{0,100}(miss\w*|lack\w*|omit\w*|without"
                    r"|leav\w* out|exclud\w*).{0,60}classifier|classifier\.(weight|bias).{0,100}(not|never) (in|updated"
                    r"|passed|part)|never appended|not appended")
def bert_tagger_head_group_not_appended(fixed: bool = False):
    return build_bert_tagger(fixed)


def tag_accuracy(model, kw):
    def fn(m, b):
        pred = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1)
        return (pred == b["labels"]).sum().item(), b["labels"].numel()
    return mean_over(model, kw["val_loader"], fn)


fix("bert_tagger_head_group_not_appended", fixed_of(bert_tagger_head_group_not_appended), tag_accuracy,
    "val tag accuracy")


# --- 2. Gesture clips: a CNN-LSTM whose frame encoder runs under torch.no_grad() --------------------------------
# Source: https://github.com/pranoyr/cnn-lstm/issues/6 ("with torch.no_grad() in cnnlstm.py means that the weight of
# resnet will not be affected by backward"; deleting it updates the CNN and the LSTM at the same time).

def moving_dot_clips(n: int, s: int, frames: int = 6, size: int = 16):
    """A faint 3x3 dot crossing a noisy frame; the class is its direction (right, left, down, up)."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    clips = 0.5 * torch.randn(n, frames, 1, size, size, generator=g)
    step = {0: (0, 2), 1: (0, -2), 2: (2, 0), 3: (-2, 0)}
    for i in range(n):
        dy, dx = step[int(y[i])]
        r0 = int(torch.randint(0, size - 3, (1,), generator=g)) if dy == 0 else (1 if dy > 0 else size - 4)
        c0 = int(torch.randint(0, size - 3, (1,), generator=g)) if dx == 0 else (1 if dx > 0 else size - 4)
        for t in range(frames):
            r, c = r0 + dy * t, c0 + dx * t
            clips[i, t, 0, r:r + 3, c:c + 3] += 0.8
    return clips, y


class CNNLSTM(nn.Module):
    def __init__(self, train_cnn=False):
        super().__init__()
        self.train_cnn = train_cnn
        self.cnn = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1),
                                 nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 8))
        self.lstm = nn.LSTM(8, 32, batch_first=True)
        self.fc = nn.Linear(32, 4)

    def forward(self, clips):                     # (batch, frames, 1, H, W)
        b, t = clips.shape[:2]
        if self.train_cnn:
            feats = self.cnn(clips.flatten(0, 1))
        else:
            with torch.no_grad():                 # as in the ResNet CNN-LSTM this was adapted from
                feats = self.cnn(clips.flatten(0, 1))
        out, _ = self.lstm(feats.view(b, t, -1))
        return self.fc(out[:, -1])


@case("clip_cnn_under_no_grad", "what_is_trained",
      bug="The frame encoder (a CNN trained from scratch here) runs inside `with torch.no_grad():` in forward, kept "
          "from a CNN-LSTM built on a frozen pretrained ResNet: no gradient reaches the CNN, so it stays at its random "
          "initialisation and only the LSTM and the head learn.",
      cause_pattern=r"no_grad|inference_mode|set_grad_enabled\(\s*false"
                    r"|(gradients?|grads?) (do(es)? not|never|cannot|can't|don't) (reach|flow|propagate|get)\w* "
                    r"(to |into |through |back to )?(the )?(cnn|encoder|backbone|conv)"
                    r"|(cnn|encoder|backbone|conv\w*) (weights |layers )?(stays?|remains?) (random|at (its |their )?"
                    r"(random )?init)")
def clip_cnn_under_no_grad(fixed: bool = False):
    seed(0)
    clips, y = moving_dot_clips(1280, 13)
    (xt, yt), (xv, yv) = split(clips, y, 1024)
    model = CNNLSTM(train_cnn=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("clip_cnn_under_no_grad", fixed_of(clip_cnn_under_no_grad),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 3. Wide & deep CTR model: the wide weights are a plain tensor, not an nn.Parameter ----------------------------
# Source: https://github.com/shenweichen/DeepCTR-Torch/pull/61 ("modified basemodel.py so that self.weight is
# registered to torch model parameters").

def click_logs(n: int, s: int, binary: int = 60, cats: int = 20):
    g = gen(s)
    xb = (torch.rand(n, binary, generator=g) < 0.2).float()
    cat = torch.randint(0, cats, (n,), generator=g)
    w = torch.randn(binary, generator=g) * 1.5
    cat_effect = 0.3 * torch.randn(cats, generator=g)
    logit = xb @ w - (0.2 * w.sum()) + cat_effect[cat]
    y = (torch.rand(n, generator=g) < torch.sigmoid(2 * logit)).float()
    return torch.cat([xb, cat[:, None].float()], 1), y


class WideAndDeep(nn.Module):
    def __init__(self, binary=60, cats=20, registered=False):
        super().__init__()
        if registered:
            self.wide = nn.Parameter(torch.zeros(binary, 1))
        else:
            self.wide = torch.zeros(binary, 1, requires_grad=True)
        self.bias = nn.Parameter(torch.zeros(1))
        self.cat = nn.Embedding(cats, 4)
        self.deep = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        binary, cat = x[:, :-1], x[:, -1].long()
        wide = binary @ self.wide.to(binary.device)
        return (wide + self.deep(self.cat(cat)) + self.bias).squeeze(1)


@case("ctr_wide_weights_plain_tensor", "what_is_trained",
      bug="The wide part's weights are a plain tensor, self.wide = torch.zeros(60, 1, requires_grad=True), instead of "
          "an nn.Parameter, so they are not registered in model.parameters(): the optimizer never sees them and the "
          "60 binary features keep a weight of zero.",
      cause_pattern=r"nn\.parameter|register_parameter|not registered|unregistered"
                    r"|(plain|bare|raw|ordinary) (torch\.)?tensor.{0,100}(attribute|parameter|requires_grad|registered)"
                    r"|requires_grad\s*=\s*true.{0,100}(attribute|not (a|an) (nn\.)?param)"
                    r"|not (in|part of|among|returned by|listed in) (the )?model\.(named_)?parameters\(\)")
def ctr_wide_weights_plain_tensor(fixed: bool = False):
    seed(0)
    x, y = click_logs(4000, 14)
    (xt, yt), (xv, yv) = split(x, y, 3200)
    model = WideAndDeep(registered=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(xt, yt), 64),
                val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


fix("ctr_wide_weights_plain_tensor", fixed_of(ctr_wide_weights_plain_tensor),
    acc_of(lambda m, b: ((m(b[0]) > 0).long(), b[1].long())), "val click accuracy")


# --- 4. Bird calls: a class-weighted loss computed in numpy and re-wrapped as a leaf tensor --------------------------
# Source: https://github.com/speechbrain/speechbrain/issues/735 (the loss only backpropagates after
# loss = Variable(loss, requires_grad=True), a fresh leaf cut from the model's graph).

CALL_WEIGHTS = np.array([0.5, 1.0, 1.0, 2.0, 2.0])


def bird_spectrograms(n: int, s: int, size: int = 16):
    """Five species: a call at a species-specific pitch band and sweep direction over a noisy spectrogram."""
    g = gen(s)
    probs = torch.tensor([0.4, 0.2, 0.2, 0.1, 0.1])
    y = torch.multinomial(probs, n, replacement=True, generator=g)
    spec = 0.5 * torch.rand(n, 1, size, size, generator=g)
    for i in range(n):
        band = [3, 3, 9, 9, 6][int(y[i])]
        sweep = [1, -1, 1, -1, 0][int(y[i])]
        start = int(torch.randint(0, 6, (1,), generator=g))
        for t in range(8):
            f = band + sweep * (t // 3)
            spec[i, 0, f, start + t] += 1.5
    return spec, y


def weighted_call_loss(in_torch: bool):
    def loss_fn(model, batch):
        spec, species = batch
        logits = model(spec)
        if in_torch:
            weight = torch.as_tensor(CALL_WEIGHTS, dtype=logits.dtype, device=logits.device)
            return F.cross_entropy(logits.float(), species, weight=weight.float())
        probs = torch.softmax(logits, 1).detach().cpu().numpy()
        labels = species.cpu().numpy()
        w = CALL_WEIGHTS[labels]
        value = -(w * np.log(probs[np.arange(len(labels)), labels] + 1e-9)).sum() / w.sum()
        return torch.tensor(value, dtype=torch.float32, device=logits.device, requires_grad=True)
    return loss_fn


@case("birdcall_numpy_loss_rewrapped", "what_is_trained",
      bug="The class-weighted loss is computed in numpy from torch.softmax(logits).detach().cpu().numpy() and returned "
          "as torch.tensor(value, requires_grad=True) (added to silence 'does not require grad'): a new leaf with no "
          "graph back to the model, so backward() reaches no weight and nothing is trained.",
      cause_pattern=r"torch\.tensor\(.{0,60}requires_grad|new leaf|(leaf|fresh|new) tensor.{0,80}(graph|grad_fn)"
                    r"|(detach\w*|numpy|\.item\(\)).{0,120}(graph|gradient|backward)"
                    r"|(cut|break|disconnect|detach)\w* (off |away )?(from )?the (computation(al)?|autograd) graph"
                    r"|no grad_fn|grad_fn (is )?none|(loss|it) (has|with) no (autograd )?graph")
def birdcall_numpy_loss_rewrapped(fixed: bool = False):
    seed(0)
    spec, y = bird_spectrograms(1280, 15)
    (xt, yt), (xv, yv) = split(spec, y, 1024)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=weighted_call_loss(in_torch=fixed), max_steps=300)


fix("birdcall_numpy_loss_rewrapped", fixed_of(birdcall_numpy_loss_rewrapped),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 5. Movie ratings: item vectors loaded with Embedding.from_pretrained (frozen by default) ----------------------
# Source: https://github.com/RUCAIBox/RecBole/issues/2046 ("have you tried setting freeze=False?": from_pretrained's
# freeze defaults to True; with and without the pretrained embeddings the metrics were identical).

def movie_ratings(n: int, s: int, users: int = 200, items: int = 150, genres: int = 6, k: int = 6):
    g = gen(s)
    genre = torch.randint(0, genres, (items,), generator=g)
    genre_vec = torch.randn(genres, k, generator=g)
    item_true = 0.5 * genre_vec[genre] + torch.randn(items, k, generator=g)
    user_true = torch.randn(users, k, generator=g)
    u = torch.randint(0, users, (n,), generator=g)
    i = torch.randint(0, items, (n,), generator=g)
    r = 3.5 + (user_true[u] * item_true[i]).sum(1) / k ** 0.5 + 0.3 * torch.randn(n, generator=g)
    metadata = genre_vec[genre] @ torch.randn(k, 16, generator=g) / k ** 0.5    # genre-only content vectors
    return torch.stack([u, i], 1), r, metadata


class ContentMF(nn.Module):
    def __init__(self, item_vectors, users=200, freeze=True):
        super().__init__()
        self.user = nn.Embedding(users, item_vectors.size(1))
        nn.init.normal_(self.user.weight, std=0.1)
        self.item = nn.Embedding.from_pretrained(item_vectors) if freeze else \
            nn.Embedding.from_pretrained(item_vectors, freeze=False)
        self.user_bias = nn.Embedding(users, 1)
        self.item_bias = nn.Embedding(item_vectors.size(0), 1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)
        self.mu = nn.Parameter(torch.tensor(3.5))

    def forward(self, pairs):
        u, i = pairs[:, 0], pairs[:, 1]
        dot = (self.user(u) * self.item(i)).sum(1)
        return dot + self.user_bias(u).squeeze(1) + self.item_bias(i).squeeze(1) + self.mu


@case("ratings_item_vectors_frozen_by_default", "what_is_trained",
      bug="The item table is loaded with nn.Embedding.from_pretrained(genre_vectors), whose freeze argument defaults "
          "to True, so the item embeddings are never trained and the model can only fit what the genre-only content "
          "vectors already encode (freeze=False lets them learn).",
      cause_pattern=r"from_pretrained.{0,160}freez|freeze\s*=\s*(true|false)|(frozen|freez\w*) by default"
                    r"|default\w* (to )?(freeze|frozen|freeze\s*=\s*true)")
def ratings_item_vectors_frozen_by_default(fixed: bool = False):
    seed(0)
    x, y, meta = movie_ratings(6000, 16)
    (xt, yt), (xv, yv) = split(x, y, 5000)
    model = ContentMF(meta, freeze=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(xt, yt), 64),
                val_loader=loader(TensorDataset(xv, yv), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("ratings_item_vectors_frozen_by_default", fixed_of(ratings_item_vectors_frozen_by_default),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)

