"""Two hand-written paraphrases per broken case of a correct diagnosis in generic wording (what a checker that found
the cause might say). ``check_patterns.py`` requires each case's cause_pattern to match both."""

PARAPHRASES = {
    "kd_softmax_over_batch": [
        "The distillation softmax is normalised over the batch dimension (dim=0) rather than over the classes.",
        "Soft targets are computed across the samples of the batch instead of across class logits; use dim=-1.",
    ],
    "kd_student_extra_axis_broadcast": [
        "Student logits have an extra singleton axis, so the KL term broadcasts against the teacher probabilities.",
        "Shape mismatch in the distillation loss: (B, 1, C) vs (B, C) is silently broadcast; squeeze the student output.",
    ],
    "structured_prune_wrong_axis": [
        "The structured pruning mask is computed over the wrong axis and removes input features instead of neurons.",
        "Channel norms use dim=0 of the weight, so whole input columns are pruned rather than output rows.",
    ],
    "svd_compressed_transposed": [
        "The factorised layer multiplies x @ W instead of x @ W.T, applying the transpose of the compressed weight.",
        "Low-rank reconstruction is used in the wrong orientation (transposed) compared to nn.Linear.",
    ],
    "seq_kd_teacher_time_major": [
        "Teacher logits are time-major (seq-first) and are flattened without a transpose, misaligned with the student.",
        "The per-step targets come from a different sample and position because the teacher output is not permuted back to batch_first.",
    ],
    "kd_teacher_class_order": [
        "Teacher and student use a different class order, so the soft targets are assigned to the wrong classes.",
        "The teacher's logit columns are a permutation of the dataset's label mapping; remap them before distilling.",
    ],
    "class_incremental_no_offset": [
        "New-task labels are not offset by the number of old classes and collide with the old class indices.",
        "Task-local labels 0..3 are used for the new classes, so the new head outputs never receive a positive target.",
    ],
    "multilabel_teacher_softmax": [
        "Multi-label soft targets were produced with softmax, which makes them sum to 1; use a sigmoid per label.",
        "The teacher probabilities are mutually exclusive (softmax) although the labels are independent.",
    ],
    "kd_regression_teacher_zscored": [
        "The teacher predicts standardised (z-scored) values while the ground-truth targets are in raw units.",
        "Distillation targets are on a different scale; invert the teacher's normalisation (multiply by std, add mean).",
    ],
    "kd_binary_softmax_single_logit": [
        "Softmax over a single output logit always gives 1, so every soft target is the positive class.",
        "The binary teacher's soft labels are constant ones; a single-logit teacher needs a sigmoid.",
    ],
    "qat_round_without_ste": [
        "The rounding in the fake-quantiser has zero gradient, so quantised weights receive no gradient; add a straight-through estimator.",
        "No STE: round() blocks backpropagation to the weights and only biases are learning.",
    ],
    "lowrank_after_optimizer": [
        "Parameters of the factorised layers are not in the optimizer because it was built before the layers were replaced.",
        "The optimizer holds stale parameters of the removed layers; rebuild the optimizer after compressing the model.",
    ],
    "weight_sharing_through_data": [
        "The shared weight is read via .data, which detaches it, so it never receives a gradient.",
        "Accessing the tied parameter outside autograd leaves the shared matrix at its random init.",
    ],
    "kd_teacher_in_optimizer": [
        "The teacher's parameters are in the optimizer and its outputs are not detached, so the teacher is being trained too.",
        "Freeze the teacher (requires_grad=False, no_grad) and optimise only student.parameters().",
    ],
    "lowrank_factors_zero_init": [
        "Both low-rank factors are initialised to zeros, so neither gets a gradient and the layer is dead.",
        "Zero init of U and V: the product's gradients vanish; initialise the factors randomly.",
    ],
    "qat_inplace_weight_rounding": [
        "Weights are overwritten in place with their quantised value every forward, so small optimizer updates are rounded away.",
        "Keep full-precision shadow weights; writing the rounded tensor into weight.data discards each update.",
    ],
    "magnitude_mask_inverted": [
        "The pruning mask comparison is inverted: it keeps the smallest weights and prunes the largest magnitudes.",
        "Mask uses abs(w) < thr, so it keeps the small weights; it should keep abs(w) > thr.",
    ],
    "ewc_anchor_by_reference": [
        "The EWC snapshot stores references to the live parameters rather than a copy, so the penalty is always zero.",
        "Old parameters were not cloned; (p - p_old) vanishes and the model forgets the previous task.",
    ],
    "lwf_old_model_not_copied": [
        "The old model used for LwF is the same object as the model being trained, not a frozen copy.",
        "Distillation targets come from the current network itself (no deepcopy), so the LwF term has zero gradient.",
    ],
    "prune_mask_before_load": [
        "Masks were computed before load_state_dict, from the random initial weights, not the pretrained ones.",
        "The pruning mask is random with respect to the checkpoint; compute the masks after loading the weights.",
    ],
    "kd_cached_logits_shuffled": [
        "Cached teacher logits are misaligned with the samples because they were produced with shuffle=True.",
        "The stored logits belong to another sample; regenerate the cache in dataset order.",
    ],
    "replay_collate_label_order": [
        "In the collate function inputs and labels are concatenated in a different order, so they are misaligned.",
        "Replay samples are paired with wrong labels; concatenate features and labels in the same order.",
    ],
    "kd_standardised_inputs_raw_teacher": [
        "The teacher receives standardised inputs although it was trained on raw features (a preprocessing mismatch).",
        "Input normalisation differs between teacher and student; feed the teacher the raw units.",
    ],
    "kd_transfer_set_uniform": [
        "The synthetic transfer set is uniform on [0, 1) and does not match the data distribution (randn).",
        "torch.rand covers only a corner of the input space with no negative values; sample like the real features.",
    ],
    "replay_buffer_sorted_head": [
        "The replay buffer takes the first rows of a label-sorted dataset, so it contains only one class.",
        "Old classes are never replayed; sample the buffer randomly or per class (reservoir sampling).",
    ],
}
