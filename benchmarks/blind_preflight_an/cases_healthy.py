"""Set an, healthy cases: five corrected twins of broken cases and five unusual but correct setups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_an import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_an.registry import (
    gen,
    healthy,
    loader,
    seed,
    teacher_classes,
    token_sequences,
    twin,
)

# ---- corrected twins ------------------------------------------------------------------------------------------

healthy("an_healthy_seg_logits_permute",
        "Twin of an_shapes_seg_logits_view: the FCN's (N, C, H, W) logits are moved to channels-last with "
        "permute(0, 2, 3, 1) before reshape(-1, C).")(twin(cases_shapes.build_seg_logits_view))
healthy("an_healthy_subword_labels_aligned",
        "Twin of an_targets_subword_labels: tiny BERT token classification with the tags on the first sub-word of "
        "each word (word_ids alignment), -100 on the other pieces, [CLS] and padding.")(
    twin(cases_targets.build_subword_labels))
healthy("an_healthy_gpt2_tied_trainable",
        "Twin of an_trained_gpt2_tied_frozen_wte: tiny GPT-2 with 16 added tokens, resize_token_embeddings before "
        "the optimizer, tied embeddings left trainable.")(twin(cases_trained.build_gpt2_tied_frozen_wte))
healthy("an_healthy_ste_returns_grad",
        "Twin of an_mech_ste_no_return: a straight-through binariser (custom autograd.Function) whose backward "
        "returns the clipped gradient.")(twin(cases_mechanics.build_ste_no_return))
healthy("an_healthy_norm_out_of_place",
        "Twin of an_data_inplace_norm_cache: the cached clips normalised out of place in __getitem__.")(
    twin(cases_data.build_inplace_norm_cache))


# ---- unusual but correct --------------------------------------------------------------------------------------

@healthy("an_healthy_multilabel_sparse_posweight",
         "Audio tagging with 12 rare tags (most clips have none): BCEWithLogitsLoss with a per-tag pos_weight of "
         "neg/pos counts, capped at 20, and many all-zero target rows.")
def build_multilabel_sparse_posweight() -> dict:
    seed(0)
    g = gen(51)
    x = torch.randn(2400, 40, generator=g)
    w = torch.randn(40, 12, generator=g) / 40 ** 0.5
    y = (x @ w > 1.4).float()
    pos = y[:2000].sum(0).clamp(min=1)
    pos_weight = ((2000 - pos) / pos).clamp(max=20.0)
    model = nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Linear(128, 12))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pos_weight), max_steps=1500)


@healthy("an_healthy_vit_llrd_warmup",
         "Tiny ViT from a config on channels-first colour patches: layer-wise LR decay param groups that cover every "
         "parameter (patch/position embeddings and CLS token in the lowest group, no weight decay on norms and "
         "biases), a 20-step warm-up then cosine decay stepped per optimizer step, and gradient clipping.")
def build_vit_llrd_warmup() -> dict:
    from transformers import ViTConfig, ViTForImageClassification, get_cosine_schedule_with_warmup

    seed(0)
    raw, y = cases_shapes.hwc_shapes(1400, 52)
    pixels = (raw.permute(0, 3, 1, 2) / 255.0 - 0.5) / 0.5
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=48, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=96, num_labels=4)
    model = ViTForImageClassification(cfg)
    base, decay, layers = 1e-3, 0.8, cfg.num_hidden_layers
    groups: dict[tuple[float, float], list] = {}
    for name, p in model.named_parameters():
        if name.startswith("vit.embeddings"):
            depth = 0
        elif name.startswith("vit.encoder.layer."):
            depth = int(name.split(".")[3]) + 1
        else:
            depth = layers + 1
        lr = base * decay ** (layers + 1 - depth)
        wd = 0.0 if p.ndim == 1 or "norm" in name else 0.05
        groups.setdefault((lr, wd), []).append(p)
    optimizer = torch.optim.AdamW([{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()])
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=20, num_training_steps=1200)

    def vit_loss(model, batch):
        return F.cross_entropy(model(pixel_values=batch[0]).logits, batch[1])

    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(pixels[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(pixels[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=vit_loss, clip_grad_norm=1.0, max_steps=1200)


@healthy("an_healthy_seg_void_255_bf16",
         "Segmentation with VOC-style void borders: 255 in the masks around every object, "
         "CrossEntropyLoss(ignore_index=255), under bf16 autocast.")
def build_seg_void_255_bf16() -> dict:
    seed(0)
    x, m = cases_shapes.seg_blobs(1100, 53)
    # a one-pixel void border where the class changes, as VOC annotates object outlines
    edge = torch.zeros_like(m, dtype=torch.bool)
    edge[:, 1:, :] |= m[:, 1:, :] != m[:, :-1, :]
    edge[:, :, 1:] |= m[:, :, 1:] != m[:, :, :-1]
    m = m.masked_fill(edge, 255)
    model = cases_shapes.TinyFCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:900], m[:900]), 32),
                val_loader=loader(TensorDataset(x[900:], m[900:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(ignore_index=255), precision="bf16", max_steps=1000)


class StudentWithTeacher(nn.Module):
    """A small student and, inside the same module, a frozen teacher (requires_grad False, kept in eval mode) that
    the distillation loss reads; forward is the student's."""

    def __init__(self, teacher: nn.Module):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 6))
        self.teacher = teacher.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, x):
        return self.student(x)


@healthy("an_healthy_frozen_teacher_distill",
         "Knowledge distillation: a frozen teacher (all requires_grad False, always in eval mode) lives inside the "
         "model next to the student; the loss is 0.5 * cross-entropy + 0.5 * T^2 * KL(teacher || student) at T=2 "
         "with log-probabilities on both sides (log_target=True).")
def build_frozen_teacher_distill() -> dict:
    seed(0)
    x, _ = teacher_classes(2400, 32, 6, s=54)
    teacher = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 6))
    with torch.no_grad():
        y = teacher(x).argmax(-1)
    model = StudentWithTeacher(teacher)
    temp = 2.0

    def distill_loss(model, batch):
        inputs, targets = batch
        student = model(inputs)
        with torch.no_grad():
            soft = F.log_softmax(model.teacher(inputs) / temp, dim=-1)
        kd = F.kl_div(F.log_softmax(student / temp, dim=-1), soft, reduction="batchmean", log_target=True)
        return 0.5 * F.cross_entropy(student, targets) + 0.5 * temp ** 2 * kd

    return dict(model=model, optimizer=torch.optim.Adam(model.student.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=distill_loss, max_steps=1500)


class MlmSet(Dataset):
    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i]


def mlm_collate(mask_id: int, vocab: int, s: int = 0):
    g = gen(s)

    def collate(rows):
        ids = torch.stack(rows)
        pick = torch.rand(ids.shape, generator=g) < 0.15
        pick[:, 0] = True  # every row has at least one masked position
        labels = torch.where(pick, ids, torch.full_like(ids, -100))
        roll = torch.rand(ids.shape, generator=g)
        inputs = ids.clone()
        inputs[pick & (roll < 0.8)] = mask_id
        rand = pick & (roll >= 0.8) & (roll < 0.9)
        inputs[rand] = torch.randint(3, vocab, (int(rand.sum()),), generator=g)
        return {"input_ids": inputs, "attention_mask": torch.ones_like(inputs), "labels": labels}
    return collate


@healthy("an_healthy_bert_mlm_accum_bf16",
         "Tiny BERT masked-LM from a config (decoder tied to the word embeddings): dynamic 15% masking "
         "(80/10/10) in the collate, about 85% of labels -100, 2-step gradient accumulation, clipping, bf16.")
def build_bert_mlm_accum_bf16() -> dict:
    from transformers import BertConfig, BertForMaskedLM

    seed(0)
    vocab = 40
    ids = token_sequences(1500, 20, vocab, s=55)
    cfg = BertConfig(vocab_size=vocab, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=96, max_position_embeddings=24, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, pad_token_id=0)
    model = BertForMaskedLM(cfg)
    collate = mlm_collate(mask_id=2, vocab=vocab)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01),
                train_loader=loader(MlmSet(ids[:1200]), 32, collate_fn=collate),
                val_loader=loader(MlmSet(ids[1200:]), 100, shuffle=False, collate_fn=mlm_collate(2, vocab, s=1)),
                accumulation_steps=2, clip_grad_norm=1.0, precision="bf16", max_steps=600)
