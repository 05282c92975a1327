"""Set bc, family "targets": which tokens the loss is taken on (prompt masking, EOS, the target side)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from benchmarks.blind_preflight_bc.registry import case, fix, fixed_of, loader, seed
from benchmarks.blind_preflight_bc.synth import (
    EOS,
    PAD,
    InstructionSet,
    TinyGPT,
    causal_answer_acc,
    causal_collate,
    causal_eos_acc,
    hf_bart,
    hf_gpt2,
    hf_llama,
    make_pairs,
    nll_causal,
    s2s_acc,
    shifted_ce,
)

GPT = lambda mm, x, a: mm(x, a)  # noqa: E731


def _sets(seed_=0, n=2000, **kw):
    return InstructionSet(make_pairs(n, seed_, **kw)), InstructionSet(make_pairs(256, 999, **kw))


# ---------------------------------------------------------------- 1
class SFTRows(Dataset):
    """Per-row tensors with the prompt masked out of the labels."""

    def __init__(self, pairs, fixed):
        self.rows = InstructionSet(pairs).rows
        self.fixed = fixed

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        p, a = self.rows[i]
        input_ids = torch.tensor(p + a)
        labels = input_ids.clone()
        if self.fixed:
            labels[:len(p)] = -100
        else:
            labels[len(p):] = -100          # meant: ignore the prompt
        return input_ids, labels


def _pad_collate(batch):
    T = max(len(x) for x, _ in batch)
    X = torch.full((len(batch), T), PAD)
    Y = torch.full((len(batch), T), -100)
    for i, (x, y) in enumerate(batch):
        X[i, :len(x)] = x
        Y[i, :len(y)] = y
    return {"input_ids": X, "attention_mask": (X != PAD).long(), "labels": Y}


@case("tg_prompt_mask_inverted", "targets",
      "The Dataset sets labels[len(prompt):] = -100 instead of labels[:len(prompt)]: the loss is taken on the "
      "instruction tokens and every answer token is ignored, so the model never learns to answer.",
      r"invert|prompt (tokens )?(are|is) (trained|supervised|in the loss)|answer (tokens )?(are|is) "
      r"(masked|ignored|never)|labels\[\s*:\s*len|labels\[\s*len\(.{0,12}\)\s*:\]|(mask|ignore)s? the "
      r"(answer|response|completion)|only (on )?the (prompt|instruction)|wrong side|-100 on the (answer|response)")
def prompt_mask_inverted(fixed=False):
    seed(0)
    train = SFTRows(make_pairs(2000, 0), fixed)
    val = SFTRows(make_pairs(256, 999), fixed)
    model = TinyGPT()

    def loss_fn(model, batch):
        return shifted_ce(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=_pad_collate), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=_pad_collate), max_steps=300)


fix("tg_prompt_mask_inverted", fixed_of(prompt_mask_inverted), lambda m, kw: causal_answer_acc(m, fwd=GPT),
    "val answer next-token acc")


# ---------------------------------------------------------------- 2
def _eos_pad_collate(fixed):
    def collate(rows):
        b = causal_collate(rows, pad_id=EOS)          # tokenizer.pad_token = tokenizer.eos_token
        labels = b["input_ids"].clone()
        for i, (p, _) in enumerate(rows):
            labels[i, :len(p)] = -100
        if fixed:
            labels[b["attention_mask"] == 0] = -100
        else:
            labels[labels == EOS] = -100              # "don't train on padding"
        b["labels"] = labels
        return b
    return collate


@case("tg_pad_eq_eos_masked", "targets",
      "pad_token_id is set to eos_token_id and the collate masks labels == pad_token_id with -100, which also "
      "removes every real EOS from the loss: the model never learns to end its answer.",
      r"eos|end[- ]of[- ](sequence|text)|pad_token(_id)?\s*(==|=|is|equals?) ?(the )?eos|stop(ping)? "
      r"(token|generat)|never (learns|learn) to (stop|end)|labels\s*==\s*pad|attention_mask\s*==\s*0")
def pad_eq_eos_masked(fixed=False):
    seed(0)
    train, val = _sets()
    model = hf_llama(pad=EOS)
    collate = _eos_pad_collate(fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=collate), loss_fn=None,
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300)


fix("tg_pad_eq_eos_masked", fixed_of(pad_eq_eos_masked), lambda m, kw: causal_eos_acc(m), "val EOS-after-answer acc")


# ---------------------------------------------------------------- 3
class PairSet(Dataset):
    def __init__(self, pairs, fixed):
        self.rows = InstructionSet(pairs).rows
        self.fixed = fixed

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        src, tgt = self.rows[i]
        enc = {"input_ids": src}
        dec = {"input_ids": tgt}
        return {"input_ids": enc["input_ids"], "labels": dec["input_ids"] if self.fixed else enc["input_ids"]}


def _bart_collate(items):
    S = max(len(it["input_ids"]) for it in items)
    T = max(len(it["labels"]) for it in items)
    x = torch.full((len(items), S), PAD)
    y = torch.full((len(items), T), -100)
    for i, it in enumerate(items):
        x[i, :len(it["input_ids"])] = torch.tensor(it["input_ids"])
        y[i, :len(it["labels"])] = torch.tensor(it["labels"])
    return {"input_ids": x, "attention_mask": (x != PAD).long(), "labels": y}


@case("tg_bart_labels_are_source", "targets",
      "The Dataset returns labels built from the source's input_ids instead of the target's: BART is trained to "
      "reproduce its input (an autoencoder) rather than the reversed / rotated answer.",
      r"labels? .{0,40}(source|input_ids|encoder input)|(source|input) .{0,30}as (the )?labels?|"
      r"autoencod|copy (the|its) (source|input)|reconstruct|target (text|ids|side|sequence)|"
      r"labels\s*=\s*.{0,20}input_ids")
def bart_labels_are_source(fixed=False):
    seed(0)
    train, val = PairSet(make_pairs(2000, 0), fixed), PairSet(make_pairs(256, 999), fixed)
    model = hf_bart()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=_bart_collate), loss_fn=None,
                val_loader=loader(val, 64, shuffle=False, collate_fn=_bart_collate), max_steps=300)


fix("tg_bart_labels_are_source", fixed_of(bart_labels_are_source), lambda m, kw: s2s_acc(m, start_id=EOS),
    "val decoder acc vs the true answer")


# ---------------------------------------------------------------- 4
@case("tg_label_smoothing_as_confidence", "targets",
      "CrossEntropyLoss(label_smoothing=0.9) was set meaning 'target confidence 0.9': 90% of the target mass is "
      "spread uniformly over the vocabulary, so the LM is trained towards near-uniform next-token probabilities.",
      r"label[_ ]smoothing|smooth(ing|ed)? .{0,30}(0\.9|90|too (large|high|strong)|uniform)|"
      r"(near[- ])?uniform (target|distribution|probabilit)|confidence|soft(ened)? targets?")
def label_smoothing_as_confidence(fixed=False):
    seed(0)
    train, val = _sets()
    model = hf_gpt2()
    crit = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=0.1 if fixed else 0.9)

    def loss_fn(model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return crit(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=causal_collate), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=causal_collate), max_steps=300)


fix("tg_label_smoothing_as_confidence", fixed_of(label_smoothing_as_confidence), lambda m, kw: nll_causal(m),
    "val answer NLL", higher=False)


# ---------------------------------------------------------------- 5
@case("tg_last_position_only", "targets",
      "The loss uses only the last column, logits[:, -2] against labels[:, -1] (a classifier's habit); with right "
      "padding that column is padding or EOS, so the answer tokens are never in the loss.",
      r"last (position|token|column|step)|\[:,\s*-1\]|\[:,\s*-2\]|only (one|a single) (token|position)|"
      r"right[- ]padd|padding side|answer tokens .{0,30}never|every (answer )?position|all positions")
def last_position_only(fixed=False):
    seed(0)
    train, val = _sets()
    model = hf_gpt2()

    def loss_fn(model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        if fixed:
            return shifted_ce(logits, batch["labels"])
        y = batch["labels"][:, -1]
        if (y == -100).all():
            y = batch["input_ids"][:, -1]
        return F.cross_entropy(logits[:, -2], y, ignore_index=-100)

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=causal_collate), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=causal_collate), max_steps=300)


fix("tg_last_position_only", fixed_of(last_position_only), lambda m, kw: causal_answer_acc(m),
    "val answer next-token acc")
