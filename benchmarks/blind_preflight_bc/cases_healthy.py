"""Set bc, healthy cases: five corrected twins of broken cases and five unusual but correct SFT / seq2seq setups."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_bc.cases_data import truncation_cuts_answer
from benchmarks.blind_preflight_bc.cases_mechanics import decoder_no_tgt_mask
from benchmarks.blind_preflight_bc.cases_shapes import gpt_unshifted_labels
from benchmarks.blind_preflight_bc.cases_targets import pad_eq_eos_masked
from benchmarks.blind_preflight_bc.cases_trained import lora_both_zero
from benchmarks.blind_preflight_bc.registry import healthy, loader, seed, twin
from benchmarks.blind_preflight_bc.synth import (
    BOS,
    EOS,
    PAD,
    InstructionSet,
    TinyGPT,
    V,
    causal_collate,
    hf_bart,
    hf_gpt2,
    hf_llama,
    hf_t5,
    lr_lambda_cosine,
    make_pairs,
    s2s_collate,
)

healthy("hc_gpt_shifted_labels", "twin of sh_gpt_unshifted_labels: logits[:, :-1] against labels[:, 1:]")(
    twin(gpt_unshifted_labels))
healthy("hc_eos_kept_in_labels", "twin of tg_pad_eq_eos_masked: pad == eos, padding masked by attention_mask")(
    twin(pad_eq_eos_masked))
healthy("hc_lora_kaiming_A", "twin of tr_lora_both_zero: lora_A Kaiming-initialised, lora_B zeros")(
    twin(lora_both_zero))
healthy("hc_decoder_with_tgt_mask", "twin of mc_decoder_no_tgt_mask: nn.Transformer with a causal tgt_mask")(
    twin(decoder_no_tgt_mask))
healthy("hc_max_length_fits", "twin of dt_truncation_cuts_answer: max_length=32 keeps every answer")(
    twin(truncation_cuts_answer))


def _sets(**kw):
    return InstructionSet(make_pairs(2000, 0, **kw)), InstructionSet(make_pairs(256, 999, **kw))


# ---------------------------------------------------------------- left-padded Llama
def _left_collate(rows):
    T = max(len(p) + len(a) for p, a in rows)
    x = torch.full((len(rows), T), PAD)
    m = torch.zeros((len(rows), T), dtype=torch.long)
    y = torch.full((len(rows), T), -100)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        off = T - len(seq)
        x[i, off:] = torch.tensor(seq)
        m[i, off:] = 1
        y[i, off + len(p):] = torch.tensor(a)
    pos = (m.cumsum(1) - 1).clamp(min=0)
    return {"input_ids": x, "attention_mask": m, "position_ids": pos, "labels": y}


@healthy("hc_llama_left_padding", "tiny Llama, left padding with attention_mask and position_ids from the mask, "
         "prompt and pads at -100, model(**batch).loss")
def llama_left_padding():
    seed(0)
    train, val = _sets(sys_max=3)
    model = hf_llama()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01),
                train_loader=loader(train, 32, collate_fn=_left_collate), loss_fn=None,
                val_loader=loader(val, 64, shuffle=False, collate_fn=_left_collate), max_steps=300)


# ---------------------------------------------------------------- BART with label smoothing and ignore_index
@healthy("hc_bart_label_smoothing", "tiny BART, decoder inputs built with shift_tokens_right, labels padded "
         "with -100, CrossEntropyLoss(label_smoothing=0.1, ignore_index=-100)")
def bart_label_smoothing():
    from transformers.models.bart.modeling_bart import shift_tokens_right
    seed(0)
    train, val = _sets(ops=("cpy", "rot"))
    model = hf_bart()
    crit = torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=-100)

    def loss_fn(model, b):
        dec = shift_tokens_right(b["labels"], PAD, EOS)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       decoder_input_ids=dec, decoder_attention_mask=(b["labels"] != -100).long()).logits
        return crit(logits.reshape(-1, logits.shape[-1]), b["labels"].reshape(-1))

    collate = lambda rows: s2s_collate(rows, start_id=EOS)  # noqa: E731
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32, collate_fn=collate), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300)


# ---------------------------------------------------------------- packed sequences, block-diagonal attention
class PackedGPT(TinyGPT):
    def forward(self, input_ids, doc_ids, position_ids):
        B, T = input_ids.shape
        x = self.embed(input_ids, position_ids)
        causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
        same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
        blocked = ~(causal & same_doc)                          # True = may not attend
        mask = blocked.repeat_interleave(self.blocks[0].attn.num_heads, 0)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln_f(x))


def _pack(rows, length=40):
    """Greedy packing of whole examples into rows of ``length`` tokens, positions restarting per document."""
    packs, cur = [], []
    for p, a in rows:
        if sum(len(q) + len(b) for q, b in cur) + len(p) + len(a) > length:
            packs.append(cur)
            cur = []
        cur.append((p, a))
    packs.append(cur)
    out = []
    for pack in packs:
        x = torch.full((length,), PAD)
        doc = torch.full((length,), -1)
        pos = torch.zeros(length, dtype=torch.long)
        y = torch.full((length,), -100)
        t = 0
        for d, (p, a) in enumerate(pack):
            n = len(p) + len(a)
            x[t:t + n] = torch.tensor(p + a)
            doc[t:t + n] = d
            pos[t:t + n] = torch.arange(n)
            y[t + len(p):t + n] = torch.tensor(a)
            t += n
        doc[t:] = torch.arange(100, 100 + length - t)          # each pad its own document
        out.append((x, doc, pos, y))
    return out


def _stack(items):
    return {k: torch.stack([it[i] for it in items]) for i, k in
            enumerate(("input_ids", "doc_ids", "position_ids", "labels"))}


@healthy("hc_packed_block_diagonal", "hand-written GPT on packed SFT rows: block-diagonal causal attention per "
         "document, positions restarting at each document, labels shifted in the loss")
def packed_block_diagonal():
    seed(0)
    train, val = _sets()
    model = PackedGPT()

    def loss_fn(model, b):
        logits = model(b["input_ids"], b["doc_ids"], b["position_ids"])
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), b["labels"][:, 1:].reshape(-1),
                               ignore_index=-100)

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(_pack(train.rows), 16, collate_fn=_stack), loss_fn=loss_fn,
                val_loader=loader(_pack(val.rows), 16, shuffle=False, collate_fn=_stack), max_steps=300)


# ---------------------------------------------------------------- GPT-2 with added chat tokens
USER, ASSISTANT = V, V + 1


def _chat_collate(rows):
    chat = [([BOS, USER] + p[1:-1] + [ASSISTANT], a) for p, a in rows]
    return causal_collate(chat)


@healthy("hc_gpt2_added_chat_tokens", "tiny GPT-2 with two added chat-template tokens: resize_token_embeddings "
         "before the optimizer is built, tied LM head, pad distinct from eos")
def gpt2_added_chat_tokens():
    seed(0)
    train, val = _sets()
    model = hf_gpt2()
    model.resize_token_embeddings(V + 2)
    assert model.lm_head.weight is model.transformer.wte.weight
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3), loss_fn=None,
                train_loader=loader(train, 32, collate_fn=_chat_collate),
                val_loader=loader(val, 64, shuffle=False, collate_fn=_chat_collate), max_steps=300)


# ---------------------------------------------------------------- T5 with accumulation, clipping, warm-up + cosine
@healthy("hc_t5_accum_clip_cosine", "tiny T5 on reverse/copy/rotate, labels padded with -100 (the model shifts them "
         "right itself), 2-step accumulation, clipping at 1.0, warm-up + cosine LambdaLR")
def t5_accum_clip_cosine():
    seed(0)
    train, val = _sets()
    model = hf_t5()
    collate = lambda rows: {k: v for k, v in s2s_collate(rows, start_id=PAD).items()  # noqa: E731
                            if k != "decoder_input_ids"}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda_cosine(300, 20))
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(train, 16, collate_fn=collate),
                loss_fn=None, val_loader=loader(val, 64, shuffle=False, collate_fn=collate), max_steps=300,
                accumulation_steps=2, clip_grad_norm=1.0)
