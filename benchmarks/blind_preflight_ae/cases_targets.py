"""Set ae, family targets: what the loss compares the output with is not what the objective means."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from transformers import BertConfig, BertForMaskedLM, T5Config, T5ForConditionalGeneration

from benchmarks.blind_preflight_ae.models import MLPEncoder
from benchmarks.blind_preflight_ae.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    retrieval_top1,
    rmse_of,
    seed,
    smooth_signals,
    token_sequences,
)


# 1. A denoising autoencoder for ECG-like traces whose loss compares the reconstruction with the noisy input it was
#    given rather than the clean trace: an overcomplete net learns the identity and removes no noise.
def dae_loss(target_clean: bool):
    def loss_fn(model, batch):
        (clean,) = batch
        noisy = clean + 0.6 * torch.randn_like(clean)
        return F.mse_loss(model(noisy), clean if target_clean else noisy)
    return loss_fn


@case("dae_reconstructs_the_noisy_input", "targets",
      bug="The denoising autoencoder corrupts each clean trace and then computes MSE between its output and the "
          "corrupted (noisy) input instead of the clean trace, so the overcomplete network learns the identity map "
          "and never denoises; the reconstruction target must be the clean signal.",
      cause_pattern=r"(target|compar\w+|loss|mse).{0,80}(noisy|corrupted|noised) (input|copy|version|trace|signal)"
                    r"|against the (noisy|corrupted)|(instead of|rather than) the clean|clean (signal|trace|input|copy)"
                    r".{0,40}(as|should be) (the )?target|learns? (the |an )?identity")
def dae_noisy_target(fixed: bool = False):
    seed(0)
    x = smooth_signals(1500, 64, rank=4, s=11)
    train, val = x[:1200], x[1200:]
    val_noisy = val + 0.6 * torch.randn(val.shape, generator=gen(12))
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(train), 64),
                val_loader=loader(TensorDataset(val_noisy, val), 300, shuffle=False),
                loss_fn=dae_loss(target_clean=fixed), max_steps=3000)


fix("dae_reconstructs_the_noisy_input", fixed_of(dae_noisy_target),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE to the clean trace", higher=False)


# 2. Masked-LM pretraining of a tiny BERT (built from a config): the labels are cloned from input_ids AFTER the
#    [MASK] substitution, so every masked position is labelled [MASK] and the model learns to echo it.
MASK = 2


def mlm_examples(n: int, s: int, labels_after_masking: bool):
    ids = token_sequences(n, 16, 24, s=s, low=3)
    chosen = torch.rand(ids.shape, generator=gen(s + 1)) < 0.2
    chosen[torch.arange(n), torch.randint(0, 16, (n,), generator=gen(s + 2))] = True
    masked = ids.masked_fill(chosen, MASK)
    labels = (masked if labels_after_masking else ids).clone().masked_fill(~chosen, -100)
    return [dict(input_ids=masked[i], attention_mask=torch.ones(16, dtype=torch.long), labels=labels[i])
            for i in range(n)]


@case("mlm_labels_cloned_after_masking", "targets",
      bug="The MLM labels are cloned from input_ids after the [MASK] substitution instead of before it, so every "
          "masked position's label is the [MASK] id itself (mask_token_id): the model learns to predict [MASK] at "
          "[MASK] and never the original token; take labels = input_ids.clone() before masking.",
      cause_pattern=r"labels?.{0,80}(\[MASK\]|mask_token_id|mask token id|the mask id|masked input_ids)"
                    r"|(clone|cop(y|ied))\w*.{0,40}after.{0,30}mask|before (the )?(\[MASK\] )?(masking|substitution)"
                    r"|predict\w* (the )?\[MASK\]")
def mlm_labels_after_mask(fixed: bool = False):
    seed(0)
    config = BertConfig(vocab_size=24, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=32, pad_token_id=0,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForMaskedLM(config)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(mlm_examples(2000, 21, labels_after_masking=not fixed), 32),
                val_loader=loader(mlm_examples(400, 22, labels_after_masking=False), 200, shuffle=False),
                max_steps=3000)


fix("mlm_labels_cloned_after_masking", fixed_of(mlm_labels_after_mask),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val masked-token accuracy (original tokens)")


# 3. A siamese verifier for machine-part sensor fingerprints: pairs are labelled 1 = same part, but the contrastive
#    loss is Hadsell's formula, where y = 1 means DISsimilar: same parts are pushed apart, different ones pulled in.
MARGIN = 2.0


def contrastive_loss(label_one_is_same: bool):
    def loss_fn(model, batch):
        a, b, same = batch
        d = F.pairwise_distance(model(a), model(b))
        y = same.float()
        if label_one_is_same:
            return (y * d.pow(2) + (1 - y) * F.relu(MARGIN - d).pow(2)).mean()
        return ((1 - y) * d.pow(2) + y * F.relu(MARGIN - d).pow(2)).mean()   # Hadsell et al.: y = 1 -> dissimilar
    return loss_fn


def part_pairs(n: int, s: int):
    g = gen(s)
    centers = torch.randn(6, 16, generator=gen(31)) * 1.2
    ca = torch.randint(0, 6, (n,), generator=g)
    same = torch.rand(n, generator=g) < 0.5
    cb = torch.where(same, ca, (ca + torch.randint(1, 6, (n,), generator=g)) % 6)
    a = centers[ca] + torch.randn(n, 16, generator=g)
    b = centers[cb] + torch.randn(n, 16, generator=g)
    return a, b, same.long()


@case("siamese_pair_label_convention_inverted", "targets",
      bug="The pair labels say 1 = same part, but the contrastive loss is written in Hadsell's convention where "
          "y = 1 means dissimilar ((1 - y) * d^2 + y * max(0, m - d)^2): similar pairs are pushed apart past the "
          "margin and dissimilar pairs pulled together; flip the labels (1 - y) or swap the two terms.",
      cause_pattern=r"(label|pair)\w* (convention|semantics|meaning|are inverted)|\by\s*=\s*1 means|1\s*=\s*(same|similar|dissimilar)"
                    r"|(similar|same) pairs?.{0,40}pushed apart|(dissimilar|different) pairs?.{0,40}pulled (together|in)"
                    r"|(flip|invert)\w*.{0,30}(pair )?labels|\(?1\s*-\s*(y|label|target)\)?.{0,40}(swap|flip|instead)"
                    r"|swap\w* the (two )?terms")
def siamese_inverted(fixed: bool = False):
    seed(0)
    a, b, same = part_pairs(3000, 32)
    va, vb, vsame = part_pairs(600, 33)
    model = MLPEncoder(16, 64, 8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(a, b, same), 64),
                val_loader=loader(TensorDataset(va, vb, vsame), 300, shuffle=False),
                loss_fn=contrastive_loss(label_one_is_same=fixed), max_steps=3000)


fix("siamese_pair_label_convention_inverted", fixed_of(siamese_inverted),
    acc_of(lambda m, b: ((F.pairwise_distance(m(b[0]), m(b[1])) < MARGIN / 2).long(), b[2])),
    "val pair-verification accuracy")


# 4. A tiny T5 (from a config) learning a token cipher: the batch passes decoder_input_ids = labels (unshifted), so
#    at step t the decoder already sees the token it must predict and learns to copy it; generation then fails.
def cipher_examples(n: int, s: int, unshifted: bool):
    src = torch.randint(2, 20, (n, 8), generator=gen(s))
    tgt = (src - 2 + 5) % 18 + 2
    out = []
    for i in range(n):
        ex = dict(input_ids=src[i], attention_mask=torch.ones(8, dtype=torch.long), labels=tgt[i])
        if unshifted:
            ex["decoder_input_ids"] = tgt[i]
        out.append(ex)
    return out


@torch.no_grad()
def greedy_token_acc(model, kw):
    def fn(m, b):
        src, labels = b["input_ids"], b["labels"]
        dec = torch.zeros(src.shape[0], 1, dtype=torch.long, device=src.device)
        for _ in range(labels.shape[1]):
            nxt = m(input_ids=src, attention_mask=b["attention_mask"], decoder_input_ids=dec).logits[:, -1].argmax(-1)
            dec = torch.cat([dec, nxt[:, None]], 1)
        return (dec[:, 1:] == labels).sum().item(), labels.numel()
    dev = next(model.parameters()).device
    return mean_over(model, [{k: v.to(dev) for k, v in b.items()} for b in kw["val_loader"]], fn)


@case("t5_decoder_inputs_are_the_labels", "targets",
      bug="Each batch passes decoder_input_ids equal to the labels, not the labels shifted one position right "
          "(decoder_start_token_id first, as T5 builds them from labels itself): with teacher forcing the decoder "
          "sees the very token it must predict and learns to copy it, so greedy generation fails; pass only labels.",
      cause_pattern=r"decoder_input_ids.{0,80}(labels|shift)|(labels|targets).{0,60}decoder_input_ids"
                    r"|shift\w*[_ ]?(tokens_)?right|(not|un)[- ]?shifted|shifted (one|by one) (position|token)"
                    r"|sees? the (very |same )?token it (must|should|has to) predict|copy(ing)? (the|its) (current|own|next) (input )?token")
def t5_unshifted(fixed: bool = False):
    seed(0)
    config = T5Config(vocab_size=20, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(cipher_examples(2000, 41, unshifted=not fixed), 32),
                val_loader=loader(cipher_examples(200, 42, unshifted=False), 200, shuffle=False),
                max_steps=3000)


fix("t5_decoder_inputs_are_the_labels", fixed_of(t5_unshifted), greedy_token_acc, "val greedy-decoding token accuracy")


# 5. Contrastive pretraining of a customer-feature encoder: two masked/noised views are made, but the InfoNCE
#    logits compare view 1 with itself (z1 @ z1.T): the positive is the row itself, solved by any injective map.
def tab_view(x):
    keep = (torch.rand_like(x) > 0.3).float()
    return x * keep + 0.5 * torch.randn_like(x)


def info_nce(cross_view: bool):
    def loss_fn(model, batch):
        (x,) = batch
        z1 = F.normalize(model(tab_view(x)), dim=1)
        z2 = F.normalize(model(tab_view(x)), dim=1)
        logits = (z1 @ (z2 if cross_view else z1).T) / 0.2
        return F.cross_entropy(logits, torch.arange(x.shape[0], device=x.device))
    return loss_fn


@case("infonce_view_compared_with_itself", "targets",
      bug="Two augmented views are encoded but the InfoNCE logits are z1 @ z1.T: each view's positive is itself (the "
          "diagonal is always the maximum self-similarity), so the loss never compares the two different views and "
          "learns no invariance to the augmentation; use z1 @ z2.T.",
      cause_pattern=r"z1\s*@\s*z1|(view|embedding)s? (is |are )?compared with (it|them)sel(f|ves)|positive is (the row |the view )?itself"
                    r"|self[- ]similarit\w+.{0,60}(positive|diagonal|trivial)|never compares? the two (different )?(views|augmentations)"
                    r"|second view.{0,40}(never|not|unused)")
def infonce_self(fixed: bool = False):
    seed(0)
    x = smooth_signals(1800, 40, rank=10, s=51)
    train, val = x[:1500], x[1500:]
    g = gen(52)

    def fixed_view(v):
        keep = (torch.rand(v.shape, generator=g) > 0.3).float()
        return v * keep + 0.5 * torch.randn(v.shape, generator=g)
    model = MLPEncoder(40, 128, 32)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(train), 128, drop_last=True),
                val_loader=loader(TensorDataset(fixed_view(val), fixed_view(val)), 300, shuffle=False),
                loss_fn=info_nce(cross_view=fixed), max_steps=2000)


def tab_retrieval(model, kw):
    model.eval()
    with torch.no_grad():
        v1, v2 = next(iter(kw["val_loader"]))
        dev = next(model.parameters()).device
        out = retrieval_top1(model(v1.to(dev)), model(v2.to(dev)))
    model.train()
    return out


fix("infonce_view_compared_with_itself", fixed_of(infonce_self), tab_retrieval, "val view-to-view top-1 retrieval")
