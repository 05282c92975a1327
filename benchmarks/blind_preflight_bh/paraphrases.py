"""Two hand-written, generic-wording paraphrases of a correct diagnosis per broken case of set bh."""

PARAPHRASES = {
    "gauss_vae_recon_broadcast": [
        "Each sample comes out of the dataset with an extra singleton dimension, so the reconstruction loss compares "
        "every output with every input in the batch.",
        "The inputs are (B, 1, D) while the decoder returns (B, D): the MSE reconstruction term silently broadcasts "
        "and the decoder only learns the batch mean.",
    ],
    "flow_base_logprob_sum_over_batch": [
        "The base log-probability is summed over the whole batch into a scalar before being combined with the "
        "per-sample log-det, so the prior term dominates.",
        "The Gaussian prior term is weighted batch-size times more than the Jacobian term; compute it per sample "
        "with sum(1) instead.",
    ],
    "mdn_logsumexp_over_batch": [
        "The mixture log-likelihood reduces with logsumexp over dim=0, the batch axis, instead of over the "
        "components.",
        "The loss marginalises across the samples of the batch rather than across the mixture components of each "
        "sample.",
    ],
    "vae_kl_sum_over_batch_dim": [
        "The KL divergence is summed over the batch axis instead of the latent axis, which overweights it and leads "
        "to posterior collapse.",
        "Because of the wrong reduction axis the KL term is scaled by batch size / latent size and the model "
        "collapses to the prior.",
    ],
    "gumbel_softmax_wrong_dim": [
        "The Gumbel-softmax relaxation is taken over dim=1, across the latent groups, instead of over each group's "
        "categories.",
        "The relaxed samples are normalised across the groups rather than the categories, so the codes are never "
        "one-hot per group.",
    ],
    "ar_targets_not_shifted": [
        "The targets are not shifted by one position: the model is trained to reproduce the token it is given, not "
        "the next token.",
        "The autoregressive loss uses the same position as input and target, so the network learns the identity "
        "instead of next-token prediction.",
    ],
    "bce_targets_normalised_to_minus_one": [
        "The binary targets were normalised to [-1, 1] before the binary cross-entropy, which expects values in "
        "[0, 1].",
        "The Bernoulli likelihood receives -1 as a target for the off pixels, a value outside its support, so the "
        "loss is unbounded below.",
    ],
    "ar_collate_shift_reversed": [
        "The collate function shifts the sequence the wrong way, so the network predicts the previous token "
        "instead of the next one.",
        "Inputs and targets are swapped in the shift: the causal model is asked for the preceding token from the "
        "current one.",
    ],
    "flow_base_logprob_on_input": [
        "The base log-probability is evaluated on the input x rather than on the latent z produced by the flow.",
        "The prior density is computed on the data instead of the transformed output, so only the log-det term "
        "drives training.",
    ],
    "bernoulli_decoder_mse_on_logits": [
        "The decoder's raw logits are regressed with a squared error against the binary pixels instead of using a "
        "Bernoulli likelihood.",
        "Mean squared error is applied to pre-sigmoid outputs; use binary_cross_entropy_with_logits instead of MSE.",
    ],
    "vae_optimizer_misses_decoder": [
        "The decoder's parameters were left out of the optimizer, so it stays at its random initialisation.",
        "The optimizer omits the decoder: only the encoder and its heads are updated while the decoder is never "
        "trained.",
    ],
    "flow_logdet_detached": [
        "The log-determinant of the Jacobian is detached, so it contributes no gradient to the flow.",
        "Because logdet is cut from the graph with .detach(), nothing prevents the scales from contracting the data.",
    ],
    "vq_no_straight_through": [
        "The quantised vectors are passed to the decoder without a straight-through estimator, so the encoder gets "
        "no reconstruction gradient.",
        "The encoder receives no gradient from the reconstruction loss because the nearest-code lookup is not "
        "differentiable and no straight-through copy is used.",
    ],
    "vae_sample_instead_of_rsample": [
        "The latent is drawn with .sample() rather than .rsample(), so no gradient flows through the sample to the "
        "encoder.",
        "The reparameterisation trick is not used (a non-differentiable sample instead of rsample), leaving the "
        "encoder trained only by the KL.",
    ],
    "made_mask_is_parameter": [
        "The autoregressive masks are registered as trainable parameters, so the optimizer changes them.",
        "The masks should be a buffer (register_buffer), not an nn.Parameter that is learned along with the weights.",
    ],
    "kl_annealing_never_advances": [
        "The KL warm-up counter is never incremented, so beta stays at zero throughout training.",
        "The annealing weight is stuck at 0: the step counter of the schedule is never advanced.",
    ],
    "made_output_mask_non_strict": [
        "The output layer's mask uses a non-strict >= comparison of degrees, so each output sees its own input.",
        "The autoregressive property is violated: output d depends on x_d itself because the output mask is not "
        "strict.",
    ],
    "causal_conv_trims_wrong_end": [
        "After padding, the convolution output is trimmed at the wrong end, so each position can see future tokens.",
        "The causal convolution is not causal: the slice keeps the last L outputs, which leak later tokens into "
        "the prediction.",
    ],
    "flow_no_permutation_between_couplings": [
        "There is no permutation between the coupling layers, so the same half is transformed every time.",
        "Every coupling conditions on the same coordinate, which is therefore never transformed; alternate or flip "
        "the halves between couplings.",
    ],
    "flow_logdet_sign_flipped": [
        "The log-det term has the wrong sign in the negative log-likelihood: it is subtracted instead of added.",
        "The change-of-variables formula is applied with a flipped sign on the Jacobian term.",
    ],
    "cvae_labels_off_by_one": [
        "The conditioning labels are off by one: each row is paired with the label of the next row.",
        "The class labels do not match their samples, so the decoder learns to ignore the condition.",
    ],
    "mdn_inputs_sorted_without_targets": [
        "The inputs are sorted but the targets are not reindexed with the same permutation, so the pairs are "
        "scrambled.",
        "Sorting x without applying the same indices to y breaks the x-y pairs.",
    ],
    "cvae_subset_from_label_sorted_order": [
        "The training subset is taken from label-sorted indices, so only the first half of the classes is ever "
        "sampled.",
        "Half of the classes are never seen in training because the sampler's indices come from argsort of the "
        "labels.",
    ],
    "flow_dequant_noise_wrong_scale": [
        "The dequantisation noise is added after scaling to the unit interval, so it is far too wide compared with "
        "a grid cell.",
        "Uniform noise is not divided by the number of levels: it should be (k + u) / 16, not k / 16 + u.",
    ],
    "cvae_collate_relabels_per_batch": [
        "The collate function re-indexes the labels within each batch, so a class id changes from batch to batch.",
        "Label ids depend on which classes the batch contains because torch.unique with return_inverse remaps them "
        "per batch.",
    ],
}
