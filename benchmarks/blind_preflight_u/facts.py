"""The fact each broken case of set u rests on, printed by verify.py before the case is trained next to its fix
(no preflight involved). Attached to FIXES[name]["fact"]."""

from __future__ import annotations

import importlib

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_u.registry import FIXES, load_all

load_all()                                   # registers the cases in family order before the modules are used here
shapes, targets, trained, mech, data = (importlib.import_module(f"benchmarks.blind_preflight_u.cases_{m}")
                                        for m in ("shapes", "targets", "trained", "mechanics", "data"))

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


@fact("gripper_frames_reshaped_not_permuted")
def _():
    x = torch.arange(2 * 2 * 3).reshape(1, 2, 2, 3)          # (N, H, W, C): pixel p has channels 3p, 3p+1, 3p+2
    print("  fact: red plane via reshape", x.reshape(1, 3, 2, 2)[0, 0].flatten().tolist(),
          "vs permute", x.permute(0, 3, 1, 2)[0, 0].flatten().tolist())


@fact("ssd_head_view_without_permute")
def _():
    out = torch.arange(6 * 2 * 2).reshape(1, 6, 2, 2)        # channel k holds 10*k-ish ids per cell
    print("  fact: scores of cell 0 / anchor 0 via view", out.view(1, -1, 3)[0, 0].tolist(),
          "vs permute", out.permute(0, 2, 3, 1).reshape(1, -1, 3)[0, 0].tolist())


@fact("pil_size_unpacked_as_h_w")
def _():
    from PIL import Image
    img = Image.new("L", (32, 16))
    print(f"  fact: a 16-high, 32-wide PIL image has .size {img.size}; `h, w = img.size` gives h={img.size[0]}, "
          f"w={img.size[1]}")


@fact("lane_logits_transpose_1_3")
def _():
    logits = torch.arange(2 * 3).reshape(1, 1, 2, 3).float()   # one class, H=2, W=3
    print("  fact: pixel order via transpose(1, 3)", logits.transpose(1, 3).reshape(-1).tolist(),
          "vs mask order", logits.permute(0, 2, 3, 1).reshape(-1).tolist())


@fact("slide_dice_softmax_last_axis")
def _():
    p = F.softmax(torch.randn(1, 3, 4, 4), dim=-1)
    print(f"  fact: softmax(dim=-1) sums over the classes at a pixel to {p.sum(1)[0, 0, 0].item():.2f} "
          f"and over the width to {p.sum(-1)[0, 0, 0].item():.2f}")


@fact("roof_mask_through_to_tensor")
def _():
    ds = targets.RoofTiles(4, 11, fixed=False)
    print("  fact: stored mask ids", np.unique(ds.masks).tolist(), "-> after to_tensor(...).long()",
          torch.unique(ds[0][1]).tolist())


@fact("leaf_ignore_index_zero")
def _():
    _, m = targets._leaf_scans(200, 13)
    print(f"  fact: class 0 (healthy tissue) is {(m == 0).float().mean().item():.0%} of pixels and ignore_index=0 "
          "drops every one of them from the loss")


@fact("parcel_coco_xywh_as_xyxy")
def _():
    ds = targets.ParcelCrops(300, 15, fixed=False)
    boxes = torch.stack([ds[i][1] for i in range(len(ds))])
    print(f"  fact: read as (x1, y1, x2, y2), {(boxes[:, 2] <= boxes[:, 0]).float().mean().item():.0%} of the COCO "
          "boxes have x2 <= x1")


@fact("swatch_folder_hidden_checkpoint_class")
def _():
    train = targets.SwatchFolder(targets._folder(2, 17, True), fixed=False)
    val = targets.SwatchFolder(targets._folder(2, 18, False), fixed=True)
    print("  fact: train class_to_idx", train.class_to_idx, "val class_to_idx", val.class_to_idx)


@fact("bolt_heatmap_meshgrid_ij")
def _():
    hm = targets.gaussian_heatmap(cx=12, cy=3, size=16, fixed=False)
    r, c = np.unravel_index(hm.argmax(), hm.shape)
    print(f"  fact: landmark at x=12, y=3 -> heatmap peak at row {r}, col {c} (should be row 3, col 12)")


@fact("material_head_swapped_after_optimizer")
def _():
    kw = trained.material_head()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: new head params in the optimizer: {sum(id(p) in held for p in kw['model'].head.parameters())}/2")


@fact("crop_band_mix_registered_as_buffer")
def _():
    m = trained.BandMixNet(fixed=False)
    print("  fact: 'mix' in parameters:", any(n == "mix" for n, _ in m.named_parameters()),
          "| in buffers:", any(n == "mix" for n, _ in m.named_buffers()))


@fact("lesion_numpy_dice_requires_grad")
def _():
    kw = trained.lesion_dice()
    x, mk = next(iter(kw["train_loader"]))
    loss = kw["loss_fn"](kw["model"], (x, mk))
    loss.backward()
    print(f"  fact: loss.grad_fn={loss.grad_fn}, weights with a gradient: "
          f"{sum(p.grad is not None for p in kw['model'].parameters())}")


@fact("wafer_pos_embedding_in_forward")
def _():
    m = trained.PatchAttention(fixed=False)
    x = torch.randn(2, 1, 16, 16)
    m(x)
    a = m.pos.detach().clone()
    m(x)
    print(f"  fact: pos changes between two forwards by {(m.pos - a).abs().mean().item():.2f} on average")


@fact("led_stage3_requires_grad_attribute")
def _():
    kw = trained.led_stage3()
    print("  fact: stage3 params requiring grad:", sum(p.requires_grad for p in kw["model"].stage3.parameters()),
          "of", len(list(kw["model"].stage3.parameters())))


@fact("trap_batchnorm_keras_momentum")
def _():
    bn = torch.nn.BatchNorm1d(1, momentum=0.99)
    bn(torch.full((4, 1), 5.0) + torch.randn(4, 1))
    bn(torch.full((4, 1), 1.0) + torch.randn(4, 1))
    print(f"  fact: after batches with means ~5 then ~1, running_mean={bn.running_mean.item():.2f} (last batch only)")


@fact("landcover_lambdalr_returns_lr")
def _():
    kw = mech.landcover_lambda()
    for _ in range(100):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  fact: lr after warm-up {kw['optimizer'].param_groups[0]['lr']:.2e} (meant {mech.BASE_LR:.0e})")


@fact("landcover_weights_cast_to_bf16")
def _():
    w = torch.tensor([0.25], dtype=torch.bfloat16)
    print(f"  fact: bf16 0.25 - 2e-4 = {(w - 2e-4).item()} (update lost); fp32 gives {0.25 - 2e-4}")


@fact("trap_batchnorm_microbatch_accumulation")
def _():
    x, _ = mech._exposures(2, 37)
    bn = torch.nn.BatchNorm2d(1)
    print(f"  fact: frame means {x.mean((1, 2, 3)).tolist()} -> after BatchNorm on the pair "
          f"{[round(v, 3) for v in bn(x).mean((1, 2, 3)).tolist()]}")


@fact("landcover_dropout_keep_prob")
def _():
    d = torch.nn.Dropout(0.9)
    print(f"  fact: nn.Dropout(0.9) keeps {(d(torch.ones(10000)) > 0).float().mean().item():.0%} of units")


@fact("harbour_flip_image_and_mask_separately")
def _():
    ds = data.HarbourScenes(200, 41, fixed=False, augment=True)
    bad = 0
    for i in range(len(ds)):
        img, mask = ds[i]
        bright = img.mean(0) > 0.7
        bad += int((bright == (mask == 1)).float().mean().item() < 0.95)
    print(f"  fact: {bad}/{len(ds)} augmented samples have image and mask disagreeing")


@fact("tomato_train_bgr_val_rgb")
def _():
    rgb = np.array([[[200, 30, 40]]], dtype=np.uint8)
    print("  fact: a red pixel", rgb[0, 0].tolist(), "is", data.imread_cv2(rgb)[0, 0].tolist(), "in training and",
          data.imread_pil(rgb)[0, 0].tolist(), "in validation")


@fact("blister_imagenet_stats_0_255_on_unit_range")
def _():
    ds = data.BlisterCells(100, 45, fixed=False)
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    print(f"  fact: inputs mean {x.mean().item():.3f}; spread within a channel (std) "
          f"{x.std((0, 2, 3)).mean().item():.4f}")


@fact("weld_uint16_counts_unscaled")
def _():
    ds = data.WeldTiles(50, 47, fixed=False)
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    print(f"  fact: dtype stored {ds.tiles.dtype}, network inputs mean {x.mean().item():.0f}, max {x.max().item():.0f}")


@fact("pose_flip_without_left_right_swap")
def _():
    ds = data.HandPoses(400, 49, fixed=False, augment=True)
    left_x = torch.stack([ds[i][1][0] for i in range(len(ds))])
    print(f"  fact: 'left wrist' target on the image's left half in {(left_x < 0.5).float().mean().item():.0%} of "
          "augmented samples (never in the raw data)")


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
