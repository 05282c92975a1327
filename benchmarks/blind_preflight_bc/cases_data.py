"""Set bc, family "data": how the instruction rows are read, paired, tokenised, truncated and padded."""

from __future__ import annotations

import random
from collections import Counter

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import ConcatDataset, Dataset

from benchmarks.blind_preflight_bc.registry import case, fix, fixed_of, loader, seed
from benchmarks.blind_preflight_bc.synth import (
    EOS,
    PAD,
    InstructionSet,
    TinyGPT,
    apply_op,
    causal_answer_acc,
    causal_collate,
    hf_gpt2,
    ids,
    make_pairs,
    prompt_ids,
    shifted_ce,
    val_rows,
)

GPT = lambda mm, x, a: mm(x, a)  # noqa: E731


def _gpt_loss(model, batch):
    return shifted_ce(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])


# ---------------------------------------------------------------- 1
def _files(n, s):
    pairs = make_pairs(n, s)
    prompts = "op,word\n" + "\n".join(f"{op},{w}" for op, w, _, _ in pairs)
    answers = "\n".join(a for _, _, a, _ in pairs)          # this export has no header line
    return prompts, answers


class TwoFileSFT(Dataset):
    def __init__(self, prompts_txt, answers_txt, fixed):
        prompts = prompts_txt.splitlines()[1:]              # skip the header
        answers = answers_txt.splitlines()[0 if fixed else 1:]   # "skip the header" here too
        self.rows = []
        for line, ans in zip(prompts, answers):
            op, word = line.split(",")
            self.rows.append((prompt_ids(op, word), ids(ans) + [EOS]))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


@case("dt_answers_off_by_one", "data",
      "Prompts and answers come from two exports; the header line is skipped in both, but the answers export has "
      "no header, so each prompt is zipped with the next row's answer and the labels are unrelated to the inputs.",
      r"off[- ]by[- ]one|misalign|(shifted|offset) by one (row|line|example)|header|zip|(next|previous|wrong) "
      r"(row|example)'?s? (answer|label|response)|pair(s|ed|ing)? .{0,30}(wrong|mismatch)|(labels?|answers?|targets?) "
      r"(are )?(unrelated|don't match|do not match|not aligned)")
def answers_off_by_one(fixed=False):
    seed(0)
    train = TwoFileSFT(*_files(2000, 0), fixed)
    val = TwoFileSFT(*_files(256, 999), fixed)
    model = TinyGPT()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3), loss_fn=_gpt_loss,
                train_loader=loader(train, 32, collate_fn=causal_collate),
                val_loader=loader(val, 64, shuffle=False, collate_fn=causal_collate), max_steps=300)


fix("dt_answers_off_by_one", fixed_of(answers_off_by_one), lambda m, kw: causal_answer_acc(m, fwd=GPT),
    "val answer next-token acc")


# ---------------------------------------------------------------- 2
def _trunc_collate(max_length):
    def collate(rows):
        b = causal_collate(rows)
        return {k: v[:, :max_length] for k, v in b.items()}   # tokenizer(..., truncation=True, max_length=...)
    return collate


@case("dt_truncation_cuts_answer", "data",
      "Rows carry an 8-token system prompt and are truncated to max_length=16 from the right: for most rows the "
      "answer (and its EOS) is cut off, so the labels that remain are mostly -100 and the model sees few answers.",
      r"truncat|max_length|max_len|(cut|chopped|clipped) off|answer .{0,40}(cut|lost|removed|missing)|"
      r"(sequence|context) length|too short|truncation_side|labels .{0,30}(mostly|all) -100")
def truncation_cuts_answer(fixed=False):
    seed(0)
    train = InstructionSet(make_pairs(2000, 0, sys_min=8, sys_max=8))
    val = InstructionSet(make_pairs(256, 999, sys_min=8, sys_max=8))
    collate = _trunc_collate(32 if fixed else 16)
    model = TinyGPT()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3), loss_fn=_gpt_loss,
                train_loader=loader(train, 32, collate_fn=collate),
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300)


fix("dt_truncation_cuts_answer", fixed_of(truncation_cuts_answer),
    lambda m, kw: causal_answer_acc(m, rows=val_rows(sys_min=8, sys_max=8), fwd=GPT), "val answer next-token acc")


# ---------------------------------------------------------------- 3
class CharTokenizer:
    """Characters ranked by frequency; 0 = pad, 1 = eos."""

    def fit(self, texts):
        counts = Counter("".join(texts))
        self.stoi = {c: i + 2 for i, (c, _) in enumerate(counts.most_common())}
        return self

    def encode(self, text):
        return [self.stoi.get(c, 0) for c in text]


def _texts(n, s):
    return [(f"{op}:{w}=", a) for op, w, a, _ in make_pairs(n, s)]


def _own_val_acc(model, kw):
    right = n = 0
    model.eval()
    with torch.no_grad():
        for b in kw["val_loader"]:
            logits = model(b["input_ids"], b["attention_mask"])
            pred, tgt = logits[:, :-1].argmax(-1), b["labels"][:, 1:]
            keep = tgt != -100
            right += (pred[keep] == tgt[keep]).sum().item()
            n += keep.sum().item()
    model.train()
    return right / n


class TextSFT(Dataset):
    """One shard of "prompt=answer" texts; fits its own tokenizer unless one is given."""

    def __init__(self, pairs, tok=None):
        self.tok = tok or CharTokenizer().fit([p + a for p, a in pairs])
        self.rows = [(self.tok.encode(p), self.tok.encode(a) + [1]) for p, a in pairs]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


@case("dt_tokenizer_per_shard", "data",
      "The training data is read as four shards and each shard's Dataset fits its own character tokenizer "
      "(ids ranked by frequency in that shard): the same character gets different ids in different shards, so "
      "the concatenated training set teaches four conflicting vocabularies.",
      r"tokeni[sz]er|vocab(ulary)?|fit(ted)? (separately|per shard|per (data ?set|file)|on each)|different "
      r"(token )?ids|(id|token) mapping|stoi|same (tokenizer|vocab)|one (shared )?(tokenizer|vocab)|shard")
def tokenizer_per_shard(fixed=False):
    seed(0)
    tr, va = _texts(2000, 0), _texts(256, 999)
    shared = CharTokenizer().fit([p + a for p, a in tr[:500]]) if fixed else None
    shards = [TextSFT(tr[k:k + 500], shared) for k in range(0, 2000, 500)]
    train = ConcatDataset(shards)
    val = TextSFT(va, shards[0].tok)           # the tokenizer saved with the model: the first shard's
    model = TinyGPT(vocab=24)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3), loss_fn=_gpt_loss,
                train_loader=loader(train, 32, collate_fn=causal_collate),
                val_loader=loader(val, 64, shuffle=False, collate_fn=causal_collate), max_steps=300)


fix("dt_tokenizer_per_shard", fixed_of(tokenizer_per_shard), _own_val_acc,
    "val answer next-token acc (first shard's tokenizer)")


# ---------------------------------------------------------------- 4
class OnTheFlyInstructions(Dataset):
    """Generates an instruction row per index (fresh words each epoch)."""

    def __init__(self, n, fixed):
        self.n, self.fixed = n, fixed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        op = random.choice(["rev", "cpy", "rot"])
        word = "".join(random.choice("abcdefgh") for _ in range(random.randint(3, 5)))
        answer = apply_op(op if self.fixed else random.choice(["rev", "cpy", "rot"]), word)
        return prompt_ids(op, word), ids(answer) + [EOS]


@case("dt_random_op_twice", "data",
      "__getitem__ draws the instruction with random.choice for the prompt and calls random.choice again when "
      "computing the answer, so two times in three the answer follows a different instruction than the one shown.",
      r"random\.choice|(drawn|sampled|called|chosen) (twice|again)|second (random )?(draw|call)|"
      r"(answer|label|target)s? .{0,40}(different|another|other) (instruction|op|operation)|"
      r"(labels?|answers?|targets?) (are )?(inconsistent|unrelated|random|noisy|don't match|do not match)|"
      r"same (op|instruction|variable)")
def random_op_twice(fixed=False):
    seed(0)
    model = hf_gpt2()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3), loss_fn=None,
                train_loader=loader(OnTheFlyInstructions(2000, fixed), 32, collate_fn=causal_collate),
                val_loader=loader(InstructionSet(make_pairs(256, 999)), 64, shuffle=False,
                                  collate_fn=causal_collate), max_steps=300)


fix("dt_random_op_twice", fixed_of(random_op_twice), lambda m, kw: causal_answer_acc(m), "val answer next-token acc")


# ---------------------------------------------------------------- 5
def _mixed_pad_collate(fixed):
    def collate(rows):
        seqs = [torch.tensor(p + a) for p, a in rows]
        x = pad_sequence(seqs, batch_first=True, padding_value=PAD)          # right padded
        T = x.shape[1]
        labels = []
        for p, a in rows:
            lab = torch.tensor([-100] * len(p) + a)
            fill = torch.full((T - len(lab),), -100)
            labels.append(torch.cat([lab, fill]) if fixed else torch.cat([fill, lab]))   # left padded
        return {"input_ids": x, "attention_mask": (x != PAD).long(), "labels": torch.stack(labels)}
    return collate


@case("dt_labels_left_padded", "data",
      "The collate right-pads input_ids with pad_sequence but pads the labels on the left (code copied from a "
      "generation snippet): in every row shorter than the batch maximum the labels are shifted against the "
      "tokens they belong to.",
      r"(left|right)[- ]pad|padding[_ ]side|pad(ded|s)? on (the )?(left|right|opposite|different)|"
      r"(labels?|targets?) .{0,40}(shifted|misaligned|offset|not aligned)|misalign|align")
def labels_left_padded(fixed=False):
    seed(0)
    train = InstructionSet(make_pairs(2000, 0, lmin=2, lmax=6, sys_max=3))
    val = InstructionSet(make_pairs(256, 999, lmin=2, lmax=6, sys_max=3))
    collate = _mixed_pad_collate(fixed)
    model = TinyGPT()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3), loss_fn=_gpt_loss,
                train_loader=loader(train, 32, collate_fn=collate),
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300)


fix("dt_labels_left_padded", fixed_of(labels_left_padded),
    lambda m, kw: causal_answer_acc(m, rows=val_rows(lmin=2, lmax=6, sys_max=3), fwd=GPT),
    "val answer next-token acc")
