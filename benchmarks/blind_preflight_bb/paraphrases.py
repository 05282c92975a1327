"""Hand-written paraphrases of a correct diagnosis (cause or fix) of each broken case, in words a checker that knows
nothing of this set might use; check_patterns.py requires each case's cause_pattern to match all of its own."""

PARAPHRASES = {
    "kws_frames_as_conv_channels": [
        "Conv1d expects (N, C, L) but the batch is (B, T, F): the time axis is used as channels; transpose(1, 2) first.",
        "The frequency axis and the time axis are swapped before the convolution; permute the input.",
    ],
    "sed_clip_pool_over_class_axis": [
        "The clip logits are max-pooled over the class axis instead of over time; pool dim=1 of (B, T, C).",
        "Aggregate frame predictions over the time dimension, not the class dimension.",
    ],
    "nextitnet_readout_at_padding": [
        "The readout takes the final position, which is padding for shorter sessions; gather the output at lengths - 1.",
        "Output at the last time step [:, -1] reads padding for right-padded sequences; use left padding or the real "
        "last item.",
    ],
    "bigru_h_n_view_mixes_clips": [
        "h_n has shape (num_layers * 2, B, H); h_n.view(B, -1) mixes samples across the batch. Use "
        "torch.cat([h_n[-2], h_n[-1]], dim=1).",
        "Reshaping the bidirectional final state with view scrambles different clips into one row; permute(1, 0, 2) "
        "before reshaping.",
    ],
    "sasrec_encoder_not_batch_first": [
        "TransformerEncoderLayer defaults to batch_first=False, so the (B, T, E) input is read as (T, B, E).",
        "Attention runs across the batch instead of across the sequence; pass batch_first=True.",
    ],
    "gru4rec_targets_not_shifted": [
        "The targets are the same as the inputs, so the model learns the identity; shift the targets by one "
        "(seq[:, 1:]).",
        "Labels equal the input tokens instead of the next item.",
    ],
    "sampled_softmax_positive_last_column": [
        "The positive item's score is in the last column but the label says class 0, which is a negative.",
        "Labels of zeros point at a negative sample; put the positive first in the concatenation.",
    ],
    "kws_label_map_per_split": [
        "The label mapping differs between the two folders: each dataset builds its own class-to-index map.",
        "Inconsistent label encoding across datasets: build one shared label map and use it for every split.",
    ],
    "vad_frame_labels_cropped": [
        "The frame labels are truncated to the output length instead of downsampled by the stride, so they are "
        "misaligned with the outputs.",
        "Subsample the targets with the model's stride (y[:, ::4]) rather than cropping them.",
    ],
    "kws_silence_folded_into_unknown": [
        "The silence class never appears as a target: all silence clips are mapped to unknown.",
        "Class 4 has no training examples; the label lookup falls back to the default unknown index.",
    ],
    "sasrec_model_rebuilt_after_optimizer": [
        "The optimizer holds the parameters of a different model instance; the model was re-created after the "
        "optimizer was built.",
        "None of the model's parameters are in the optimizer, so they never change: create the optimizer after the "
        "final model.",
    ],
    "frontend_cut_by_numpy_roundtrip": [
        "The forward goes through numpy (.numpy() / torch.from_numpy), which breaks the autograd graph.",
        "The graph is cut inside forward: the front end gets no gradient; keep the normalisation in torch.",
    ],
    "probe_pretrained_not_loaded": [
        "load_state_dict(strict=False) silently skipped every key because of the 'module.' prefix; strip it.",
        "The pretrained weights were never loaded, so the frozen backbone is random (unexpected_keys lists all keys).",
    ],
    "item_embeddings_frozen_from_pretrained": [
        "nn.Embedding.from_pretrained freezes the weights by default; pass freeze=False.",
        "The item embedding is frozen (requires_grad=False) and never updated.",
    ],
    "gru_outputs_detached": [
        "The GRU outputs are detached before the head, so the encoder receives no gradient.",
        "Autograd graph broken by .detach(): only the final linear layer trains.",
    ],
    "sasrec_no_causal_mask": [
        "No causal mask: each position can attend to future items, leaking the target; pass "
        "generate_square_subsequent_mask as attn_mask.",
        "The self-attention looks ahead at the next token; use is_causal=True.",
    ],
    "sasrec_key_padding_mask_inverted": [
        "The padding mask is inverted: key_padding_mask must be True at padding positions, not at real tokens.",
        "src_key_padding_mask marks the real items True, so attention attends only to the pad positions.",
    ],
    "sampled_softmax_no_logq_correction": [
        "Sampled softmax with popularity-sampled negatives needs the logQ correction: subtract log of the sampling "
        "probability from the logits.",
        "The negative sampling distribution is not corrected for, biasing scores against popular items.",
    ],
    "cosine_logits_no_temperature": [
        "Cosine-similarity logits lie in [-1, 1]; divide by a temperature (e.g. 0.05) before the cross-entropy.",
        "The logits are bounded so the softmax is nearly uniform; scale the logits.",
    ],
    "kws_exponential_lr_per_batch": [
        "The ExponentialLR scheduler is stepped every batch instead of every epoch, so the learning rate decays to "
        "nearly zero.",
        "Learning rate collapses within a few dozen steps: gamma=0.9 applied per iteration.",
    ],
    "alarm_per_clip_normalisation": [
        "Per-clip normalisation removes the level information the classes depend on; use dataset-wide statistics.",
        "Each sample is standardised with its own mean and std, erasing loudness.",
    ],
    "kws_train_audio_not_resampled": [
        "The training audio's sample rate (16 kHz) differs from the 8 kHz the features assume; resample it.",
        "Sampling rate mismatch between training and validation clips: frequencies are halved.",
    ],
    "kws_crop_first_second": [
        "Cropping every clip to its first second cuts the keyword out of most recordings.",
        "Fixed-length truncation drops the event; pad or choose the window around the energy peak.",
    ],
    "item_zero_is_padding_id": [
        "Item id 0 is a real item but also the padding_idx; shift the item ids by 1 and reserve 0 for padding.",
        "ignore_index=0 drops every target equal to the most popular item, which collides with the padding id.",
    ],
    "sessions_sorted_by_item_not_time": [
        "The sessions are ordered by item id rather than by timestamp, destroying the click order.",
        "Sort the interactions chronologically within each session before building sequences.",
    ],
}
