"""Targets: what the loss is asked to fit is not what the user wants predicted."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_x.registry import (
    acc_of,
    balanced_acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
)

# --- 1. T5 given decoder_input_ids = labels (no shift) ---------------------------------------------------------------

_PHRASES = torch.stack([torch.randperm(36, generator=torch.Generator().manual_seed(11 + k))[:6] + 4
                        for k in range(10)])


def _t5_pairs(n, s, length=8):
    """Source: 8 noise ids in 14..39 with one intent keyword (ids 4..13) somewhere; target: the 6-token canned reply
    of that intent."""
    g = gen(s)
    src = torch.randint(14, 40, (n, length), generator=g)
    intent = torch.randint(0, 10, (n,), generator=g)
    src[torch.arange(n), torch.randint(0, length, (n,), generator=g)] = 4 + intent
    return src, _PHRASES[intent]


def tiny_t5():
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=40, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
                   dropout_rate=0.0, initializer_factor=0.1, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                   relative_attention_num_buckets=8, tie_word_embeddings=False)
    return T5ForConditionalGeneration(cfg)


def t5_batches(src, tgt, pass_decoder_inputs):
    rows = []
    for s, t in zip(src, tgt):
        row = {"input_ids": s, "attention_mask": torch.ones_like(s), "labels": t}
        if pass_decoder_inputs:
            row["decoder_input_ids"] = t      # "the decoder should see the target sentence"
        rows.append(row)
    return rows


@case("tg_t5_decoder_input_ids_equal_labels", "targets",
      bug="Each batch passes decoder_input_ids equal to labels to T5ForConditionalGeneration; the decoder input is "
          "not shifted right, so at every position the decoder already sees the token it must predict and learns to "
          "copy it (loss near zero, generation garbage); leave decoder_input_ids out so the model shifts the labels.",
      cause_pattern=r"decoder_input_ids.{0,200}(labels|shift)|(labels|targets?).{0,120}decoder_input_ids|"
                    r"shift(ed)?[_ ]right|_shift_right|(not|un)[- ]?shifted.{0,80}(decoder|labels|teacher)|"
                    r"teacher forcing.{0,120}(sees?|leak|copy|same)|decoder (input|sees).{0,80}(token|label) it "
                    r"(must|should|has to) predict")
def tg_t5(fixed=False):
    seed(0)
    src, tgt = _t5_pairs(1200, 21)
    model = tiny_t5()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(t5_batches(src[:1000], tgt[:1000], not fixed), 32),
                val_loader=loader(t5_batches(src[1000:], tgt[1000:], False), 100, shuffle=False),
                loss_fn=None, max_steps=200)


def _t5_teacher_forced(m, b):
    out = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
    return out.logits.argmax(-1), b["labels"]


fix("tg_t5_decoder_input_ids_equal_labels", fixed_of(tg_t5), acc_of(_t5_teacher_forced),
    "val token accuracy (labels shifted by the model)", steps=200)

# --- 2. class weights listed in value-count order, indexed by class id ------------------------------------------------

INTENTS = ["billing", "other", "refund"]          # ids 0, 1, 2 (sorted, as LabelEncoder gives them)


def _intents(n, s):
    """Sentence vectors of support tickets: 'other' 82 %, 'billing' 14 %, 'refund' 4 %, overlapping clusters."""
    g = gen(s)
    y = torch.multinomial(torch.tensor([0.14, 0.82, 0.04]), n, replacement=True, generator=g)
    centers = torch.randn(3, 16, generator=g) * 0.45
    x = centers[y] + torch.randn(n, 16, generator=g)
    return x, y


def intent_weights(y, fixed):
    counts = Counter(y.tolist())
    total = sum(counts.values())
    if fixed:
        return torch.tensor([total / (3 * counts[c]) for c in range(3)])
    # pandas habit: df.intent.value_counts() is ordered by frequency, and the list is handed to the loss as-is
    return torch.tensor([total / (3 * cnt) for _, cnt in counts.most_common()])


@case("tg_class_weights_in_value_counts_order", "targets",
      bug="The inverse-frequency class weights are built in value_counts / most_common order (most frequent class "
          "first) and passed to CrossEntropyLoss(weight=...), which indexes them by class id: the weights land on the "
          "wrong classes, the majority intent 'other' getting the weight meant for 'billing' (seven times its own) "
          "and 'billing' the majority's small one.",
      cause_pattern=r"(class[_ ]weights?|weight=).{0,200}(order|index(ed)? by class|class id|most_common|"
                    r"value_counts|majority|swapped|reversed|wrong class)|(value_counts|most_common).{0,120}weight|"
                    r"(largest|highest|biggest) weight.{0,80}(majority|most frequent|common)")
def tg_weights(fixed=False):
    seed(0)
    x, y = _intents(3000, 22)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=intent_weights(y[:2400], fixed)), max_steps=300)


fix("tg_class_weights_in_value_counts_order", fixed_of(tg_weights),
    balanced_acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]), 3), "val balanced accuracy", steps=300)

# --- 3. sigmoid output head on a price regression ----------------------------------------------------------------------


def _prices(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, generator=g)
    y = 250 + 60 * (x @ w) / 10 ** 0.5 + 10 * torch.randn(n, generator=g)   # thousands of dollars
    return x, y.unsqueeze(1)


@case("tg_sigmoid_head_on_price_regression", "targets",
      bug="The price regressor ends in nn.Sigmoid() (kept from the classification notebook it was copied from), so "
          "its output is bounded to (0, 1) while the targets are prices in the hundreds; MSE saturates the sigmoid "
          "and the predictions stay pinned at 1.",
      cause_pattern=r"sigmoid.{0,200}(regress|bounded|\(0, ?1\)|range|saturat|target)|(output|final|last) "
                    r"(activation|layer).{0,120}(bounded|sigmoid|\(0, ?1\))|(targets?|labels?) (range|span|are|lie) "
                    r".{0,80}(outside|beyond|larger than|exceed).{0,60}(output|sigmoid|\(0, ?1\))")
def tg_sigmoid(fixed=False):
    seed(0)
    x, y = _prices(1800, 23)
    layers = [nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1)]
    if not fixed:
        layers.append(nn.Sigmoid())
    model = nn.Sequential(*layers)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 150, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("tg_sigmoid_head_on_price_regression", fixed_of(tg_sigmoid), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", steps=300, higher=False)

# --- 4. BertForSequenceClassification with num_labels=1 on 4 classes ---------------------------------------------------


def _tickets(n, s, length=12):
    """Token ids; the class (0..3) is set by which of four keywords (ids 5..8) the ticket contains."""
    g = gen(s)
    x = torch.randint(10, 100, (n, length), generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    pos = torch.randint(1, length, (n,), generator=g)
    x[torch.arange(n), pos] = 5 + y
    x[:, 0] = 2                                    # [CLS]
    return x, y


def tiny_bert_classifier(num_labels):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, num_labels=num_labels,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    return BertForSequenceClassification(cfg)


def ticket_rows(x, y, fixed):
    # the broken version cast labels to float after "Found dtype Long but expected Float" from the loss
    return [{"input_ids": a, "attention_mask": torch.ones_like(a), "labels": b if fixed else b.float()}
            for a, b in zip(x, y)]


@case("tg_bert_num_labels_one_for_four_classes", "targets",
      bug="The 4-class ticket classifier is BertForSequenceClassification with config num_labels=1 (one output "
          "'label' column), which Hugging Face treats as regression: the head has one logit and MSELoss fits the "
          "class ids as numbers (labels cast to float to silence the dtype error), so argmax is always class 0.",
      cause_pattern=r"num_labels.{0,200}(regress|mse|1\b|one)|problem_type|(regression|mseloss|mse).{0,160}"
                    r"(class(es| ids)?|num_labels|classif)|single (output|logit).{0,100}(classes|classif)")
def tg_bert_one(fixed=False):
    seed(0)
    x, y = _tickets(1400, 24)
    model = tiny_bert_classifier(4 if fixed else 1)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(ticket_rows(x[:1100], y[:1100], fixed), 32),
                val_loader=loader(ticket_rows(x[1100:], y[1100:], fixed), 100, shuffle=False),
                loss_fn=None, max_steps=250)


def _bert_argmax(m, b):
    out = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    return out.logits.argmax(-1), b["labels"].long()


fix("tg_bert_num_labels_one_for_four_classes", fixed_of(tg_bert_one), acc_of(_bert_argmax),
    "val accuracy (argmax of the logits, as compute_metrics does)", steps=250)

# --- 5. focal loss with p instead of p_t ----------------------------------------------------------------------------


def _transactions(n, s):
    g = gen(s)
    y = (torch.rand(n, generator=g) < 0.12).long()
    x = torch.randn(n, 12, generator=g)
    x[:, :3] += 1.4 * y[:, None]
    x[:, 3] += 2.0 * y * torch.sign(x[:, 4])
    return x, y.float()


class FocalLoss(nn.Module):
    """Sigmoid focal loss, written from the paper's formula with p for p_t in the broken version."""

    def __init__(self, fixed, gamma=2.0, alpha=0.75):
        super().__init__()
        self.fixed, self.gamma, self.alpha = fixed, gamma, alpha

    def forward(self, logits, target):
        logits = logits.squeeze(-1)
        bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        p = torch.sigmoid(logits)
        p_t = p * target + (1 - p) * (1 - target) if self.fixed else p
        alpha_t = self.alpha * target + (1 - self.alpha) * (1 - target)
        return (alpha_t * (1 - p_t) ** self.gamma * bce).mean()


@case("tg_focal_loss_uses_p_not_p_t", "targets",
      bug="The hand-written sigmoid focal loss weights every example by (1 - p) ** gamma with p = sigmoid(logit) "
          "instead of (1 - p_t) ** gamma: for the negatives the modulating factor is inverted, so confidently wrong "
          "negatives (false alarms) get almost no gradient and easy negatives get the most.",
      cause_pattern=r"p_t\b|pt\b.{0,80}(not|instead|rather)|(focal|modulating).{0,200}(p_t|true class|inverted|"
                    r"negatives?|wrong sign|1 ?- ?p\b)|\(1 ?- ?p\) ?\*\* ?gamma.{0,120}(negative|instead|wrong)")
def tg_focal(fixed=False):
    seed(0)
    x, y = _transactions(3000, 25)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=FocalLoss(fixed), max_steps=300)


fix("tg_focal_loss_uses_p_not_p_t", fixed_of(tg_focal),
    balanced_acc_of(lambda m, b: ((m(b[0]).squeeze(-1) > 0).long(), b[1].long()), 2), "val balanced accuracy",
    steps=300)
