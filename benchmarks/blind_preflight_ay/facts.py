"""The fact each broken case of set ay rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from benchmarks.blind_preflight_ay.registry import CASES, FIXES, load_all


def first_batch(name):
    kw = CASES[name].build()
    return kw, next(iter(kw["train_loader"]))


def hflip_wrong_axis():
    img = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3)
    print("  pixel (0,0) before", img[0, 0], "after np.flip(axis=-1)", np.flip(img, axis=-1)[0, 0],
          "after np.flip(axis=1)", np.flip(img, axis=1)[0, 0])


def count_head_broadcast():
    kw, (x, y) = first_batch("count_head_broadcast")
    out = kw["model"](x)
    print("  output", tuple(out.shape), "target", tuple(y.shape), "broadcast", tuple((out - y).shape))


def multicrop_labels_repeat():
    y = torch.tensor([0, 1, 2])
    print("  labels", y.tolist(), "repeat(5)", y.repeat(5).tolist(), "repeat_interleave(5)",
          y.repeat_interleave(5).tolist())


def keypoint_target_extra_dim():
    kw, (x, y) = first_batch("keypoint_target_extra_dim")
    out = kw["model"](x)
    print("  output", tuple(out.shape), "target", tuple(y.shape), "broadcast", tuple((out - y).shape))


def smoothing_scatter_dim0():
    y = torch.tensor([2, 0, 3, 1])
    t = torch.zeros(4, 4)
    print("  scatter_(0):", t.clone().scatter_(0, y.unsqueeze(1), 1.0).tolist(), "scatter_(1):",
          t.clone().scatter_(1, y.unsqueeze(1), 1.0).tolist())


def class_to_idx_folder_order():
    from benchmarks.blind_preflight_ay.cases_targets import FOLDERS_LISTDIR
    print("  train", {c: i for i, c in enumerate(sorted(FOLDERS_LISTDIR))}, "val",
          {c: i for i, c in enumerate(FOLDERS_LISTDIR)})


def mixup_weights_swapped():
    print("  lam=0.9: image is 0.9 x + 0.1 x[perm]; broken label weights 0.1 on y, 0.9 on y[perm]")


def count_targets_scaled_train_only():
    kw = CASES["count_targets_scaled_train_only"].build()
    print("  train target max", float(kw["train_loader"].dataset.tensors[1].max()), "val target max",
          float(kw["val_loader"].dataset.tensors[1].max()))


def poisson_log_input_default():
    print("  PoissonNLLLoss().log_input =", nn.PoissonNLLLoss().log_input,
          "-> minimiser exp(out) = count, i.e. out = log(count): count 8 read as", round(float(np.log(8)), 2))


def hflip_changes_label():
    from benchmarks.blind_preflight_ay.registry import arrows
    img, y = arrows(4, s=0)
    print("  label", int(y[0]), "brightness along the bar", img[0].mean((0, 2)).round()[::3].tolist())


def optimizer_before_new_head():
    kw = CASES["optimizer_before_new_head"].build()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  head weight in optimizer:", id(kw["model"].fc.weight) in ids,
          "trainable tensors:", sum(p.requires_grad for p in kw["model"].parameters()))


def optimizer_on_discarded_model():
    kw = CASES["optimizer_on_discarded_model"].build()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  model tensors in optimizer:", sum(id(p) in ids for p in kw["model"].parameters()), "of",
          len(list(kw["model"].parameters())))


def head_created_in_forward():
    kw = CASES["head_created_in_forward"].build()
    print("  registered parameters named head:", [n for n, _ in kw["model"].named_parameters() if "head" in n])


def stages_in_python_list():
    kw = CASES["stages_in_python_list"].build()
    print("  model.parameters():", [n for n, _ in kw["model"].named_parameters()])


def features_detached_from_scratch():
    kw, (x, y) = first_batch("features_detached_from_scratch")
    nn.CrossEntropyLoss()(kw["model"](x), y).backward()
    print("  backbone grads None:", all(p.grad is None for p in kw["model"].backbone.parameters()))


def steplr_epochs_stepped_per_batch():
    kw = CASES["steplr_epochs_stepped_per_batch"].build()
    opt, sch = kw["optimizer"], kw["scheduler"]
    for _ in range(50):
        opt.step()
        sch.step()
    print("  lr after 50 batches:", opt.param_groups[0]["lr"])


def zero_init_all_weights():
    kw = CASES["zero_init_all_weights"].build()
    print("  max |weight| per layer:", [round(float(m.weight.abs().max()), 3) for m in kw["model"].modules()
                                        if isinstance(m, (nn.Conv2d, nn.Linear))])


def bn_momentum_zero_from_scratch():
    kw, (x, y) = first_batch("bn_momentum_zero_from_scratch")
    kw["model"](x)
    bn = kw["model"].stem[1]
    print("  stem BN running_mean after a train-mode batch:", bn.running_mean[:4].tolist(), "momentum", bn.momentum)


def sigmoid_before_cross_entropy():
    p = torch.sigmoid(torch.tensor([[8.0, -8.0, -8.0, -8.0]]))
    print("  best-case sigmoid scores", p.tolist(), "softmax of them", p.softmax(1).tolist())


def param_group_learning_rate_key():
    kw = CASES["param_group_learning_rate_key"].build()
    print("  head group:", {k: v for k, v in kw["optimizer"].param_groups[1].items() if k != "params"})


def bgr_train_rgb_val():
    kw, (x, y) = first_batch("bgr_train_rgb_val")
    print("  train red-class blob pixel channel max (R,G,B):", x[y == 0].amax((0, 2, 3)).tolist())


def imagenet_stats_on_0_255():
    kw, (x, y) = first_batch("imagenet_stats_on_0_255")
    print("  input range", float(x.min()), float(x.max()))


def hue_jitter_on_colour_classes():
    print("  np.roll(red, 1, axis=-1) =", np.roll(np.array([220, 40, 40]), 1).tolist(), "(green-ish is (40, 220, 40))")


def paths_shuffled_without_labels():
    import random
    paths, labels = ["a.png", "b.png", "c.png"], [0, 1, 2]
    random.Random(0).shuffle(paths)
    print("  after random.shuffle(paths):", list(zip(paths, labels)))


def val_transform_missing_normalize():
    kw = CASES["val_transform_missing_normalize"].build()
    print("  train input mean", round(float(kw["train_loader"].dataset.tensors[0].mean()), 3), "val input mean",
          round(float(kw["val_loader"].dataset.tensors[0].mean()), 3))


load_all()
for _name, _spec in FIXES.items():
    _spec["fact"] = globals()[_name]
