"""Check set ax's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
a hand-written paraphrase of a correct diagnosis (``PARAPHRASES``), and none of the generic warnings set a's checker
lists (what a checker says about a run without naming this set's causes).

    .venv/bin/python -m benchmarks.blind_preflight_ax.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_ax.registry import load_all

PARAPHRASES = {
    "shapes_scores_view_document_major": "The flat scores are query-major but are reshaped with view(D, Q) and "
                                         "transposed, so each document's score lands on another document; use "
                                         "view(Q, D).",
    "shapes_stacked_fields_reshape": "torch.stack puts the field axis first, (F, B, E); reshaping that to (B, -1) "
                                     "without permute(1, 0, 2) mixes embeddings of different samples.",
    "shapes_query_features_repeat_not_interleave": "query.repeat(D, 1) tiles the whole batch of queries, so a "
                                                   "document is concatenated with another query's features; use "
                                                   "repeat_interleave.",
    "shapes_interleaved_triplets_chunked": "The batch is laid out a0, p0, n0, a1, ... but e.chunk(3) takes the first "
                                           "third as anchors: anchors, positives and negatives are unrelated samples.",
    "shapes_two_tower_matmul_sum": "Summing u @ v.T over dim 1 adds the user's score with all items in the batch; "
                                   "the score should be the diagonal, (u * v).sum(1).",
    "targets_rank_position_as_relevance": "The target uses the rank position where 1 is the best document, so "
                                          "softmax gives the worst documents the most mass; use max_rank - rank or "
                                          "the relevance grade instead.",
    "targets_pm1_labels_bce": "BCEWithLogitsLoss expects targets in [0, 1] but the labels are -1/+1; map them with "
                              "(y + 1) / 2.",
    "targets_rating_threshold_off_by_one": "The label threshold rating > 5 is never true on a 1-5 scale; every "
                                           "target is 0. Use rating >= 4.",
    "targets_pairwise_sign_flipped": "The pair logit is s_j - s_i while the label says i beats j: the sign is "
                                     "reversed, so the model learns the inverse ranking.",
    "targets_in_batch_labels_zeros": "For in-batch negatives the positive of query i sits on the diagonal: labels "
                                     "must be torch.arange(B), not zeros.",
    "trained_from_pretrained_frozen": "nn.Embedding.from_pretrained defaults to freeze=True, so the embedding "
                                      "tables are never updated; pass freeze=False.",
    "trained_vocab_resized_after_optimizer": "The embedding was replaced by a new nn.Embedding after the optimizer "
                                             "was created; the optimizer still updates the old table. Create the "
                                             "optimizer after resizing.",
    "trained_optimizer_misses_embeddings": "The optimizer only gets model.deep.parameters() and the head: the "
                                           "embeddings and cross layers are never updated. Pass model.parameters().",
    "trained_padding_idx_real_category": "padding_idx=0 collides with a real tag that was encoded as 0: its row "
                                         "stays zero and gets no gradient. Reserve 0 for padding and shift the tag "
                                         "ids by one.",
    "trained_wide_part_in_plain_dict": "The wide layer sits in a plain Python dict, so it is not registered as a "
                                       "submodule and is missing from model.parameters(); use nn.ModuleDict.",
    "mechanics_steplr_epochs_per_batch": "StepLR with step_size=30 is stepped every batch rather than every epoch, "
                                         "so the learning rate decays to near zero within a few hundred steps.",
    "mechanics_ranknet_sum_over_pairs": "The pairwise loss uses reduction='sum' over hundreds of pairs; with SGD at "
                                        "lr 0.1 the updates are far too large. Take the mean over the pairs.",
    "mechanics_bf16_raw_timestamp": "The raw Unix timestamp ~1.7e9 cannot be represented in bfloat16: all values "
                                    "round to the same number. Subtract a reference time and scale it.",
    "mechanics_adam_l2_on_embeddings": "Adam's coupled L2 weight_decay shrinks every embedding row each step, rare "
                                       "categories collapse to zero; use AdamW or put the embeddings in a no_decay "
                                       "group.",
    "mechanics_batch_hard_unnormalised_collapse": "Hardest-negative mining from the start on unnormalised "
                                                  "embeddings makes them collapse; use semi-hard mining and "
                                                  "L2-normalise the embeddings.",
    "data_target_encoding_in_fold_leak": "The target encoding includes each row's own label, which leaks the "
                                         "target; compute it out-of-fold or leave-one-out.",
    "data_label_encoder_per_split": "The LabelEncoder is fit separately on train and validation, so the same code "
                                    "means different cities. Fit on train and only transform validation.",
    "data_hash_modulo_embedding_dim": "The hashed ids are taken modulo 16 (the embedding dim) instead of the number "
                                      "of buckets, so hundreds of products collide into a few rows.",
    "data_scaler_fitted_not_applied": "The StandardScaler was fitted but the training tensor is built from the raw, "
                                      "unscaled X_train while validation is scaled.",
    "data_random_batches_no_positives": "With random batches over 500 classes almost no anchor has a positive in "
                                        "its batch; use a class-balanced P x K sampler such as MPerClassSampler.",
}


def check_paraphrases(cases) -> int:
    ok = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        text = PARAPHRASES.get(name, "")
        hit = bool(text) and re.search(c.cause_pattern, text, re.IGNORECASE) is not None
        ok += hit
        if not hit:
            print(f"{name}: pattern does not match its paraphrase")
    total = sum(not c.healthy for c in cases.values())
    print(f"{ok}/{total} patterns match a hand-written paraphrase of a correct diagnosis")
    return 0 if ok == total else 1


if __name__ == "__main__":
    cases = load_all()
    bad = check_paraphrases(cases)
    sys.exit(check_patterns(cases) or bad)
