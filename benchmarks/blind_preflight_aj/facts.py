"""The fact each broken case of set aj rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_aj import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_aj.registry import FIXES

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


@fact("aj_heatmap_meshgrid_ij")
def _():
    xx, yy = torch.meshgrid(torch.arange(3), torch.arange(3))
    peak = int(cases_shapes.gaussian_heatmaps(torch.tensor([[12, 3]]), xy_indexing=False)[0, 0].argmax())
    print(f"  torch.meshgrid default: xx[0] = {xx[0].tolist()} (constant along a row: xx indexes rows); "
          f"a landmark at x=12, y=3 gets its peak at (row, col) = {divmod(peak, 16)}")


@fact("aj_har_transformer_seq_first")
def _():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    x = torch.randn(4, 6, 8)
    y = layer(x)
    x2 = x.clone()
    x2[1] += 1.0
    print(f"  batch_first={layer.self_attn.batch_first}; changing window 1 changes window 0's output: "
          f"{not torch.allclose(layer(x2)[0], y[0])}")


@fact("aj_imu_conv1d_view_not_permute")
def _():
    x = torch.arange(12.).view(1, 4, 3)      # 4 time steps x 3 axes
    print(f"  view(1, 3, 4) row 0 = {x.view(1, 3, 4)[0, 0].tolist()} (mixed axes); permute row 0 = "
          f"{x.permute(0, 2, 1)[0, 0].tolist()} (axis 0 over time)")


@fact("aj_box_targets_broadcast")
def _():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = F.smooth_l1_loss(torch.zeros(32, 4), torch.zeros(32, 1, 4), reduction="none")
    print(f"  smooth_l1_loss((32, 4), (32, 1, 4)) elementwise shape: {tuple(out.shape)}")


@fact("aj_vad_labels_pad_sequence_time_major")
def _():
    labels = [torch.zeros(5, dtype=torch.long), torch.ones(3, dtype=torch.long)]
    print(f"  pad_sequence(labels).shape = {tuple(torch.nn.utils.rnn.pad_sequence(labels).shape)} (time, batch) vs "
          f"features padded batch_first: (2, 5, 8)")


@fact("aj_tagging_ce_on_multihot")
def _():
    logits = torch.tensor([[5.0, 5.0, -5.0]])
    print(f"  CE with target [1, 1, 0] on logits [5, 5, -5]: {F.cross_entropy(logits, torch.tensor([[1., 1., 0.]])):.3f}"
          f"; on logits [-5, -5, -15] (sigmoid < 0.5 everywhere): "
          f"{F.cross_entropy(logits - 10, torch.tensor([[1., 1., 0.]])):.3f} (shift-invariant)")


@fact("aj_siamese_label_convention_flipped")
def _():
    x1, x2, same = cases_targets.device_pairs(1000, 2)
    print(f"  dataset: same-device pairs have label 1 ({int(same.sum())} of 1000); loss term for label 1: "
          f"max(0, m - d)^2 (pushes them apart)")


@fact("aj_implicit_positives_only")
def _():
    kw = cases_targets.implicit_positives_only()
    labels = kw["train_loader"].dataset.tensors[2]
    print(f"  distinct training labels: {labels.unique().tolist()} over {len(labels)} rows")


@fact("aj_har_ignore_index_real_class")
def _():
    _, y = cases_targets.har_features(1500, 4)
    print(f"  share of class 0 ('walking'): {(y == 0).float().mean():.2f}; "
          f"CE(ignore_index=0) on an all-class-0 batch: {nn.CrossEntropyLoss(ignore_index=0)(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))}")


@fact("aj_dae_target_is_noisy_input")
def _():
    noisy, clean = cases_targets.sensor_traces(1500, 5)
    print(f"  RMSE(noisy, clean) = {((noisy - clean) ** 2).mean().sqrt():.3f}: the identity scores 0 on the loss")


@fact("aj_bert_probe_head_replaced_after_optimizer")
def _():
    kw = cases_trained.bert_probe_head_swap()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    trainable = [n for n, p in kw["model"].named_parameters() if p.requires_grad]
    print(f"  trainable: {trainable}; held by the optimizer: "
          f"{[n for n, p in kw['model'].named_parameters() if id(p) in held]}")


@fact("aj_fm_factors_plain_tensor")
def _():
    m = cases_trained.FactorizationMachine(register=False)
    print(f"  parameters(): {[n for n, _ in m.named_parameters()]}; V.requires_grad={m.V.requires_grad}")


@fact("aj_rating_clamp_kills_gradient")
def _():
    raw = torch.tensor([0.02, -0.1, 0.3], requires_grad=True)
    torch.clamp(raw, 1.0, 5.0).sum().backward()
    print(f"  raw scores near 0 -> clamp(1, 5) gradient: {raw.grad.tolist()}")


@fact("aj_det_box_loss_through_numpy")
def _():
    pred = torch.rand(2, 4, requires_grad=True)
    iou = torch.tensor(cases_trained.iou_numpy(pred.detach().numpy(), np.random.rand(2, 4)))
    print(f"  IoU wrapped with torch.tensor: requires_grad={iou.requires_grad}, grad_fn={iou.grad_fn}")


@fact("aj_item_embeddings_from_pretrained_frozen")
def _():
    emb = nn.Embedding.from_pretrained(torch.randn(5, 3))
    print(f"  nn.Embedding.from_pretrained(...).weight.requires_grad = {emb.weight.requires_grad}")


@fact("aj_vae_kl_sum_recon_mean")
def _():
    x = cases_mechanics.spectra(32, 1)
    print(f"  per batch of 32: mse_loss(mean(x), x) = {F.mse_loss(x.mean(0).expand_as(x), x):.4f} vs one nat of KL "
          f"per latent summed over the batch = {32 * 4}")


@fact("aj_fault_pos_weight_inverted")
def _():
    _, y = cases_mechanics.fault_readings(3000, 2)
    y = y[:2400]
    print(f"  positives {int(y.sum())}, negatives {int((1 - y).sum())}: n_pos/n_neg = {y.sum() / (1 - y).sum():.3f},"
          f" n_neg/n_pos = {(1 - y).sum() / y.sum():.2f}")


@fact("aj_lambdalr_returns_lr_not_factor")
def _():
    kw = cases_mechanics.lambdalr_returns_lr()
    print(f"  optimizer lr after LambdaLR init: {kw['optimizer'].param_groups[0]['lr']:.2e} (meant 3e-3)")


@fact("aj_pure_bf16_weights_updates_lost")
def _():
    w = torch.tensor([0.2], dtype=torch.bfloat16)
    print(f"  bf16: 0.2 + 1e-4 == 0.2 -> {bool((w + 1e-4) == w)}; bf16 spacing at 0.2 = "
          f"{torch.finfo(torch.bfloat16).eps * 0.125:.1e}")


@fact("aj_param_group_lr_scale_ignored")
def _():
    kw = cases_mechanics.lr_scale_ignored()
    print(f"  param groups: {[(g.get('lr'), g.get('lr_scale')) for g in kw['optimizer'].param_groups]} "
          f"(torch.optim reads only 'lr')")


@fact("aj_landmark_hflip_without_side_swap")
def _():
    img, pts = cases_data.eye_images(4, 1)
    ds = cases_data.EyeDataset(img, pts, augment=True, swap_sides=False)
    torch.manual_seed(1)
    flipped = [ds[0][1] for _ in range(8)]
    print(f"  'left eye' x of sample 0 over 8 draws: {sorted({round(float(p[0]), 3) for p in flipped})} "
          f"(both sides of the face)")


@fact("aj_vibration_standardized_per_row")
def _():
    x, y = cases_data.band_energies(6, 2)
    z = (x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, keepdims=True)
    print(f"  row means before: {np.round(x.mean(1), 2).tolist()}, after axis=1 standardisation: "
          f"{np.round(z.mean(1), 2).tolist()}; labels {y.tolist()}")


@fact("aj_listdir_order_vs_sorted_labels")
def _():
    folder = cases_data.RecordingFolder(torch.zeros(6, 1), s=13)
    print(f"  listdir(): {folder.listdir()[:3]}...; CSV order: {sorted(folder.names)[:3]}...")


@fact("aj_bert_attention_mask_inverted")
def _():
    batch = cases_data.review_collate(pad_is_true=True)([(torch.tensor([1, 7, 20, 0, 0]), torch.tensor(1))])
    print(f"  input_ids {batch['input_ids'][0].tolist()} -> attention_mask {batch['attention_mask'][0].tolist()}")


@fact("aj_siamese_positive_is_anchor")
def _():
    x, spk = cases_data.speaker_vectors(200, 5)
    ds = cases_data.SpeakerPairs(x, spk, anchor_as_positive=True)
    pairs = [ds[i] for i in range(40)]
    pos = [F.pairwise_distance(a[None], b[None]).item() for a, b, d in pairs if d == 0]
    print(f"  distance of the {len(pos)} positive pairs among 40 items: max {max(pos):.3f}")


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
