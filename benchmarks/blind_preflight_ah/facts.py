"""The fact each broken case of set ah rests on, printed by verify.py before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to FIXES[name]["fact"]."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_ah.registry import FIXES, load_all

CASES = load_all()  # imports the case modules in family order (shapes, targets, trained, mechanics, data, healthy)

from benchmarks.blind_preflight_ah import cases_data as D  # noqa: E402
from benchmarks.blind_preflight_ah import cases_mechanics as M  # noqa: E402
from benchmarks.blind_preflight_ah import cases_shapes as S  # noqa: E402
from benchmarks.blind_preflight_ah import cases_targets as T  # noqa: E402
from benchmarks.blind_preflight_ah import cases_trained as W  # noqa: E402

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


def first_batch(kw):
    return next(iter(kw["train_loader"]))

# ---------------------------------------------------------------- shapes


@fact("ah_seg_logits_view_without_permute")
def _():
    logits = torch.arange(2 * 3 * 4 * 4).view(2, 3, 4, 4)
    rows = logits.view(-1, 3)
    right = logits.permute(0, 2, 3, 1).reshape(-1, 3)
    print(f"  fact: view(-1, 3) row 0 = {rows[0].tolist()} (3 pixels of channel 0); "
          f"permute(0, 2, 3, 1) row 0 = {right[0].tolist()} (3 classes of pixel 0)")


@fact("ah_gru_final_state_view_mixes_samples")
def _():
    kw = S.gru_hidden_view()
    x, _ = first_batch(kw)
    _, h_n = kw["model"].gru(x)
    marked = torch.arange(x.size(0)).view(1, -1, 1).expand(4, -1, h_n.size(2)).float()  # state = its sample id
    rows = marked.reshape(x.size(0), -1)
    print(f"  fact: h_n {tuple(h_n.shape)}; after .view(B, -1) row 0 holds the states of samples "
          f"{sorted(set(rows[0].long().tolist()))}, row 1 of {sorted(set(rows[1].long().tolist()))}")


@fact("ah_lstm_last_step_is_padding")
def _():
    tok, lengths, _ = S.reviews(1024, 5)
    print(f"  fact: review lengths {int(lengths.min())}-{int(lengths.max())} padded to {tok.size(1)}; "
          f"output[:, -1] is a padding step for {(tok[:, -1] == S.PAD).float().mean():.0%} of the reviews")


@fact("ah_mf_scores_outer_product")
def _():
    kw = S.mf_outer_product()
    u, i, r = first_batch(kw)
    print(f"  fact: model(users, items) has shape {tuple(kw['model'](u, i).shape)} for ratings {tuple(r.shape)}: "
          f"the loss broadcasts each user's row against every rating of the batch")


@fact("ah_conv1d_slides_over_features")
def _():
    kw = S.conv1d_over_features()
    conv = kw["model"].conv[0]
    x, _ = first_batch(kw)
    print(f"  fact: input {tuple(x.shape)} (batch, time, features) into Conv1d(in_channels={conv.in_channels}): "
          f"the kernel of width {conv.kernel_size[0]} slides over the {x.size(2)} features")

# ---------------------------------------------------------------- targets


@fact("ah_mask_scaled_by_to_tensor")
def _():
    kw = T.mask_to_tensor()
    ds = kw["train_loader"].dataset
    raw = torch.from_numpy(ds.masks[:50]).unique().tolist()
    seen = torch.cat([ds[i][1].unique() for i in range(50)]).unique().tolist()
    print(f"  fact: raw mask values {raw}; after to_tensor(...).long() {seen} (1/255 and 2/255 truncate to 0)")


@fact("ah_forecast_target_shifted_backwards")
def _():
    x, y = T.load_windows(T.load_curve(3000, 45), 24, 1)
    print(f"  fact: with shift(1) the label equals input column -2 for "
          f"{torch.isclose(y[:, 0], x[:, -2]).float().mean():.0%} of the windows (a copy of the hour before last)")


@fact("ah_ignore_index_drops_real_tag")
def _():
    tags = torch.cat([t for _, t in T.tag_sentences(900, 27)])
    print(f"  fact: tag 0 is {(tags == 0).float().mean():.0%} of the real tokens, all of them ignored by "
          f"CrossEntropyLoss(ignore_index=0)")


@fact("ah_bce_targets_minus_one_plus_one")
def _():
    y = T.credit(2000, 31)[1]
    loss = F.binary_cross_entropy_with_logits(torch.tensor([-5.0, -20.0]), torch.tensor([-1.0, -1.0]), reduction="none")
    print(f"  fact: labels {y.unique().tolist()}; BCEWithLogits for target -1 at logits -5 / -20: "
          f"{loss[0]:.2f} / {loss[1]:.2f} (unbounded below)")


@fact("ah_relu_output_on_standardised_target")
def _():
    y = T.demand(2000, 43)[1]
    print(f"  fact: {(y < 0).float().mean():.0%} of the standardised targets are negative; a ReLU output is >= 0")

# ---------------------------------------------------------------- what is trained


@fact("ah_hook_features_detached_backbone")
def _():
    kw = W.hook_detach()
    x, y = first_batch(kw)
    F.cross_entropy(kw["model"](x), y).backward()
    grads = [p.grad for p in kw["model"].backbone.parameters()]
    print(f"  fact: after backward, {sum(g is None for g in grads)}/{len(grads)} backbone tensors have grad None; "
          f"head grad norm {kw['model'].head.weight.grad.norm():.3f}")


@fact("ah_input_layer_built_in_forward")
def _():
    kw = W.layer_in_forward()
    x, _ = first_batch(kw)
    with torch.no_grad():
        diff = (kw["model"](x) - kw["model"](x)).abs().max()
    print(f"  fact: two forward passes of the same batch differ by up to {diff:.3f}; the optimizer holds "
          f"{sum(p.numel() for g in kw['optimizer'].param_groups for p in g['params'])} parameters, none of the "
          f"input layer's")


@fact("ah_optimizer_holds_old_model")
def _():
    kw = W.model_rebuilt()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: {sum(id(p) in held for p in kw['model'].parameters())} of the model's "
          f"{len(list(kw['model'].parameters()))} parameter tensors are in the optimizer")


@fact("ah_optimizer_only_on_classifier")
def _():
    kw = W.head_only_optimizer()
    held = sum(p.numel() for g in kw["optimizer"].param_groups for p in g["params"])
    print(f"  fact: the optimizer holds {held} of the model's {sum(p.numel() for p in kw['model'].parameters())} "
          f"parameters (model.fc only)")


@fact("ah_task_heads_one_shared_module")
def _():
    heads = W.shared_heads()["model"].heads
    print(f"  fact: heads[0] is heads[1] is heads[2]: {heads[0] is heads[1] is heads[2]}; "
          f"{len(list(heads.parameters()))} head tensors instead of 6")

# ---------------------------------------------------------------- mechanics


@fact("ah_lambdalr_returns_lr_not_factor")
def _():
    kw = M.lambdalr_absolute()
    print(f"  fact: after LambdaLR(...) the optimizer lr is {kw['optimizer'].param_groups[0]['lr']:.1e} "
          f"(base lr {kw['optimizer'].param_groups[0]['initial_lr']:.0e})")


@fact("ah_adam_with_adadelta_lr_1")
def _():
    kw = M.adam_lr_one()
    model, opt = kw["model"], kw["optimizer"]
    x, y = first_batch(kw)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 1))
    print(f"  fact: Adam lr={opt.param_groups[0]['lr']}: losses of the first 5 steps on one batch {losses}")


@fact("ah_weights_cast_to_bf16")
def _():
    kw = M.pure_bf16()
    model, opt = kw["model"], kw["optimizer"]
    x, y = first_batch(kw)
    before = [p.detach().clone() for p in model.parameters()]
    F.cross_entropy(model(x).float(), y).backward()
    opt.step()
    same = sum((p == b).sum().item() for p, b in zip(model.parameters(), before))
    total = sum(p.numel() for p in model.parameters())
    print(f"  fact: after one AdamW step at lr 2e-4, {same / total:.0%} of the bf16 weights are bit-identical")


@fact("ah_batchnorm_with_micro_batches_of_2")
def _():
    bn = torch.nn.BatchNorm1d(3)
    out = bn(torch.tensor([[5.0, 0.1, -2.0], [7.0, 0.3, 9.0]]))
    print(f"  fact: BatchNorm1d on a batch of 2 outputs {out.detach().round(decimals=2).tolist()} whatever the values")


@fact("ah_all_weights_zero_initialised")
def _():
    kw = M.zero_init()
    x, y = first_batch(kw)
    F.cross_entropy(kw["model"](x), y).backward()
    grads = {n: round(p.grad.abs().max().item(), 4) for n, p in kw["model"].named_parameters()}
    print(f"  fact: max |grad| per tensor after one backward: {grads}")

# ---------------------------------------------------------------- data


@fact("ah_split_of_label_sorted_rows")
def _():
    kw = D.sorted_split()
    ytr = kw["train_loader"].dataset.tensors[1]
    yv = kw["val_loader"].dataset.tensors[1]
    print(f"  fact: classes in train {ytr.unique().tolist()}, in val {yv.unique().tolist()}")


@fact("ah_image_and_mask_flipped_independently")
def _():
    x, m = D.markings(64, 611)
    ds = D.MarkingDataset(x, m, augment=True)
    torch.manual_seed(0)
    import random
    random.seed(0)
    mismatched = 0
    for i in range(64):
        img, mask = ds[i]
        mismatched += not (((img[0] > 0.75) == (mask == 1)).float().mean() > 0.9)
    print(f"  fact: {mismatched}/64 augmented pairs have the mask mirrored relative to the image")


@fact("ah_features_standardised_per_row")
def _():
    x = D.row_standardised()["train_loader"].dataset.tensors[0]
    print(f"  fact: after per-row scaling, the per-column std is {[round(v, 4) for v in x.std(0).tolist()]}")


@fact("ah_label_index_built_per_clinic")
def _():
    kw = D.per_clinic_index()
    a, b = kw["train_loader"].dataset.datasets
    print(f"  fact: clinic A class_to_idx {a.class_to_idx}; clinic B {b.class_to_idx}")


@fact("ah_getitem_normalises_in_place")
def _():
    kw = D.inplace_normalise()
    ds = kw["train_loader"].dataset
    print(f"  fact: stored data mean {ds.x.mean():.2f} std {ds.x.std():.2f}", end="")
    for epoch in (1, 2, 3):
        for i in range(len(ds)):
            ds[i]
        print(f"; after epoch {epoch}: mean {ds.x.mean():.2f} std {ds.x.std():.4f}", end="")
    print()


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
