"""The fact each broken case of set ai rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import torch

from benchmarks.blind_preflight_ai.registry import FIXES, load_all


def _kw(name, fixed=False):
    build = load_all()[name].build
    return build() if not fixed else FIXES[name]["fixed"]()


def _first(kw):
    return next(iter(kw["train_loader"]))


def hwc_reshape():
    img = torch.arange(2 * 2 * 3).reshape(2, 2, 3)          # H=2, W=2, RGB
    print("  HWC pixel (0,0) =", img[0, 0].tolist(), "| reshape(3,2,2)[:,0,0] =", img.reshape(3, 2, 2)[:, 0, 0].tolist(),
          "| permute(2,0,1)[:,0,0] =", img.permute(2, 0, 1)[:, 0, 0].tolist())


def seg_flatten():
    logits = torch.arange(2 * 3 * 2 * 2).reshape(2, 3, 2, 2).float()
    print("  logits (N=2, C=3, H=2, W=2): view(-1, 3)[0] =", logits.reshape(-1, 3)[0].tolist(),
          "(3 pixels of channel 0) vs permute(0,2,3,1).reshape(-1, 3)[0] =",
          logits.permute(0, 2, 3, 1).reshape(-1, 3)[0].tolist(), "(3 classes of pixel 0)")


def bilstm():
    h_n = torch.stack([torch.arange(4).float().unsqueeze(1).expand(4, 2), 10 + torch.arange(4).float().unsqueeze(1)
                       .expand(4, 2)])                       # (2 dirs, B=4, hidden=2), value = sample id (+10: backward)
    print("  h_n (dirs=2, B=4, H=2) holding the sample id: view(4, -1) rows =", h_n.view(4, -1)[:, ::2].tolist(),
          "vs cat(h_n[0], h_n[1]) rows =", torch.cat([h_n[0], h_n[1]], 1)[:, ::2].tolist())


def collate_list():
    kw = _kw("ai_collate_list_targets")
    feats, targets = _first(kw)
    print(f"  collated targets: {type(targets).__name__} of {len(targets)} tensors of shape {tuple(targets[0].shape)};"
          f" stack().view(-1,2)[0] = {torch.stack(targets).view(-1, 2)[0].tolist()} vs stack(dim=1)[0] = "
          f"{[round(v, 4) for v in torch.stack(targets, 1)[0].tolist()]}")


def rating_broadcast():
    kw = _kw("ai_rating_broadcast_loss")
    u, i, r = _first(kw)
    pred = kw["model"](u, i)
    print(f"  pred {tuple(pred.shape)} - rating {tuple(r.shape)} -> {tuple((pred - r).shape)}")


def mask_scaled():
    kw = _kw("ai_mask_to_tensor_scaled")
    _, mask = _first(kw)
    fixed = FIXES["ai_mask_to_tensor_scaled"]["fixed"]()
    print("  mask values after the image transform + .long():", mask.unique().tolist(), "| true class ids:",
          _first(fixed)[1].unique().tolist())


def label_codes():
    from benchmarks.blind_preflight_ai.cases_targets import encode_in_order_seen, plan_rows
    _, names = plan_rows(1600, 13)
    print("  train codes:", encode_in_order_seen(names[:1200]), "| val codes:", encode_in_order_seen(names[1200:]))


def raw_price():
    kw = _kw("ai_raw_price_target")
    x, y = _first(kw)
    print(f"  target mean {y.mean():.0f}, std {y.std():.0f}; initial prediction mean {kw['model'](x).mean():.3f}; "
          f"initial MSE {torch.nn.functional.mse_loss(kw['model'](x), y):.3g}")


def multihot():
    kw = _kw("ai_multihot_crossentropy")
    _, y = _first(kw)
    print(f"  tags per row: {y.sum(1)[:8].tolist()}; the best a softmax can give each of 2 / 3 true tags: 0.5 / 0.333")


def forecast():
    from benchmarks.blind_preflight_ai.cases_targets import WINDOW
    kw = _kw("ai_forecast_target_last_input")
    x, y = _first(kw)
    print(f"  target == last input value of the window: {bool(torch.equal(y, x[:, WINDOW - 1]))}")


def fm_plain():
    kw = _kw("ai_fm_factors_plain_tensor")
    names = [n for n, _ in kw["model"].named_parameters()]
    print(f"  registered parameters: {names}; factor table v is a {type(kw['model'].v).__name__} "
          f"with requires_grad={kw['model'].v.requires_grad}, in optimizer: "
          f"{any(p is kw['model'].v for g in kw['optimizer'].param_groups for p in g['params'])}")


def module_attr():
    kw = _kw("ai_module_requires_grad_attr")
    m = kw["model"]
    print(f"  model.backbone.requires_grad = {m.backbone.requires_grad} (a Module attribute); backbone parameters "
          f"requiring grad: {sum(p.requires_grad for p in m.backbone.parameters())} of "
          f"{len(list(m.backbone.parameters()))}")


def groups_miss():
    kw = _kw("ai_param_groups_miss_module")
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  parameters in no group:", [n for n, p in kw["model"].named_parameters() if id(p) not in in_opt])


def from_pretrained():
    kw = _kw("ai_from_pretrained_frozen")
    print(f"  emb.weight.requires_grad = {kw['model'].emb.weight.requires_grad} (from_pretrained default freeze=True)")


def detach():
    kw = _kw("ai_detach_in_forward")
    x, y = _first(kw)
    torch.nn.functional.cross_entropy(kw["model"](x), y).backward()
    print("  grad of gru.weight_ih_l0 after backward:", kw["model"].gru.weight_ih_l0.grad)


def _lrs(kw, steps):
    opt, sched, out = kw["optimizer"], kw["scheduler"], []
    for s in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def schedule_epochs():
    lrs = _lrs(_kw("ai_linear_schedule_epochs"), 6)
    print("  lr over the first 6 steps:", [f"{v:.1e}" for v in lrs])


def bf16_weights():
    w = torch.tensor([0.3], dtype=torch.bfloat16)
    print(f"  bf16: 0.3 + 3e-4 -> {float(w + 3e-4):.6f} (unchanged: {bool(w + 3e-4 == w)}); bf16 spacing in "
          f"[0.25, 0.5) is 2**-9 = {2 ** -9:.5f}, so updates below {2 ** -10:.5f} round away")


def lambdalr():
    kw = _kw("ai_lambdalr_returns_lr")
    print(f"  optimizer lr after LambdaLR init: {kw['optimizer'].param_groups[0]['lr']:.1e} (meant: 1e-3)")


def keep_prob():
    kw = _kw("ai_dropout_keep_prob")
    d = [m for m in kw["model"] if isinstance(m, torch.nn.Dropout)][0]
    out = d(torch.ones(10000))
    print(f"  nn.Dropout(p={d.p}) in train mode zeroes {float((out == 0).float().mean()):.2f} of the units")


def relu_head():
    kw = _kw("ai_relu_output_head")
    _, y = _first(kw)
    print(f"  fraction of negative targets: {float((y < 0).float().mean()):.2f}; last module: {kw['model'][-2]}")


def per_row():
    kw = _kw("ai_per_row_standardize")
    x, _ = _first(kw)
    print(f"  row means after the Dataset: {x.mean(1)[:4].tolist()} (level erased)")


def sorted_split():
    kw = _kw("ai_class_sorted_split")
    ytr = kw["train_loader"].dataset.tensors[1]
    yva = kw["val_loader"].dataset.tensors[1]
    print("  train class counts:", torch.bincount(ytr, minlength=4).tolist(), "| val class counts:",
          torch.bincount(yva, minlength=4).tolist())


def unpaired_flip():
    from benchmarks.blind_preflight_ai.cases_data import FlipSeg
    x = torch.arange(16.).reshape(1, 1, 4, 4).repeat(200, 1, 1, 1)
    m = torch.arange(16).reshape(1, 4, 4).repeat(200, 1, 1)
    ds = FlipSeg(x, m, fixed=False)
    same = sum(bool(torch.equal(ds[i][0][0].long(), ds[i][1])) for i in range(200))
    print(f"  image and mask flipped alike in {same} of 200 draws")


def sorted_names():
    kw = _kw("ai_sorted_names_csv_labels")
    ds = kw["train_loader"].dataset
    print("  first sorted file names:", ds.names[:4], "paired with the CSV rows of scan_1 .. scan_4")


def sampler():
    kw = _kw("ai_sampler_class_weights")
    idx = list(iter(kw["train_loader"].sampler))
    print(f"  sampler weights: {len(kw['train_loader'].sampler.weights)} for {len(kw['train_loader'].dataset)} rows;"
          f" distinct indices drawn: {sorted(set(idx))}")


load_all()   # imports the case modules, which fill FIXES
for _name, _fn in {
    "ai_hwc_reshape_to_chw": hwc_reshape, "ai_seg_flatten_no_permute": seg_flatten, "ai_bilstm_hn_view": bilstm,
    "ai_collate_list_targets": collate_list, "ai_rating_broadcast_loss": rating_broadcast,
    "ai_mask_to_tensor_scaled": mask_scaled, "ai_label_codes_per_split": label_codes,
    "ai_raw_price_target": raw_price, "ai_multihot_crossentropy": multihot,
    "ai_forecast_target_last_input": forecast, "ai_fm_factors_plain_tensor": fm_plain,
    "ai_module_requires_grad_attr": module_attr, "ai_param_groups_miss_module": groups_miss,
    "ai_from_pretrained_frozen": from_pretrained, "ai_detach_in_forward": detach,
    "ai_linear_schedule_epochs": schedule_epochs, "ai_pure_bf16_weights": bf16_weights,
    "ai_lambdalr_returns_lr": lambdalr, "ai_dropout_keep_prob": keep_prob, "ai_relu_output_head": relu_head,
    "ai_per_row_standardize": per_row, "ai_class_sorted_split": sorted_split, "ai_unpaired_seg_flip": unpaired_flip,
    "ai_sorted_names_csv_labels": sorted_names, "ai_sampler_class_weights": sampler,
}.items():
    FIXES[_name]["fact"] = _fn
