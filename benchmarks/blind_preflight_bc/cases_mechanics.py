"""Set bc, family "mechanics": attention masks, positions, teacher forcing and the warm-up schedule."""

from __future__ import annotations

import torch
from transformers import get_linear_schedule_with_warmup

from benchmarks.blind_preflight_bc.common import GRUSeq2Seq, ce, fixed_len_collate
from benchmarks.blind_preflight_bc.registry import case, fix, fixed_of, loader, seed
from benchmarks.blind_preflight_bc.synth import (
    BOS,
    InstructionSet,
    TinyGPT,
    TinySeq2Seq,
    causal_answer_acc,
    causal_collate,
    causal_greedy_acc,
    hf_gpt2,
    make_pairs,
    s2s_collate,
    s2s_greedy_acc,
    shifted_ce,
    val_rows,
)

GPT = lambda mm, x, a: mm(x, a)  # noqa: E731


def _sets(**kw):
    return InstructionSet(make_pairs(2000, 0, **kw)), InstructionSet(make_pairs(256, 999, **kw))


def _gpt_kw(model, lr=3e-3):
    train, val = _sets()

    def loss_fn(model, batch):
        return shifted_ce(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=lr), loss_fn=loss_fn,
                train_loader=loader(train, 32, collate_fn=causal_collate),
                val_loader=loader(val, 64, shuffle=False, collate_fn=causal_collate), max_steps=300)


# ---------------------------------------------------------------- 1
class HFStyleMaskGPT(TinyGPT):
    """The causal mask written the Hugging Face way (1 = may attend, 0 = masked) and handed to nn.MultiheadAttention."""

    def __init__(self, fixed=False, **kw):
        super().__init__(**kw)
        self.fixed = fixed

    def causal_mask(self, T, device):
        keep = torch.tril(torch.ones(T, T, device=device))
        if self.fixed:
            return keep == 0                     # bool: True = not allowed
        return keep                              # float: ADDED to the scores, masks nothing


@case("mc_float_causal_mask", "mechanics",
      "The causal mask is a float tril of ones (1 = attend, 0 = masked, the Hugging Face convention) passed as "
      "attn_mask to nn.MultiheadAttention, which adds a float mask to the scores: nothing is masked, every "
      "position sees the future token it must predict and greedy generation fails.",
      r"attn_mask|causal[_ ]mask|(float|additive) mask|-inf|tril|triu|bool(ean)? mask|look(s|ing)? ahead|"
      r"future (token|position)s?|peek|leak(s|age)? .{0,20}(future|next)|not causal|mask (is )?added")
def float_causal_mask(fixed=False):
    seed(0)
    return _gpt_kw(HFStyleMaskGPT(fixed))


fix("mc_float_causal_mask", fixed_of(float_causal_mask), lambda m, kw: causal_greedy_acc(m, fwd=GPT),
    "val greedy answer acc")


# ---------------------------------------------------------------- 2
class NoTgtMaskSeq2Seq(TinySeq2Seq):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, input_ids, attention_mask, decoder_input_ids, causal=None):
        return super().forward(input_ids, attention_mask, decoder_input_ids, causal=self.fixed)


def _s2s_fwd(model, b):
    return model(b["input_ids"], b["attention_mask"], b["decoder_input_ids"])


@case("mc_decoder_no_tgt_mask", "mechanics",
      "nn.Transformer is called without tgt_mask (generate_square_subsequent_mask): under teacher forcing the "
      "decoder attends to later target tokens, learns to read the answer off its own input, and greedy decoding "
      "fails.",
      r"tgt_mask|generate_square_subsequent_mask|causal|subsequent|look(s|ing)? ahead|future (target )?tokens?|"
      r"peek|leak|decoder (self[- ])?attention .{0,40}(mask|unmasked)|triangular")
def decoder_no_tgt_mask(fixed=False):
    seed(0)
    train, val = _sets()
    model = NoTgtMaskSeq2Seq(fixed)

    def loss_fn(model, b):
        return ce(_s2s_fwd(model, b), b["labels"])

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32, collate_fn=s2s_collate), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=s2s_collate), max_steps=300)


fix("mc_decoder_no_tgt_mask", fixed_of(decoder_no_tgt_mask),
    lambda m, kw: s2s_greedy_acc(m, fwd=_s2s_fwd, start_id=BOS), "val greedy answer acc")


# ---------------------------------------------------------------- 3
class NoPosGPT(TinyGPT):
    def __init__(self, fixed=False, **kw):
        super().__init__(**kw)
        self.fixed = fixed

    def embed(self, input_ids, position_ids=None):
        x = self.tok(input_ids)
        if self.fixed:
            x = x + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        return x                                   # self.pos is built but never added


@case("mc_no_position_embedding", "mechanics",
      "The GPT's forward builds a position embedding table but never adds it to the token embeddings: the "
      "decoder has no position information, so it cannot tell which letter of the word to emit next.",
      r"position(al)?[_ ](embedding|encoding|ids|information)|wpe|self\.pos|(no|missing|without) "
      r"position|order[- ](agnostic|invariant)|permutation[- ]invariant|bag of (words|tokens)|"
      r"(never|not) (added|used)")
def no_position_embedding(fixed=False):
    seed(0)
    return _gpt_kw(NoPosGPT(fixed))


fix("mc_no_position_embedding", fixed_of(no_position_embedding), lambda m, kw: causal_answer_acc(m, fwd=GPT),
    "val answer next-token acc")


# ---------------------------------------------------------------- 4
@torch.no_grad()
def gru_greedy_acc(model, rows=None):
    rows = rows or val_rows(256)
    was = model.training
    model.eval()
    x, d, y = fixed_len_collate(8)(rows)
    _, hid = model.enc(model.emb(x))
    tok, preds = d[:, :1], []
    for _ in range(8):
        o, hid = model.dec(model.emb(tok), hid)
        tok = model.out(o).argmax(-1)
        preds.append(tok)
    pred = torch.cat(preds, 1)
    keep = y != -100
    model.train(was)
    return (pred[keep] == y[keep]).float().mean().item()


@case("mc_no_teacher_forcing", "mechanics",
      "The GRU seq2seq is trained with teacher_forcing_ratio=0.0 (meant 1.0): from the first step the decoder is "
      "fed its own detached argmax predictions instead of the gold previous token, so early training is on "
      "garbage inputs and learning is very slow.",
      r"teacher[_ ]forc|scheduled sampling|(own|its) (previous )?predictions?|argmax .{0,30}(fed|input)|"
      r"gold (previous )?tokens?|ground[- ]truth (previous )?tokens?|exposure|free[- ]running|autoregressive training")
def no_teacher_forcing(fixed=False):
    seed(0)
    train, val = _sets()
    model = GRUSeq2Seq(teacher_forcing=1.0 if fixed else 0.0)
    collate = fixed_len_collate(8)

    def loss_fn(model, batch):
        x, d, y = batch
        return ce(model(x, d), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=collate), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300, clip_grad_norm=1.0)


fix("mc_no_teacher_forcing", fixed_of(no_teacher_forcing), lambda m, kw: gru_greedy_acc(m), "val greedy answer acc")


# ---------------------------------------------------------------- 5
@case("mc_schedule_in_samples", "mechanics",
      "get_linear_schedule_with_warmup is given num_training_steps = epochs * len(train_dataset) (samples, not "
      "optimizer steps) and 10% of it as warm-up: 3000 warm-up steps, so the 300 steps run at <= 10% of the "
      "peak learning rate.",
      r"num_training_steps|num_warmup_steps|get_linear_schedule_with_warmup|len\(.{0,20}dataset\)|"
      r"samples? (instead of|not|rather than) (optimi[sz]er )?steps|(counts?|counted|measured) (in )?samples|"
      r"warm[- ]?up (lasts|of|is) \d{3,}|3000 (warm[- ]?up )?steps|steps per epoch|len\(.{0,20}loader\)")
def schedule_in_samples(fixed=False):
    seed(0)
    train, val = _sets()
    model = hf_gpt2()
    tl = loader(train, 32, collate_fn=causal_collate)
    epochs = 15
    total = epochs * len(tl) if fixed else epochs * len(train)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=int(0.1 * total), num_training_steps=total)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=tl, loss_fn=None,
                val_loader=loader(val, 64, shuffle=False, collate_fn=causal_collate), max_steps=300)


fix("mc_schedule_in_samples", fixed_of(schedule_in_samples), lambda m, kw: causal_answer_acc(m),
    "val answer next-token acc")
