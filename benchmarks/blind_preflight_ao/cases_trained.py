"""What is trained: the weights that carry the signal never change (frozen, rebuilt, cut from the graph, or left out
of the optimizer), while the loss still moves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ao.registry import (
    CLS,
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    keyword_texts,
    loader,
    order_texts,
    seed,
)


def _argmax(m, b):
    return m(b[0]).argmax(-1), b[-1]


# --- 1. nn.Embedding.from_pretrained freezes by default; the domain words are zero (OOV) rows ---------------------
def glove_like_matrix(vocab, n_classes, dim=32):
    """A "GloVe" lookup for the vocabulary: general words found, the domain keywords (ids 4..) missing -> zeros."""
    m = torch.randn(vocab, dim, generator=gen(30))
    m[: 4 + n_classes] = 0.0
    return m


class BagClassifier(nn.Module):
    def __init__(self, matrix, n_classes, freeze):
        super().__init__()
        self.emb = nn.Embedding.from_pretrained(matrix) if freeze else \
            nn.Embedding.from_pretrained(matrix, freeze=False)
        self.mlp = nn.Sequential(nn.Linear(matrix.shape[1], 64), nn.ReLU(), nn.Linear(64, n_classes))

    def forward(self, tokens):
        return self.mlp(self.emb(tokens).mean(1))


@case("trained_from_pretrained_frozen_oov", "what_is_trained",
      bug="The ticket classifier loads its word vectors with nn.Embedding.from_pretrained(matrix), which freezes them "
          "by default (freeze=True), and the topic keywords were out of the GloVe vocabulary and got all-zero rows, "
          "so the words that decide the label stay zero forever.",
      cause_pattern=r"Embedding\.from_pretrained|from_pretrained\(matrix|freeze ?= ?(True|False)|frozen (embedding|word vector)s?|"
                    r"(embedding|word vector)s? (are |is |stay |remain )?(frozen|never updated|not trained)|"
                    r"(zero|all-zero|oov).{0,60}(row|vector)s?")
def from_pretrained_frozen_oov(fixed=False):
    seed(0)
    x, y, _ = keyword_texts(1600, 20, 80, 4, s=31)
    model = BagClassifier(glove_like_matrix(80, 4), 4, freeze=not fixed)
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("trained_from_pretrained_frozen_oov", fixed_of(from_pretrained_frozen_oov), acc_of(_argmax), "val accuracy",
    steps=250)


# --- 2. the GRU is constructed inside forward(): new random weights every call -----------------------------------
class SpamGRU(nn.Module):
    def __init__(self, vocab, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(vocab, 32, padding_idx=0)
        if fixed:
            self.rnn = nn.GRU(32, 48, batch_first=True)
        self.head = nn.Linear(48, 2)

    def forward(self, tokens):
        rnn = self.rnn if self.fixed else nn.GRU(32, 48, batch_first=True).to(tokens.device)
        _, h = rnn(self.emb(tokens))
        return self.head(h[-1])


@case("trained_gru_built_in_forward", "what_is_trained",
      bug="The spam filter constructs its nn.GRU inside forward(), so every call runs a freshly initialised GRU "
          "that is not a registered submodule, is never in the optimizer and never trained, and the head sees "
          "different random features at every step.",
      cause_pattern=r"(inside|in|within) (the )?forward|(creat|construct|instantiat|buil|defin)\w* (a |an |the )?"
                    r"(new |fresh )?(nn\.)?(GRU|layer|module).{0,40}(each|every) (call|step|forward)|"
                    r"(re-?initiali[sz]ed|fresh(ly)? (random|initiali[sz]ed)).{0,40}(each|every)|"
                    r"not (a )?registered (sub)?module")
def gru_built_in_forward(fixed=False):
    seed(0)
    x, y = order_texts(1600, 12, 30, s=32)
    model = SpamGRU(30, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("trained_gru_built_in_forward", fixed_of(gru_built_in_forward), acc_of(_argmax), "val accuracy", steps=300)


# --- 3. encoder run under torch.no_grad() in forward (copied from the inference script) ---------------------------
class Encoder(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=0)
        self.rnn = nn.GRU(32, 48, batch_first=True)

    def forward(self, tokens):
        return self.rnn(self.emb(tokens))[1][-1]


class OrderClassifier(nn.Module):
    def __init__(self, vocab, fixed):
        super().__init__()
        self.fixed = fixed
        self.encoder = Encoder(vocab)
        self.head = nn.Linear(48, 2)

    def forward(self, tokens):
        if self.fixed:
            h = self.encoder(tokens)
        else:
            with torch.no_grad():                    # "saves memory", copied from predict.py
                h = self.encoder(tokens)
        return self.head(h)


@case("trained_encoder_under_no_grad", "what_is_trained",
      bug="The negation detector's forward() runs its embedding+GRU encoder inside torch.no_grad() (copied from the "
          "inference script), so no gradient reaches the encoder and only the final linear layer is trained on "
          "random recurrent features.",
      cause_pattern=r"no_grad|inference_mode|no gradient (reaches|flows|to)|(graph|gradient).{0,40}(cut|detach|block)|"
                    r"encoder (is |are )?(never|not) (trained|updated|receiving)")
def encoder_under_no_grad(fixed=False):
    seed(0)
    x, y = order_texts(1600, 12, 30, s=33)
    model = OrderClassifier(30, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("trained_encoder_under_no_grad", fixed_of(encoder_under_no_grad), acc_of(_argmax), "val accuracy", steps=300)


# --- 4. BERT built from a config (random weights) and then "frozen like a pretrained backbone" -------------------
def bert_rows(x, y):
    ids = torch.cat([torch.full((x.shape[0], 1), CLS), x], 1)
    return [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": t} for i, t in zip(ids, y)]


@case("trained_frozen_random_bert", "what_is_trained",
      bug="The intent model is BertForSequenceClassification(config), randomly initialised rather than "
          "from_pretrained, yet its whole model.bert backbone is frozen (requires_grad=False) as for feature "
          "extraction, so only the classifier layer trains on features of a random, untrained encoder.",
      cause_pattern=r"(random(ly)?[- ]initiali[sz]ed|untrained|not pretrained|from (a )?config|without pretrained)"
                    r".{0,120}(frozen|freez|requires_grad)|(frozen|freez|requires_grad).{0,120}(random(ly)?[- ]"
                    r"initiali[sz]ed|untrained|not pretrained|from (a )?config|never pretrained)")
def frozen_random_bert(fixed=False):
    seed(0)
    from transformers import BertConfig, BertForSequenceClassification
    x, y, _ = keyword_texts(1600, 15, 40, 4, s=34)
    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=4)
    model = BertForSequenceClassification(config)
    if not fixed:
        for p in model.bert.parameters():
            p.requires_grad = False
    return dict(model=model,
                optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3),
                train_loader=loader(bert_rows(x[:1200], y[:1200]), 32),
                val_loader=loader(bert_rows(x[1200:], y[1200:]), 100, shuffle=False), max_steps=500)


def _bert_pred(m, b):
    return m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1), b["labels"]


fix("trained_frozen_random_bert", fixed_of(frozen_random_bert), acc_of(_bert_pred), "val accuracy", steps=300)


# --- 5. one optimizer over the encoder only: the decoder of the seq2seq is never stepped ---------------------------
K5, T5 = 6, 10


def transduction(n, s):
    g = gen(s)
    src = torch.randint(0, K5, (n, T5), generator=g)
    tgt = torch.cumsum(src, 1) % K5
    dec_in = torch.cat([torch.full((n, 1), K5), tgt[:, :-1]], 1)
    return src, dec_in, tgt


class GRUSeq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleDict(dict(emb=nn.Embedding(K5, 16), rnn=nn.GRU(16, 32, batch_first=True)))
        self.decoder = nn.ModuleDict(dict(emb=nn.Embedding(K5 + 1, 16), rnn=nn.GRU(48, 64, batch_first=True),
                                          out=nn.Linear(64, K5)))

    def forward(self, src, dec_in):
        enc, _ = self.encoder["rnn"](self.encoder["emb"](src))
        h, _ = self.decoder["rnn"](torch.cat([enc, self.decoder["emb"](dec_in)], -1))
        return self.decoder["out"](h)


def s2s_ce(model, batch):
    src, dec_in, tgt = batch
    return F.cross_entropy(model(src, dec_in).reshape(-1, K5), tgt.reshape(-1))


@case("trained_optimizer_encoder_only", "what_is_trained",
      bug="The tutorial's two optimizers were merged into one built from model.encoder.parameters() only, so the "
          "decoder's embedding, GRU and output layer get gradients but are never updated.",
      cause_pattern=r"encoder\.parameters|decoder.{0,100}(not|never|missing|absent|left out).{0,40}(optimi[sz]er|"
                    r"updated|stepped)|optimi[sz]er.{0,100}(lacks|misses|omits|without|excludes|not (hold|contain|"
                    r"include)\w*).{0,40}decoder")
def optimizer_encoder_only(fixed=False):
    seed(0)
    src, dec_in, tgt = transduction(1500, s=35)
    model = GRUSeq2Seq()
    params = model.parameters() if fixed else model.encoder.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=5e-3),
                train_loader=loader(TensorDataset(src[:1200], dec_in[:1200], tgt[:1200]), 32),
                val_loader=loader(TensorDataset(src[1200:], dec_in[1200:], tgt[1200:]), 100, shuffle=False),
                loss_fn=s2s_ce, max_steps=500)


def _s2s_pred(m, b):
    return m(b[0], b[1]).argmax(-1), b[2]


fix("trained_optimizer_encoder_only", fixed_of(optimizer_encoder_only), acc_of(_s2s_pred), "val token accuracy",
    steps=300)
