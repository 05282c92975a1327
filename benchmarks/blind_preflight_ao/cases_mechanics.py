"""Mechanics: the optimizer, the schedule, teacher forcing or an attention mask make the update go nowhere or teach
the wrong computation; the loss stays finite."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ao.registry import (
    CLS,
    PAD,
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    keyword_texts,
    loader,
    seed,
    token_sequences,
)


def _argmax(m, b):
    return m(b[0]).argmax(-1), b[-1]


class GRUClassifier(nn.Module):
    def __init__(self, vocab, n_classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=0)
        self.rnn = nn.GRU(32, 48, batch_first=True)
        self.head = nn.Linear(48, n_classes)

    def forward(self, tokens):
        return self.head(self.rnn(self.emb(tokens))[1][-1])


# --- 1. linear warm-up/decay schedule told the number of epochs as its number of steps ------------------------------
@case("mechanics_schedule_total_steps_is_epochs", "mechanics",
      bug="get_linear_schedule_with_warmup is given num_training_steps=num_epochs (3) instead of epochs x batches "
          "per epoch, and is stepped every batch, so the learning rate decays to 0 after 3 optimizer steps and the "
          "headline classifier stops learning.",
      cause_pattern=r"num_training_steps|(learning rate|\blr\b).{0,60}(decay|drop|reach|fall|go)\w* to (0|zero)|"
                    r"(lr|learning rate) (is|becomes|=) (0|zero)|epochs? (instead of|rather than|not) .{0,20}steps|"
                    r"total (training )?steps")
def schedule_total_steps_is_epochs(fixed=False):
    seed(0)
    from transformers import get_linear_schedule_with_warmup
    x, y, _ = keyword_texts(1600, 20, 60, 4, s=41)
    model = GRUClassifier(60, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = loader(TensorDataset(x[:1200], y[:1200]), 32)
    epochs = 3
    total = epochs * len(train) if fixed else epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=total)
    return dict(model=model, optimizer=optimizer, train_loader=train, scheduler=scheduler,
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=epochs * len(train))


fix("mechanics_schedule_total_steps_is_epochs", fixed_of(schedule_total_steps_is_epochs), acc_of(_argmax),
    "val accuracy", steps=114)


# --- 2. BERT's fine-tuning learning rate with plain SGD on a model trained from scratch -----------------------------
@case("mechanics_sgd_with_finetuning_lr", "mechanics",
      bug="The from-scratch GRU language-ID classifier uses plain torch.optim.SGD with lr=2e-5, the learning rate of "
          "a BERT/AdamW fine-tuning recipe, so every update is about a millionth of the weights and the model "
          "stays at chance.",
      cause_pattern=r"(learning rate|\blr\b).{0,60}(too (small|low)|tiny|far too)|2e-5|2e-05|0\.00002|"
                    r"(small|low|tiny) (learning rate|\blr\b)|updates? (are|is) (negligible|tiny|too small)|"
                    r"sgd.{0,80}(fine-?tun|adam)")
def sgd_with_finetuning_lr(fixed=False):
    seed(0)
    x, y, _ = keyword_texts(1600, 20, 60, 4, s=42)
    model = GRUClassifier(60, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3) if fixed else \
        torch.optim.SGD(model.parameters(), lr=2e-5)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("mechanics_sgd_with_finetuning_lr", fixed_of(sgd_with_finetuning_lr), acc_of(_argmax), "val accuracy",
    steps=250)


# --- 3. token-level loss summed (reduction="sum") under an SGD learning rate tuned for the mean ----------------------
N_POS = 6


def pos_rows(n, s):
    """POS-like tagging: the tag of each token is a fixed function of the token and its left neighbour."""
    g = gen(s)
    ids = torch.randint(4, 60, (n, 24), generator=g)
    prev = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], 1)
    return ids, (ids + (prev % 2) * 3) % N_POS


class POSTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(60, 32)
        self.rnn = nn.GRU(32, 32, batch_first=True)
        self.out = nn.Linear(32, N_POS)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


class TokenCE:
    def __init__(self, reduction):
        self.criterion = nn.CrossEntropyLoss(reduction=reduction)

    def __call__(self, model, batch):
        ids, tags = batch
        return self.criterion(model(ids).reshape(-1, N_POS), tags.reshape(-1))


@case("mechanics_loss_summed_over_tokens", "mechanics",
      bug="The POS tagger's CrossEntropyLoss uses reduction='sum' over all 768 tokens of a batch while the SGD "
          "learning rate (0.05, momentum 0.9) was tuned for the per-token mean, so every step is hundreds of times "
          "too large and training thrashes instead of converging.",
      cause_pattern=r"reduction ?= ?['\"]?sum|summed (over|across)|sum(med)? (of|over) (the |all )?(token|element)|"
                    r"(loss|gradient)s? (scale|grow)s? with (the )?(batch|number of tokens|sequence)|"
                    r"reduction ?= ?['\"]?mean|(instead of|not|rather than) (the )?(per-token )?mean")
def loss_summed_over_tokens(fixed=False):
    seed(0)
    x, y = pos_rows(1500, s=43)
    model = POSTagger()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=TokenCE("mean" if fixed else "sum"), max_steps=500)


fix("mechanics_loss_summed_over_tokens", fixed_of(loss_summed_over_tokens), acc_of(_argmax), "val tag accuracy",
    steps=300)


# --- 4. src_key_padding_mask built True on the real tokens ---------------------------------------------------------
class CLSEncoder(nn.Module):
    def __init__(self, vocab, n_classes, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(vocab, 32, padding_idx=PAD)
        self.pos = nn.Embedding(32, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, n_classes)

    def forward(self, ids):
        keep = ids != PAD
        pad_mask = ~keep if self.fixed else keep     # "mask = where the tokens are"
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.encoder(self.emb(ids) + self.pos(pos), src_key_padding_mask=pad_mask)
        return self.head(h[:, 0])


def cls_texts(n, s):
    x, y, _ = keyword_texts(n, 23, 50, 4, s=s, lengths=(4, 19))
    return torch.cat([torch.full((n, 1), CLS), x], 1), y


@case("mechanics_key_padding_mask_inverted", "mechanics",
      bug="The CLS-pooled transformer classifier passes src_key_padding_mask = (ids != pad), True on the real "
          "tokens, but PyTorch masks out the True positions, so every token attends only to the padding and the "
          "[CLS] vector never sees the text.",
      cause_pattern=r"(key_)?padding_mask.{0,80}(invert|revers|flip|wrong way|opposite|True (on|for|at) (the )?"
                    r"(real|valid|actual|non-pad))|(invert|revers|flip)\w* .{0,40}mask|attends? only to "
                    r"(the )?pad|ids ?!= ?pad|True (marks|means) (positions )?(to )?(ignore|masked)")
def key_padding_mask_inverted(fixed=False):
    seed(0)
    x, y = cls_texts(1600, s=44)
    model = CLSEncoder(50, 4, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("mechanics_key_padding_mask_inverted", fixed_of(key_padding_mask_inverted), acc_of(_argmax), "val accuracy",
    steps=300)


# --- 5. decoder-only LM without a causal mask -----------------------------------------------------------------------
class TinyCausalLM(nn.Module):
    def __init__(self, vocab, causal):
        super().__init__()
        self.causal = causal
        self.emb = nn.Embedding(vocab, 32)
        self.pos = nn.Embedding(32, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.lm_head = nn.Linear(32, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.emb(ids) + self.pos(torch.arange(t, device=ids.device))
        if self.causal:
            mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
            h = self.blocks(h, mask=mask, is_causal=True)
        else:
            h = self.blocks(h)
        return self.lm_head(h)


def lm_loss(model, batch):
    ids = batch[0]
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@case("mechanics_lm_without_causal_mask", "mechanics",
      bug="The hand-written decoder-only language model runs its nn.TransformerEncoder blocks without a causal "
          "(square subsequent) mask, so each position attends to the next token it is asked to predict and learns "
          "to copy it, which fails as soon as the future is not in the input.",
      cause_pattern=r"(no|without|missing|lacks?|forg[eo]t\w*) (a |the |any )?causal|causal (attention )?mask (is )?(missing|absent|"
                    r"not (passed|applied|used))|square[_ ]subsequent|subsequent mask|look[- ]?ahead|future (token|position)s?|"
                    r"attends? to (the )?(next|later|future)|is_causal")
def lm_without_causal_mask(fixed=False):
    seed(0)
    seqs = token_sequences(1400, 17, 40, s=45, low=4)
    model = TinyCausalLM(40, causal=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(seqs[:1100]), 32),
                val_loader=loader(TensorDataset(seqs[1100:]), 100, shuffle=False),
                loss_fn=lm_loss, max_steps=500)


def prefix_batches():
    """Generation-time check: prefixes of 3-12 tokens, the next token predicted from the last position."""
    seqs = token_sequences(1400, 17, 40, s=45, low=4)[1100:]
    return [(seqs[:, :n], seqs[:, n]) for n in range(3, 13)]


def _last_pred(m, b):
    return m(b[0])[:, -1].argmax(-1), b[1]


fix("mechanics_lm_without_causal_mask", fixed_of(lm_without_causal_mask), acc_of(_last_pred, prefix_batches),
    "next-token accuracy from prefixes", steps=300)
