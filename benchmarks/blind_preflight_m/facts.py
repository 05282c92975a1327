"""The fact each broken case of set m rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches the facts to ``FIXES``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_m import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_m.registry import attach_fact, first_batch


@attach_fact("shapes_gru_no_batch_first")
def _():
    kw = cases_shapes.shapes_gru_no_batch_first()
    x, _ = first_batch(kw)
    print(f"  fact: batch {tuple(x.shape)} (batch, time, features); GRU batch_first={kw['model'].gru.batch_first}: "
          f"it reads dim 0 ({x.shape[0]}) as time")


@attach_fact("shapes_hwc_reshape")
def _():
    img, _ = cases_shapes.blob_tiles(1, 2)
    t = torch.from_numpy(img)
    same = torch.equal(t.reshape(-1, 3, 16, 16), t.permute(0, 3, 1, 2))
    print(f"  fact: reshape(N, 3, 16, 16) equals permute(0, 3, 1, 2): {same}; plane 0 of the reshape starts with "
          f"{t.reshape(-1, 3, 16, 16)[0, 0, 0, :3].tolist()} = pixel (0, 0)'s R, G, B")


@attach_fact("shapes_horizon_broadcast")
def _():
    kw = cases_shapes.shapes_horizon_broadcast()
    x, y = first_batch(kw)
    out = kw["model"](x)
    print(f"  fact: output {tuple(out.shape)}, target {tuple(y.shape)} -> MSELoss compares "
          f"{tuple(torch.broadcast_shapes(out.shape, y.shape))}")


@attach_fact("shapes_conv1d_time_as_channels")
def _():
    kw = cases_shapes.shapes_conv1d_time_as_channels()
    x, _ = first_batch(kw)
    conv = kw["model"].body[0]
    print(f"  fact: batch {tuple(x.shape)}; Conv1d(in_channels={conv.in_channels}) slides along dim 2 "
          f"(length {x.shape[2]} = the leads)")


@attach_fact("shapes_seg_view_nchw")
def _():
    logits = torch.arange(2 * 3 * 2 * 2).view(2, 3, 2, 2)
    print(f"  fact: view(-1, 3) row 0 of an (N, 3, H, W) tensor = {logits.view(-1, 3)[0].tolist()} (one class map), "
          f"permuted row 0 = {logits.permute(0, 2, 3, 1).reshape(-1, 3)[0].tolist()} (one pixel's 3 classes)")


@attach_fact("targets_softmax_then_cross_entropy")
def _():
    p = torch.tensor([[1.0, 0.0, 0.0] + [0.0] * 7])
    print(f"  fact: a perfect one-hot 'probability' fed to CrossEntropyLoss still costs "
          f"{F.cross_entropy(p, torch.tensor([0])).item():.3f} (softmax applied again)")


@attach_fact("targets_softmax_into_nllloss")
def _():
    p = torch.softmax(torch.tensor([[2.0, 0.0, -1.0]]), 1)
    print(f"  fact: NLLLoss(softmax) = {F.nll_loss(p, torch.tensor([0])).item():.3f} = -p[y], not "
          f"-log p[y] = {F.nll_loss(p.log(), torch.tensor([0])).item():.3f}")


@attach_fact("targets_multilabel_cross_entropy")
def _():
    kw = cases_targets.targets_multilabel_cross_entropy()
    _, y = first_batch(kw)
    print(f"  fact: targets are multi-hot, {y.sum(1).float().mean():.2f} tags per row; CrossEntropyLoss is a softmax "
          f"over the 6 tags (its gradient sums to zero across them)")


@attach_fact("targets_contrastive_label_flipped")
def _():
    kw = cases_targets.targets_contrastive_label_flipped()
    x1, x2, y = first_batch(kw)
    d = (x1 - x2).norm(dim=1)
    print(f"  fact: raw distance same-writer pairs (label 1) {d[y == 1].mean():.2f}, others {d[y == 0].mean():.2f}; "
          f"the loss pulls label-0 pairs together")


@attach_fact("targets_forecast_target_unshifted")
def _():
    kw = cases_targets.targets_forecast_target_unshifted()
    x, y = first_batch(kw, "val_loader")
    print(f"  fact: target equals the window's last reading: {torch.allclose(x[:, -1], y)}")


@attach_fact("trained_head_swapped_after_optimizer")
def _():
    kw = cases_trained.trained_head_swapped_after_optimizer()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: new head's parameters in the optimizer: "
          f"{[id(p) in held for p in kw['model'].fc.parameters()]}")


@attach_fact("trained_from_pretrained_frozen")
def _():
    kw = cases_trained.trained_from_pretrained_frozen()
    print(f"  fact: item table requires_grad={kw['model'].item.weight.requires_grad} (from_pretrained default "
          f"freeze=True)")


@attach_fact("trained_cnn_under_no_grad")
def _():
    kw = cases_trained.trained_cnn_under_no_grad()
    x, y = first_batch(kw)
    F.cross_entropy(kw["model"](x), y).backward()
    print(f"  fact: CNN grads after backward: {[p.grad for p in kw['model'].cnn.parameters()][:2]}")


@attach_fact("trained_vit_freeze_by_name")
def _():
    kw = cases_trained.trained_vit_freeze_by_name()
    trainable = [n for n, p in kw["model"].named_parameters() if p.requires_grad]
    print(f"  fact: {len(trainable)} trainable tensors, classifier among them: "
          f"{any(n.startswith('classifier') for n in trainable)}")


@attach_fact("trained_zero_init")
def _():
    kw = cases_trained.trained_zero_init()
    x, y = first_batch(kw)
    F.mse_loss(kw["model"](x), y).backward()
    print(f"  fact: first-layer grad norm {kw['model'][0].weight.grad.norm():.3g}, output-bias grad "
          f"{kw['model'][4].bias.grad.item():.3g}")


@attach_fact("mech_schedule_total_is_epochs")
def _():
    kw = cases_mechanics.mech_schedule_total_is_epochs()
    lrs = []
    for _ in range(5):
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  fact: learning rate over the first 5 steps {lrs}")


@attach_fact("mech_lambdalr_returns_lr")
def _():
    kw = cases_mechanics.mech_lambdalr_returns_lr()
    print(f"  fact: effective lr at step 0 = {kw['optimizer'].param_groups[0]['lr']:.2g}")


@attach_fact("mech_dropout_keep_prob")
def _():
    kw = cases_mechanics.mech_dropout_keep_prob()
    print(f"  fact: nn.Dropout p = {kw['model'][2].p} (probability of zeroing)")


@attach_fact("mech_accumulation_scaled_twice")
def _():
    kw = cases_mechanics.mech_accumulation_scaled_twice()
    print(f"  fact: loss_fn divides by {cases_mechanics.ACCUM}, accumulation_steps={kw['accumulation_steps']}: "
          f"each micro-batch weighs 1/{cases_mechanics.ACCUM * kw['accumulation_steps']}")


@attach_fact("mech_vae_kl_sum_vs_mean_recon")
def _():
    kw = cases_mechanics.mech_vae_kl_sum_vs_mean_recon()
    (x,) = first_batch(kw)
    recon, mu, logvar = kw["model"](x)
    print(f"  fact: at init recon (mean) {F.mse_loss(recon, x).item():.3g} vs KL (sum) "
          f"{(-0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())).item():.3g}")


@attach_fact("data_seg_flip_not_joint")
def _():
    kw = cases_data.data_seg_flip_not_joint()
    ds = kw["train_loader"].dataset
    torch.manual_seed(0)
    agree = 0
    for i in range(200):
        img, mask = ds[i]
        agree += bool(((img[0] > 0.4) & (mask == 1)).sum() >= 0.8 * mask.sum())
    print(f"  fact: {agree}/200 augmented masks still lie on their building")


@attach_fact("data_hflip_changes_label")
def _():
    x, y = cases_data.arrow_signs(1, 42)
    print(f"  fact: class {y.item()} sign; its mirror image puts the arrow head on the "
          f"{'right' if x[0, 0].flip(-1)[:, :8].sum() < x[0, 0].flip(-1)[:, 8:].sum() else 'left'}")


@attach_fact("data_val_not_standardised")
def _():
    kw = cases_data.data_val_not_standardised()
    tx, _ = first_batch(kw)
    vx, _ = first_batch(kw, "val_loader")
    print(f"  fact: train feature means {tx.mean(0)[:2].tolist()}, val feature means {vx.mean(0)[:2].tolist()}")


@attach_fact("data_truncation_drops_signal")
def _():
    ids, _ = cases_data.tickets(1, 44)
    pos = [i for i, t in enumerate(ids[0].tolist()) if 3 <= t <= 8]
    print(f"  fact: label tokens at positions {pos}; the collate keeps positions 0..31")


@attach_fact("data_onehot_per_split")
def _():
    import numpy as np
    city, _, _ = cases_data.churn_table(2000, 45, list("ABCDEFGH"))
    vcity, _, _ = cases_data.churn_table(500, 46, list("ABDEFGHI"))
    print(f"  fact: train columns {np.unique(city).tolist()}, val columns {np.unique(vcity).tolist()}")
