"""Set bc, family "shapes": the one-position shift and the axes of labels, decoder inputs and recurrent inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from benchmarks.blind_preflight_bc.common import GRUSeq2Seq, ce, fixed_len_collate
from benchmarks.blind_preflight_bc.registry import case, fix, fixed_of, loader, seed
from benchmarks.blind_preflight_bc.synth import (
    PAD,
    InstructionSet,
    TinyGPT,
    V,
    causal_answer_acc,
    causal_collate,
    hf_gpt2,
    hf_t5,
    make_pairs,
    s2s_acc,
    s2s_collate,
    shifted_ce,
    val_rows,
)


def _sets(seed_=0, n=2000, **kw):
    return InstructionSet(make_pairs(n, seed_, **kw)), InstructionSet(make_pairs(256, 999, **kw))


# ---------------------------------------------------------------- 1
@case("sh_gpt_unshifted_labels", "shapes",
      "The hand-written GPT's loss compares logits[:, t] with labels[:, t] (no one-position shift): a causal model "
      "sees token t at position t, so it learns to copy its input token instead of predicting the next one.",
      r"shift|next[- ]token|logits\[\s*:?,?\s*:-1|labels\[\s*:?,?\s*1:|same position|current (input )?token|"
      r"copy(ing)? (its|the) (own )?input|identity|off[- ]by[- ]one|predicts? (the )?token it (already )?sees|"
      r"t\+1|one position")
def gpt_unshifted_labels(fixed=False):
    seed(0)
    train, val = _sets()
    model = TinyGPT()

    def loss_fn(model, batch):
        logits = model(batch["input_ids"], batch["attention_mask"])
        if fixed:
            return shifted_ce(logits, batch["labels"])
        return F.cross_entropy(logits.view(-1, logits.size(-1)), batch["labels"].view(-1), ignore_index=-100)

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=causal_collate), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=causal_collate), max_steps=300)


fix("sh_gpt_unshifted_labels", fixed_of(gpt_unshifted_labels),
    lambda m, kw: causal_answer_acc(m, fwd=lambda mm, x, a: mm(x, a)), "val answer next-token acc")


# ---------------------------------------------------------------- 2
def _preshift_collate(rows):
    b = causal_collate(rows)
    lab = torch.full_like(b["labels"], -100)
    lab[:, :-1] = b["labels"][:, 1:]      # "labels are the next token", done by hand
    b["labels"] = lab
    return b


@case("sh_gpt2_preshifted_labels", "shapes",
      "The collate shifts labels left by one by hand, but GPT2LMHeadModel shifts labels internally again: the "
      "model is trained to predict the token two positions ahead.",
      r"shift(ed|s)? (twice|again|internally)|double[- ]shift|two positions|t\s*\+\s*2|already shift|"
      r"shifts? (the )?labels (inside|internally)|labels\s*=\s*(batch\[.input_ids.\]|input_ids)|"
      r"pre-?shift|same as input_ids|skip(s|ping)? a token")
def gpt2_preshifted_labels(fixed=False):
    seed(0)
    train, val = _sets()
    model = hf_gpt2()
    collate = causal_collate if fixed else _preshift_collate
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=collate), loss_fn=None,
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300)


fix("sh_gpt2_preshifted_labels", fixed_of(gpt2_preshifted_labels), lambda m, kw: causal_answer_acc(m),
    "val answer next-token acc")


# ---------------------------------------------------------------- 3
def _t5_collate_same(rows):
    b = s2s_collate(rows, start_id=PAD)
    dec = b["labels"].clone()
    dec[dec == -100] = PAD
    b["decoder_input_ids"] = dec           # "the decoder reads the target"
    return b


def _t5_collate_fixed(rows):
    b = s2s_collate(rows, start_id=PAD)
    del b["decoder_input_ids"]             # the model builds them with _shift_right(labels)
    return b


@case("sh_t5_decoder_inputs_equal_labels", "shapes",
      "decoder_input_ids are passed equal to the labels (not shifted right with the decoder start token): under "
      "teacher forcing the T5 decoder sees the very token it must predict and learns to copy it.",
      r"decoder_input_ids|shift(ed)?[_ ]right|_shift_right|decoder[_ ]start|start token|"
      r"(equal|same as|identical to) (the )?labels|sees? the (very )?token it (must|has to|should) predict|"
      r"copy(ing)? the (decoder )?input|teacher forcing")
def t5_decoder_inputs_equal_labels(fixed=False):
    seed(0)
    train, val = _sets()
    model = hf_t5()
    collate = _t5_collate_fixed if fixed else _t5_collate_same
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=collate), loss_fn=None,
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300)


fix("sh_t5_decoder_inputs_equal_labels", fixed_of(t5_decoder_inputs_equal_labels),
    lambda m, kw: s2s_acc(m, start_id=PAD), "val decoder acc (shifted inputs)")


# ---------------------------------------------------------------- 4
def _pairs_collate(batch_first_labels):
    def collate(rows):
        xs, ys = [], []
        for p, a in rows:
            seq = torch.tensor(p + a)
            lab = seq.clone()
            lab[:len(p)] = -100
            xs.append(seq[:-1])
            ys.append(lab[1:])
        x = pad_sequence(xs, batch_first=True, padding_value=PAD)
        y = pad_sequence(ys, batch_first=batch_first_labels, padding_value=-100)
        return x, y
    return collate


@case("sh_labels_time_major", "shapes",
      "The collate pads the targets with pad_sequence's default batch_first=False, so labels are (T, B) while "
      "the inputs and logits are (B, T); flattening both with view(-1) pairs each logit with another row's token.",
      r"batch_first|pad_sequence|\(T,\s*B\)|\(B,\s*T\)|time[- ]major|seq(uence)?[- ]first|transpos|"
      r"(labels|targets) .{0,40}(wrong|different) (order|layout|axis)|flatten(ing|ed)? .{0,40}order|"
      r"another row|misalign")
def labels_time_major(fixed=False):
    seed(0)
    train, val = _sets()
    model = TinyGPT()
    collate = _pairs_collate(batch_first_labels=fixed)

    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=-100)

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=collate, drop_last=True), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300)


fix("sh_labels_time_major", fixed_of(labels_time_major), lambda m, kw: causal_answer_acc(m, fwd=lambda mm, x, a: mm(x)),
    "val answer next-token acc")


# ---------------------------------------------------------------- 5
@torch.no_grad()
def gru_acc(model, rows=None):
    rows = rows or val_rows()
    was = model.training
    model.eval()
    x, d, y = fixed_len_collate(8)(rows)
    pred = model(x, d).argmax(-1)
    keep = y != -100
    model.train(was)
    return (pred[keep] == y[keep]).float().mean().item()


@case("sh_gru_seq2seq_not_batch_first", "shapes",
      "The GRU encoder and decoder are built with the default batch_first=False but fed (batch, time, features) "
      "tensors: the recurrence runs over the batch axis, mixing different examples, and each step sees one token.",
      r"batch_first|\(batch,\s*(time|seq)|\(seq(_len)?,\s*batch|\(T,\s*B|\(B,\s*T|time[- ]major|"
      r"recurren\w+ (runs )?over the batch|across (the )?batch|permute|transpose")
def gru_seq2seq_not_batch_first(fixed=False):
    seed(0)
    train, val = _sets()
    model = GRUSeq2Seq(batch_first=fixed)
    collate = fixed_len_collate(8)

    def loss_fn(model, batch):
        x, d, y = batch
        return ce(model(x, d), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=collate), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300, clip_grad_norm=1.0)


fix("sh_gru_seq2seq_not_batch_first", fixed_of(gru_seq2seq_not_batch_first), lambda m, kw: gru_acc(m),
    "val decoder acc")
