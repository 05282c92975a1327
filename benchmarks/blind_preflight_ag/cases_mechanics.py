"""Set ag, family mechanics: the step itself is wrong (a learning-rate schedule, an attention mask, what the decoder
is fed), with no error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from transformers import (
    DistilBertConfig,
    DistilBertForSequenceClassification,
    T5Config,
    T5ForConditionalGeneration,
    get_linear_schedule_with_warmup,
)

from benchmarks.blind_preflight_ag.cases_shapes import OrderTransformer, intent_commands
from benchmarks.blind_preflight_ag.cases_targets import DictDataset
from benchmarks.blind_preflight_ag.cases_trained import three_way_reviews
from benchmarks.blind_preflight_ag.registry import (
    TinyCausalLM,
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    markov_text,
    mean_over,
    seed,
)

# ---------------------------------------------------------------------------------------------- linear warm-up schedule

EPOCHS = 8


def distilbert_schedule_case(fixed: bool):
    seed(0)
    config = DistilBertConfig(vocab_size=80, dim=48, n_layers=2, n_heads=4, hidden_dim=96, max_position_embeddings=32,
                              dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=3)
    model = DistilBertForSequenceClassification(config)
    train, val = three_way_reviews(1200, 111), three_way_reviews(300, 112)
    train_loader = loader(DictDataset(**train), 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    total = EPOCHS * len(train_loader) if fixed else EPOCHS            # broken: epochs, stepped every batch
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=int(0.06 * total),
                                                num_training_steps=total)
    return dict(model=model, optimizer=optimizer, train_loader=train_loader, scheduler=scheduler,
                val_loader=loader(DictDataset(**val), 100, shuffle=False), loss_fn=None,
                max_steps=EPOCHS * len(train_loader))


@case("ag_linear_schedule_total_in_epochs", "mechanics",
      "A DistilBERT fine-tuning loop calls scheduler.step() after every batch but builds "
      "get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=EPOCHS) with EPOCHS = 8: "
      "the schedule thinks training is 8 steps long, the learning rate decays to 0 by step 8 and stays 0 for the "
      "other 296 of the 304 steps (fix: num_training_steps=EPOCHS * len(train_loader), the optimizer-step count).",
      r"num_training_steps|\b(learning rate|lr)\b.{0,100}\b(reach\w*|decay\w*|drops?|falls?|goes|hits|stays?)\b "
      r"(to |at )?(0(\.0+)?|zero)\b|(schedule|scheduler).{0,120}(epochs?|8 steps|too short|ends? (after|at|before))"
      r"|(epochs?).{0,80}(instead of|rather than|not) .{0,20}(steps|batches|iterations)"
      r"|len\(train_loader\)")
def ag_linear_schedule_total_in_epochs(fixed: bool = False):
    return distilbert_schedule_case(fixed)


fix("ag_linear_schedule_total_in_epochs", fixed_of(ag_linear_schedule_total_in_epochs),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy", steps=120)


# ---------------------------------------------------------------------------------------------- warm-up lambda

@case("ag_warmup_lambda_never_capped", "mechanics",
      "An intent Transformer's warm-up is LambdaLR(optimizer, lambda step: (step + 1) / 10) with AdamW at lr 3e-3, "
      "meant to ramp up over 10 steps and then hold; without min(1.0, ...) the factor keeps growing linearly, so the "
      "learning rate is 3e-2 by step 100 and 9e-2 by step 300, far too high for a post-LN Transformer, and training "
      "degrades instead of converging (fix: lambda step: min(1.0, (step + 1) / 10)).",
      r"(warm-?up|lambda|lr_lambda|multiplier|factor).{0,120}(never (capped|clamped|stops|levels|flattens)|not "
      r"(capped|clamped|bounded)|without (a )?(cap|min|clamp)|keeps? (growing|increasing|rising)|grows? "
      r"(without|linearly|unbounded)|unbounded|exceeds? 1)|min\s*\(\s*1(\.0)?\s*,"
      r"|(learning rate|lr).{0,80}(keeps? (growing|increasing|rising)|grows?|increas\w*) .{0,40}(after|past|beyond) "
      r"(the )?warm-?up")
def ag_warmup_lambda_never_capped(fixed: bool = False):
    seed(0)
    ids, y = intent_commands(2000, 121)
    model = OrderTransformer(batch_first=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warm = 10
    ramp = (lambda step: min(1.0, (step + 1) / warm)) if fixed else (lambda step: (step + 1) / warm)
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, ramp),
                train_loader=loader(TensorDataset(ids[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("ag_warmup_lambda_never_capped", fixed_of(ag_warmup_lambda_never_capped),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=200)


# ---------------------------------------------------------------------------------------------- causal mask

@torch.no_grad()
def prefix_next_token_acc(model, kw):
    """Next-token accuracy as generation sees it: the model gets only the prefix ids[:, :t+1] and predicts t+1."""
    def fn(m, b):
        ids = b[0]
        right = n = 0
        for t in range(3, ids.shape[1] - 1):
            pred = m(ids[:, : t + 1])[:, -1].argmax(-1)
            right += (pred == ids[:, t + 1]).sum().item()
            n += ids.shape[0]
        return right, n
    return mean_over(model, kw["val_loader"], fn)


@case("ag_lm_missing_causal_mask", "mechanics",
      "A small decoder-only LM built from nn.TransformerEncoder is called without a causal mask (no mask=, no "
      "is_causal=True): every position attends to the tokens after it, including the next token it is scored "
      "against, so the shifted next-token loss collapses towards 0 by copying from the future while the model has "
      "learnt nothing it can use when generating from a prefix (fix: mask=nn.Transformer.generate_square_subsequent_mask"
      "(T) with is_causal=True).",
      r"(no|missing|without|forg[eo]t\w*|absent|lacks?) (a |the )?causal|causal mask.{0,40}(missing|absent|not "
      r"(passed|set|applied|used))|is_causal\s*=\s*true|non-?causal|square_subsequent_mask|look-?ahead"
      r"|(attend\w*|see\w*|peek\w*|leak\w*).{0,60}(future|later|next|subsequent) (tokens?|positions?)"
      r"|future (tokens?|positions?).{0,60}(visible|leak\w*|attend\w*)")
def ag_lm_missing_causal_mask(fixed: bool = False):
    seed(0)
    ids = markov_text(2000, 16, 40, s=131)

    def lm_loss(model, batch):
        tokens = batch[0]
        logits = model(tokens)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    model = TinyCausalLM(40, d=48, causal=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(ids[:1700]), 32),
                val_loader=loader(TensorDataset(ids[1700:]), 300, shuffle=False),
                loss_fn=lm_loss, max_steps=800)


fix("ag_lm_missing_causal_mask", fixed_of(ag_lm_missing_causal_mask), prefix_next_token_acc,
    "val next-token accuracy from prefixes", steps=150)


# ---------------------------------------------------------------------------------------------- key padding mask

def padded_commands(n: int, s: int, max_len: int = 14):
    """Commands of 6..12 ids, right-padded with 0 to 14: the intent word (5..8) follows the marker 3; two distractor
    intent words elsewhere. Every row has padding."""
    g = gen(s)
    ids = torch.zeros(n, max_len, dtype=torch.long)
    y = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(6, 13, (1,), generator=g))
        row = torch.randint(9, 40, (k,), generator=g)
        p, d1, d2 = torch.randperm(k - 1, generator=g)[:3].tolist()
        row[d1] = int(torch.randint(5, 9, (1,), generator=g))
        row[d2] = int(torch.randint(5, 9, (1,), generator=g))
        y[i] = int(torch.randint(0, 4, (1,), generator=g))
        row[p], row[p + 1] = 3, 5 + y[i]
        ids[i, :k] = row
    return ids, y


class PaddedIntentTransformer(nn.Module):
    def __init__(self, vocab: int = 40, d: int = 32, max_len: int = 16, mask_is_pad: bool = True):
        super().__init__()
        self.mask_is_pad = mask_is_pad
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.fc = nn.Linear(d, 4)

    def forward(self, ids):
        real = ids != 0
        # nn.Transformer*: True = "ignore this key"; the broken model passes the HF-style attention mask (True = keep)
        key_padding_mask = ~real if self.mask_is_pad else real
        h = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        h = self.enc(h, src_key_padding_mask=key_padding_mask)
        w = real.unsqueeze(-1).to(h.dtype)
        return self.fc((h * w).sum(1) / w.sum(1))


def padded_intent_case(fixed: bool):
    seed(0)
    ids, y = padded_commands(2000, 141)
    model = PaddedIntentTransformer(mask_is_pad=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


@case("ag_key_padding_mask_inverted", "mechanics",
      "A padded intent classifier passes src_key_padding_mask=(ids != PAD), the Hugging Face attention_mask "
      "convention (True/1 = real token), to nn.TransformerEncoder, where True means 'ignore this key': every word "
      "attends only to the padding, no word ever sees another, and the word after the marker that decides the label "
      "is out of reach (every row is padded, so no NaN shows up) (fix: src_key_padding_mask=(ids == PAD)).",
      r"(src_)?key_padding_mask|padding mask.{0,80}(invert\w*|flipp\w*|revers\w*|wrong|opposite)"
      r"|(invert\w*|flipp\w*|revers\w*|opposite).{0,80}(padding )?mask|attend\w* (only )?(to )?(the )?pad"
      r"|true (means|=) ['\"]?(ignore|masked|padding)|(ids|input_ids) ?== ?pad")
def ag_key_padding_mask_inverted(fixed: bool = False):
    return padded_intent_case(fixed)


fix("ag_key_padding_mask_inverted", fixed_of(ag_key_padding_mask_inverted),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=150)


# ---------------------------------------------------------------------------------------------- T5 decoder inputs

def reversal_pairs(n: int, s: int, length: int = 8):
    """Toy transliteration: the target is the source read backwards, each id mapped through a fixed table."""
    g = gen(s)
    table = torch.randperm(36, generator=gen(151)) + 4
    src = torch.randint(4, 40, (n, length), generator=g)
    tgt = table[(src.flip(1) - 4)]
    return src, tgt


@case("ag_t5_decoder_inputs_are_labels", "mechanics",
      "A T5 fine-tuning loop passes decoder_input_ids=labels together with labels=labels, so the decoder reads the "
      "very token it is asked to predict at each position (T5 only shifts labels right into decoder inputs when "
      "decoder_input_ids is not given): it learns to copy its input, the loss drops to near 0, and with real "
      "teacher forcing or generation it outputs the previous token (fix: pass only labels, or "
      "decoder_input_ids=model._shift_right(labels)).",
      r"decoder_input_ids|(shift\w*).{0,40}right|_shift_right|teacher.?forc\w*.{0,80}(same|current|target) "
      r"(token|position)|decoder.{0,80}(sees?|reads?|given|fed) (the )?(target|label|answer)")
def ag_t5_decoder_inputs_are_labels(fixed: bool = False):
    seed(0)
    src, tgt = reversal_pairs(1500, 152)
    config = T5Config(vocab_size=40, d_model=48, d_kv=12, d_ff=96, num_layers=1, num_heads=4, dropout_rate=0.0,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config)

    def rows(a, b):
        d = dict(input_ids=a, attention_mask=torch.ones_like(a), labels=b)
        if not fixed:
            d["decoder_input_ids"] = b.clone()
        return DictDataset(**d)

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(rows(src[:1200], tgt[:1200]), 32),
                val_loader=loader(rows(src[1200:], tgt[1200:]), 100, shuffle=False),
                loss_fn=None, max_steps=400)


@torch.no_grad()
def t5_teacher_forced_acc(model, kw):
    """Token accuracy with proper teacher forcing (decoder inputs = labels shifted right, as generation sees them)."""
    def fn(m, b):
        out = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
        return (out.logits.argmax(-1) == b["labels"]).sum().item(), b["labels"].numel()
    return mean_over(model, kw["val_loader"], fn)


fix("ag_t5_decoder_inputs_are_labels", fixed_of(ag_t5_decoder_inputs_are_labels), t5_teacher_forced_acc,
    "val token accuracy (teacher-forced, shifted)", steps=120)
