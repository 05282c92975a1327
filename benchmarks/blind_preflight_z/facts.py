"""The fact each broken case of set z rests on, printed by ``verify.py`` before the case is trained next to its fix.
Importing this module attaches each function to its entry of ``registry.FIXES``."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_z import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_z.registry import FIXES


def gru_hn_view_batch_mixing():
    h = torch.arange(2 * 3).reshape(2, 3, 1).expand(2, 3, 2)  # layer l, sample b -> value 3*l + b
    print("  h_n (layers=2, batch=3) rows after view(3, -1):", h.reshape(3, -1)[:, ::2].tolist(),
          "| after permute(1, 0, 2):", h.permute(1, 0, 2).reshape(3, -1)[:, ::2].tolist())


def hwc_image_view_not_permute():
    img = torch.zeros(16, 16, 3)
    img[..., 0] = 1.0  # a pure red image
    v, p = img.view(3, 16, 16), img.permute(2, 0, 1)
    print(f"  red image: channel sums with view {v.sum((1, 2)).tolist()}, with permute {p.sum((1, 2)).tolist()}")


def seq_logits_view_for_ce():
    logits = torch.arange(2 * 3).reshape(1, 2, 3)  # (B=1, T=2, C=3): value = t * 3 + c
    print("  (B,T,C) values t*3+c, read at [0, c, t] after view:", logits.view(1, 3, 2)[0].tolist(),
          "after permute:", logits.permute(0, 2, 1)[0].tolist())


def conv1d_over_channels_not_time():
    m = cases_shapes.FaultCNN(fixed=False)
    print(f"  Conv1d in_channels={m.conv[0].in_channels} (the window length), kernel slides over "
          f"{cases_shapes.SENSORS} positions (the sensors), not over {cases_shapes.WIN} time steps")


def posenc_seq_first_on_batch_first():
    x = torch.zeros(8, cases_shapes.ORD_LEN, 32)
    buggy = cases_shapes.PositionalEncoding(32)(x)[0]
    fixed = cases_shapes.PositionalEncoding(32, fixed=True)(x)[0]
    print(f"  largest difference of the added encoding between positions of one sample: buggy "
          f"{(buggy - buggy[:1]).abs().max().item():.3g}, fixed {(fixed - fixed[:1]).abs().max().item():.3g}")


def bce_mask_values_0_255():
    x = torch.tensor([0.0, 5.0, 50.0])
    print("  BCEWithLogits(logit, target=255) at logits 0, 5, 50:",
          [round(F.binary_cross_entropy_with_logits(v, torch.tensor(255.0)).item(), 1) for v in x])


def hf_num_labels_one_for_binary():
    m = cases_targets._bert(1)
    print(f"  num_labels=1 -> logits of width {m.classifier.out_features}; argmax over one column is always 0; "
          "Transformers uses MSELoss when num_labels == 1")


def unscaled_price_targets():
    kw = cases_targets.unscaled_price_targets()
    x, y = next(iter(kw["train_loader"]))
    print(f"  target mean {y.mean().item():.3g}, initial prediction mean {kw['model'](x).mean().item():.3g}; "
          "Adam moves each weight by about lr=1e-3 per step")


def multilabel_with_crossentropy():
    logits = torch.tensor([[3.0, 3.0, -3.0]])
    soft = [round(v, 2) for v in torch.softmax(logits, 1)[0].tolist()]
    sig = [round(v, 2) for v in torch.sigmoid(logits)[0].tolist()]
    print(f"  two true genres, logits {logits[0].tolist()}: softmax {soft} (each below 0.5+) vs sigmoid {sig}")


def class_weights_are_frequencies():
    kw = cases_targets.class_weights_are_frequencies()
    print(f"  CrossEntropyLoss weight = {[round(v, 3) for v in kw['loss_fn'].weight.tolist()]} (the class "
          "frequencies: the rare urgent class weighs least)")


def heads_shared_by_list_multiplication():
    m = cases_trained.PropertyNet()
    print(f"  heads[0] is heads[2]: {m.heads[0] is m.heads[2]}; distinct head parameters: "
          f"{len(list(m.heads.parameters()))} tensors for 3 heads")


def module_requires_grad_attribute():
    kw = cases_trained.module_requires_grad_attribute()
    m = kw["model"]
    print(f"  block3.requires_grad attribute={m.encoder.block3.requires_grad}, its parameters: "
          f"{[p.requires_grad for p in m.encoder.block3.parameters()]}")


def state_dict_module_prefix_strict_false():
    ckpt, _, _ = cases_trained._pretrained_and_data(10)
    res = cases_trained.Backbone().load_state_dict(ckpt, strict=False)
    print(f"  strict=False: {len(res.unexpected_keys)} unexpected keys (e.g. {res.unexpected_keys[0]}), "
          f"{len(res.missing_keys)} missing -> nothing loaded")


def embedding_from_pretrained_frozen():
    e = nn.Embedding.from_pretrained(torch.randn(5, 3))
    print(f"  nn.Embedding.from_pretrained(...).weight.requires_grad = {e.weight.requires_grad}")


def optimizer_only_encoder_params():
    kw = cases_trained.optimizer_only_encoder_params()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    dec = list(kw["model"].decoder.parameters())
    print(f"  decoder parameters in the optimizer: {sum(id(p) in in_opt for p in dec)}/{len(dec)}")


def loss_rewrapped_in_new_tensor():
    kw = cases_mechanics.loss_rewrapped_in_new_tensor()
    loss = kw["loss_fn"](kw["model"], next(iter(kw["train_loader"])))
    loss.backward()
    print(f"  loss.grad_fn={loss.grad_fn}; model grads after backward: "
          f"{[p.grad is not None for p in kw['model'].parameters()][:2]}...")


def lambdalr_returns_lr_not_factor():
    kw = cases_mechanics.lambdalr_returns_lr_not_factor()
    opt, sched = kw["optimizer"], kw["scheduler"]
    for _ in range(30):
        opt.step()
        sched.step()
    print(f"  effective lr after warm-up: {opt.param_groups[0]['lr']:.2g} (meant {cases_mechanics.BASE_LR:g})")


def pure_bf16_weights_adam():
    w = torch.tensor([0.2], dtype=torch.bfloat16)
    print(f"  in bf16: 0.2 + 2e-4 == 0.2 is {(w + 2e-4).item() == w.item()}; the bf16 spacing near 0.2 is "
          f"2**-3 * 2**-7 = {2 ** -10:.2g}, so an Adam step of ~2e-4 rounds away")


def hidden_detached_every_timestep():
    cell = nn.GRUCell(2, 4)
    x = torch.randn(1, 3, 2, requires_grad=True)
    h = torch.zeros(1, 4)
    for t in range(3):
        h = cell(x[:, t], h).detach() if t < 2 else cell(x[:, t], h)
    h.sum().backward()
    print(f"  grad reaching step 0 input through detached h: {x.grad[0, 0].abs().sum().item():.3g}, "
          f"last step: {x.grad[0, 2].abs().sum().item():.3g}")


def dropout_keep_prob_as_p():
    d = nn.Dropout(cases_mechanics.KEEP_PROB)
    torch.manual_seed(0)
    print(f"  nn.Dropout(p={cases_mechanics.KEEP_PROB}) keeps {(d(torch.ones(10000)) > 0).float().mean().item():.2f} "
          "of the units")


def val_split_not_standardized():
    kw = cases_data.val_split_not_standardized()
    xt, _ = next(iter(kw["train_loader"]))
    xv, _ = next(iter(kw["val_loader"]))
    print(f"  train feature std {xt.std(0).mean().item():.2g}, val feature std {xv.std(0).mean().item():.3g}")


def class_sorted_without_shuffle():
    kw = cases_data.class_sorted_without_shuffle()
    labels = [b[1].unique().tolist() for b in list(kw["train_loader"])[:25:6]]
    print(f"  classes in batches 0, 6, 12, 18, 24: {labels}")


def dummies_encoded_per_split():
    oh, cats = cases_data.get_dummies(["Berlin", "Cologne", "Berlin"])
    print(f"  validation dummies columns {cats} vs training {cases_data.CITIES}: 'Berlin' lands in the "
          f"'{cases_data.CITIES[int(np.argmax(oh[0]))]}' column")


def hflip_augment_direction_labels():
    img, y = cases_data._arrows(1, 36)
    flipped = torch.flip(img[0], dims=[2])
    print(f"  label {y.item()} (0=left, 1=right); flip moves the bright column from "
          f"{int(img[0, 0].sum(0).argmax())} to {int(flipped[0].sum(0).argmax())}, label kept")


def filenames_sorted_lexicographically():
    names = [f"img_{i}.npy" for i in range(12)]
    print(f"  sorted(): {sorted(names)[:5]} ... (position 2 holds img_10, label of img_2)")


for _name, _fn in list(globals().items()):
    if _name in FIXES and callable(_fn):
        FIXES[_name]["fact"] = _fn
