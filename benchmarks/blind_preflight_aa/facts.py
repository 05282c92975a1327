"""Set aa: the fact each broken case rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to ``FIXES[name]['fact']``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_aa.cases_data import FruitDataset, arrow_templates, pil_open
from benchmarks.blind_preflight_aa.registry import CASES, FIXES, load_all


def _kw(name: str, fixed: bool = False):
    load_all()
    return (FIXES[name]["fixed"] if fixed else CASES[name].build)()


def _first(kw):
    return next(iter(kw["train_loader"]))


def seg_logits_view_nchw():
    logits = torch.arange(2 * 3 * 2 * 2).float().reshape(2, 3, 2, 2)     # (N, C, H, W), value = position
    print("  logits.view(-1, 3)[0] =", logits.view(-1, 3)[0].tolist(), "(three pixels of class map 0);",
          "permute(0, 2, 3, 1).reshape(-1, 3)[0] =", logits.permute(0, 2, 3, 1).reshape(-1, 3)[0].tolist(),
          "(one pixel, three classes)")


def keypoint_softargmax_axis():
    h = torch.randn(1, 3, 256)
    print("  softmax(dim=1) sums over the 256 pixels of a heatmap to", round(F.softmax(h, 1).sum(-1)[0, 0].item(), 1),
          "instead of 1 (dim=-1 gives", round(F.softmax(h, -1).sum(-1)[0, 0].item(), 3), ")")


def crnn_spectrogram_reshape():
    x = torch.arange(8 * 8 * 48).reshape(1, 8, 8, 48)                     # (N, C, F', T), value = flat index
    step = x.reshape(1, 48, 64)[0, 0]
    print("  reshape(N, T, C*F')[0, 0] holds time indices", sorted({int(v) % 48 for v in step})[:6], "... (",
          len({int(v) % 48 for v in step}), "different frames in one 'time step')")


def bigru_hidden_view():
    kw = _kw("bigru_hidden_view")
    x, _ = _first(kw)
    _, h = kw["model"].gru(x)
    print("  h_n shape", tuple(h.shape), "with batch_first=True; h_n.view(N, -1)[1, :16] equals h_n[0, 2]:",
          bool(torch.equal(h.view(x.size(0), -1)[1, :16], h[0, 2])))


def conv1d_time_as_channels():
    kw = _kw("conv1d_time_as_channels")
    x, _ = _first(kw)
    conv = kw["model"].features[0]
    print("  input", tuple(x.shape), "(N, T, C); first Conv1d in_channels =", conv.in_channels,
          "so it slides over", x.shape[-1], "positions (the sensor axes)")


def mask_totensor_scaled():
    kw = _kw("mask_totensor_scaled")
    _, mask = _first(kw)
    print("  unique target values in a training batch:", mask.unique().tolist(),
          "| fixed:", _first(_kw("mask_totensor_scaled", True))[1].unique().tolist())


def keypoint_flip_no_swap():
    kw = _kw("keypoint_flip_no_swap")
    ds = kw["train_loader"].dataset
    torch.manual_seed(1)
    left_x = torch.stack([ds[i][1][0] for i in range(200)])
    print("  x of 'left eye' target over 200 training samples: %.0f%% on the right half of the image"
          % (100 * (left_x > 7.5).float().mean()))


def sigmoid_head_pixel_targets():
    kw = _kw("sigmoid_head_pixel_targets")
    _, boxes = _first(kw)
    print("  target range %.1f-%.1f px; nn.Sigmoid output range (0, 1)" % (boxes.min(), boxes.max()))


def window_label_index():
    kw = _kw("window_label_index")
    ds = kw["train_loader"].dataset
    dataset_y = torch.stack([ds[i][1] for i in range(len(ds))])
    true_y = torch.stack([ds.labels[i * ds.stride + ds.window // 2] for i in range(len(ds))])
    print("  training windows whose label is the label at their own centre: %.0f%%"
          % (100 * (dataset_y == true_y).float().mean()), "| label counts:", torch.bincount(dataset_y, minlength=4).tolist())


def mask_bilinear_resize():
    kw = _kw("mask_bilinear_resize")
    ds = kw["train_loader"].dataset
    bil = torch.stack([ds[i][1] for i in range(64)])
    near = torch.stack([F.interpolate(ds.masks[i][None, None].float(), size=(16, 16), mode="nearest")[0, 0].long()
                        for i in range(64)])
    print("  class-2 pixels (nearest): %d, of which labelled 2 after bilinear + .long(): %d"
          % ((near == 2).sum(), ((near == 2) & (bil == 2)).sum()))


def head_swapped_after_optimizer():
    kw = _kw("head_swapped_after_optimizer")
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  model.fc.weight in the optimizer:", id(kw["model"].fc.weight) in in_opt,
          "| optimizer tensors that are in the model:",
          sum(id(p) in in_opt for p in kw["model"].parameters()))


def rezero_gate_plain_tensor():
    kw = _kw("rezero_gate_plain_tensor")
    names = [n for n, _ in kw["model"].named_parameters()]
    print("  'alpha' among named_parameters():", any("alpha" in n for n in names),
          "| block 0 alpha =", kw["model"].blocks[0].alpha.item())


def round_in_forward_count():
    x = torch.tensor([2.3], requires_grad=True)
    torch.round(x * 2).sum().backward()
    print("  d round(2x) / dx =", x.grad.item())


def ae_optimizer_decoder_only():
    kw = _kw("ae_optimizer_decoder_only")
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    enc = list(kw["model"].encoder.parameters())
    print("  encoder tensors in the optimizer: %d of %d" % (sum(id(p) in in_opt for p in enc), len(enc)))


def freeze_by_name_fc_vs_classifier():
    kw = _kw("freeze_by_name_fc_vs_classifier")
    print("  trainable:", [n for n, p in kw["model"].named_parameters() if p.requires_grad])


def focal_loss_missing_minus():
    p = torch.tensor([0.1, 0.5, 0.9])
    print("  (1 - p)^2 * log(p) for p =", p.tolist(), "->", [round(v, 3) for v in ((1 - p) ** 2 * p.log()).tolist()],
          "(lowest when p -> 0)")


def lambdalr_absolute_lr():
    kw = _kw("lambdalr_absolute_lr")
    for _ in range(100):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print("  lr after 100 steps:", kw["optimizer"].param_groups[0]["lr"])


def constant_init_symmetry():
    kw = _kw("constant_init_symmetry")
    w = kw["model"].features[0].weight
    print("  distinct first-layer filters after init:", torch.unique(w.detach().reshape(w.shape[0], -1), dim=0).shape[0],
          "of", w.shape[0])


def dice_on_logits():
    logits = torch.full((1, 16, 16), -0.3)
    mask = torch.zeros(1, 16, 16)
    mask[0, :4, :4] = 1
    print("  denominator pred.sum() + mask.sum() + 1 on logits of -0.3: %.1f" % (logits.sum() + mask.sum() + 1))


def onecycle_steps_per_epoch_dataset():
    kw = _kw("onecycle_steps_per_epoch_dataset")
    lrs = []
    for _ in range(kw["max_steps"]):
        kw["optimizer"].step()
        kw["scheduler"].step()
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
    print("  total_steps %d for a %d-step run; peak LR reached %.2e (max_lr 3e-3)"
          % (kw["scheduler"].total_steps, kw["max_steps"], max(lrs)))


def image_mask_separate_random():
    kw = _kw("image_mask_separate_random")
    ds = kw["train_loader"].dataset
    torch.manual_seed(2)
    aligned = 0
    for i in range(64):
        img, mask = ds[i]
        aligned += float(((img[0] > 0.6) == (mask[0] > 0.5)).float().mean() > 0.9)
    print("  training pairs whose mask still lies on the image: %d / 64" % aligned)


def hflip_left_right_classes():
    t = arrow_templates()
    print("  the horizontally flipped 'left' template equals the 'right' template:", bool(torch.equal(t[0].flip(-1), t[1])),
          "| flipped 'up' equals 'up':", bool(torch.equal(t[2].flip(-1), t[2])))


def per_window_znorm():
    kw = _kw("per_window_znorm")
    ds = kw["train_loader"].dataset
    stds = [torch.stack([ds.x[i] for i in range(len(ds)) if ds.y[i] == c]).std().item() for c in range(3)]
    after = [torch.stack([ds[i][0] for i in range(len(ds)) if ds.y[i] == c]).std().item() for c in range(3)]
    print("  per-class std before:", [round(s, 2) for s in stds], "after per-window z-norm:", [round(s, 2) for s in after])


def bgr_train_rgb_val():
    kw = _kw("bgr_train_rgb_val")
    tr = kw["train_loader"].dataset
    i = int((tr.y == 0).nonzero()[0])
    print("  a red training photo's channel means (train reader):", [round(v, 2) for v in tr[i][0].mean((1, 2)).tolist()],
          "| same photo through the validation reader:",
          [round(v, 2) for v in FruitDataset(tr.store, tr.y, pil_open)[i][0].mean((1, 2)).tolist()])


def postpad_last_step():
    kw = _kw("postpad_last_step")
    x, lengths, _ = _first(kw)
    print("  batch padded to %d steps; sessions of length %d-%d: out[:, -1] follows up to %d padding steps"
          % (x.shape[1], lengths.min(), lengths.max(), x.shape[1] - lengths.min()))


load_all()
for _name in FIXES:
    FIXES[_name]["fact"] = globals()[_name]
