"""Check set aw's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
none of the generic warnings set a's checker lists (set k's check), then a hand-written paraphrase of a correct
diagnosis of each bug (worded as a checker or a colleague would, not copied from the bug sentence).

    .venv/bin/python -m benchmarks.blind_preflight_aw.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_aw.registry import load_all

PARAPHRASES = {
    "graph_reg_broadcast": "The model output is [32, 1] while the graph labels are [32]; MSELoss broadcasts them to a "
                           "32x32 matrix. Call .squeeze(-1) on the prediction.",
    "edge_index_view": "edge_index is built from an (E, 2) edge list with view(2, -1), which does not transpose it: "
                       "use .t() so that row 0 holds the sources.",
    "stft_mask_reshape": "The predicted mask is (B, T, F) and is reshaped to the spectrogram's (B, F, T) instead of "
                         "transposed, so the mask is applied to the wrong time-frequency bins.",
    "dice_broadcast": "In the Dice loss the prediction (8, 1, 16, 16, 16) and the target (8, 16, 16, 16) broadcast to "
                      "(8, 8, 16, 16, 16); add the channel dimension to the target.",
    "channels_last_reshape": "The input volume is channels-last and reshape() to (B, C, D, H, W) interleaves the two "
                             "modalities; use permute(0, 4, 1, 2, 3).",
    "label_trilinear": "Segmentation masks were resized with trilinear interpolation and then truncated to integers, "
                       "which erodes the foreground; resize label maps with nearest-neighbour interpolation.",
    "noisy_target": "Inputs and targets are swapped: the network receives clean audio and is trained to output the "
                    "noisy mixture.",
    "no_pit": "The separation loss is not permutation invariant: outputs are compared with references in a fixed "
              "order although speaker order is arbitrary. Use PIT.",
    "wrong_target_column": "The regression target is the number of atoms (column 0 of the label table), not the bond "
                           "count you meant to predict.",
    "si_snr_sign": "You minimise SI-SNR directly; it is higher-is-better, so the loss should be its negative "
                   "(maximise SI-SNR).",
    "gnn_layers_list": "The GNN layers are held in a Python list, so they are not registered and their weights are "
                       "not in model.parameters(); wrap them in nn.ModuleList.",
    "model_recreated": "The optimizer was built for a different model instance: the model was re-created after the "
                       "optimizer, so its parameters are not in the optimizer.",
    "gnn_no_grad": "The message-passing block runs under torch.no_grad(), so the convolution layers get no gradient "
                   "and are never updated.",
    "freeze_slice": "list(model.parameters())[:-1] froze everything except the final bias; only one bias vector is "
                    "trainable.",
    "gcn_buffer_weights": "The GCN weights are registered as buffers, not nn.Parameter, so the optimizer never "
                          "updates them.",
    "steplr_epochs": "The StepLR step_size is in epochs but the scheduler is stepped per batch, so the learning rate "
                     "decays to nearly zero within a few hundred steps.",
    "dice_softmax_dim": "Softmax is applied over the last spatial axis instead of the class/channel dimension of the "
                        "5D logits, so the class probabilities are wrong.",
    "gcn_no_self_loops": "The GCN normalisation has no self-loops (use A + I / add_self_loops), so each node's own "
                         "features are dropped from its update.",
    "scatter_overwrite": "scatter() overwrites duplicate indices, so only one neighbour message survives per node; "
                         "aggregate with scatter_add or index_add_.",
    "batch_level_pit": "The permutation is chosen for the whole batch rather than per utterance; take the best "
                       "assignment for each mixture before averaging.",
    "mask_axis_order": "The masks are stored in (x, y, z) order while the images are (z, y, x): image and mask are "
                       "transposed relative to each other.",
    "flip_image_only": "The flip augmentation is applied to the image but not to the mask, so labels are misaligned "
                       "for flipped samples.",
    "edge_offset_missing": "When batching graphs the edge indices are not incremented by the cumulative node count, "
                           "so all edges point into the first graph.",
    "sorted_graphs_labels": "Graphs are sorted by size in the collate but the labels are not reordered, so graphs and "
                            "labels no longer match.",
    "independent_crops": "The noisy input and clean target are cropped at different random offsets, so they are "
                         "misaligned in time; use one shared offset.",
}


def paraphrases_match(cases) -> int:
    broken = {n: c for n, c in cases.items() if not c.healthy}
    bad = [n for n, c in broken.items()
           if n not in PARAPHRASES or not re.search(c.cause_pattern, PARAPHRASES[n], re.IGNORECASE)]
    for n in bad:
        print(f"{n}: pattern does not match its paraphrase")
    print(f"{len(broken) - len(bad)}/{len(broken)} patterns match a hand-written paraphrase of a correct diagnosis")
    return 1 if bad else 0


if __name__ == "__main__":
    cases = load_all()
    rc = check_patterns(cases)
    sys.exit(paraphrases_match(cases) or rc)
