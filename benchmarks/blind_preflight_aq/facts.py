"""Facts behind set aq's broken cases, printed by verify.py before each case is trained next to its fix (no
preflight involved). Importing this module attaches each function to its case's entry in ``FIXES``."""

from __future__ import annotations

import torch

from benchmarks.blind_preflight_aq.registry import FIXES, load_all

load_all()
FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        FIXES[name]["fact"] = fn
        return fn
    return register


def first_batch(name, fixed=False):
    kw = FIXES[name]["fixed"]() if fixed else load_all()[name].build()
    return kw, next(iter(kw["train_loader"]))


@fact("ctc_batch_first_layout")
def _f1():
    kw, b = first_batch("ctc_batch_first_layout")
    print(f"  model output {tuple(kw['model'](b[0]).shape)} (N, T, C); nn.CTCLoss reads dim 0 as time")


@fact("ctc_log_softmax_batch_dim")
def _f2():
    kw, b = first_batch("ctc_log_softmax_batch_dim")
    lp = kw["model"](b[0]).transpose(0, 1).log_softmax(1)
    print(f"  exp(log_probs).sum(-1) over classes: {lp.exp().sum(-1)[0, :3].tolist()} (should be 1)")


@fact("seg_channels_last_view")
def _f3():
    kw, b = first_batch("seg_channels_last_view")
    x = b[0]
    print(f"  tile {tuple(x.shape)}; view == permute: {torch.equal(x.view(x.size(0), 3, 16, 16), x.permute(0, 3, 1, 2))}")


@fact("depth_mse_broadcast")
def _f4():
    kw, b = first_batch("depth_mse_broadcast")
    p = kw["model"](b[0])
    print(f"  prediction {tuple(p.shape)} vs target {tuple(b[1].shape)} -> broadcast {tuple((p - b[1]).shape)}")


@fact("seg_logits_view_no_permute")
def _f5():
    logits = torch.arange(2 * 3 * 2 * 2).view(2, 3, 2, 2)
    print(f"  logits.view(-1, 3)[0] = {logits.view(-1, 3)[0].tolist()} vs pixel 0's classes "
          f"{logits[0, :, 0, 0].tolist()}")


@fact("ctc_blank_is_a_character")
def _f6():
    kw, b = first_batch("ctc_blank_is_a_character")
    valid = torch.cat([b[1][i, :b[3][i]] for i in range(len(b[1]))])
    print(f"  share of target characters equal to the blank id 0: {(valid == 0).float().mean():.2f}")


@fact("kp_heatmap_xy_swapped")
def _f7():
    kw, b = first_batch("kp_heatmap_xy_swapped")
    idx = b[2][0, 0].flatten().argmax().item()
    print(f"  keypoint (x, y) = {b[1][0].tolist()}; target peak at (x, y) = ({idx % 16}, {idx // 16})")


@fact("box_xywh_targets_giou")
def _f8():
    kw, b = first_batch("box_xywh_targets_giou")
    print(f"  training targets {b[1][:2].tolist()} (x, y, w, h); share with 'x2' < 'x1': "
          f"{(b[1][:, 2] < b[1][:, 0]).float().mean():.2f}")


@fact("seg_mask_totensor_scaled")
def _f9():
    kw, b = first_batch("seg_mask_totensor_scaled")
    print(f"  unique training mask labels: {b[1].unique().tolist()}")


@fact("depth_sigmoid_head")
def _f10():
    kw, b = first_batch("depth_sigmoid_head")
    print(f"  target depth range {b[1].min():.2f}-{b[1].max():.2f} m; sigmoid output range (0, 1)")


@fact("depth_range_plain_tensor")
def _f11():
    kw, _ = first_batch("depth_range_plain_tensor")
    names = [n for n, _ in kw["model"].named_parameters()]
    print(f"  'log_range' in named_parameters: {'log_range' in names}; max depth {kw['model'].log_range.exp().item():.1f} m")


@fact("seg_optimizer_before_head_swap")
def _f12():
    kw, _ = first_batch("seg_optimizer_before_head_swap")
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  new head weight in optimizer: {id(kw['model'].head.weight) in in_opt}")


@fact("ctc_freeze_by_name_substring")
def _f13():
    kw, _ = first_batch("ctc_freeze_by_name_substring")
    print(f"  trainable: {[n for n, p in kw['model'].named_parameters() if p.requires_grad]}")


@fact("box_backbone_detached")
def _f14():
    kw, b = first_batch("box_backbone_detached")
    kw["model"](b[0]).sum().backward()
    print(f"  backbone grad is None: {kw['model'].backbone[0].weight.grad is None}")


@fact("box_head_under_no_grad")
def _f15():
    kw, b = first_batch("box_head_under_no_grad")
    print(f"  decoded boxes requires_grad: {kw['model'](b[0])[1].requires_grad}")


@fact("ctc_exponential_lr_per_batch")
def _f16():
    print(f"  lr factor after 60 steps: {0.8 ** 60:.2e}")


@fact("seg_clip_norm_tiny_sgd")
def _f17():
    kw, _ = first_batch("seg_clip_norm_tiny_sgd")
    print(f"  clip_grad_norm={kw['clip_grad_norm']}: largest step per update {0.1 * kw['clip_grad_norm']:.0e} in norm")


@fact("kp_adam_eps_one")
def _f18():
    kw, b = first_batch("kp_adam_eps_one")
    torch.nn.functional.mse_loss(kw["model"](b[0]), b[2]).backward()
    g = kw["model"].head.weight.grad.abs().mean().item()
    print(f"  mean |grad| of the head {g:.1e} vs eps {kw['optimizer'].param_groups[0]['eps']}")


@fact("box_warmup_longer_than_run")
def _f19():
    print(f"  lr factor at step 300 of a 10000-step warm-up: {300 / 10000:.2f}")


@fact("elevation_bf16_absolute")
def _f20():
    v = torch.tensor([848.0, 849.0, 850.0, 851.0, 852.0])
    print(f"  {v.tolist()} in bf16: {v.bfloat16().float().tolist()}")


@fact("box_hflip_image_only")
def _f21():
    kw, _ = first_batch("box_hflip_image_only")
    print(f"  flip probability {kw['train_loader'].dataset.p}; boxes returned unchanged when the image is flipped")


@fact("kp_shift_heatmap_unmoved")
def _f22():
    kw, b = first_batch("kp_shift_heatmap_unmoved")
    idx = b[0][:, 0].flatten(1).argmax(1)
    hidx = b[2][:, 0].flatten(1).argmax(1)
    print(f"  images whose brightest pixel is the target peak: {(idx == hidx).float().mean():.2f}")


@fact("ctc_val_features_unnormalised")
def _f23():
    kw, _ = first_batch("ctc_val_features_unnormalised")
    tr, va = kw["train_loader"].dataset.tensors[0], kw["val_loader"].dataset.tensors[0]
    print(f"  train features mean {tr.mean():.2f} std {tr.std():.2f}; val mean {va.mean():.2f} std {va.std():.2f}")


@fact("ctc_sorted_features_not_transcripts")
def _f24():
    kw, _ = first_batch("ctc_sorted_features_not_transcripts")
    _, _, ilen, tlen = kw["train_loader"].dataset.tensors
    print(f"  utterances whose input length is 3 x target length: {(ilen == 3 * tlen).float().mean():.2f}")


@fact("seg_crop_offsets_independent")
def _f25():
    kw, _ = first_batch("seg_crop_offsets_independent")
    off = kw["train_loader"].dataset.offsets[:1000]
    print(f"  crops with image offset == mask offset: {((off[:, 0] == off[:, 2]) & (off[:, 1] == off[:, 3])).float().mean():.2f}")
