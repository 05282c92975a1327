"""Set ae, healthy cases: 5 corrected twins of broken cases and 5 unusual but correct setups; none should warn."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

from benchmarks.blind_preflight_ae import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_ae.models import MLPEncoder
from benchmarks.blind_preflight_ae.registry import gen, healthy, loader, seed, smooth_signals, token_sequences, twin

# --- corrected twins -------------------------------------------------------------------------------------------------
healthy("session_lm_pad_sequence_batch_first",
        "Twin of session_lm_pad_sequence_time_major: variable-length sessions padded with "
        "pad_sequence(batch_first=True) (labels padded with -100) into a batch_first GRU.")(twin(cases_shapes.session_lm))
healthy("tiny_bert_mlm_labels_before_masking",
        "Twin of mlm_labels_cloned_after_masking: a tiny BertForMaskedLM from a config, labels taken before the "
        "[MASK] substitution, -100 on unmasked positions.")(twin(cases_targets.mlm_labels_after_mask))
healthy("seq2seq_single_optimizer_all_parameters",
        "Twin of seq2seq_encoder_left_out_of_optimizer: one Adam over model.parameters() for a GRU "
        "encoder-decoder, gradient clipping 1.0.")(twin(cases_trained.seq2seq_decoder_only_opt))
healthy("transformer_decoder_with_causal_mask",
        "Twin of transformer_decoder_without_causal_mask: nn.Transformer with "
        "tgt_mask=generate_square_subsequent_mask(T) under teacher forcing.")(twin(cases_mechanics.transformer_no_mask))
healthy("denoiser_shared_flip_for_input_and_target",
        "Twin of denoiser_flips_input_and_target_independently: one flip decision applied to both the noisy input "
        "and the clean target.")(twin(cases_data.flip_denoiser))


# --- unusual but correct ---------------------------------------------------------------------------------------------
@healthy("tiny_gpt2_bf16_two_param_groups_warmup",
         "A tiny GPT2LMHeadModel built from a config (no download) on token progressions, labels = input_ids (the "
         "model shifts them), bf16, AdamW with no weight decay on biases/LayerNorms, linear warm-up then constant.")
def tiny_gpt2():
    seed(0)
    ids = token_sequences(1500, 24, 40, s=211, low=3)
    config = GPT2Config(vocab_size=40, n_positions=32, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=2e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    data = [dict(input_ids=ids[i], attention_mask=torch.ones(24, dtype=torch.long), labels=ids[i])
            for i in range(len(ids))]
    return dict(model=model, optimizer=optimizer, train_loader=loader(data, 32), scheduler=scheduler,
                precision="bf16", max_steps=2000)


class FrozenEncoderDenoiser(nn.Module):
    """A 'pretrained' encoder frozen on purpose (requires_grad=False, kept out of the optimizer), decoder trained."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 64))
        self.encoder.requires_grad_(False)

    def forward(self, x):
        return self.decoder(self.encoder(x))


@healthy("denoiser_frozen_pretrained_encoder",
         "Denoising decoder trained on top of an encoder frozen on purpose: encoder.requires_grad_(False) and only "
         "decoder.parameters() in the optimizer; clean targets, noise made on the input's device.")
def frozen_encoder_denoiser():
    seed(0)
    x = smooth_signals(1200, 64, rank=4, s=221)
    model = FrozenEncoderDenoiser()

    def loss_fn(m, batch):
        (clean,) = batch
        return F.mse_loss(m(clean + 0.4 * torch.randn_like(clean)), clean)
    return dict(model=model, optimizer=torch.optim.Adam(model.decoder.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x), 64), loss_fn=loss_fn, max_steps=2000)


@healthy("multitask_recon_and_class_accumulation_clip",
         "Two-output model (reconstruction + class head, both built in __init__), summed MSE + cross-entropy, "
         "2-step gradient accumulation and clip_grad_norm=1.0.")
def multitask_accum():
    seed(0)
    return dict(cases_trained.head_in_forward(fixed=True), accumulation_steps=2, clip_grad_norm=1.0)


class TripletsByClass(Dataset):
    def __init__(self, x, y, s: int = 0):
        self.x, self.y = x, y
        self.by_class = {int(c): (y == c).nonzero().flatten() for c in y.unique()}
        self.g = gen(s)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        c = int(self.y[i])
        pos = self.by_class[c][torch.randint(len(self.by_class[c]), (1,), generator=self.g)].item()
        neg_c = (c + 1 + torch.randint(len(self.by_class) - 1, (1,), generator=self.g).item()) % len(self.by_class)
        neg = self.by_class[neg_c][torch.randint(len(self.by_class[neg_c]), (1,), generator=self.g)].item()
        return self.x[i], self.x[pos], self.x[neg]


@healthy("triplet_embedding_cosine_schedule",
         "Triplet embedding learning with nn.TripletMarginLoss, positives from the anchor's class and negatives from "
         "another class, L2-normalised outputs and CosineAnnealingLR stepped per optimizer step.")
def triplet_cosine():
    seed(0)
    x, y = cases_data.gait_data(2000, 231)
    model = nn.Sequential(MLPEncoder(20, 64, 16), nn.Flatten())
    criterion = nn.TripletMarginLoss(margin=0.5)

    def loss_fn(m, batch):
        a, p, n = (F.normalize(m(t), dim=1) for t in batch)
        return criterion(a, p, n)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TripletsByClass(x, y, 232), 64),
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2000), loss_fn=loss_fn,
                max_steps=2000)


@healthy("distillation_frozen_teacher_temperature",
         "Knowledge distillation with the teacher inside the wrapper but frozen (requires_grad=False, eval), "
         "KL(log_softmax(student/T) || softmax(teacher/T)) * T^2 mixed 0.5/0.5 with cross-entropy on full labels.")
def distillation_correct():
    seed(0)
    x, _, y = cases_trained.transfer_set(2000, 241, labelled=1.0)
    model = cases_trained.Distiller(cases_trained.teacher_net(), nn.Sequential(nn.Linear(20, 64), nn.ReLU(),
                                                                               nn.Linear(64, 5)))
    T = 3.0

    def loss_fn(m, batch):
        xb, yb = batch
        s = m(xb)
        with torch.no_grad():
            t = m.teacher(xb)
        kd = F.kl_div(F.log_softmax(s / T, dim=1), F.softmax(t / T, dim=1), reduction="batchmean") * T * T
        return 0.5 * kd + 0.5 * F.cross_entropy(s, yb)
    return dict(model=model, optimizer=torch.optim.Adam(model.student.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=loss_fn, max_steps=int(math.ceil(2000 / 64)) * 40)
