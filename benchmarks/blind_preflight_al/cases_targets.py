"""Set al, family targets: the targets the loss sees are not the ones the user meant."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_al.registry import (
    acc_of,
    adam,
    case,
    ds,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    token_sequences,
)


# 6 ------------------------------------------------------------------ ReLU output on standardized targets
def rent_table(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, generator=gen(40)) / 3
    rent = 900 + 300 * (x @ w + 0.5 * torch.sin(2 * x[:, 0])) + 30 * torch.randn(n, generator=g)
    return x, rent


@case("al_relu_head_standardized_target", "targets",
      "The regression head ends in nn.ReLU() (rents are never negative) but the targets were standardized to zero mean "
      "and unit variance, so about half of them are negative and the model can never predict below 0.",
      r"ReLU.{0,120}(negative|standardi[sz]|z-?score|zero[- ]mean|below (0|zero))|(standardi[sz]|z-?score|zero[- ]mean)"
      r".{0,120}(ReLU|non-?negative|clamp|output activation)|(final|last|output) (layer |activation ).{0,40}(ReLU|non-?negative)"
      r"|(cannot|can ?not|never) (predict|output).{0,30}(negative|below)")
def al_relu_head_standardized_target(fixed=False):
    seed(0)
    x, rent = rent_table(1500, 11)
    mu, sd = rent[:1200].mean(), rent[:1200].std()
    y = ((rent - mu) / sd).unsqueeze(1)
    layers = [nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1)] + ([] if fixed else [nn.ReLU()])
    model = nn.Sequential(*layers)
    return dict(model=model, optimizer=adam(model), train_loader=loader(ds(x[:1200], y[:1200])),
                val_loader=loader(ds(x[1200:], y[1200:]), 100, shuffle=False), loss_fn=nn.MSELoss())


# 7 ------------------------------------------------------------------ decoder input not shifted (teacher forcing)
class TinyGRULM(nn.Module):
    def __init__(self, vocab=40):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.out = nn.Linear(64, vocab)

    def forward(self, tok):
        return self.out(self.gru(self.emb(tok))[0])


def lm_loss(model, batch):
    logits = model(batch[0])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[1].reshape(-1))


@case("al_decoder_input_not_shifted", "targets",
      "For teacher forcing the decoder input and the target are the same un-shifted sequence (inputs = targets = seq), "
      "so position t is trained to output the token it is given; the inputs must be seq[:, :-1] and the targets "
      "seq[:, 1:].",
      r"shift|teacher[- ]forcing|(input|inputs|decoder input).{0,60}(same as|identical to|equal(s)? (to )?)(the )?"
      r"(target|label)|copy (its|the) input|next[- ]token|\[:, ?:-1\]|\[:, ?1:\]|off[- ]by[- ]one")
def al_decoder_input_not_shifted(fixed=False):
    seed(0)
    seq = token_sequences(1400, 13, 40, 13)
    inp, tgt = (seq[:, :-1], seq[:, 1:]) if fixed else (seq[:, :-1], seq[:, :-1])
    model = TinyGRULM()
    return dict(model=model, optimizer=adam(model, 1e-2), train_loader=loader(ds(inp[:1100], tgt[:1100])),
                val_loader=loader(ds(seq[1100:, :-1], seq[1100:, 1:]), 100, shuffle=False), loss_fn=lm_loss)


# 8 ------------------------------------------------------------------ NT-Xent with the self pair as the positive
def subspace_pairs(n, s):
    g = gen(s)
    base = torch.randn(n, 4, generator=g) @ torch.randn(4, 32, generator=gen(98))
    return base + 0.9 * torch.randn(n, 32, generator=g), base + 0.9 * torch.randn(n, 32, generator=g)


def nt_xent(fixed, temperature=0.2):
    def loss_fn(model, batch):
        z = F.normalize(torch.cat([model(batch[0]), model(batch[1])]), dim=-1)
        n = z.shape[0] // 2
        sim = z @ z.T / temperature
        idx = torch.arange(2 * n, device=z.device)
        if fixed:
            sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), -1e4)
            labels = (idx + n) % (2 * n)
        else:
            labels = idx                                   # each row's "positive" is itself
        return F.cross_entropy(sim, labels)
    return loss_fn


@torch.no_grad()
def pair_top1(model, kw):
    was = model.training
    model.eval()
    a, b = subspace_pairs(300, 78)
    d = next(model.parameters()).device
    za, zb = F.normalize(model(a.to(d)), dim=-1), F.normalize(model(b.to(d)), dim=-1)
    model.train(was)
    return ((za @ zb.T).argmax(1) == torch.arange(300, device=d)).float().mean().item()


@case("al_ntxent_self_positive", "targets",
      "In the NT-Xent loss over the 2N x 2N similarity matrix the labels are arange(2N) and the diagonal is not masked, "
      "so every embedding's positive is itself (similarity always 1/T) instead of its other view at (i + N) % 2N.",
      r"(self|diagonal|itself|own).{0,80}(positive|label|target|mask)|(positive|label|target).{0,80}(itself|self|diagonal)"
      r"|arange\(2|\(i ?\+ ?N\)|other view|i ?\+ ?(N|batch)")
def al_ntxent_self_positive(fixed=False):
    seed(0)
    v1, v2 = subspace_pairs(2000, 15)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    return dict(model=model, optimizer=adam(model), train_loader=loader(ds(v1, v2), 64, drop_last=True),
                loss_fn=nt_xent(fixed))


# 9 ------------------------------------------------------------------ 0/255 masks into BCEWithLogitsLoss
def blob_scenes(n, s, size=16):
    g = gen(s)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    cy, cx = torch.randint(3, size - 3, (n, 1, 1), generator=g), torch.randint(3, size - 3, (n, 1, 1), generator=g)
    r = torch.randint(2, 4, (n, 1, 1), generator=g)
    mask = ((yy - cy) ** 2 + (xx - cx) ** 2 <= r ** 2)
    img = 0.5 * torch.randn(n, size, size, generator=g) + mask.float()
    return img.unsqueeze(1), (mask.to(torch.uint8) * 255).unsqueeze(1)      # PNG masks store 0/255


def fcn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 1, 1))


def seg_iou(model, kw):
    def fn(m, b):
        p, t = m(b[0]) > 0, b[1] > 0.5
        return ((p & t).sum() / (p | t).sum().clamp(min=1)).item() * len(b[0]), len(b[0])
    return mean_over(model, kw["val_loader"], fn)


@case("al_mask_255_bce", "targets",
      "Binary masks loaded from PNG hold 0 and 255 and are passed to BCEWithLogitsLoss as mask.float() without dividing "
      "by 255, so foreground targets are 255 instead of 1: the loss goes negative and every pixel is pushed to "
      "foreground.",
      r"255|(target|mask|label)s?.{0,80}(outside|not in|exceed|greater than|above|larger than).{0,20}(\[0, ?1\]|0 and 1|one|1\b)"
      r"|(divide|scale|normali[sz]e).{0,40}(mask|target)|binary (target|mask).{0,60}(range|values)")
def al_mask_255_bce(fixed=False):
    seed(0)
    img, mask = blob_scenes(900, 17)
    target = mask.float() / 255 if fixed else mask.float()
    vimg, vmask = blob_scenes(200, 18)
    model = fcn()
    return dict(model=model, optimizer=adam(model), train_loader=loader(ds(img[:700], target[:700])),
                val_loader=loader(ds(vimg, vmask.float() / 255), 100, shuffle=False), loss_fn=nn.BCEWithLogitsLoss())


# 10 ----------------------------------------------------------------- NER labels not aligned to sub-word tokens
def ner_batch(n, s, fixed, max_len=24):
    """Words 0..29; words >= 15 split into two word-pieces. Tag = a property of the word and of the previous word."""
    g = gen(s)
    ids = torch.zeros(n, max_len, dtype=torch.long)
    labels = torch.full((n, max_len), -100, dtype=torch.long)
    gold = torch.full((n, max_len), -100, dtype=torch.long)
    att = torch.zeros(n, max_len, dtype=torch.long)
    for i in range(n):
        words = torch.randint(0, 30, (int(torch.randint(5, 10, (1,), generator=g)),), generator=g).tolist()
        tags = [(w % 3 + (1 if j and words[j - 1] >= 20 else 0)) % 3 for j, w in enumerate(words)]
        toks, first = [1], []                                       # [CLS]=1
        for w in words:
            first.append(len(toks))
            toks += [5 + w, 40 + w % 10] if w >= 15 else [5 + w]
        toks.append(2)                                                  # [SEP]=2
        ids[i, :len(toks)], att[i, :len(toks)] = torch.tensor(toks), 1
        for f, t in zip(first, tags):
            gold[i, f] = t
        if fixed:
            labels[i] = gold[i]
        else:
            labels[i, :len(tags)] = torch.tensor(tags)                  # word tags laid on token positions as they are
    return ids, att, labels, gold


class DictDS(torch.utils.data.Dataset):
    def __init__(self, **cols):
        self.cols = cols

    def __len__(self):
        return len(next(iter(self.cols.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.cols.items()}


def tiny_bert_tagger():
    from transformers import BertConfig, BertForTokenClassification
    cfg = BertConfig(vocab_size=60, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                     max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForTokenClassification(cfg)


def ner_word_acc(model, kw):
    ids, att, _, gold = ner_batch(300, 20, True)
    d = next(model.parameters()).device
    was = model.training
    model.eval()
    with torch.no_grad():
        pred = model(input_ids=ids.to(d), attention_mask=att.to(d)).logits.argmax(-1).cpu()
    model.train(was)
    keep = gold != -100
    return (pred[keep] == gold[keep]).float().mean().item()


@case("al_ner_labels_not_subword_aligned", "targets",
      "Word-level NER tags are laid on the word-piece token positions as they are (no word_ids() alignment, no -100 on "
      "[CLS] and on continuation pieces), so after [CLS] and the first split word every tag sits on the wrong token.",
      r"word_?ids|align|sub-?word|word-?piece|(first|continuation) (sub-?)?token|\[CLS\].{0,60}(-100|label|tag)"
      r"|(labels?|tags?).{0,80}(shifted|offset|wrong token|misplaced)")
def al_ner_labels_not_subword_aligned(fixed=False):
    seed(0)
    ids, att, labels, _ = ner_batch(1000, 19, fixed)
    vids, vatt, vlabels, _ = ner_batch(200, 21, fixed)
    model = tiny_bert_tagger()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), 3e-3),
                train_loader=loader(DictDS(input_ids=ids, attention_mask=att, labels=labels)),
                val_loader=loader(DictDS(input_ids=vids, attention_mask=vatt, labels=vlabels), 100, shuffle=False),
                loss_fn=None)


def _rmse_fwd(m, b):
    return m(b[0]), b[1]


def _lm_fwd(m, b):
    return m(b[0]).argmax(-1), b[1]


fix("al_relu_head_standardized_target", fixed_of(al_relu_head_standardized_target), rmse_of(_rmse_fwd),
    "val RMSE (std units)", steps=250, higher=False)
fix("al_decoder_input_not_shifted", fixed_of(al_decoder_input_not_shifted), acc_of(_lm_fwd), "next-token accuracy",
    steps=250)
fix("al_ntxent_self_positive", fixed_of(al_ntxent_self_positive), pair_top1, "top-1 view retrieval", steps=250)
fix("al_mask_255_bce", fixed_of(al_mask_255_bce), seg_iou, "val IoU", steps=250)
fix("al_ner_labels_not_subword_aligned", fixed_of(al_ner_labels_not_subword_aligned), ner_word_acc,
    "word tag accuracy", steps=250)
