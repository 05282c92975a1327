"""The fact each broken case of set bc rests on, printed by ``verify.py`` before the case is trained (no preflight).
Importing this module attaches each fact to ``FIXES``."""

from __future__ import annotations

import torch

from benchmarks.blind_preflight_bc import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained  # noqa: F401
from benchmarks.blind_preflight_bc.registry import CASES, FIXES, load_all
from benchmarks.blind_preflight_bc.synth import EOS, ITOS


def _first(kw):
    return next(iter(kw["train_loader"]))


def _toks(t):
    return " ".join(ITOS[i] if 0 <= i < len(ITOS) else str(i) for i in t.tolist())


def f_sh_gpt_unshifted_labels():
    b = _first(CASES["sh_gpt_unshifted_labels"].build())
    keep = b["labels"] != -100
    print("  labels equal the input token at the same position wherever supervised:",
          bool((b["labels"][keep] == b["input_ids"][keep]).all()))


def f_sh_gpt2_preshifted_labels():
    b = _first(CASES["sh_gpt2_preshifted_labels"].build())
    print("  input_ids[0]:", _toks(b["input_ids"][0, :10]))
    print("  labels[0]   :", b["labels"][0, :10].tolist(), "(already the next token; the model shifts again)")


def f_sh_t5_decoder_inputs_equal_labels():
    b = _first(CASES["sh_t5_decoder_inputs_equal_labels"].build())
    keep = b["labels"] != -100
    print("  decoder_input_ids == labels on every target position:",
          bool((b["decoder_input_ids"][keep] == b["labels"][keep]).all()))


def f_sh_labels_time_major():
    x, y = _first(CASES["sh_labels_time_major"].build())
    print("  inputs", tuple(x.shape), "labels", tuple(y.shape), "(pad_sequence default batch_first=False)")


def f_sh_gru_seq2seq_not_batch_first():
    kw = CASES["sh_gru_seq2seq_not_batch_first"].build()
    x, _, _ = _first(kw)
    print("  GRU batch_first:", kw["model"].enc.batch_first, "input", tuple(x.shape), "-> time axis = batch of",
          x.shape[0])


def f_tg_prompt_mask_inverted():
    b = _first(CASES["tg_prompt_mask_inverted"].build())
    print("  row 0 tokens:", _toks(b["input_ids"][0]))
    print("  supervised  :", _toks(b["input_ids"][0][b["labels"][0] != -100]), "(the prompt, not the answer)")


def f_tg_pad_eq_eos_masked():
    b = _first(CASES["tg_pad_eq_eos_masked"].build())
    print("  EOS tokens among the labels:", int((b["labels"] == EOS).sum()), "of",
          int((b["input_ids"] == EOS).sum() - (b["attention_mask"] == 0).sum()), "real EOS in the batch")


def f_tg_bart_labels_are_source():
    b = _first(CASES["tg_bart_labels_are_source"].build())
    print("  labels[0]   :", _toks(b["labels"][0][b["labels"][0] != -100]))
    print("  input_ids[0]:", _toks(b["input_ids"][0][b["attention_mask"][0] == 1]))


def f_tg_label_smoothing_as_confidence():
    v = 28
    print(f"  label_smoothing=0.9 over {v} classes: target probability {0.1 + 0.9 / v:.3f}, others {0.9 / v:.3f}")


def f_tg_last_position_only():
    b = _first(CASES["tg_last_position_only"].build())
    print("  supervised positions per batch:", int((b["labels"][:, -1] != -100).sum()), "of",
          int((b["labels"] != -100).sum()), "answer tokens")


def f_lora(name):
    def f():
        kw = CASES[name].build()
        opt_ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
        names = [n for n, p in kw["model"].named_parameters() if p.requires_grad and id(p) in opt_ids]
        print(f"  trainable and in the optimizer: {len(names)} tensors, e.g. {names[:3]}")
        lora = [(n, p) for n, p in kw["model"].named_parameters() if "lora" in n]
        if lora:
            print("  lora_A all zero:", all(float(p.abs().sum()) == 0 for n, p in lora if "lora_A" in n),
                  "| scaling:", kw["model"].model.layers[0].self_attn.q_proj.scaling)
    return f


def f_mc_float_causal_mask():
    m = CASES["mc_float_causal_mask"].build()["model"]
    print("  mask passed to MultiheadAttention:", m.causal_mask(4, "cpu").tolist(), "(float: added to scores)")


def f_mc_decoder_no_tgt_mask():
    print("  the decoder is called with tgt_mask=None: position t attends to target positions > t")


def f_mc_no_position_embedding():
    m = CASES["mc_no_position_embedding"].build()["model"]
    x = torch.tensor([[8, 9, 10]])
    print("  embed() identical for a permutation:",
          bool(torch.allclose(m.embed(x)[0, [2, 1, 0]], m.embed(x.flip(1))[0])))


def f_mc_no_teacher_forcing():
    m = CASES["mc_no_teacher_forcing"].build()["model"]
    print("  teacher_forcing ratio:", m.teacher_forcing)


def f_mc_schedule_in_samples():
    kw = CASES["mc_schedule_in_samples"].build()
    s = kw["scheduler"]
    lrs = []
    for _ in range(300):
        kw["optimizer"].step()
        s.step()
        lrs.append(s.get_last_lr()[0])
    print(f"  LR after 300 steps {lrs[-1]:.2e} (peak 2e-3), mean {sum(lrs) / 300:.2e}")


def f_dt_answers_off_by_one():
    ds = CASES["dt_answers_off_by_one"].build()["train_loader"].dataset
    p, a = ds.rows[0]
    print("  row 0 prompt:", _toks(torch.tensor(p)), "| answer:", _toks(torch.tensor(a)))


def f_dt_truncation_cuts_answer():
    b = _first(CASES["dt_truncation_cuts_answer"].build())
    print("  answer tokens left after truncation:", int((b["labels"] != -100).sum()), "in a batch of",
          b["labels"].shape[0], "rows")


def f_dt_tokenizer_per_shard():
    ds = CASES["dt_tokenizer_per_shard"].build()["train_loader"].dataset
    print("  id of 'a' in each shard's tokenizer:", [d.tok.stoi["a"] for d in ds.datasets],
          "| of 'r':", [d.tok.stoi["r"] for d in ds.datasets])


def f_dt_random_op_twice():
    ds = CASES["dt_random_op_twice"].build()["train_loader"].dataset
    p, a = ds[0]
    print("  prompt:", _toks(torch.tensor(p)), "| answer:", _toks(torch.tensor(a)))


def f_dt_labels_left_padded():
    b = _first(CASES["dt_labels_left_padded"].build())
    i = int(b["attention_mask"].sum(1).argmin())
    print("  shortest row tokens:", _toks(b["input_ids"][i]))
    print("  its labels         :", b["labels"][i].tolist())


load_all()
for _name in list(FIXES):
    _f = globals().get("f_" + _name)
    if _f is None and _name.startswith("tr_"):
        _f = f_lora(_name)
    FIXES[_name]["fact"] = _f
