"""Two hand-written, generic-wording paraphrases of a correct diagnosis per broken case (check_patterns checks that
each case's cause_pattern matches both)."""

PARAPHRASES = {
    "hetero_nll_target_column": [
        "The Gaussian NLL broadcasts the per-row mean against a column of targets into a (B, B) matrix; flatten the "
        "targets first.",
        "Targets shaped (B, 1) against a predicted mean of shape (B,) make the NLL compare each prediction with every "
        "target in the batch; reshape y with view(-1).",
    ],
    "quantile_target_tiled": [
        "The quantile targets are tiled with repeat instead of repeat_interleave, so the pinball loss pairs each "
        "prediction with another row's target.",
        "In the pinball loss the flattened quantile predictions are misaligned with the wrong row's target; build "
        "the expanded targets with repeat_interleave.",
    ],
    "coral_levels_reshaped": [
        "The cumulative level targets are reshaped instead of transposed, which scrambles the binary targets across "
        "rows.",
        "Use .t() rather than reshape on the (K-1, B) comparison: the ordinal levels end up mixed between other rows.",
    ],
    "sensor_conv_view_not_transpose": [
        "The window is turned into channels-first with view instead of transpose, which interleaves time steps and "
        "channels.",
        "Use permute(0, 2, 1) rather than reshape to put channels first; the current layout scrambles each channel's "
        "time series.",
    ],
    "focal_index_matrix": [
        "The focal loss indexes the probabilities with probs[:, y], building a (B, B) matrix of every label in the "
        "batch; use gather.",
        "Selecting the true-class probability broadcasts each row against all targets of the batch; pick it per row "
        "with gather(1, y[:, None]).",
    ],
    "coral_levels_ge": [
        "The ordinal level targets use >= where > is needed, an off-by-one that makes the first level always 1.",
        "Levels built with greater-or-equal shift every rank up by one; compare with > k instead.",
    ],
    "pinball_sign_flipped": [
        "The pinball loss has its sign reversed (prediction minus target), so each head learns the 1 - tau quantile.",
        "Compute the quantile error as target minus prediction; with pred - y the low and high quantiles swap.",
    ],
    "multitask_mask_after_fill": [
        "The missing-target mask is computed after the NaNs were already filled with zeros, so the mask is all ones.",
        "Build the observed mask before nan_to_num: as it is, missing entries are trained toward 0.",
    ],
    "pos_weight_inverted": [
        "pos_weight is inverted (positives over negatives), which weights the rare class down instead of up.",
        "Use n_neg / n_pos rather than its reciprocal: the current pos_weight is below 1 and suppresses positives.",
    ],
    "multitask_task_columns_swapped": [
        "The two task targets are swapped in the training data, so each head learns the other task's target.",
        "Each task head is trained on the wrong column: the Dataset reverses the target columns for training only.",
    ],
    "scale_net_not_in_optimizer": [
        "The variance network is not in the optimizer, so the predicted uncertainty stays at its random "
        "initialisation.",
        "The optimizer only receives mean_net's parameters; the sigma branch is never updated.",
    ],
    "mean_head_on_detached_trunk": [
        "The mean head reads detached trunk features, so the shared trunk learns only from the log-variance head.",
        "A .detach() between the trunk and the mean prediction keeps the mean loss from training the shared "
        "features.",
    ],
    "coral_thresholds_buffer": [
        "The ordinal thresholds are a register_buffer, not a parameter, so they stay at zero.",
        "The cutpoints are never learned: they remain constant because they were registered as a buffer.",
    ],
    "quantile_trunk_no_grad": [
        "The trunk runs under a no_grad context in forward, so only the quantile heads learn on random features.",
        "Gradients are disabled for the shared encoder in the forward pass; the trunk never trains.",
    ],
    "quantile_net_rebuilt_after_optimizer": [
        "The network is rebuilt by set_quantiles after the optimizer was created, so the optimizer updates the old "
        "discarded layers.",
        "The optimizer was constructed before the model replaced its layers; build it after calling set_quantiles.",
    ],
    "coral_levels_with_cross_entropy": [
        "The multi-hot level targets are trained with cross entropy instead of binary cross-entropy per level.",
        "Use binary_cross_entropy_with_logits rather than softmax cross entropy: the ordinal levels are not mutually "
        "exclusive.",
    ],
    "gaussian_nll_given_std": [
        "The standard deviation is passed where gaussian_nll_loss expects a variance; square the scale.",
        "The var argument receives sigma, so the network learns the variance in its scale output; pass scale ** 2.",
    ],
    "weighted_sampler_no_replacement": [
        "The weighted sampler uses replacement=False with num_samples equal to the dataset size, which is only a "
        "permutation.",
        "Drawing without replacement gives each sample exactly once per epoch, so the sampler does no oversampling of "
        "the minority class.",
    ],
    "gru_reads_padded_last_step": [
        "The GRU output is taken at the last padded position instead of each sequence's true length.",
        "Index the recurrent output at lengths - 1 (or use pack_padded_sequence) rather than out[:, -1] over the "
        "padding.",
    ],
    "bce_weight_instead_of_pos_weight": [
        "The imbalance ratio is given as weight= instead of pos_weight, so it rescales every element the same.",
        "Pass the ratio as pos_weight rather than weight=: weight multiplies all samples by the same constant.",
    ],
    "sampler_given_class_weights": [
        "The sampler receives class weights instead of one weight per sample, so it only draws indices 0 and 1.",
        "WeightedRandomSampler needs per-sample weights; with two class weights it only ever samples the first two "
        "rows.",
    ],
    "window_target_at_start": [
        "The window's target is taken at the window start (y[i]) instead of the reading after the window.",
        "Targets are misaligned with the windows: label each window with y[i + window], the value that follows it.",
    ],
    "collate_sorts_inputs_not_targets": [
        "The collate function sorts the sequences by length but the targets are not reordered with them.",
        "After sorting by length, the labels keep their original order, so they are paired with the wrong sequences.",
    ],
    "ordinal_labels_alphabetical": [
        "The ordinal grade names are encoded in alphabetical order, so the ranks are not in their natural order.",
        "Encoding labels with sorted(set(...)) gives lexicographic rank order; map the grades in their true ordinal "
        "order.",
    ],
    "train_columns_sorted_by_name": [
        "The training features are in sorted column order while validation uses the logged order.",
        "Validation feeds the columns in a different order than training, so features land in the wrong slots.",
    ],
}
