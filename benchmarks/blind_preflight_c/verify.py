"""Facts per case, no preflight: batch shapes, mode, what is trained, data content.

    .venv/bin/python -m benchmarks.blind_preflight_c.verify [NAME ...]

Read next to each case's `bug`: e.g. the (B,) vs (B,1) shapes, train=False, params with a gradient that
are not in the optimizer, val rows found in train, distinct inputs drawn by the loader.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch import nn

from benchmarks.blind_preflight_c.registry import load_all
from optimus_preflight.preflight.standalone import loss_adapter


def shapes(obj):
    if torch.is_tensor(obj):
        return f"{tuple(obj.shape)}{'' if obj.is_floating_point() else 'i'}"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}:{shapes(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "(" + ", ".join(shapes(v) for v in obj) + ")"
    return type(obj).__name__


def first_tensor(batch):
    if torch.is_tensor(batch):
        return batch
    if isinstance(batch, dict):
        return batch.get("input_ids", next(iter(batch.values())))
    return batch[0]


def main(names):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    cases = load_all()
    for name in names or list(cases):
        c = cases[name]
        try:
            report(name, c)
        except Exception as e:  # noqa: BLE001
            print(f"{name}: verify raised {type(e).__name__}: {e}", flush=True)


def report(name, c):
    if True:
        kw = c.build()
        model, opt, tl = kw["model"], kw["optimizer"], kw["train_loader"]
        batch = next(iter(tl))
        facts = [f"batch={shapes(batch)}", f"train={model.training}"]
        try:
            out = loss_adapter(kw.get("loss_fn"))(model, batch)
            loss = out[0] if isinstance(out, tuple) else out
            facts.append(f"loss={loss.item():.4g}")
            loss.backward()
        except Exception as e:  # noqa: BLE001
            facts.append(f"backward raised {type(e).__name__}")
        in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
        params = list(model.parameters())
        facts.append(f"params={len(params)} trainable={sum(p.requires_grad for p in params)} in_opt={len(in_opt)}")
        graded_not_in_opt = [n for n, p in model.named_parameters() if p.grad is not None and id(p) not in in_opt]
        if graded_not_in_opt:
            facts.append(f"grad-but-not-in-opt={graded_not_in_opt[:4]}")
        registered = {id(p) for p in params}
        loose = []
        for m in model.modules():
            for k, v in vars(m).items():
                for t in (v if isinstance(v, (list, tuple)) else [v]):
                    if torch.is_tensor(t) and t.requires_grad and t.is_leaf and id(t) not in registered:
                        loose.append(f"{k}(grad={'yes' if t.grad is not None else 'no'})")
        if loose:
            facts.append(f"unregistered={loose[:3]}")
        ps = [m.p for m in model.modules() if isinstance(m, nn.Dropout)] + \
             [m.dropout for m in model.modules() if isinstance(m, nn.LSTM) and m.dropout]
        if getattr(model, "keep_prob", None) is not None:
            ps.append(model.keep_prob)
        if ps:
            facts.append(f"dropout_max={max(ps)}")
        cfg = getattr(model, "config", None)
        if cfg is not None and hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
            tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
            facts.append(f"config.tie={getattr(cfg, 'tie_word_embeddings', None)} actually_tied={tied}")
        if isinstance(batch, dict) and "labels" in batch and batch["labels"].dim() == 2:
            ids, lab = batch["input_ids"], batch["labels"]
            facts.append(f"labels==input_ids:{bool((lab == ids).all())} labels==ids[:,1:]-style:"
                         f"{bool((lab[:, :-1] == ids[:, 1:]).all())}")
        # content: distinct inputs and labels over up to 20 batches
        seen, labels = set(), []
        for k, b in enumerate(tl):
            t = first_tensor(b)
            for r in t:
                seen.add(hash(r.numpy().tobytes()))
            lab = b["labels"] if isinstance(b, dict) else (b[-1] if isinstance(b, (list, tuple)) else None)
            if lab is not None and not lab.is_floating_point():
                labels.append(lab.flatten())
            if k >= 19:
                break
        facts.append(f"distinct_inputs(20 batches)={len(seen)}")
        if labels:
            lab = torch.cat(labels)
            vals, counts = lab.unique(return_counts=True)
            facts.append(f"labels: {len(vals)} distinct, top share {counts.max().item() / len(lab):.2f}")
        elif isinstance(batch, (list, tuple)) and torch.is_tensor(batch[-1]) and batch[-1].is_floating_point():
            y = batch[-1]
            facts.append(f"target mean {y.mean():.4g} std {y.std():.4g} row-sum max {y.reshape(len(y), -1).sum(1).max():.3g}")
        if "val_loader" in kw:
            tr = {hash(r.numpy().tobytes()) for b in kw["train_loader"] for r in first_tensor(b)}
            va = [hash(r.numpy().tobytes()) for b in kw["val_loader"] for r in first_tensor(b)]
            facts.append(f"val rows also in train: {sum(h in tr for h in va)}/{len(va)}")
        print(f"{name} [{c.family}]\n    " + "\n    ".join(facts), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
