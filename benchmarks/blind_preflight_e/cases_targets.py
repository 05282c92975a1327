"""Set e, family 2: targets and labels (range, encoding, dtype, ignored labels, leaks, mappings)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_e.registry import case, loader, seed, teacher_classes, teacher_regression

FAMILY = "targets"


def mlp(d_in, d_out, hidden=64):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


# --------------------------------------------------------------------------- 1. regression targets cast to long


class HousingDataset(Dataset):
    """Adapted from the project's classification dataset class: features as float32, the target as a long."""

    def __init__(self, X: np.ndarray, y: np.ndarray):
        self.X, self.y = X.astype(np.float32), y

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        return torch.tensor(self.X[i]), torch.tensor(self.y[i]).long()   # BUG: a float target made a long


def housing_arrays(s=0):
    x, y = teacher_regression(3000, 12, s=s)
    y = (y - y[:2560].mean()) / y[:2560].std()          # standardised with the training statistics
    return x.numpy(), y.numpy()


def housing_mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y.float())


@case("housing_value_targets_cast_to_long", FAMILY,
      "the regression Dataset was adapted from a classification one and returns torch.tensor(y).long(): "
      "the standardised house values (mostly in (-1, 1)) are truncated towards zero, so about half of the targets "
      "are exactly 0 and the rest -1 or 1; the model is fitted to integer-truncated targets",
      r"integer|int64|\blong\b|dtype|truncat|round|discret|whole numbers|(few|\d+) distinct (values|targets)|(targets?|"
      r"labels?)[^.]*(mostly|all)[^.]*(zero|0\b)")
def housing_value_targets_cast_to_long():
    seed(0)
    X, y = housing_arrays(s=11)
    model = mlp(12, 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(HousingDataset(X[:2560], y[:2560]), 64),
                val_loader=loader(HousingDataset(X[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=housing_mse, max_steps=2000)


# --------------------------------------------------------------------------- 2. label encoder fitted on each split


TICKET_CLASSES = ["account", "billing", "bug", "feature_request"]


def encode_labels(names):
    """Map label names to ids (a LabelEncoder in three lines)."""
    classes = sorted(set(names))
    return torch.tensor([classes.index(n) for n in names])


def ticket_splits(s=0):
    x, y = teacher_classes(4000, 16, 4, s=s)
    names = [TICKET_CLASSES[i] for i in y.tolist()]
    train_x, train_names = x[:3000], names[:3000]
    # the validation tickets come from a later month, when account questions went to a separate queue
    keep = [i for i in range(3000, 4000) if names[i] != "account"]
    val_x, val_names = x[keep], [names[i] for i in keep]
    return (train_x, train_names), (val_x, val_names)


@case("ticket_labels_encoded_per_split", FAMILY,
      "the label ids are made by encode_labels() (sorted(set(names)).index) separately for the training and the "
      "validation split; the validation month has no 'account' tickets, so there billing=0, bug=1, feature_request=2 "
      "while training uses billing=1, bug=2, feature_request=3: every validation label names a different class",
      r"mapping|(labels?|class(es)?)[^.]*encod|encod\w*[^.]*(labels?|class|split)|inconsisten|(val|validation)[^.]*(labels?|class(es)?|targets?)[^.]*(differ|shift|wrong|mismatch|"
      r"distribution|never|absent|missing)|class (index|indices|ids?|order)|label (ids?|index|indices)")
def ticket_labels_encoded_per_split():
    seed(0)
    (tx, tn), (vx, vn) = ticket_splits(s=12)
    model = mlp(16, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(tx, encode_labels(tn)), 64),
                val_loader=loader(TensorDataset(vx, encode_labels(vn)), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 3. sigmoid output against 1..5 star ratings


def star_ratings(s=0):
    x, z = teacher_regression(3000, 10, s=s)
    stars = torch.clamp(torch.round(3 + 1.2 * z), 1, 5)
    return x, stars


def rating_mse(model, batch):
    x, stars = batch
    return F.mse_loss(model(x).squeeze(-1), stars)


@case("rating_regressor_sigmoid_head_on_1_to_5_stars", FAMILY,
      "the rating regressor ends in nn.Sigmoid() (copied from a click model) but the targets are 1-5 star ratings: "
      "every prediction is confined to (0, 1), below every target, so the MSE cannot go under (stars - 1)^2 and the "
      "sigmoid saturates",
      r"sigmoid|(outputs?|predictions?)[^.]*(range|bound|\(0, ?1\)|\[0, ?1\]|saturat|below)|(targets?|labels?)[^.]*("
      r"outside|out of|beyond|exceed|above)[^.]*(range|\(0, ?1\)|\[0, ?1\]|output)|range[^.]*(outputs?|predictions?|"
      r"sigmoid)")
def rating_regressor_sigmoid_head_on_1_to_5_stars():
    seed(0)
    x, stars = star_ratings(s=13)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1), nn.Sigmoid())
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], stars[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], stars[2560:]), 128, shuffle=False),
                loss_fn=rating_mse, max_steps=2000)


# --------------------------------------------------------------------------- 4. MLM labels cloned after masking


MLM_VOCAB, MASK_ID = 64, 4


def tiny_bert_config(**kw):
    from transformers import BertConfig
    base = dict(vocab_size=MLM_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1)
    base.update(kw)
    return BertConfig(**base)


def mlm_collate(batch):
    input_ids = torch.stack([b[0] for b in batch])
    masked = torch.rand(input_ids.shape) < 0.15
    input_ids[masked] = MASK_ID                      # mask 15% of the tokens (in place)
    labels = input_ids.clone()                       # BUG: cloned after the masking: the targets are [MASK] too
    labels[~masked] = -100                           # only the masked positions count
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def mlm_corpus(n=2048, T=16, s=0):
    from benchmarks.blind_preflight_e.registry import token_sequences
    return token_sequences(n, T, MLM_VOCAB, s=s, low=5)


@case("bert_mlm_labels_cloned_after_masking", FAMILY,
      "the MLM collate replaces 15% of input_ids with [MASK] in place and only then clones them into labels: at every "
      "masked position the target is the [MASK] id itself, so BertForMaskedLM learns to output [MASK] where it reads "
      "[MASK] (the loss falls to ~0) and never to reconstruct the hidden token",
      r"\[MASK\]|mask (token|id)|copy|cop(ies|ying)|identity|identical|trivial|(labels?|targets?)[^.]*(equal|same|"
      r"identical|match)[^.]*inputs?|inputs?[^.]*(equal|same|identical|match)[^.]*(labels?|targets?)|leak|clone")
def bert_mlm_labels_cloned_after_masking():
    from transformers import BertForMaskedLM
    seed(0)
    model = BertForMaskedLM(tiny_bert_config())
    ids = mlm_corpus(s=14)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids), 32, collate_fn=mlm_collate), loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- 5. num_labels=1 on a 4-intent classifier


def intent_batches(n=1600, T=12, vocab=64, s=0):
    """Four intents, each marked by which of four cue-token ranges dominates the utterance; padded, with a mask."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 4, (n,), generator=g)
    lengths = torch.randint(5, T + 1, (n,), generator=g)
    ids = torch.zeros(n, T, dtype=torch.long)
    for i in range(n):
        L = int(lengths[i])
        toks = torch.randint(10, vocab, (L,), generator=g)
        cue = 10 + 12 * int(y[i]) + torch.randint(0, 12, (L // 2,), generator=g)
        toks[torch.randperm(L, generator=g)[: L // 2]] = cue
        toks[0] = 2
        ids[i, :L] = toks
    return ids, (ids != 0).long(), y


class DictDataset(Dataset):
    def __init__(self, **tensors):
        self.tensors = tensors
        self.n = len(next(iter(tensors.values())))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.tensors.items()}


@case("bert_intent_classifier_num_labels_1", FAMILY,
      "BertForSequenceClassification is built with num_labels=1 ('one label per utterance') for a 4-intent task: "
      "with one output Hugging Face sets problem_type='regression' and trains MSE between a single score and the "
      "intent ids 0-3, treating the classes as ordered numbers",
      r"regression|num_labels|problem_type|\bMSE\b|mean.squared|single (output|logit|score)|one (output|logit|score)")
def bert_intent_classifier_num_labels_1():
    from transformers import BertForSequenceClassification
    seed(0)
    ids, att, y = intent_batches(s=15)
    model = BertForSequenceClassification(tiny_bert_config(num_labels=1))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(DictDataset(input_ids=ids[:1280], attention_mask=att[:1280], labels=y[:1280]), 32),
                val_loader=loader(DictDataset(input_ids=ids[1280:], attention_mask=att[1280:], labels=y[1280:]), 64,
                                  shuffle=False),
                loss_fn=None, max_steps=2000)


# --------------------------------------------------------------------------- T5 helpers (the healthy set's T5 case)


T5_VOCAB, T5_PAD, T5_EOS = 48, 0, 1


def keyphrase_pairs(n=1600, src_len=20, s=0):
    """Source: 8-20 tokens; target: its first three tokens reversed, then EOS; both right-padded with 0."""
    g = torch.Generator().manual_seed(s)
    src = torch.zeros(n, src_len, dtype=torch.long)
    tgt = torch.full((n, src_len), T5_PAD, dtype=torch.long)
    for i in range(n):
        L = int(torch.randint(8, src_len + 1, (1,), generator=g))
        toks = torch.randint(3, T5_VOCAB, (L,), generator=g)
        src[i, :L] = toks
        tgt[i, :4] = torch.cat([toks[:3].flip(0), torch.tensor([T5_EOS])])
    return src, (src != T5_PAD).long(), tgt


def tiny_t5(**kw):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = dict(vocab_size=T5_VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
               dropout_rate=0.1, pad_token_id=T5_PAD, eos_token_id=T5_EOS, decoder_start_token_id=T5_PAD)
    cfg.update(kw)
    return T5ForConditionalGeneration(T5Config(**cfg))


# --------------------------------------------------------------------------- 7. decoder-only LM without a causal mask


def markov_text(n=1200, T=33, vocab=24, s=0):
    """Token streams from a random sparse bigram chain: the next token has real uncertainty (~1.4 nats)."""
    g = torch.Generator().manual_seed(s)
    logits = torch.randn(vocab, vocab, generator=g) * 2.5
    probs = torch.softmax(logits, 1)
    seq = torch.zeros(n, T, dtype=torch.long)
    seq[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(1, T):
        seq[:, t] = torch.multinomial(probs[seq[:, t - 1]], 1, generator=g).squeeze(1)
    return seq, probs


class TinyCharGPT(nn.Module):
    def __init__(self, vocab=24, d=48, T=32, layers=2, causal=False):
        super().__init__()
        self.causal = causal
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, T, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        T = ids.size(1)
        h = self.tok(ids) + self.pos[:, :T]
        mask = nn.Transformer.generate_square_subsequent_mask(T) if self.causal else None
        return self.head(self.blocks(h, mask=mask, is_causal=self.causal))


def next_token_loss(model, batch):
    (seq,) = batch
    logits = model(seq[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), seq[:, 1:].reshape(-1))


@case("char_gpt_encoder_stack_without_causal_mask", FAMILY,
      "the decoder-only language model is an nn.TransformerEncoder called without a causal mask (no mask, "
      "is_causal=False): position t attends to position t+1, which is exactly the token it is trained to predict, "
      "so the next-token loss falls far below the data's entropy by copying the future and the model cannot generate",
      r"causal|future|look.?ahead|leak|peek|subsequent|triangular|attn_mask|is_causal|(targets?|labels?|next tokens?)"
      r"[^.]*(visible|in the input|seen|attend)")
def char_gpt_encoder_stack_without_causal_mask():
    seed(0)
    seq, _ = markov_text(s=17)
    model = TinyCharGPT(causal=False)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(seq[:1024]), 32),
                val_loader=loader(TensorDataset(seq[1024:]), 64, shuffle=False),
                loss_fn=next_token_loss, max_steps=2000)


# --------------------------------------------------------------------------- 8. 0/255 masks with ignore_index=255


def crack_images(n=1200, size=16, s=0):
    """Grey images with one thin bright crack; masks as read from 8-bit PNGs: 0 background, 255 crack."""
    g = torch.Generator().manual_seed(s)
    x = 0.2 * torch.randn(n, 1, size, size, generator=g)
    m = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        r = int(torch.randint(2, size - 2, (1,), generator=g))
        slope = float(torch.rand(1, generator=g)) - 0.5
        for c in range(size):
            rr = int(round(r + slope * (c - size / 2)))
            if 0 <= rr < size:
                x[i, 0, rr, c] += 1.0
                m[i, rr, c] = 255
    return x, m


@case("crack_segmentation_png_masks_255_ignored", FAMILY,
      "the binary crack masks are read from 8-bit PNGs as 0/255 and fed unchanged to CrossEntropyLoss(ignore_index="
      "255) (the VOC boundary convention kept from another project): every crack pixel is ignored, the loss only "
      "ever sees class 0 and the net learns to predict background everywhere",
      r"255|ignore_index|ignored|(only|single|one) (one )?class|(class 1|positive|foreground)[^.]*(never|no |absent)")
def crack_segmentation_png_masks_255_ignored():
    seed(0)
    x, m = crack_images(s=18)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 2, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1024], m[:1024]), 32),
                val_loader=loader(TensorDataset(x[1024:], m[1024:]), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(ignore_index=255), max_steps=1500)
