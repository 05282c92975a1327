"""Two hand-written paraphrases per broken case of set bc: a correct diagnosis in generic wording (what a checker
that found the cause might say), used by ``check_patterns.py`` to make sure each cause_pattern is not tied to the
case's own sentence."""

PARAPHRASES = {
    "sh_gpt_unshifted_labels": [
        "The loss pairs each position's logits with the token at that same position; for a causal LM the targets "
        "must be shifted by one (logits[:, :-1] vs labels[:, 1:]).",
        "The model can minimise the loss by copying its input token: labels are not shifted to the next token.",
    ],
    "sh_gpt2_preshifted_labels": [
        "Labels were shifted by hand although GPT2LMHeadModel shifts them internally, so targets are two "
        "positions ahead.",
        "Pass labels = input_ids (unshifted); the model already applies the one-token shift, so it is shifted twice.",
    ],
    "sh_t5_decoder_inputs_equal_labels": [
        "decoder_input_ids are identical to the labels; they must be the labels shifted right with the decoder "
        "start token.",
        "Do not pass decoder_input_ids equal to labels: let the model build them with _shift_right so the "
        "decoder cannot see the token it predicts.",
    ],
    "sh_labels_time_major": [
        "The targets are laid out (T, B) while the logits are (B, T): pad_sequence defaults to batch_first=False.",
        "Labels and logits are flattened in different orders (time-major vs batch-major), so each prediction is "
        "scored against another row's token.",
    ],
    "sh_gru_seq2seq_not_batch_first": [
        "nn.GRU expects (seq_len, batch, features) unless batch_first=True, but receives (batch, time, features).",
        "The recurrent layers run over the batch dimension: construct them with batch_first=True or transpose "
        "the inputs.",
    ],
    "tg_prompt_mask_inverted": [
        "The -100 mask is inverted: the prompt tokens are supervised and the answer tokens are ignored.",
        "Only the instruction is in the loss; mask labels[:len(prompt)] instead of the response.",
    ],
    "tg_pad_eq_eos_masked": [
        "Because pad_token_id equals eos_token_id, masking padding by token id also masks the EOS token, so the "
        "model never learns to stop.",
        "Mask padding with attention_mask == 0 instead of labels == pad_token_id to keep the end-of-sequence "
        "token in the loss.",
    ],
    "tg_bart_labels_are_source": [
        "The labels are the source input_ids, so the seq2seq model learns to reconstruct its input instead of the "
        "target sequence.",
        "Targets were built from the encoder input rather than the target text: the model is trained as an "
        "autoencoder.",
    ],
    "tg_label_smoothing_as_confidence": [
        "label_smoothing=0.9 spreads 90% of the target mass uniformly; use a small value such as 0.1.",
        "The smoothing is far too strong: the training targets are near-uniform distributions over the vocabulary.",
    ],
    "tg_last_position_only": [
        "Only the last position contributes to the loss ([:, -1]); with right padding it is padding or EOS.",
        "The loss should cover every answer position, not a single token at the end of the padded row.",
    ],
    "tr_lora_both_zero": [
        "lora_A and lora_B are both zero-initialised, so their gradients are zero and the adapter never learns.",
        "Initialise lora_A with kaiming_uniform_ and keep only lora_B at zero; with both factors all zeros "
        "nothing is updated.",
    ],
    "tr_lora_alpha_over_r": [
        "The LoRA scaling alpha / r = 1/64 makes the adapter update tiny; set lora_alpha on the order of r.",
        "With rank 64 and alpha 1 the adapter output is shrunk 64x, an effective learning rate far too small.",
    ],
    "tr_optimizer_before_lora": [
        "The optimizer was created before the adapters were added, so the LoRA parameters are not in the "
        "optimizer and are never updated.",
        "Rebuild the optimizer after injecting LoRA: it only holds the frozen base weights.",
    ],
    "tr_lora_name_filter": [
        "The name filter used to set requires_grad matches no adapter parameter ('lora' vs down/up); only the "
        "norm layers are trainable.",
        "Adapter weights are frozen because their names don't match the filter, so only the RMSNorm weights train.",
    ],
    "tr_freeze_after_inject": [
        "requires_grad_(False) after injecting the adapters froze the LoRA weights too; only the lm_head trains.",
        "The freezing order is wrong: freeze the base model before adding the adapters, otherwise no adapter "
        "param is trainable.",
    ],
    "mc_float_causal_mask": [
        "A float 0/1 causal mask is added to the attention scores, so future tokens are not masked; use a boolean "
        "mask or -inf.",
        "The attention is not causal: every position can look ahead at the token it is predicting.",
    ],
    "mc_decoder_no_tgt_mask": [
        "The decoder is called without tgt_mask, so it can attend to future target tokens during teacher forcing.",
        "Pass generate_square_subsequent_mask as the decoder's causal mask; otherwise decoder self-attention is "
        "unmasked and leaks the answer.",
    ],
    "mc_no_position_embedding": [
        "The position embedding is created but never added, so the model has no position information.",
        "Without positional encoding the causal transformer is order-agnostic and cannot align answer and "
        "prompt letters.",
    ],
    "mc_no_teacher_forcing": [
        "teacher_forcing_ratio is 0: the decoder is fed its own predictions instead of the gold previous tokens.",
        "Training runs free-running (the argmax of the previous step is fed as input); use teacher forcing.",
    ],
    "mc_schedule_in_samples": [
        "num_training_steps was computed from len(train_dataset) (samples), so the warm-up lasts 3000 steps and "
        "the learning rate stays tiny.",
        "The scheduler counts samples rather than optimizer steps: use epochs * len(train_loader) for the "
        "warmup and total steps.",
    ],
    "dt_answers_off_by_one": [
        "Prompts and answers are misaligned by one row because a header was skipped in a file that had none.",
        "Each prompt is paired with the next example's answer; the labels don't match the inputs.",
    ],
    "dt_truncation_cuts_answer": [
        "max_length truncation cuts the answer off most rows, so the labels are mostly -100.",
        "Sequences are truncated too short: raise max_length so the response and EOS are kept.",
    ],
    "dt_tokenizer_per_shard": [
        "Each shard fits its own tokenizer, so the same character maps to different ids across the training set.",
        "Use one shared vocabulary (stoi) for every dataset; the token mapping differs between files.",
    ],
    "dt_random_op_twice": [
        "random.choice is called twice, so the answer is computed for a different instruction than the prompt "
        "shows.",
        "The labels are inconsistent with the inputs: reuse the same op variable for the prompt and the answer.",
    ],
    "dt_labels_left_padded": [
        "Inputs are right-padded but labels are left-padded, so labels are misaligned with the tokens in shorter "
        "rows.",
        "Pad labels on the same side as input_ids (padding_side mismatch shifts the targets).",
    ],
}
