"""The fact each broken case of set l rests on, printed by ``verify.py`` before the case trains next to its fix (no
preflight involved). Importing this module attaches each fact to ``FIXES``."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from benchmarks.blind_preflight_l import cases_data as D
from benchmarks.blind_preflight_l import cases_mechanics as M
from benchmarks.blind_preflight_l import cases_shapes as S
from benchmarks.blind_preflight_l import cases_targets as T
from benchmarks.blind_preflight_l import cases_trained as W
from benchmarks.blind_preflight_l.registry import FIXES


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("shapes_graph_readout_without_batch_vector")
def _graph():
    kw = S.graph_readout()
    x, ei, b, y = next(iter(kw["train_loader"]))
    print(f"  fact: model(x, edge_index) -> {tuple(kw['model'](x, ei).shape)}; per-graph targets {tuple(y.shape)}; "
          f"with the batch vector -> {tuple(kw['model'](x, ei, b).shape)}")


@fact("shapes_packed_gru_padded_last_step")
def _gru():
    kw = S.packed_gru()
    tokens, lengths, _ = next(iter(kw["train_loader"]))
    m = kw["model"]
    packed = nn.utils.rnn.pack_padded_sequence(m.emb(tokens), lengths, batch_first=True, enforce_sorted=False)
    out, _ = nn.utils.rnn.pad_packed_sequence(m.gru(packed)[0], batch_first=True)
    zero = (out[:, -1].abs().sum(1) == 0).float().mean().item()
    print(f"  fact: out[:, -1] is all zeros for {zero:.0%} of a batch (lengths {lengths.min()}..{lengths.max()})")


@fact("shapes_lstm_input_view_instead_of_transpose")
def _view():
    x = torch.arange(2 * 3 * 1).view(2, 3, 1)  # clip b, frame t -> value 3b + t
    print(f"  fact: view(T, B, M) sequence 0 = {x.view(3, 2, 1)[:, 0, 0].tolist()}, transpose = "
          f"{x.transpose(0, 1)[:, 0, 0].tolist()} (values 0-2 clip 0, 3-5 clip 1)")


@fact("shapes_log_softmax_over_batch_dim")
def _dim0():
    kw = S.log_softmax_dim0()
    x, _ = next(iter(kw["train_loader"]))
    out = kw["model"](x).exp()
    print(f"  fact: exp(LogSoftmax(dim=0)) sums over classes {out.sum(1)[:3].tolist()}, over the batch "
          f"{out.sum(0)[:3].tolist()}")


@fact("shapes_autoencoder_target_extra_channel_dim")
def _ae():
    kw = S.ae_target()
    x, target = next(iter(kw["train_loader"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shape = (kw["model"](x) - target).shape
    print(f"  fact: output {tuple(kw['model'](x).shape)} vs target {tuple(target.shape)} broadcast to {tuple(shape)}")


@fact("targets_contrastive_pair_labels_inverted")
def _contrastive():
    kw = T.contrastive()
    x1, x2, y = next(iter(kw["train_loader"]))
    d_same = (x1 - x2).norm(dim=1)[y == 1].mean().item()
    d_diff = (x1 - x2).norm(dim=1)[y == 0].mean().item()
    print(f"  fact: raw distance of pairs labelled 1 = {d_same:.2f}, labelled 0 = {d_diff:.2f}; the loss pulls y=0 "
          "pairs together")


@fact("targets_multilabel_with_cross_entropy")
def _multilabel():
    x, y = T._tags(3072, 14)
    counts = torch.bincount(y.sum(1).long(), minlength=7).tolist()
    print(f"  fact: tags per clip 0..6: {counts}; CrossEntropyLoss of an all-zero target row = "
          f"{nn.CrossEntropyLoss()(torch.randn(1, 6), torch.zeros(1, 6)).item():.3f}")


@fact("targets_nominal_classes_regressed_with_mse")
def _nominal():
    kw = T.class_regression()
    print(f"  fact: model output {tuple(kw['model'](torch.randn(2, 12)).shape)}; targets are class ids as floats "
          f"{next(iter(kw['train_loader']))[1][:6, 0].tolist()}")


@fact("targets_word_labels_not_aligned_to_subwords")
def _ner():
    bad, good = T._ner(1, 18, aligned=False)[0], T._ner(1, 18, aligned=True)[0]
    print(f"  fact: ids {bad['input_ids'][:12].tolist()}\n        labels as built  {bad['labels'][:12].tolist()}\n"
          f"        aligned labels   {good['labels'][:12].tolist()}")


@fact("targets_sigmoid_output_for_unbounded_regression")
def _sigmoid():
    _, y = T._prices(2560, 20)
    print(f"  fact: targets range {y.min():.2f}..{y.max():.2f}, {(y > 1).float().mean():.0%} above 1; "
          "Sigmoid output is < 1")


@fact("trained_requires_grad_set_on_module_not_params")
def _module_flag():
    kw = W.requires_grad_module()
    m = kw["model"]
    print(f"  fact: model.block3.requires_grad = {m.block3.requires_grad} but its parameters require grad: "
          f"{[p.requires_grad for p in m.block3.parameters()]}; trainable tensors: "
          f"{[n for n, p in m.named_parameters() if p.requires_grad]}")


@fact("trained_from_pretrained_embedding_frozen_by_default")
def _from_pretrained():
    e = nn.Embedding.from_pretrained(torch.randn(3, 2))
    print(f"  fact: nn.Embedding.from_pretrained(w).weight.requires_grad = {e.weight.requires_grad}")


@fact("trained_reentrant_checkpoint_after_frozen_embedding")
def _reentrant():
    kw = W.reentrant_checkpoint()
    m = kw["model"]
    x, y = next(iter(kw["train_loader"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nn.CrossEntropyLoss()(m(x), y).backward()
    print(f"  fact: after backward, layer grads None: {[p.grad is None for p in m.layers.parameters()][:4]}...; "
          f"head grad None: {m.head.weight.grad is None}")


@fact("trained_numpy_roundtrip_inside_forward")
def _numpy():
    kw = W.numpy_forward()
    m = kw["model"]
    x, y = next(iter(kw["train_loader"]))
    nn.MSELoss()(m(x), y).backward()
    print(f"  fact: encoder grads None: {[p.grad is None for p in m.encoder.parameters()]}; np.clip returns "
          f"{type(np.clip(np.zeros(1), -3, 3)).__name__}")


@fact("trained_padding_idx_on_a_real_relation")
def _padding_idx():
    kw = W.padding_idx_relation()
    m = kw["model"]
    h, r, t = next(iter(kw["train_loader"]))
    nn.functional.cross_entropy(m(h, r), t).backward()
    print(f"  fact: relation 0 vector norm {m.rel.weight[0].norm():.3f}, its gradient norm "
          f"{m.rel.weight.grad[0].norm():.3f}; share of queries with relation 0: {(r == 0).float().mean():.0%}")


@fact("mechanics_key_padding_mask_inverted")
def _mask():
    ids, mask, _ = M._reviews(1, 31)
    print(f"  fact: attention_mask {mask[0].tolist()}; as src_key_padding_mask True = ignored key, so only the "
          f"{int((mask[0] == 0).sum())} pads are attended")


@fact("mechanics_lambdalr_returns_lr_not_factor")
def _lambdalr():
    kw = M.lambdalr()
    print(f"  fact: optimizer lr after LambdaLR init = {kw['optimizer'].param_groups[0]['lr']:.1e}")


@fact("mechanics_all_weights_initialised_to_zero")
def _zeros():
    kw = M.zero_init()
    x, y = next(iter(kw["train_loader"]))
    nn.CrossEntropyLoss()(kw["model"](x), y).backward()
    grads = [round(p.grad.abs().sum().item(), 4) for p in kw["model"].parameters()]
    print(f"  fact: |grad| per tensor (W1, b1, W2, b2, W3, b3) = {grads}")


@fact("mechanics_dice_loss_on_argmax_rewrapped")
def _dice():
    kw = M.dice_argmax()
    loss = kw["loss_fn"](kw["model"], next(iter(kw["train_loader"])))
    loss.backward()
    print(f"  fact: loss.is_leaf = {loss.is_leaf}, grad_fn = {loss.grad_fn}; model grads None: "
          f"{all(p.grad is None for p in kw['model'].parameters())}")


@fact("mechanics_language_model_without_causal_mask")
def _causal():
    m = M.no_causal_mask()["model"].eval()
    x = torch.randint(0, 24, (1, 8))
    y = x.clone()
    y[0, -1] = (y[0, -1] + 1) % 24
    changed = (m(x)[0, 0] - m(y)[0, 0]).abs().max().item()
    print(f"  fact: changing the last token changes the logits at position 0 by {changed:.3f} (0 with a causal mask)")


@fact("data_horizontal_flip_augmentation_on_direction_labels")
def _flip():
    x, y = D._arrows(2048, 41)
    left, right = x[y == 0].mean(0).flatten(), x[y == 1].mean(0).flatten()
    flipped = x[y == 0].flip(-1).mean(0).flatten()
    cos = torch.nn.functional.cosine_similarity
    print(f"  fact: a flipped 'left' image matches the 'right' class mean (cos {cos(flipped, right, 0):.2f}) more "
          f"than the 'left' one (cos {cos(flipped, left, 0):.2f})")


@fact("data_segmentation_flip_applied_to_image_only")
def _segflip():
    img, mask = D._nuclei(256, 43)
    ds = D.NucleiDataset(img, mask, joint=False)
    agree = sum(((ds[i][0][0] > 0.5).long() == ds[i][1]).float().mean().item() for i in range(256)) / 256
    print(f"  fact: pixel agreement between thresholded image and mask as delivered: {agree:.2f} (1.0 if aligned)")


@fact("data_pixels_divided_by_255_twice")
def _255():
    kw = D.double_scaling()
    x, _ = next(iter(kw["train_loader"]))
    print(f"  fact: input range as delivered {x.min():.4f}..{x.max():.4f}")


@fact("data_val_labels_encoded_with_their_own_mapping")
def _mapping():
    _, names = D._commands(3072, 48)
    _, vnames = D._commands(768, 49)
    print(f"  fact: train mapping {D.encode(names)[1]}\n        val mapping   {D.encode(vnames)[1]}")


@fact("data_forecast_target_shifted_backwards")
def _shift():
    kw = D.shifted_target()
    x, y = next(iter(kw["train_loader"]))
    print(f"  fact: target equals input column -2 for {(x[:, -2:-1] == y).float().mean():.0%} of rows")
