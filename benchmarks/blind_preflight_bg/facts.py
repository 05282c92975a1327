"""The fact each broken case of set bg rests on, printed without the preflight (attached to FIXES[name]["fact"])."""

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_bg.registry import FIXES, load_all

load_all()


def _fact(name):
    def register(fn):
        FIXES[name]["fact"] = fn
        return fn
    return register


@_fact("ctc_logprobs_reshaped_not_transposed")
def _():
    a = torch.arange(2 * 3).view(2, 3, 1)  # (N=2, T=3)
    print("  fact: reshape(T, N, C) row 0 =", a.reshape(3, 2, 1)[0].flatten().tolist(),
          "vs transpose row 0 =", a.transpose(0, 1)[0].flatten().tolist())


@_fact("ctc_log_softmax_over_batch")
def _():
    lp = F.log_softmax(torch.randn(5, 4, 7), dim=1)
    print(f"  fact: per-frame class probabilities sum to {lp.exp().sum(-1)[0, 0]:.3f} (should be 1)")


@_fact("ctc_downsampled_lengths_wrong")
def _():
    conv = torch.nn.Conv1d(12, 4, 3, stride=2, padding=1)
    print("  fact: stride-2 conv maps 24 frames to", conv(torch.zeros(1, 12, 24)).shape[-1], "; (24+3)//4 =", 27 // 4)


@_fact("simclr_normalize_over_batch")
def _():
    z = F.normalize(torch.randn(8, 4), dim=0)
    print(f"  fact: row norms after normalize(dim=0): {z.norm(dim=1).min():.2f}..{z.norm(dim=1).max():.2f}")


@_fact("triplet_distance_summed_over_batch")
def _():
    print("  fact: (a - p).pow(2).sum(0) on (64, 32) has shape", tuple(torch.zeros(64, 32).sum(0).shape))


@_fact("ctc_labels_collide_with_blank")
def _():
    from benchmarks.blind_preflight_bg.registry import ctc_sequences
    y = ctc_sequences(64, 0, zero_based=True)[2]
    print("  fact: zero-based targets use label 0 (the blank) in", int((y[:, 0] == 0).sum()), "of 64 first positions")


@_fact("ctc_target_lengths_include_padding")
def _():
    from benchmarks.blind_preflight_bg.registry import ctc_sequences
    y, yl = ctc_sequences(64, 0)[2:]
    print("  fact: true target lengths", yl[:8].tolist(), "vs the padded width", y.size(1))


@_fact("simclr_positive_is_self")
def _():
    z = F.normalize(torch.randn(6, 4), dim=1)
    print("  fact: argmax of unmasked similarity rows == self:", ((z @ z.T).argmax(1) == torch.arange(6)).all().item())


@_fact("moco_labels_arange")
def _():
    print("  fact: the positive key is column 0 of cat([l_pos, l_neg]); arange(N) points at columns 0..N-1")


@_fact("mae_loss_on_visible_patches")
def _():
    print("  fact: visible patches are in the model's input, so their reconstruction is a copy")


@_fact("simsiam_no_stop_gradient")
def _():
    print("  fact: without detach, -cos(p1, z2) gets gradient through z2 as well (both branches move)")


@_fact("simsiam_stop_gradient_on_predictor")
def _():
    p = torch.nn.Linear(3, 3)
    (-F.cosine_similarity(p(torch.randn(4, 3)).detach(), torch.randn(4, 3, requires_grad=True)).mean()).backward()
    print("  fact: predictor grad after p.detach():", p.weight.grad)


@_fact("simclr_encoder_under_no_grad")
def _():
    lin = torch.nn.Linear(3, 3)
    with torch.no_grad():
        h = lin(torch.randn(2, 3))
    print("  fact: output of a layer under no_grad requires_grad =", h.requires_grad)


@_fact("simclr_optimizer_projector_only")
def _():
    print("  fact: parameters not passed to the optimizer are never stepped")


@_fact("moco_optimizer_on_key_encoder")
def _():
    print("  fact: the key encoder is computed under no_grad, its parameters have requires_grad=False")


@_fact("moco_momentum_update_reversed")
def _():
    print("  fact: q = m*q + (1-m)*k with m=0.99 pulls q 1% toward k each step; k never changes")


@_fact("triplet_margin_loss_arguments_swapped")
def _():
    a, p, n = torch.zeros(1, 2), torch.tensor([[0.1, 0.0]]), torch.tensor([[2.0, 0.0]])
    print(f"  fact: (a, p, n) loss {F.triplet_margin_loss(a, p, n, margin=0.5):.2f}, (a, n, p) loss "
          f"{F.triplet_margin_loss(a, n, p, margin=0.5):.2f} on a correct embedding")


@_fact("infonce_temperature_multiplied")
def _():
    print(f"  fact: logits within [-0.1, 0.1]: softmax max over 64 is at most {torch.softmax(torch.tensor([0.1] + [-0.1] * 63), 0)[0]:.4f}")


@_fact("triplet_hard_negative_mining_unmasked")
def _():
    e = F.normalize(torch.randn(5, 4), dim=1)
    print("  fact: min of unmasked cdist rows is the anchor itself:", torch.cdist(e, e).min(1).values.tolist()[:3])


@_fact("infonce_distance_logits_not_negated")
def _():
    print("  fact: softmax over +distance puts the most mass on the farthest candidate:",
          torch.softmax(torch.tensor([0.1, 1.5, 1.9]), 0).argmax().item(), "(index of distance 1.9)")


@_fact("clip_pairs_misaligned")
def _():
    print("  fact: txt[order[i]] with a random permutation matches i for ~1/N rows")


@_fact("simclr_views_share_augmentation_seed")
def _():
    from benchmarks.blind_preflight_bg.cases_data import SeededViews
    from benchmarks.blind_preflight_bg.registry import latent_signal
    a, b = SeededViews(latent_signal(4, 0)[0], True)[0]
    print("  fact: the two views are equal:", torch.equal(a, b))


@_fact("ctc_collate_sorts_inputs_not_targets")
def _():
    print("  fact: x[order] with y unchanged pairs row i's frames with another row's labels")


@_fact("triplet_positive_from_any_class")
def _():
    print("  fact: a random index out of 12 balanced classes is in the anchor's class ~1/12 of the time")


@_fact("ctc_left_padded_frames")
def _():
    from benchmarks.blind_preflight_bg.cases_data import left_pad
    from benchmarks.blind_preflight_bg.registry import ctc_sequences
    x, xl = left_pad(ctc_sequences(4, 0))[:2]
    print("  fact: frames 0..xl-1 of row 0 that are padding:", int((x[0, :xl[0]].abs().sum(-1) == 0).sum()))
