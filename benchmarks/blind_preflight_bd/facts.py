"""The fact each of set bd's broken cases rests on, printed before verify trains it (no preflight involved)."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import default_collate

from benchmarks.blind_preflight_bd import synth
from benchmarks.blind_preflight_bd.registry import FIXES, load_all

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


@fact("seg_hwc_to_chw_transpose_swaps_hw")
def _():
    img = np.zeros((32, 32, 3), np.float32)
    img[2, 20] = 1
    a, b = img.transpose(2, 1, 0), img.transpose(2, 0, 1)
    print("  fact: HWC pixel (row 2, col 20) lands at", tuple(int(v) for v in np.argwhere(a[0])[0]),
          "after transpose(2, 1, 0), at", tuple(int(v) for v in np.argwhere(b[0])[0]), "after transpose(2, 0, 1)")


@fact("seg_channels_last_logits_reshaped_not_permuted")
def _():
    x = torch.arange(2 * 2 * 3).view(1, 2, 2, 3)     # (N, H, W, C): pixel p's classes are 3p..3p+2
    print("  fact: class-0 map after reshape:", x.reshape(1, 3, 2, 2)[0, 0].tolist(), "after permute:",
          x.permute(0, 3, 1, 2)[0, 0].tolist())


@fact("kp_heatmap_flat_index_x_times_w")
def _():
    hm = torch.zeros(1, 16, 16)
    hm[0, 3, 10] = 1                                  # y = 3, x = 10
    print("  fact: flatten index of (y=3, x=10) is", int(hm.flatten(1).argmax()), "= y*W+x; x*W+y =", 10 * 16 + 3)


@fact("box_list_collated_then_reshaped")
def _():
    batch = default_collate([(0, [1.0, 2.0, 3.0, 4.0]), (1, [5.0, 6.0, 7.0, 8.0])])[1]
    print("  fact: default_collate gives", len(batch), "tensors of shape", tuple(batch[0].shape),
          "; stack().reshape(-1, 4) =", torch.stack(batch).reshape(-1, 4).tolist())


@fact("cox_risk_column_times_event_row")
def _():
    print("  fact: (N, 1) * (N,) broadcasts to", tuple((torch.zeros(5, 1) * torch.zeros(5)).shape))


@fact("seg_background_passed_as_ignore_index")
def _():
    logits = torch.zeros(1, 3, 2, 2, requires_grad=True)
    F.cross_entropy(logits, torch.tensor([[[0, 0], [0, 1]]]), ignore_index=0).backward()
    print("  fact: with ignore_index=0 the grad at background pixels is", logits.grad[0, :, 0, 0].tolist())


@fact("box_coco_xywh_into_xyxy_giou")
def _():
    _, b = synth.box_images(1000, s=70)
    xywh = np.concatenate([b[:, :2], b[:, 2:] - b[:, :2]], 1)
    print(f"  fact: read as xyxy, {np.mean(xywh[:, 2] < xywh[:, 0]):.0%} of the COCO boxes have x1 < x0")


@fact("centernet_peak_not_divided_by_stride")
def _():
    _, c = synth.blob_centers(1000, s=80)
    print(f"  fact: {np.mean((c >= 16).any(1)):.0%} of the centres lie past the 16-cell map when not divided by 2")


@fact("cox_censored_flag_used_as_event")
def _():
    _, _, e, _ = synth.survival_table(1200, s=90, censor_rate=0.8, censor_feature=3)
    print(f"  fact: {e.mean():.0%} died; the flag passed as 'event' marks the other {1 - e.mean():.0%}")


@fact("box_image_resized_boxes_not")
def _():
    _, b = synth.box_images(1000, size=64, s=100)
    print(f"  fact: {np.mean((b / 32 > 1).any(1)):.0%} of the normalised targets exceed 1 (sigmoid head range)")


@fact("box_size_head_missing_from_optimizer")
def _():
    from benchmarks.blind_preflight_bd.cases_trained import box_size_head_missing_from_optimizer as b
    kw = b()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  fact: size_head params in the optimizer:",
          sum(id(p) in ids for p in kw["model"].size_head.parameters()), "of",
          len(list(kw["model"].size_head.parameters())))


@fact("hazard_baseline_plain_tensor")
def _():
    from benchmarks.blind_preflight_bd.cases_trained import DiscreteHazard
    m = DiscreteHazard()
    print("  fact: 'baseline' in named_parameters():", "baseline" in dict(m.named_parameters()))


@fact("seg_head_conv_created_in_forward")
def _():
    from benchmarks.blind_preflight_bd.cases_trained import LazyHeadUNet
    m = LazyHeadUNet()
    x = torch.randn(1, 3, 8, 8)
    m.eval()
    with torch.no_grad():
            print("  fact: two forwards of the same input differ by", float((m(x) - m(x)).abs().max()))


@fact("kp_optimizer_over_ema_copy")
def _():
    from benchmarks.blind_preflight_bd.cases_trained import LandmarkNet
    m = LandmarkNet()
    ema = copy.deepcopy(m)
    print("  fact: the optimizer's params share storage with the model's:",
          any(p.data_ptr() == q.data_ptr() for p in m.parameters() for q in ema.parameters()))


@fact("box_random_backbone_under_no_grad")
def _():
    from benchmarks.blind_preflight_bd.cases_trained import FrozenTrunkRegressor
    m = FrozenTrunkRegressor()
    m(torch.randn(2, 1, 32, 32)).sum().backward()
    print("  fact: backbone grads after backward:", {p.grad is None for p in m.backbone.parameters()} == {True})


@fact("seg_dice_softmax_over_batch_dim")
def _():
    p = torch.softmax(torch.randn(4, 3, 2, 2), dim=0)
    print("  fact: with dim=0, class probabilities of one pixel sum to", round(float(p[0, :, 0, 0].sum()), 3))


@fact("centernet_focal_no_positive_pixels")
def _():
    _, c = synth.blob_centers(1000, s=170)
    hm = synth.gaussian_heatmap(c, 16, 2, exact_peak=False)
    print("  fact: heatmaps with a cell exactly 1.0:", int((hm == 1).any((1, 2)).sum()), "of 1000; max peak",
          round(float(hm.max()), 4))


@fact("box_iou_loss_returns_iou")
def _():
    from benchmarks.blind_preflight_bd.cases_mechanics import iou_loss
    t = torch.tensor([[0.1, 0.1, 0.5, 0.5]])
    near, far = torch.tensor([[0.12, 0.1, 0.5, 0.52]]), torch.tensor([[0.6, 0.6, 0.9, 0.9]])
    print("  fact: loss of a near-perfect box", round(float(iou_loss(False)(near, t)), 3), "vs a disjoint box",
          round(float(iou_loss(False)(far, t)), 3))


@fact("cox_cumsum_risk_set_on_shuffled_batches")
def _():
    from benchmarks.blind_preflight_bd.cases_mechanics import SortedCohort
    from benchmarks.blind_preflight_bd.registry import loader
    t = next(iter(loader(SortedCohort(1200, 190), 64)))[1]
    print("  fact: a shuffled batch is sorted by descending time:", bool((t[:-1] >= t[1:]).all()))


@fact("hazard_bce_over_intervals_after_exit")
def _():
    k = torch.tensor([1, 8])
    at_risk = (torch.arange(10)[None] <= k[:, None]).sum().item()
    print("  fact: of 20 interval terms for subjects exiting in intervals 1 and 8,", 20 - at_risk,
          "lie after the exit")


@fact("seg_crop_drawn_separately_for_image_and_mask")
def _():
    import random
    random.seed(0)
    offs = [((random.randint(0, 8), random.randint(0, 8)), (random.randint(0, 8), random.randint(0, 8)))
            for _ in range(1000)]
    print(f"  fact: image and mask crops at the same offset in {np.mean([a == b for a, b in offs]):.1%} of draws")


@fact("box_hflip_image_only")
def _():
    print("  fact: a box [2, 5, 10, 9] on a flipped 32-px image should be [22, 5, 30, 9]; it stays [2, 5, 10, 9]")


@fact("kp_hflip_without_left_right_swap")
def _():
    print("  fact: after flipping, left x=0.2 becomes 0.8 (> right's 1 - 0.7 = 0.3): index 0 is now the right one")


@fact("seg_mask_downscaled_bilinear")
def _():
    m = torch.tensor([[[[0.0, 2.0, 2.0, 0.0]] * 4]])
    print("  fact: a 0-2-2-0 row downscaled bilinearly:", F.interpolate(m, size=(2, 2), mode="bilinear",
          align_corners=False)[0, 0, 0].tolist(), "nearest:", F.interpolate(m, size=(2, 2))[0, 0, 0].tolist())


@fact("cox_table_sorted_time_not_features")
def _():
    x, t, _, _ = synth.survival_table(1200, s=250)
    xs = x  # features left in file order
    ts = t[np.argsort(-t)]
    print("  fact: corr(x0, time) before sort", round(float(np.corrcoef(x[:, 0], t)[0, 1]), 3), "after sorting "
          "time only", round(float(np.corrcoef(xs[:, 0], ts)[0, 1]), 3))


def attach():
    load_all()                      # the case modules register their fixes on import
    for name, fn in FACTS.items():
        if name in FIXES:
            FIXES[name]["fact"] = fn


attach()
