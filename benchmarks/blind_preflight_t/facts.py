"""The fact each of set t's broken cases rests on, printed by ``verify.py`` before the case is trained (no
preflight): shapes, values, learning rates, gradients, what a Dataset returns."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_t import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_t.registry import FIXES


def fact(name: str):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("tile_seg_logits_view_not_permute")
def _seg_view():
    logits = torch.arange(2 * 4 * 2 * 2).float().view(2, 4, 2, 2)  # N=2, C=4, 2x2 pixels
    print("  fact: logits.view(-1, 4)[0] =", logits.view(-1, 4)[0].tolist(),
          "(4 pixels of channel 0); permuted row 0 =", logits.permute(0, 2, 3, 1).reshape(-1, 4)[0].tolist(),
          "(4 class scores of pixel 0)")


@fact("colour_blob_gap_mean_wrong_axes")
def _gap():
    h = torch.randn(2, 16, 16, 16)
    print(f"  fact: h (N, C, H, W) = {tuple(h.shape)}: h.mean(dim=(1, 2)) -> {tuple(h.mean(dim=(1, 2)).shape)} "
          "(one value per column, channels averaged); h.mean(dim=(2, 3)) -> "
          f"{tuple(h.mean(dim=(2, 3)).shape)} (one value per channel)")


@fact("image_meta_stack_view_mixes_samples")
def _stack():
    a, b = torch.arange(4.0)[:, None].repeat(1, 2), 10 + torch.arange(4.0)[:, None].repeat(1, 2)
    print("  fact: a rows = samples 0..3, b rows = 10..13; torch.stack([a, b]).view(4, -1) rows =",
          torch.stack([a, b]).view(4, -1)[:, ::2].tolist(), "vs dim=1:", torch.stack([a, b], 1).view(4, -1)[:, ::2].tolist())


@fact("mil_attention_softmax_over_batch")
def _mil():
    scores = torch.randn(3, 8, 1)
    per_bag = [round(v, 2) for v in torch.softmax(scores, 0).sum((1, 2)).tolist()]
    print("  fact: softmax(dim=0) weights per bag sum to", per_bag, "(dim=1: 1.0 each); one bag per batch: "
          "softmax(dim=0) weights =", torch.softmax(scores[:1], 0).unique().tolist())


@fact("siamese_label_column_broadcasts_loss")
def _siamese():
    label, d = torch.ones(32, 1), torch.rand(32)
    print(f"  fact: label {tuple(label.shape)} * distance {tuple(d.shape)} -> {tuple((label * d ** 2).shape)}")


@fact("png_mask_to_tensor_scaled_to_zero")
def _mask():
    mask = np.array([[[0], [1]], [[2], [3]]], dtype=np.uint8)
    t = cases_targets.to_tensor(mask)
    print("  fact: mask ids", np.unique(mask).tolist(), "-> to_tensor", t.unique().tolist(), "-> .long()",
          t.long().unique().tolist())


@fact("gcn_unlabelled_nodes_trained_as_class0")
def _gcn():
    y = cases_targets.gcn_unlabelled_nodes_trained_as_class0()["train_loader"].dataset[0][1]
    print(f"  fact: train targets == 0 for {float((y == 0).float().mean()):.0%} of the nodes (90 of 600 labelled)")


@fact("patch_match_contrastive_label_flipped")
def _contrastive():
    d = torch.tensor([0.0, 3.0])
    for y in (1.0, 0.0):
        loss = (1 - y) * d ** 2 + y * torch.clamp(2.0 - d, min=0) ** 2
        print(f"  fact: dataset label {y:.0f} ({'match' if y else 'no match'}): loss at distance 0 / 3 =",
              loss.tolist())


@fact("keypoint_heatmap_not_divided_by_stride")
def _heatmap():
    ds = cases_targets.keypoint_heatmap_not_divided_by_stride()["train_loader"].dataset
    peaks = torch.stack([ds[i][1].amax((1, 2)) for i in range(200)])
    print(f"  fact: {float((peaks < 0.5).float().mean()):.0%} of the 8x8 target heatmaps peak below 0.5 "
          "(the Gaussian lies off the map)")


@fact("denoiser_trained_on_uniform_noise")
def _noise():
    x = torch.zeros(100_000)
    print(f"  fact: rand_like mean {torch.rand_like(x).mean():.2f} std {torch.rand_like(x).std():.2f}; "
          f"randn_like mean {torch.randn_like(x).mean():.2f} std {torch.randn_like(x).std():.2f}")


@fact("multitask_decoder_group_never_appended")
def _groups():
    kw = cases_trained.multitask_decoder_group_never_appended()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    dec = list(kw["model"].decoder.parameters())
    print(f"  fact: {sum(id(p) in in_opt for p in dec)} of {len(dec)} decoder tensors are in the optimizer")


@fact("point_layers_weights_registered_as_buffers")
def _buffers():
    model = cases_trained.PointSetNet(fixed=False)
    print("  fact: parameters", [n for n, _ in model.named_parameters()], "buffers",
          [n for n, _ in model.named_buffers()])


@fact("vit_backbone_forward_under_no_grad")
def _no_grad():
    model = cases_trained.ViTClassifier(fixed=False)
    model(torch.randn(4, 1, 16, 16)).sum().backward()
    vit = [p.grad is not None for p in model.vit.parameters()]
    print(f"  fact: after backward {sum(vit)} of {len(vit)} ViT tensors have a gradient; head:",
          all(p.grad is not None for p in model.head.parameters()))


@fact("link_embeddings_from_pretrained_frozen")
def _frozen():
    emb = nn.Embedding.from_pretrained(torch.randn(4, 2))
    print("  fact: nn.Embedding.from_pretrained(t).weight.requires_grad =", emb.weight.requires_grad)


@fact("spot_locator_all_weights_zero_init")
def _zero():
    model = cases_trained.SpotLocator(fixed=False)
    F.mse_loss(model(torch.randn(8, 1, 16, 16)), torch.rand(8, 2)).backward()
    nonzero = [n for n, p in model.named_parameters() if p.grad.abs().sum() > 0]
    print("  fact: tensors with a nonzero gradient after one step:", nonzero)


@fact("spot_cnn_warmup_lambda_never_capped")
def _warmup():
    kw = cases_mechanics.spot_cnn_warmup_lambda_never_capped()
    opt, sched, lrs = kw["optimizer"], kw["scheduler"], {}
    for step in range(300):
        lrs[step] = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
    print("  fact: lr at steps 0 / 4 / 100 / 299:", [round(lrs[s], 3) for s in (0, 4, 100, 299)])


@fact("gcn_sum_aggregation_without_degree_norm")
@torch.no_grad()
def _sum_gcn():
    kw = cases_mechanics.gcn_sum_aggregation_without_degree_norm()
    model, x = kw["model"], next(iter(kw["train_loader"]))[0]
    normalised = cases_mechanics.SumGCN(model.a_hat - torch.eye(600), True)
    print(f"  fact: mean degree (with self-loop) {float(model.a_hat.sum(1).mean()):.0f}; mean |logit| at init "
          f"{float(model(x).abs().mean()):.3g} (degree-normalised: {float(normalised(x).abs().mean()):.3g})")


@fact("glyph_mlp_keep_prob_as_dropout_p")
def _dropout():
    drop = nn.Dropout(0.9).train()
    print(f"  fact: nn.Dropout(0.9) zeroes {float((drop(torch.ones(10_000)) == 0).float().mean()):.0%} of the units")


@fact("superres_mse_sum_with_mean_tuned_lr")
def _sum():
    p, y = torch.zeros(16, 1, 16, 16), torch.ones(16, 1, 16, 16)
    ratio = nn.MSELoss(reduction="sum")(p, y) / nn.MSELoss()(p, y)
    print(f"  fact: sum / mean loss (and gradient) ratio for a (16, 1, 16, 16) batch = {float(ratio):.0f}")


@fact("vae_kl_summed_recon_averaged")
@torch.no_grad()
def _vae():
    kw = cases_mechanics.vae_kl_summed_recon_averaged()
    x = next(iter(kw["train_loader"]))[0]
    recon, mu, logvar = kw["model"](x)
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    print(f"  fact: at init recon (mean) {float(F.mse_loss(recon, x)):.3f}, KL (summed) {float(kl):.3f}; "
          f"so relative to the mean reconstruction the KL weighs x.numel() = {x.numel()} times what the ELBO gives it")


@fact("seg_flip_drawn_separately_for_mask")
def _flip():
    ds = cases_data.AugmentedTiles(*cases_shapes.rect_scenes(200, 16, torch.Generator().manual_seed(0)), fixed=False)
    torch.manual_seed(0)
    mismatched = 0
    for i in range(200):
        img, mask = ds[i]
        mismatched += not (torch.equal(img, ds.images[i]) == torch.equal(mask, ds.masks[i]))
    print(f"  fact: {mismatched / 200:.0%} of the augmented samples have exactly one of image/mask flipped")


@fact("eye_keypoints_flip_without_left_right_swap")
def _eyes():
    ds = cases_data.eye_keypoints_flip_without_left_right_swap()["train_loader"].dataset
    torch.manual_seed(0)
    t = torch.stack([ds[i][1] for i in range(400)])
    print(f"  fact: 'left eye' x > 'right eye' x in {float((t[:, 0] > t[:, 2]).float().mean()):.0%} of the targets")


@fact("procedural_dataset_reseeded_every_item")
def _reseed():
    ds = cases_data.ShapesOnTheFly(1200, 7, fixed=False)
    print("  fact: items 0 and 999 identical:", torch.equal(ds[0][0], ds[999][0]), "labels", ds[0][1], ds[999][1])


@fact("resized_images_boxes_left_in_original_pixels")
def _boxes():
    ds = cases_data.resized_images_boxes_left_in_original_pixels()["train_loader"].dataset
    t = torch.stack([ds[i][1] for i in range(300)])
    print(f"  fact: normalised box targets range {float(t.min()):.2f}..{float(t.max()):.2f} (expected within 0..1); "
          f"original sizes {int(ds.sizes.min())}..{int(ds.sizes.max())} px")


@fact("two_folders_different_class_to_idx")
def _folders():
    g = torch.Generator().manual_seed(0)
    r1 = cases_data.FolderDataset(cases_data.photo_folder(100, g))
    r2 = cases_data.FolderDataset(cases_data.photo_folder(100, g, skip="bicycle"))
    print("  fact: round 1 class_to_idx", r1.class_to_idx, "round 2", r2.class_to_idx)
