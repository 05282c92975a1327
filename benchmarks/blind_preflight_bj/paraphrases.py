"""Two hand-written, generic-wording paraphrases of a correct diagnosis per broken case of set bj (each must be
matched by the case's cause_pattern; see check_patterns.py)."""

PARAPHRASES = {
    "s_gru_batch_first": [
        "The recurrent layer expects (seq_len, batch, features) but receives batch-major tensors; set batch_first=True "
        "so it does not iterate over the batch.",
        "Samples in a batch are treated as time steps by the GRU: the time axis and the batch axis are swapped.",
    ],
    "s_conv_view": [
        "Use x.transpose(1, 2) instead of view/reshape when moving features to the channel axis for the convolution.",
        "The reshape to (batch, channels, length) scrambles time steps and features instead of permuting the axes.",
    ],
    "s_quantile_broadcast": [
        "The quantile loss broadcasts the target against the wrong axis: each quantile is compared with a different "
        "horizon step; unsqueeze the target at the last dimension.",
        "Target of shape (B, 1, H) is broadcast against predictions (B, H, Q), so the horizon and quantile axes are "
        "misaligned.",
    ],
    "s_last_step_index": [
        "The head reads the recurrent output at the first time step instead of the last; use out[:, -1].",
        "The forecast is made from the state after the oldest step of the window rather than the final position.",
    ],
    "s_lag_stack_dim": [
        "Lag columns are stacked with dim=0 and then reshaped, so the lag features of each row come from other "
        "windows; stack along dim=1.",
        "The feature matrix mixes rows: lags of different samples end up in one row after the reshape of the stack.",
    ],
    "t_off_by_one_horizon": [
        "The horizon targets are shifted by one step: the first target equals the last input value (off by one).",
        "Targets start one step too early, inside the input window; slice them from L, not L-1.",
    ],
    "t_target_norm_own_stats": [
        "The target is normalised with its own mean and std rather than the input window's statistics, so level "
        "information is lost.",
        "Scale the horizon with the input window statistics (the context window mean and std) instead of per-target "
        "normalisation.",
    ],
    "t_quantile_sign": [
        "The pinball loss uses pred - y; the sign of the error is flipped, so the quantile levels are inverted.",
        "Quantiles are swapped: the 0.1 output learns the 0.9 quantile because the residual sign is reversed.",
    ],
    "t_decoder_input_unshifted": [
        "Teacher forcing leaks the target: the decoder input is not shifted right by one, so the decoder sees the "
        "value it must predict.",
        "The decoder is fed the current target itself at each step; shift the decoder inputs by one step.",
    ],
    "t_missing_in_loss": [
        "The observed-value mask is ignored in the loss, so zero-filled missing targets are trained on.",
        "Missing targets imputed as zero are included in the loss; weight the squared error by the mask.",
    ],
    "w_head_replaced_after_optim": [
        "The output head was replaced after the optimizer was created, so the new head is not in the optimizer and "
        "is never updated.",
        "The optimizer was built before the head was reassigned; rebuild the optimizer after changing the module.",
    ],
    "w_encoder_detached": [
        "The encoder output is detached, so no gradient reaches the encoder and it stays at its random init.",
        "A stop-gradient cuts the encoder off from the loss: the embedding network is never trained.",
    ],
    "w_no_grad_covariates": [
        "The covariate branch runs under torch.no_grad(), so it receives no gradient and is never trained.",
        "Gradients are disabled for the exogenous feature branch in the forward pass: that layer stays random.",
    ],
    "w_forecast_head_untrained": [
        "The loss uses the backcast output instead of the forecast output, so the forecast head is never trained.",
        "The criterion is applied to the wrong element of the model's output tuple; the forecast branch gets no "
        "gradient and stays random.",
    ],
    "w_shared_horizon_heads": [
        "The list of heads is built by list multiplication, so one Linear module is repeated for every horizon step.",
        "All horizon heads are the same object and share weights, so every horizon predicts the same value.",
    ],
    "m_tcn_trim_wrong_side": [
        "The causal convolution trims the padding on the wrong side, so outputs are misaligned and see the future "
        "padding.",
        "Chomp the end of the padded convolution output, not the start: the final output sees zeros instead of the "
        "past window.",
    ],
    "m_revin_no_denorm": [
        "The forecast is never denormalised: apply the inverse transform (out * std + mean) before comparing with "
        "raw targets.",
        "The model predicts in normalised space while the loss uses raw-scale targets; undo the instance "
        "normalisation on the output.",
    ],
    "m_pack_lengths_full": [
        "Pass each series' true length to pack_padded_sequence; with the padded length the final hidden state is "
        "read after the padding zeros.",
        "The lengths given to packing are the full padded length, so padding values are consumed by the RNN.",
    ],
    "m_decoder_no_hidden": [
        "The decoder is called without the hidden state, so each decoding step starts from a zero state and the "
        "encoder context is never passed on.",
        "The decoder runs without the hidden state of the previous step, so the encoder context is lost; pass h "
        "to the decoder each step.",
    ],
    "m_cumsum_dim0": [
        "The predicted increments are accumulated across the batch (cumsum over dim 0) instead of along the horizon.",
        "Integrating the deltas sums over the samples of the batch rather than over time.",
    ],
    "d_lags_after_shuffle": [
        "The rows are shuffled before building the lag windows, so the temporal order is destroyed.",
        "Lags and targets are computed after a random permutation of the time steps; shuffle windows, not rows.",
    ],
    "d_missing_zero_no_mask": [
        "Missing values are filled with zero in the raw scale; forward-fill or mask them instead.",
        "NaNs in the inputs are replaced with 0 without a missingness indicator, producing fake drops.",
    ],
    "d_ae_contaminated": [
        "The autoencoder is trained on data that includes the anomalies; train it on normal windows only.",
        "Anomalous windows are part of the training set, so the detector learns to reconstruct them (contamination).",
    ],
    "d_covariate_misaligned": [
        "The future covariates are misaligned by one step with the horizon targets (off by one).",
        "Each forecast step receives the promotion feature of the previous step; index the covariates at the "
        "horizon steps.",
    ],
    "d_collate_sort_unpaired": [
        "The collate function sorts the inputs by length but not the targets, so the labels no longer match their "
        "sequences.",
        "After reordering the batch for packing, apply the same permutation to the targets; they are misaligned.",
    ],
}
