"""Set b sanity (no preflight): 20 plain optimizer steps per case (first vs last loss), plus a direct
check of each broken case's claimed mechanism.

    .venv/bin/python -m benchmarks.blind_preflight_b.sanity [NAME ...]

Healthy cases must show DEC (the mean of the last 3 losses below the first 3) and train=True;
broken ones must show CLAIM ok (the mechanism the `bug` sentence names is really there).
"""

from __future__ import annotations

import sys
import time
import warnings

import torch

from benchmarks.blind_preflight_b.registry import load_all
from optimus_preflight.preflight.standalone import loss_adapter


def _first(loader):
    return next(iter(loader))


def _out_vs_target(kw):
    x, y = _first(kw["train_loader"])[:2]
    with torch.no_grad():
        out = kw["model"](x)
    return tuple(out.shape), tuple(y.shape)


def _labels(kw, key=1, batches=20):
    ys = []
    for k, b in enumerate(kw["train_loader"]):
        ys.append(b[key] if not isinstance(b, dict) else b["labels"])
        if k >= batches:
            break
    return torch.cat([y.flatten() for y in ys])


def _opt_ids(kw):
    return {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}


def _grads_outside_opt(kw):
    """Tensors with requires_grad reachable from the loss that get a gradient but are not in the optimizer."""
    model, opt = kw["model"], kw["optimizer"]
    compute = loss_adapter(kw.get("loss_fn"))
    seen = {}

    def collect(obj, depth=0):
        if depth > 3:
            return
        if isinstance(obj, torch.nn.Parameter) or (isinstance(obj, torch.Tensor) and obj.requires_grad):
            seen[id(obj)] = obj
        elif isinstance(obj, torch.nn.Module):
            for v in vars(obj).values():
                collect(v, depth + 1)
            for m in obj.children():
                collect(m, depth + 1)
            for p in obj.parameters():
                seen[id(p)] = p
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                collect(v, depth + 1)
        elif isinstance(obj, dict):
            for v in obj.values():
                collect(v, depth + 1)

    collect(model)
    fn = kw.get("loss_fn")
    for cell in getattr(fn, "__closure__", None) or ():
        collect(cell.cell_contents)
    opt.zero_grad()
    compute(model, _first(kw["train_loader"])).backward()
    ids = _opt_ids(kw)
    missing = [t for i, t in seen.items() if i not in ids and t.grad is not None and t.grad.abs().sum() > 0]
    opt.zero_grad()
    return len(missing)


def _accum_cleared(kw):
    model = kw["model"].eval()           # dropout off: the same micro-batch gives the same gradient
    compute = loss_adapter(kw.get("loss_fn"))
    it = iter(kw["train_loader"])
    b1, b2 = next(it), next(it)
    for q in model.parameters():
        q.grad = None
    compute(model, b1).backward()
    g1 = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    compute(model, b2).backward()
    for q in model.parameters():
        q.grad = None
    compute(model, b2).backward()
    g2 = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    for q in model.parameters():
        q.grad = None
    compute(model, b1).backward()
    compute(model, b2).backward()
    both = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    for q in model.parameters():
        q.grad = None
    # cleared: after b1+b2 the gradient equals b2's alone (not g1 + g2)
    model.train()
    n = next(iter(g2))
    return torch.allclose(both[n], g2[n]) and not torch.allclose(g1[n], torch.zeros_like(g1[n]))


def _plain_loss_ratio(kw, plain):
    b = _first(kw["train_loader"])
    with torch.no_grad():
        return float(loss_adapter(kw.get("loss_fn"))(kw["model"], b)) / float(plain(kw["model"], b))


def _hf_shift(kw):
    b = _first(kw["train_loader"])
    ids, labels = b["input_ids"], b["labels"]
    return bool((labels[:, :-1] == ids[:, 1:]).all()) and not bool((labels == ids).all())


def _distinct_rows(loader, batches=30):
    rows = []
    for k, b in enumerate(loader):
        x = b[0] if not isinstance(b, dict) else b["input_ids"]
        rows.extend(tuple(r.flatten().tolist()) for r in x)
        if k >= batches:
            break
    return len(set(rows)), len(rows)


def _overlap(kw):
    def rows(loader):
        out = set()
        for b in loader:
            out.update(tuple(torch.round(r.flatten().float(), decimals=5).tolist()) for r in b[0])
        return out
    tr, va = rows(kw["train_loader"]), rows(kw["val_loader"])
    return len(tr & va) / len(va)


CLAIMS = {
    "wine_quality_targets_as_column": lambda kw: (lambda s: (s, s[0] == (64,) and s[1] == (64, 1)))(_out_vs_target(kw)),
    "keypoint_cnn_targets_n_1_2": lambda kw: (lambda s: (s, s[0] == (32, 2) and s[1] == (32, 1, 2)))(_out_vs_target(kw)),
    "spam_gru_focal_loss_b1_vs_b": lambda kw: (lambda s: (s, s[0] == (64, 1) and s[1] == (64,)))(_out_vs_target(kw)),
    "segnet_log_softmax_over_width": lambda kw: (lambda o: ("sum exp over dim1=%.2f dim3=%.2f" % (
        o.exp().sum(1).mean(), o.exp().sum(3).mean()), abs(float(o.exp().sum(3).mean()) - 1) < 1e-4))(
        kw["model"](_first(kw["train_loader"])[0]).detach()),
    "ecg_mlp_log_softmax_singleton_dim": lambda kw: (lambda o: (f"out {tuple(o.shape)} max|logp|={o.abs().max():.2g}",
                                                                float(o.abs().max()) == 0.0))(
        kw["model"](_first(kw["train_loader"])[0]).detach()),
    "intent_transformer_default_seq_first": lambda kw: (
        f"batch_first={kw['model'].encoder.layers[0].self_attn.batch_first}, batch {tuple(_first(kw['train_loader'])[0].shape)}",
        not kw["model"].encoder.layers[0].self_attn.batch_first),
    "char_gru_batchify_time_major": lambda kw: (f"batch {tuple(_first(kw['train_loader'])[0].shape)} (bptt, bsz), "
                                                f"batch_first={kw['model'].gru.batch_first}",
                                                tuple(_first(kw['train_loader'])[0].shape) == (24, 16)),
    "telco_churn_yes_case_mismatch": lambda kw: (lambda y: (f"labels {y.unique().tolist()}", y.unique().numel() == 1))(_labels(kw)),
    "glyphs_first_rows_of_sorted_export": lambda kw: (lambda y: (f"labels {y.unique().tolist()}", y.unique().numel() == 1))(_labels(kw)),
    "audio_tagging_multihot_into_ce": lambda kw: (lambda y: (f"row sums mean {y.sum(1).mean():.2f}", float(y.sum(1).mean()) > 1.5))(
        _first(kw["train_loader"])[1]),
    "arxiv_topics_multihot_normalised_into_ce": lambda kw: (lambda y: (
        f"rows with >1 topic {(y > 0).sum(1).gt(1).float().mean():.0%}", float((y > 0).sum(1).gt(1).float().mean()) > 0.3))(
        _first(kw["train_loader"])[1]),
    "bilstm_ner_ignore_index_is_O_tag": lambda kw: (lambda b: (lambda frac: (f"ignored (==0) {frac:.0%} of positions", frac > 0.7))(
        float((b[1] == 0).float().mean())))(_first(kw["train_loader"])),
    "t5_reverse_labels_pad_mask_inverted": lambda kw: (lambda l: (f"labels values {l.unique().tolist()}",
                                                                  set(l.unique().tolist()) <= {-100, 0}))(
        _first(kw["train_loader"])["labels"]),
    "grid_load_lstm_targets_in_kw": lambda kw: (lambda y: (f"target mean {y.mean():.3g} std {y.std():.3g}", float(y.mean()) > 1e4))(
        _first(kw["train_loader"])[1]),
    "crowd_counter_raw_counts": lambda kw: (lambda y: (f"target mean {y.mean():.3g} std {y.std():.3g}", float(y.mean()) > 100))(
        _first(kw["train_loader"])[1]),
    "multitask_heads_in_python_list": lambda kw: (lambda n: (f"{n} grad tensors outside the optimizer", n == 6))(_grads_outside_opt(kw)),
    "protonet_prototypes_in_plain_dict": lambda kw: (lambda n: (f"{n} grad tensors outside the optimizer", n == 5))(_grads_outside_opt(kw)),
    "decay_groups_by_name_miss_layernorm": lambda kw: (lambda n: (f"{n} trainable params not in the optimizer", n > 0))(
        sum(1 for p in kw["model"].parameters() if p.requires_grad and id(p) not in _opt_ids(kw))),
    "simclr_projection_head_outside_model": lambda kw: (lambda n: (f"{n} grad tensors outside the optimizer", n == 4))(_grads_outside_opt(kw)),
    "pet_cnn_dropout2d_keep_080": lambda kw: (str([m.p for m in kw["model"].modules() if isinstance(m, torch.nn.Dropout2d)]), True),
    "gpt2_pdrop_as_keep_prob": lambda kw: (f"resid_pdrop={kw['model'].config.resid_pdrop}", kw["model"].config.resid_pdrop == 0.9),
    "gpt2_head_initialised_from_embedding_clone": lambda kw: (
        f"tied={kw['model'].lm_head.weight is kw['model'].transformer.wte.weight}, config tie={kw['model'].config.tie_word_embeddings}",
        kw["model"].lm_head.weight is not kw["model"].transformer.wte.weight),
    "llama_input_embeddings_reinitialised_untied": lambda kw: (
        f"tied={kw['model'].lm_head.weight is kw['model'].model.embed_tokens.weight}",
        kw["model"].lm_head.weight is not kw["model"].model.embed_tokens.weight),
    "distilbert_reloaded_from_checkpoint_stays_eval": lambda kw: (f"training={kw['model'].training}", not kw["model"].training),
    "vit_left_in_eval_by_profiling_helper": lambda kw: (f"training={kw['model'].training}", not kw["model"].training),
    "scraped_reviews_overlapping_pages_split": lambda kw: (lambda f: (f"{f:.0%} of val rows in train", f > 0.5))(_overlap(kw)),
    "sensor_csv_glob_picks_copy": lambda kw: (lambda f: (f"{f:.0%} of val rows in train", f > 0.1))(_overlap(kw)),
    "xray_val_dataset_built_from_train_files": lambda kw: (lambda f: (f"{f:.0%} of val rows in train", f > 0.9))(_overlap(kw)),
    "bucket_sampler_yields_first_bucket": lambda kw: (lambda d: (f"{d[0]} distinct of {d[1]} rows drawn", d[0] <= 32))(
        _distinct_rows(kw["train_loader"])),
    "hard_example_sampler_temperature_too_low": lambda kw: (lambda d: (f"{d[0]} distinct of {d[1]} rows drawn", d[0] < 50))(
        _distinct_rows(kw["train_loader"])),
    "flowers_path_fstring_double_braces": lambda kw: (lambda d: (f"{d[0]} distinct inputs of {d[1]}", d[0] == 1))(
        _distinct_rows(kw["train_loader"], 5)),
    "roberta_tickets_getitem_uses_stale_loop_index": lambda kw: (lambda d: (f"{d[0]} distinct inputs of {d[1]}", d[0] == 1))(
        _distinct_rows(kw["train_loader"], 5)),
    "fraud_mlp_zero_grad_in_forward": lambda kw: ("grad of 2 micro-batches == last one's", _accum_cleared(kw)),
    "speech_gru_pre_hook_clears_grads": lambda kw: ("grad of 2 micro-batches == last one's", _accum_cleared(kw)),
    "regressor_loss_divided_by_accum_twice": lambda kw: (lambda r: (f"loss / plain mse = {r:.3f}", abs(r - 1 / 8) < 1e-4))(
        _plain_loss_ratio(kw, lambda m, b: torch.nn.functional.mse_loss(m(b[0]).squeeze(-1), b[1]))),
    "bert_nli_hf_loss_divided_by_accum_twice": lambda kw: (lambda r: (f"loss / model loss = {r:.3f}", abs(r - 1 / 4) < 1e-3))(
        (kw["model"].eval(), _plain_loss_ratio(kw, lambda m, b: m(**b).loss), kw["model"].train())[1]),
    "llama_labels_preshifted_by_hand": lambda kw: ("labels == input_ids shifted by one", _hf_shift(kw)),
    "neox_labels_rolled_by_hand": lambda kw: ("labels == input_ids shifted by one", _hf_shift(kw)),
}


def run_steps(kw, steps=20):
    model, optimizer, train_loader = kw["model"], kw["optimizer"], kw["train_loader"]
    compute_loss = loss_adapter(kw.get("loss_fn"))
    losses, batches = [], iter(train_loader)
    for _ in range(steps):
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(train_loader)
            batch = next(batches)
        optimizer.zero_grad()
        loss = compute_loss(model, batch)
        loss = loss[0] if isinstance(loss, tuple) else loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return sum(losses[:3]) / 3, sum(losses[-3:]) / 3


def main(names: list[str]) -> int:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    cases = load_all()
    bad = 0
    for name in names or list(cases):
        case = cases[name]
        start = time.time()
        kind = "H" if case.healthy else "B"
        try:
            claim = ""
            if not case.healthy:
                detail, ok = CLAIMS[name](case.build())
                claim = f"CLAIM {'ok' if ok else 'NOT-SHOWN'} ({detail})"
                bad += not ok
            kw = case.build()
            training = kw["model"].training
            first, last = run_steps(kw)
            verdict = "DEC" if last < first else "NOT-DEC"
            if case.healthy and (verdict != "DEC" or not training):
                bad += 1
            print(f"{name:46s} {kind} first {first:.4g} last {last:.4g} {verdict} train={training} {claim} "
                  f"{time.time() - start:.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            bad += 1
            print(f"{name:46s} {kind} RAISED {type(e).__name__}: {str(e)[:200]}", flush=True)
    print(f"{bad} case(s) not as claimed")
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
