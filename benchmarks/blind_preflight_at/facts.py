"""The fact each of set at's broken cases rests on, printed by ``verify.py`` before the case is trained next to its
fix (no preflight involved). Importing this module attaches each function to ``FIXES[name]['fact']``."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_at.registry import FIXES, LoRALinear, build_vocab, image_captions, load_all

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


@fact("pc_view_not_transpose")
def _():
    p = torch.arange(12.).view(1, 4, 3)
    print("  (1, 4, 3) points", p[0].tolist(), "-> view(1, 3, 4) rows", p.view(1, 3, 4)[0].tolist(),
          "vs transpose", p.transpose(1, 2)[0].tolist())


@fact("pc_maxpool_over_channels")
def _():
    x = torch.randn(1, 8, 5)
    perm = torch.randperm(5)
    print("  permuting the points changes max(dim=1):", not torch.equal(x.max(1).values, x[:, :, perm].max(1).values),
          "; max(dim=2):", not torch.equal(x.max(2).values, x[:, :, perm].max(2).values))


@fact("pc_centre_wrong_dim")
def _():
    p = torch.randn(4, 64, 3) + 6 * torch.randn(4, 1, 3)
    print("  centroid norms after mean(dim=0):", (p - p.mean(0, keepdim=True)).mean(1).norm(dim=1).round(decimals=2)
          .tolist(), "after mean(dim=1):", (p - p.mean(1, keepdim=True)).mean(1).norm(dim=1).max().item())


@fact("video_unfold_frames_wrong_order")
def _():
    B, T = 3, 2
    owner = torch.arange(B).repeat_interleave(T)[:, None].float()  # row -> its video
    print("  videos pooled per clip with view(T, B): ", owner.view(T, B, 1)[..., 0].T.tolist(),
          "with view(B, T):", owner.view(B, T, 1)[..., 0].tolist())


@fact("frame_logits_flatten_scramble")
def _():
    logits = torch.arange(2 * 3 * 4).view(2, 3, 4)  # (B, C, T)
    print("  first row of reshape(-1, C):", logits.reshape(-1, 3)[0].tolist(), "; of permute+reshape:",
          logits.permute(0, 2, 1).reshape(-1, 3)[0].tolist(), "(frame 0's three class logits)")


@fact("clip_labels_all_zero")
def _():
    print("  targets of a batch of 4:", torch.zeros(4, dtype=torch.long).tolist(), "true pairs:", torch.arange(4).tolist())


@fact("clip_collate_sorts_captions")
def _():
    lengths = torch.tensor([4, 7, 5, 8])
    print("  caption order after sorting:", torch.argsort(lengths, descending=True).tolist(),
          "; images stay in", list(range(4)))


@fact("pc_seg_labels_not_subsampled")
def _():
    idx = torch.randperm(8)[:4]
    print("  points kept", idx.tolist(), "labels kept", list(range(4)))


@fact("frame_labels_window_offset")
def _():
    print("  window frames 20..35 paired with the labels of frames 0..15")


@fact("video_clip_label_index")
def _():
    print("  item -> (video, label index):", [(i // 3, i) for i in range(6)])


@fact("lora_both_factors_zero")
def _():
    layer = LoRALinear(nn.Linear(6, 4), r=2, zero_a=True)
    layer(torch.randn(5, 6)).sum().backward()
    print("  grad norms A, B:", layer.A.grad.norm().item(), layer.B.grad.norm().item())


@fact("lora_wrapped_attribute_unused")
def _():
    fc = nn.Linear(3, 3)
    net = nn.Sequential(fc)
    holder = nn.Module()
    holder.fc1, holder.net = fc, net
    holder.fc1 = LoRALinear(holder.fc1)
    print("  net[0] is the LoRA layer:", isinstance(holder.net[0], LoRALinear))


@fact("head_swapped_after_optimizer")
def _():
    m = nn.Sequential(nn.Linear(3, 3))
    opt = torch.optim.Adam(m.parameters())
    m[0] = nn.Linear(3, 2)
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    print("  new head's weight in the optimizer:", id(m[0].weight) in ids)


@fact("unfrozen_layer_not_in_optimizer")
def _():
    _unfrozen, b = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = torch.optim.Adam(b.parameters())
    print("  optimizer tensors:", sum(len(g["params"]) for g in opt.param_groups), "(the unfrozen layer's 2 missing)")


@fact("optimizer_on_pre_copy_model")
def _():
    import copy
    m = nn.Linear(2, 2)
    opt = torch.optim.Adam(m.parameters())
    c = copy.deepcopy(m)
    print("  copy's weight is the optimizer's tensor:", c.weight is opt.param_groups[0]["params"][0])


@fact("param_group_lr_key_typo")
def _():
    p, q = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [p]}, {"params": [q], "learning_rate": 1e-2}], lr=1e-5)
    print("  head group lr:", opt.param_groups[1]["lr"])


@fact("resumed_pretrain_optimizer_state")
def _():
    p = nn.Parameter(torch.zeros(1))
    old = torch.optim.Adam([p], lr=1e-7)
    opt = torch.optim.Adam([p], lr=3e-3)
    opt.load_state_dict(old.state_dict())
    print("  lr after load_state_dict:", opt.param_groups[0]["lr"])


@fact("lora_scaling_integer_division")
def _():
    print("  alpha // r with alpha=2, r=4:", 2 // 4)


@fact("lambdalr_returns_lr")
def _():
    opt = torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=2e-3)
    s = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 2e-3 * min(1.0, (k + 1) / 20))
    for _ in range(50):
        opt.step()
        s.step()
    print("  lr after 50 steps:", opt.param_groups[0]["lr"])


@fact("warmup_sized_for_epochs")
def _():
    opt = torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=2e-3)
    s = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-3, total_iters=2400)
    for _ in range(200):
        opt.step()
        s.step()
    print("  lr after 200 steps:", opt.param_groups[0]["lr"], "of 2e-3")


@fact("pc_unit_sphere_removes_size")
def _():
    p = torch.randn(64, 3)
    a, b = p, 2.5 * p
    na, nb = a / a.norm(dim=1).max(), b / b.norm(dim=1).max()
    print("  a cloud and the same cloud 2.5x larger are identical after unit-sphere scaling:", torch.allclose(na, nb))


@fact("clip_hflip_breaks_captions")
def _():
    img = torch.zeros(1, 8)
    img[0, :3] = 1
    print("  'left' square columns", img.nonzero()[:, 1].tolist(), "-> flipped",
          torch.flip(img, dims=[-1]).nonzero()[:, 1].tolist(), "caption still says left")


@fact("caption_vocab_rebuilt_for_val")
def _():
    _, caps, _ = image_captions(1280, s=5)
    tr, va = build_vocab(caps[:1024]), build_vocab(caps[1024:])
    print("  'red' id train/val:", tr["red"], va["red"], "; 'left':", tr["left"], va["left"])


@fact("video_frames_sampled_unsorted")
def _():
    print("  sampled frame indices:", torch.randperm(12)[:6].tolist())


@fact("pc_minmax_per_axis")
def _():
    rod = torch.randn(64, 3) * torch.tensor([2.2, 0.45, 0.45])
    n = (rod - rod.min(0).values) / (rod.max(0).values - rod.min(0).values)
    print("  std per axis of an x-rod before:", rod.std(0).round(decimals=2).tolist(), "after per-axis min-max:",
          n.std(0).round(decimals=2).tolist())


load_all()  # the case modules fill FIXES
for _name, _fn in FACTS.items():
    if _name in FIXES:
        FIXES[_name]["fact"] = _fn
