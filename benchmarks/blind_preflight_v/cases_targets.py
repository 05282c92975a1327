"""Targets: five losses whose target (or the input the loss reads as a target distribution) says something else."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset
from transformers import T5Config, T5ForConditionalGeneration

from benchmarks.blind_preflight_v.registry import acc_of, case, fix, fixed_of, gen, loader, mean_of, rmse_of, seed


# --------------------------------------------------------------------------- T1: CTC on raw logits
class FrameTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(12, 48, batch_first=True, bidirectional=True)
        self.out = nn.Linear(96, 9)                     # blank + 8 phones

    def forward(self, x):
        h, _ = self.gru(x)
        return self.out(h)                              # (batch, time, classes)


def _phone_frames(n, g, protos, length=5, frames=24):
    labels = torch.randint(1, 9, (n, length), generator=g)
    x = 0.6 * torch.randn(n, frames, 12, generator=g)
    for i in range(n):
        t = int(torch.randint(0, 2, (1,), generator=g))
        for k in range(length):
            t += 1                                                          # a silent frame between phones
            d = 2 + int(torch.randint(0, 2, (1,), generator=g))
            x[i, t:t + d] += protos[labels[i, k]]
            t += d
    return x, labels


def _ctc_loss(fixed):
    def loss_fn(model, batch):
        x, labels = batch
        out = model(x)
        log_probs = out.log_softmax(-1) if fixed else out
        in_len = torch.full((x.size(0),), x.size(1), dtype=torch.long, device=x.device)
        tgt_len = torch.full((x.size(0),), labels.size(1), dtype=torch.long, device=x.device)
        return F.ctc_loss(log_probs.transpose(0, 1), labels, in_len, tgt_len, blank=0, zero_infinity=True)
    return loss_fn


def _greedy_exact(m, b):
    x, labels = b
    best = m(x).argmax(-1).cpu()
    right = 0
    for row, lab in zip(best.tolist(), labels.cpu().tolist()):
        out, prev = [], 0
        for s in row:
            if s != prev and s != 0:
                out.append(s)
            prev = s
        right += out == lab
    return right, len(labels)


@case("ctc_loss_on_raw_logits", "targets",
      bug="F.ctc_loss is given the raw linear-layer logits instead of log-probabilities (log_softmax over the "
          "classes), so the CTC loss can be driven below zero by raising every logit while the frame posteriors "
          "stop being trained.",
      cause_pattern=r"(ctc\w*|CTCLoss).{0,120}(log_softmax|log[- ]?probabilit|log[- ]probs|logits|unnormali[sz]ed|"
                    r"normali[sz]ed)|(log_softmax|log[- ]?probabilit|log[- ]probs).{0,120}(ctc|CTCLoss)"
                    r"|(ctc\w*|CTCLoss).{0,80}(negative|below zero)")
def ctc_raw(fixed: bool = False):
    seed(0)
    g = gen(11)
    protos = torch.randn(9, 12, generator=g)
    x, y = _phone_frames(1400, g, protos)
    model = FrameTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 100, shuffle=False),
                loss_fn=_ctc_loss(fixed), max_steps=300)


fix("ctc_loss_on_raw_logits", fixed_of(ctc_raw), mean_of(_greedy_exact), "val exact transcripts (greedy)")


# --------------------------------------------------------------------------- T2: TD target without the done mask
GAMMA = 0.9


def _corridor(n_episodes, g, n_states=6, p_right=0.6):
    """Random-walk episodes in a corridor, stored the way an auto-resetting vector env hands them over: on the
    terminal step the next observation is already the first observation of the next episode."""
    s_list, r_list, s2_list, d_list = [], [], [], []
    s = int(torch.randint(0, 3, (1,), generator=g))
    while len(d_list) < n_episodes * 12:
        step = 1 if float(torch.rand(1, generator=g)) < p_right else -1
        nxt = max(0, s + step)
        done = nxt == n_states - 1
        reset = int(torch.randint(0, 3, (1,), generator=g))
        s_list.append(s)
        r_list.append(1.0 if done else 0.0)
        s2_list.append(reset if done else nxt)
        d_list.append(float(done))
        s = reset if done else nxt
    eye = torch.eye(n_states)
    return eye[s_list], torch.tensor(r_list), eye[s2_list], torch.tensor(d_list)


def _true_values(n_states=6, p_right=0.6):
    m = n_states - 1
    a = torch.eye(m, dtype=torch.float64)
    b = torch.zeros(m, dtype=torch.float64)
    for s in range(m):
        right, left = s + 1, max(0, s - 1)
        if right == m:
            b[s] += p_right
        else:
            a[s, right] -= GAMMA * p_right
        a[s, left] -= GAMMA * (1 - p_right)
    return torch.linalg.solve(a, b).float()


def _td_loss(fixed):
    def loss_fn(model, batch):
        s, r, s2, done = batch
        v = model(s).squeeze(-1)
        with torch.no_grad():
            v2 = model(s2).squeeze(-1)
        target = r + GAMMA * v2 * (1 - done) if fixed else r + GAMMA * v2
        return F.mse_loss(v, target)
    return loss_fn


@case("td_target_bootstraps_through_done", "targets",
      bug="The TD target r + gamma * V(s') is not multiplied by (1 - done), so on terminal transitions it bootstraps "
          "from the auto-reset next observation of the following episode and every state's value is inflated.",
      cause_pattern=r"\(1 ?- ?dones?\)|1 ?- ?dones?\b|done[_ ]?mask|not[_ ]done|terminal (states?|transitions?|steps?)"
                    r"|bootstrap\w*.{0,60}(terminal|done|episode (end|boundar))|episode (end|boundar)\w*"
                    r"|\bdones?\b.{0,40}(mask|ignored|unused|not used)")
def td_done(fixed: bool = False):
    seed(0)
    s, r, s2, d = _corridor(300, gen(12))
    v_true = _true_values()
    val_s = torch.eye(6)[torch.arange(5).repeat(20)]
    val_v = v_true[torch.arange(5).repeat(20)]
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(s, r, s2, d), 64),
                val_loader=loader(TensorDataset(val_s, val_v), 100, shuffle=False),
                loss_fn=_td_loss(fixed), max_steps=300)


fix("td_target_bootstraps_through_done", fixed_of(td_done), rmse_of(lambda m, b: (m(b[0]).squeeze(-1), b[1])),
    "RMSE to the true state values", higher=False)


# --------------------------------------------------------------------------- T3: T5 decoder_input_ids = labels
class Reversal(Dataset):
    def __init__(self, src, fixed):
        self.src, self.fixed = src, fixed

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        ids = self.src[i]
        labels = torch.cat([ids.flip(0), torch.tensor([1])])
        item = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
        if not self.fixed:
            item["decoder_input_ids"] = labels.clone()       # "the decoder needs its inputs too"
        return item


def _tiny_t5():
    return T5ForConditionalGeneration(T5Config(vocab_size=40, d_model=32, d_kv=16, d_ff=64, num_layers=1,
                                               num_decoder_layers=1, num_heads=2, decoder_start_token_id=0,
                                               pad_token_id=0, eos_token_id=1))


def _t5_acc(m, b):
    logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).logits
    return logits.argmax(-1), b["labels"]


@case("t5_decoder_inputs_equal_labels", "targets",
      bug="Each batch passes decoder_input_ids equal to labels to T5ForConditionalGeneration, so at every position "
          "the decoder already sees the token it must predict and learns to copy it, instead of reading the labels "
          "shifted right, which the model builds itself when only labels are given.",
      cause_pattern=r"decoder_input_ids|shift\w*[_ ]right|shifted (one position )?(to the )?right|labels? shifted"
                    r"|decoder (inputs?|sees).{0,60}(same|equal|identical|copy|labels|token it (must|should|has to) "
                    r"predict)|(copy|copies|copying) the (target|label|next token|token it)|learns? to copy")
def t5_dec(fixed: bool = False):
    seed(0)
    src = torch.randint(3, 40, (1500, 6), generator=gen(13))
    model = _tiny_t5()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                train_loader=loader(Reversal(src[:1200], fixed), 32),
                val_loader=loader(Reversal(src[1200:], True), 100, shuffle=False),
                loss_fn=None, max_steps=250)


fix("t5_decoder_inputs_equal_labels", fixed_of(t5_dec), acc_of(_t5_acc), "val token accuracy (labels shifted by T5)",
    steps=250)


# --------------------------------------------------------------------------- T4: CLIP loss with zeros as labels
class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.img = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
        self.txt = nn.EmbeddingBag(41, 32, mode="mean")
        self.txt_proj = nn.Linear(32, 32)
        self.register_buffer("scale", torch.tensor(10.0))

    def forward(self, image, caption):
        zi = F.normalize(self.img(image), dim=-1)
        zt = F.normalize(self.txt_proj(self.txt(caption)), dim=-1)
        return zi, zt


def _pairs(n, g, protos):
    attrs = torch.randint(0, 4, (n, 3), generator=g)
    image = protos[torch.arange(3), attrs].sum(1) + 0.3 * torch.randn(n, 16, generator=g)
    words = 4 + 4 * torch.arange(3) + attrs
    caption = torch.cat([words, torch.randint(16, 41, (n, 3), generator=g)], 1)
    caption = torch.gather(caption, 1, torch.argsort(torch.rand(n, 6, generator=g), 1))
    combo = attrs[:, 0] * 16 + attrs[:, 1] * 4 + attrs[:, 2]
    return image, caption, combo


def _clip_loss(fixed):
    def loss_fn(model, batch):
        image, caption, _ = batch
        zi, zt = model(image, caption)
        logits = model.scale * zi @ zt.T
        if fixed:
            labels = torch.arange(logits.size(0), device=logits.device)
        else:
            labels = torch.zeros(logits.size(0), dtype=torch.long, device=logits.device)  # "positive at index 0"
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    return loss_fn


def _retrieval(m, b):
    image, caption, combo = b
    zi, zt = m(image, caption)
    best = (zi @ zt.T).argmax(-1)
    return combo[best], combo


def clip_zeros(fixed: bool = False):
    seed(0)
    g = gen(14)
    protos = torch.randn(3, 4, 16, generator=g)
    image, caption, combo = _pairs(1700, g, protos)
    model = TwoTower()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(image[:1400], caption[:1400], combo[:1400]), 32),
                val_loader=loader(TensorDataset(image[1400:], caption[1400:], combo[1400:]), 100, shuffle=False),
                loss_fn=_clip_loss(fixed), max_steps=300)


case("clip_labels_zeros_on_in_batch_matrix", "targets",
     bug="The CLIP-style loss builds the in-batch (batch, batch) image-caption similarity matrix but uses "
         "labels = torch.zeros(batch), copied from a MoCo-style [positive, negatives] layout, so every image is "
         "trained to match caption 0 of the batch instead of its own caption on the diagonal (torch.arange(batch)).",
     cause_pattern=r"torch\.arange|arange\(|diagonal|zeros\(.{0,30}(labels?|targets?)|(labels?|targets?).{0,40}"
                   r"(all )?zeros?\b|labels? (are|is) (all )?(0|zero)|(caption|text|sample|column|index) 0\b"
                   r"|in-batch.{0,60}(label|target)")(clip_zeros)
fix("clip_labels_zeros_on_in_batch_matrix", fixed_of(clip_zeros), acc_of(_retrieval),
    "val image->caption top-1 (same attributes)")


# --------------------------------------------------------------------------- T5: ListNet fed rank positions
class DocScorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, docs):                          # (queries, docs, features)
        return self.mlp(docs).squeeze(-1)


def _ranking_data(n, g, w):
    docs = torch.randn(n, 10, 8, generator=g)
    quality = docs @ w + 0.3 * torch.randn(n, 10, generator=g)
    rank = torch.argsort(torch.argsort(-quality, 1), 1) + 1          # 1 = best, from the editors' ordering
    return docs, rank


def _listnet(fixed):
    def loss_fn(model, batch):
        docs, rank = batch
        relevance = (10 - rank).float() if fixed else rank.float()
        return -(F.softmax(relevance, -1) * F.log_softmax(model(docs), -1)).sum(-1).mean()
    return loss_fn


@case("listnet_fed_rank_positions", "targets",
      bug="The ListNet loss is fed the 'rank' column (1 = best document) as the relevance target, so "
          "softmax(relevance) puts the most weight on the worst-ranked document and the scorer learns the reversed "
          "order; relevance must grow with quality (e.g. n_docs - rank).",
      cause_pattern=r"\brank\b.{0,60}(position|column|as (the )?(relevance|label|target))|(relevance|labels?|targets?)"
                    r".{0,80}(revers\w*|invert\w*|inverse|higher (is|=|means) better|lower (is|=|means) better)"
                    r"|revers\w* (order|ranking)|n_docs ?- ?rank|1 ?/ ?rank|ranks? (instead of|rather than|as) "
                    r"(the )?relevance|positions? (instead of|rather than|as) (the )?relevance")
def listnet_rank(fixed: bool = False):
    seed(0)
    g = gen(15)
    w = torch.randn(8, generator=g)
    docs, rank = _ranking_data(1200, g, w)
    model = DocScorer()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(docs[:900], rank[:900]), 32),
                val_loader=loader(TensorDataset(docs[900:], rank[900:]), 100, shuffle=False),
                loss_fn=_listnet(fixed), max_steps=300)


def _top1(m, b):
    docs, rank = b
    best = m(docs).argmax(-1)
    return rank.gather(1, best[:, None]).squeeze(1), torch.ones_like(best)


fix("listnet_fed_rank_positions", fixed_of(listnet_rank), acc_of(_top1), "val top-1 is the best document")
