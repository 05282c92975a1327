"""Two hand-written, generic-wording paraphrases of a correct diagnosis per broken case (check_patterns.py requires
each case's cause_pattern to match both)."""

PARAPHRASES = {
    "ctc_logprobs_reshaped_not_transposed": [
        "The batch-first output is reshaped into the time-major layout instead of transposed, which scrambles frames of different samples.",
        "Use .transpose(0, 1) rather than .view/.reshape to get (T, N, C) for the CTC loss; reshaping mixes the batch and time axes.",
    ],
    "ctc_log_softmax_over_batch": [
        "The log_softmax feeding the CTC loss normalises along dim=1, the batch, so the scores are not log-probabilities over the classes.",
        "Normalise over the class axis: the per-frame scores given to ctc_loss are not normalized over the vocabulary.",
    ],
    "ctc_downsampled_lengths_wrong": [
        "The input_lengths passed to ctc_loss do not match the encoder's output length after the stride-2 downsampling.",
        "The model subsamples time by 2 but the lengths given to the CTC loss are divided by 4; compute them from the output length.",
    ],
    "simclr_normalize_over_batch": [
        "The embeddings are L2-normalised with dim=0, across the batch, so the similarity matrix is not cosine similarity.",
        "Normalize each embedding row to unit length (dim=1) before the contrastive similarities; the current normalisation runs over the batch axis.",
    ],
    "triplet_distance_summed_over_batch": [
        "The triplet distances are reduced with sum(0), over the batch axis, instead of per sample over the embedding dimension.",
        "Compute each anchor's distance to its own positive and negative along dim=1; the current reduction sums over the batch.",
    ],
    "ctc_labels_collide_with_blank": [
        "The blank index is 0, the same id as the first real label, so that label can never be emitted.",
        "Shift the target labels by +1 so they start at 1 and do not collide with the CTC blank.",
    ],
    "ctc_target_lengths_include_padding": [
        "target_lengths is set to the padded width for every sample rather than the true length of each transcript.",
        "The CTC loss counts the padding value as part of each label sequence; pass the true target lengths.",
    ],
    "simclr_positive_is_self": [
        "The contrastive labels point at the diagonal, so each embedding's positive is itself rather than the other view.",
        "The target for row i should be its partner i + N in the other view; with an unmasked self-similarity the task is trivial.",
    ],
    "moco_labels_arange": [
        "The positive logit sits in the first column, yet the labels are arange(N) rather than zeros.",
        "With the positive key at index 0 of the logits, the targets should all be 0; arange labels point queries at queue entries.",
    ],
    "mae_loss_on_visible_patches": [
        "The reconstruction loss is computed on the unmasked positions, so the network only learns to copy its visible input.",
        "Average the error over the masked patches only; the current loss uses mask == 0 (visible) positions.",
    ],
    "simsiam_no_stop_gradient": [
        "There is no stop-gradient on the target branch: detach the projection the predictor is compared against.",
        "Both branches receive gradient through the cosine loss and the representation collapses; add .detach() to the target.",
    ],
    "simsiam_stop_gradient_on_predictor": [
        "The detach is applied to the predictor output instead of the target, so the predictor never trains.",
        "Stop-gradient sits on the wrong branch: the prediction is detached while the projection branch should be.",
    ],
    "simclr_encoder_under_no_grad": [
        "The encoder runs under torch.no_grad() in the forward, so only the projection head is trained.",
        "The backbone never receives gradient and stays at its random init because its forward is wrapped in no_grad.",
    ],
    "simclr_optimizer_projector_only": [
        "The optimizer holds only the projector's parameters; the encoder is never updated.",
        "The backbone's parameters are missing from the optimizer, so the representation is not trained even though it gets gradients.",
    ],
    "moco_optimizer_on_key_encoder": [
        "The optimizer was built on the momentum key encoder rather than the query encoder.",
        "The query encoder that receives gradients is not in the optimizer and is never stepped.",
    ],
    "moco_momentum_update_reversed": [
        "The momentum update runs in the wrong direction: the query encoder is overwritten toward the key encoder.",
        "The key encoder never updates because the EMA is applied to the online network instead of the target.",
    ],
    "triplet_margin_loss_arguments_swapped": [
        "The triplet loss arguments are given in the wrong order: it should be (anchor, positive, negative).",
        "Positive and negative are swapped in the margin loss, so it pushes the positive away from the anchor.",
    ],
    "infonce_temperature_multiplied": [
        "The similarities are multiplied by the temperature instead of divided by it, so the logits are tiny.",
        "Divide the cosine logits by the temperature; as written the softmax is almost uniform.",
    ],
    "triplet_hard_negative_mining_unmasked": [
        "The hardest-negative mining does not mask same-class rows or the diagonal, so the anchor itself is chosen as negative.",
        "Exclude the anchor and its same-class samples before taking the minimum distance for the negative.",
    ],
    "infonce_distance_logits_not_negated": [
        "The logits are distances with the wrong sign: negate the cdist values before the cross-entropy.",
        "Using positive Euclidean distance as a logit rewards a large distance to the positive; use minus the distance.",
    ],
    "clip_pairs_misaligned": [
        "The image-text pairs are misaligned: the text is taken from a shuffled index, so matched pairs are unrelated.",
        "The dataset permutes the captions independently of the images; the pairs fed to the contrastive loss do not match.",
    ],
    "simclr_views_share_augmentation_seed": [
        "Both views are generated with the same seed, so the two augmentations are identical.",
        "The augmentation generator is re-seeded identically before each view; the two views of a sample are duplicates.",
    ],
    "ctc_collate_sorts_inputs_not_targets": [
        "The collate function sorts the inputs by length but the targets are not reordered the same way.",
        "After sorting the batch, each sample's labels belong to another sample: the transcripts are misaligned with the audio.",
    ],
    "triplet_positive_from_any_class": [
        "The positive is drawn from a random index rather than from the anchor's class.",
        "Most positives come from another class; sample the positive from the same class as the anchor.",
    ],
    "ctc_left_padded_frames": [
        "The frames are left-padded while the lengths assume the real frames come first.",
        "Padding sits at the start of each sequence but input_lengths selects the first frames; right-pad instead.",
    ],
}
