"""Set g: healthy setups (no bug). Most are the correct twin of a broken case of this set; several are unusual but
correct (a frozen part that IS loaded, learned task weights, warmup + cosine with accumulation, bf16 autocast,
two learning rates with label smoothing, a weighted sampler with replacement, negatives from a private generator)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_g import cases_data as D
from benchmarks.blind_preflight_g import cases_mechanics as M
from benchmarks.blind_preflight_g import cases_shapes as S
from benchmarks.blind_preflight_g import cases_targets as T
from benchmarks.blind_preflight_g import cases_trained as W
from benchmarks.blind_preflight_g.registry import healthy, loader, seed

# --------------------------------------------------------------------------- twins of broken cases


def nll_gather(model, batch):
    images, labels = batch
    log_probs = F.log_softmax(model(images), dim=1)
    return -log_probs.gather(1, labels[:, None]).squeeze(1).mean()


@healthy("galaxy_cnn_nll_gathered_per_sample",
         "a small CNN on 1x16x16 galaxy cutouts (4 morphologies) with a hand-written NLL that picks each sample's "
         "true-class log-probability with log_probs.gather(1, labels[:, None]); Adam, shuffled loader, val split")
def galaxy_cnn_nll_gathered_per_sample():
    kw = S._galaxy(fix=True)
    kw["loss_fn"] = nll_gather
    return kw


@healthy("speech_packed_gru_reads_last_valid_step",
         "variable-length (5-24 frame) clips padded per batch, packed with pack_padded_sequence(enforce_sorted=False) "
         "into a GRU, unpacked, and read at out[arange(B), lengths - 1], each clip's last real frame")
def speech_packed_gru_reads_last_valid_step():
    return S._commands(fix=True)


@healthy("citation_gcn_aggregates_incoming_edges",
         "a two-layer GCN on batches of directed citation graphs (A[src, dst] = 1) aggregating over in-neighbours "
         "with A.transpose(1, 2), in-degree normalised, plus a self term; node CE with -100 on isolated nodes")
def citation_gcn_aggregates_incoming_edges():
    return S._citation(fix=True)


@healthy("ad_ctr_fm_with_field_offsets",
         "a factorisation machine for click-through: per-field id offsets into one embedding table, linear terms and "
         "the pairwise term 0.5 * ((sum over fields)^2 - sum of squares) summed over the embedding dim; BCE logits")
def ad_ctr_fm_with_field_offsets():
    return S._ctr(fix=True)


class UncertaintyMultiTask(W.VehicleMultiTask):
    def __init__(self):
        super().__init__(separate=True)
        self.log_vars = nn.Parameter(torch.zeros(3))       # learned task weights (Kendall et al.)


def uncertainty_weighted_ce(model, batch):
    x, y = batch
    logits = model(x)
    losses = torch.stack([F.cross_entropy(logits[:, t], y[:, t]) for t in range(3)])
    return (torch.exp(-model.log_vars) * losses + model.log_vars).sum()


@healthy("vehicle_multitask_separate_heads_learned_task_weights",
         "a shared tabular trunk with three separate heads ([nn.Linear(64, 4) for _ in range(3)]) and learned "
         "homoscedastic task weights: sum of exp(-s_t) * CE_t + s_t, the log-variances s_t trained with the model")
def vehicle_multitask_separate_heads_learned_task_weights():
    seed(0)
    x, y = W.vehicle_sensors(s=21)
    model = UncertaintyMultiTask()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=uncertainty_weighted_ce, max_steps=2000)


@healthy("turbine_failures_weighted_sampler_with_replacement",
         "a 4%-positive failure classifier balanced with WeightedRandomSampler(1 / class_count[y], num_samples=len(y), "
         "replacement=True): one weight per row, classes drawn about equally; CE on (B, 2) logits")
def turbine_failures_weighted_sampler_with_replacement():
    return D._failures(fix=True)


@healthy("gpt2_tiny_sequential_warmup_cosine_accumulated",
         "GPT2LMHeadModel from a tiny GPT2Config: AdamW with SequentialLR(LinearLR warmup 100 steps, then cosine), "
         "micro-batches of 16 with accumulation_steps=2, labels = input_ids (the model shifts them); model(**batch).loss")
def gpt2_tiny_sequential_warmup_cosine_accumulated():
    kw = M._lm_schedules(fix=True)
    kw["train_loader"] = loader(kw["train_loader"].dataset, 16)
    kw["accumulation_steps"] = 2
    kw["max_steps"] = 2000
    return kw


def pretrained_word_vectors(vocab=120, dim=48, s=0):
    """'Pretrained' vectors (a vector file read at startup): keyword families already cluster."""
    g = torch.Generator().manual_seed(s)
    vectors = torch.randn(vocab, dim, generator=g) * 0.5
    for family in range(4):
        vectors[4 + 4 * family:8 + 4 * family, family] += 2.0
    return vectors


@healthy("bert_intent_last_layer_cls_with_frozen_loaded_word_embeddings",
         "a tiny BertModel from a BertConfig with a linear head on the last layer's [CLS] (hidden_states[-1]); the word "
         "embeddings are loaded from a pretrained vector table and frozen on purpose (requires_grad_(False)), the "
         "optimizer holds every other parameter")
def bert_intent_last_layer_cls_with_frozen_loaded_word_embeddings():
    seed(0)
    ids, att, y = W.intent_utterances(s=24)
    model = W.IntentClassifier(layer=-1)
    words = model.bert.embeddings.word_embeddings
    with torch.no_grad():
        words.weight.copy_(pretrained_word_vectors())
    words.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.AdamW(params, lr=2e-3),
                train_loader=loader(TensorDataset(ids[:1600], att[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], att[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=W.intent_ce, max_steps=2000)


@healthy("lesion_segmentation_joint_random_crop",
         "a tiny fully convolutional segmenter on random 16x16 crops of 24x24 scans, the same random offsets applied "
         "to the image and its mask; (B, 2, H, W) logits and (B, H, W) masks into CrossEntropyLoss")
def lesion_segmentation_joint_random_crop():
    return D._lesions(fix=True)


@healthy("photo_caption_clip_arange_labels_learned_log_scale",
         "an image-caption dual encoder (MLP + EmbeddingBag) with the symmetric in-batch CLIP loss: labels = "
         "arange(B) on the (B, B) cosine logits, a learnable logit_scale initialised to log(10) and exponentiated")
def photo_caption_clip_arange_labels_learned_log_scale():
    kw = T._captions(fix=True)
    seed(0)
    model = T.DualEncoder(learn_scale=True)
    kw["model"], kw["optimizer"] = model, torch.optim.Adam(model.parameters(), lr=2e-3)
    return kw


@healthy("ward_admissions_log_rate_head_poisson",
         "a Poisson regression of ward admissions (mean ~0.4): the MLP's raw output is the log-rate and "
         "nn.PoissonNLLLoss() (log_input=True) gets it directly; counts as float targets")
def ward_admissions_log_rate_head_poisson():
    seed(0)
    x, y = T.ward_admissions(s=14)
    model = T.RateMLP(softplus=False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=nn.PoissonNLLLoss(), max_steps=2000)


QUANTILES = torch.tensor([0.1, 0.5, 0.9])


def multi_pinball(model, batch):
    x, y = batch
    err = y[:, None] - model(x)                    # (B, 3): y - pred per quantile
    return torch.maximum(QUANTILES * err, (QUANTILES - 1) * err).mean()


@healthy("demand_three_quantile_pinball_clipped",
         "a demand forecaster with three outputs (P10, P50, P90) trained with the pinball loss on err = y - pred per "
         "quantile, clip_grad_norm=1.0, Adam")
def demand_three_quantile_pinball_clipped():
    seed(0)
    x, y = T.store_demand(s=13)
    model = T.QuantileMLP(quantiles=3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=multi_pinball, clip_grad_norm=1.0, max_steps=2000)


@healthy("shop_bpr_fresh_negatives_private_generator",
         "matrix factorisation with item biases trained with BPR; the loss draws new random negative items every call "
         "from its own torch.Generator (seeded once), drop_last loader, Adam")
def shop_bpr_fresh_negatives_private_generator():
    return M._shop(fix=True)


# --------------------------------------------------------------------------- other real-world shapes


class ReverseTask(Dataset):
    def __init__(self, src, lengths):
        self.src, self.lengths = src, lengths

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        n = int(self.lengths[i])
        ids = self.src[i, :n]
        return ids, ids.flip(0)


def t5_collate(items):
    eos = 1
    srcs = [torch.cat([s, torch.tensor([eos])]) for s, _ in items]
    tgts = [torch.cat([t, torch.tensor([eos])]) for _, t in items]
    input_ids = nn.utils.rnn.pad_sequence(srcs, batch_first=True, padding_value=0)
    labels = nn.utils.rnn.pad_sequence(tgts, batch_first=True, padding_value=-100)
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


@healthy("t5_tiny_reverse_bf16_autocast",
         "T5ForConditionalGeneration from a tiny T5Config (no download) reversing variable-length id sequences: "
         "source + EOS with attention_mask, labels = reversed source + EOS padded with -100; precision='bf16' "
         "(autocast on CPU), AdamW")
def t5_tiny_reverse_bf16_autocast():
    from transformers import T5Config, T5ForConditionalGeneration
    seed(0)
    g = torch.Generator().manual_seed(61)
    src = torch.randint(2, 16, (1500, 8), generator=g)
    lengths = torch.randint(3, 9, (1500,), generator=g)
    model = T5ForConditionalGeneration(T5Config(vocab_size=16, d_model=48, d_kv=12, d_ff=96, num_layers=2,
                                                num_decoder_layers=2, num_heads=4, dropout_rate=0.0,
                                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(ReverseTask(src[:1300], lengths[:1300]), 32, collate_fn=t5_collate),
                val_loader=loader(ReverseTask(src[1300:], lengths[1300:]), 100, shuffle=False, collate_fn=t5_collate),
                loss_fn=None, precision="bf16", max_steps=2000)


def vit_label_smoothing(model, batch):
    logits = model(pixel_values=batch["pixel_values"]).logits
    return F.cross_entropy(logits, batch["labels"], label_smoothing=0.1)


@healthy("swatch_vit_two_lr_groups_label_smoothing",
         "ViTForImageClassification from a tiny ViTConfig on RGB swatches (the same pipeline for train and val): "
         "AdamW with two groups, the ViT body at lr 5e-4 and the classifier at 3e-3, cross-entropy with "
         "label_smoothing=0.1 on .logits")
def swatch_vit_two_lr_groups_label_smoothing():
    kw = D._swatches(fix=True)
    model = kw["model"]
    kw["optimizer"] = torch.optim.AdamW([{"params": model.vit.parameters(), "lr": 5e-4},
                                         {"params": model.classifier.parameters(), "lr": 3e-3}], weight_decay=0.01)
    kw["loss_fn"] = vit_label_smoothing
    return kw
