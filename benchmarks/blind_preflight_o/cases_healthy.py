"""Set o, healthy cases: 5 corrected twins of broken cases and 5 unusual but correct setups. All must learn."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler
from transformers import GPT2Config, GPT2LMHeadModel

from benchmarks.blind_preflight_o.cases_data import build_sounds
from benchmarks.blind_preflight_o.cases_mechanics import build_credit
from benchmarks.blind_preflight_o.cases_shapes import build_tagger
from benchmarks.blind_preflight_o.cases_targets import build_two_tower
from benchmarks.blind_preflight_o.cases_trained import build_expression
from benchmarks.blind_preflight_o.registry import gen, healthy, loader, seed, tensors, token_sequences, twin

# --------------------------------------------------------------------------------------------------------------
# The corrected twins: the same builders with the one-line fix.

healthy("healthy_twin_seq_first_tagger", "The seq-first GRU tagger with its (time, batch) logits scored against "
        "tags.t().reshape(-1), both flattened time-major.")(twin(build_tagger))
healthy("healthy_twin_two_tower_infonce", "The two-tower InfoNCE model with labels = torch.arange(B), the diagonal "
        "of the in-batch similarity matrix.")(twin(build_two_tower))
healthy("healthy_twin_low_rank_probe", "The expression classifier whose 200x8 projection is "
        "nn.Parameter(torch.randn(200, 8) * 0.05), registered and trained.")(twin(build_expression))
healthy("healthy_twin_lambdalr_factor", "The credit-limit regressor with LambdaLR(lr_lambda=lambda step: "
        "0.999 ** step), a factor on the base lr.")(twin(build_credit))
healthy("healthy_twin_sorted_listings", "Sound-event clips and label files both read from sorted(os.listdir(...)), "
        "paired by name.")(twin(build_sounds))


# --------------------------------------------------------------------------------------------------------------
# Full-batch GCN on a community graph: one graph per step, a training mask, self-loops and symmetric normalisation.

class CitationGraph(Dataset):
    def __init__(self, n: int = 400, s: int = 40):
        g = gen(s)
        self.y = torch.randint(0, 4, (n,), generator=g)
        same = self.y.unsqueeze(0) == self.y.unsqueeze(1)
        p = torch.where(same, 0.06, 0.004)
        a = (torch.rand(n, n, generator=g) < p).float().triu(1)
        a = a + a.t() + torch.eye(n)                                         # self-loops
        d = a.sum(1).rsqrt()
        self.adj = d.unsqueeze(1) * a * d.unsqueeze(0)
        self.x = F.one_hot(self.y, 4).float() @ torch.randn(4, 16, generator=g) * 0.6 + torch.randn(n, 16, generator=g)
        self.train_mask = torch.rand(n, generator=g) < 0.3

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return self.x, self.y, self.train_mask


class GCN(nn.Module):
    def __init__(self, adj: torch.Tensor):
        super().__init__()
        self.register_buffer("adj", adj)
        self.lin1, self.lin2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = F.dropout(F.relu(self.adj @ self.lin1(x)), 0.3, training=self.training)
        return self.adj @ self.lin2(h)


def masked_node_loss(model, batch):
    x, y, mask = batch
    return F.cross_entropy(model(x)[mask], y[mask])


@healthy("healthy_gcn_full_batch_masked", "A two-layer GCN with D^-1/2 (A + I) D^-1/2 as a buffer, trained full-batch "
         "(DataLoader(batch_size=None) over one graph) with the loss on the 30% training mask only.")
def build_gcn() -> dict:
    seed(0)
    graph = CitationGraph()
    model = GCN(graph.adj)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4),
                train_loader=DataLoader(graph, batch_size=None), loss_fn=masked_node_loss, max_steps=200)


# --------------------------------------------------------------------------------------------------------------
# Single-object "detector": a class head and a box head on one CNN, under bf16 autocast, OneCycleLR per step.

def boxes(n: int, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = gen(s)
    cls = torch.randint(0, 3, (n,), generator=g)
    size = torch.randint(3, 7, (n,), generator=g)
    top, left = torch.randint(0, 10, (2, n), generator=g)
    imgs = 0.2 * torch.randn(n, 3, 16, 16, generator=g)
    for i in range(n):
        t, l, w = int(top[i]), int(left[i]), int(size[i])
        imgs[i, int(cls[i]), t:t + w, l:l + w] += 1.0
    box = torch.stack([(left + size / 2) / 16, (top + size / 2) / 16, size / 16], 1)
    return imgs, cls, box


class BoxNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.cls_head = nn.Linear(512, 3)
        self.box_head = nn.Sequential(nn.Linear(512, 3), nn.Sigmoid())

    def forward(self, x):
        h = self.backbone(x)
        return self.cls_head(h), self.box_head(h)


def detection_loss(model, batch):
    imgs, cls, box = batch
    logits, pred_box = model(imgs)
    return F.cross_entropy(logits, cls) + 5 * F.smooth_l1_loss(pred_box.float(), box, beta=0.05)


@healthy("healthy_box_and_class_bf16", "A one-object detector: class and (cx, cy, w) box heads on one CNN, summed "
         "cross-entropy + 5 x smooth L1, bf16 precision, AdamW with OneCycleLR stepped per optimizer step.")
def build_boxes() -> dict:
    seed(0)
    imgs, cls, box = boxes(1200, 41)
    model = BoxNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=300),
                train_loader=loader(tensors(imgs, cls, box), 32), loss_fn=detection_loss,
                precision="bf16", max_steps=300)


# --------------------------------------------------------------------------------------------------------------
# Tiny GPT-2 from a config on right-padded variable-length sequences, pads masked out of the labels, accumulation 2.

class PaddedSequences(Dataset):
    def __init__(self, n: int, s: int, max_len: int = 24):
        seqs = token_sequences(n, max_len, 64, s=s)
        lengths = torch.randint(8, max_len + 1, (n,), generator=gen(s + 1))
        mask = (torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)).long()
        self.ids = seqs * mask                                                # pad id 0
        self.mask = mask
        self.labels = self.ids.masked_fill(mask == 0, -100)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return dict(input_ids=self.ids[i], attention_mask=self.mask[i], labels=self.labels[i])


@healthy("healthy_gpt2_padded_accumulated", "A tiny GPT-2 built from a GPT2Config on right-padded progressions with "
         "attention_mask and -100 labels on the padding, 2-step gradient accumulation and a linear warm-up LambdaLR.")
def build_gpt2() -> dict:
    seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: min(1.0, (step + 1) / 20))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(PaddedSequences(1200, 42), 16), loss_fn=None,
                accumulation_steps=2, clip_grad_norm=1.0, max_steps=300)


# --------------------------------------------------------------------------------------------------------------
# Packed LSTM over variable-length accelerometer windows, imbalanced activities rebalanced per sample.

def activities(n: int, s: int, max_len: int = 50) -> tuple[torch.Tensor, ...]:
    g = gen(s)
    y = torch.multinomial(torch.tensor([0.6, 0.25, 0.15]), n, replacement=True, generator=g)
    lengths = torch.randint(10, max_len + 1, (n,), generator=g)
    t = torch.arange(max_len).float().unsqueeze(0)
    freq = torch.tensor([0.2, 0.5, 0.9])[y].unsqueeze(1)
    phase = torch.rand(n, 1, generator=g) * 6.28
    x = torch.stack([torch.sin(freq * t + phase), torch.cos(freq * t + phase), 0.3 * torch.ones(n, max_len)], -1)
    x = x + 0.3 * torch.randn(n, max_len, 3, generator=g)
    x[t.expand(n, -1) >= lengths.unsqueeze(1)] = 0
    return x, lengths, y


class PackedActivityLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 32, batch_first=True)
        self.out = nn.Linear(32, 3)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return self.out(h[-1])


def activity_loss(model, batch):
    x, lengths, y = batch
    return F.cross_entropy(model(x, lengths), y)


@healthy("healthy_packed_lstm_weighted_sampler", "An LSTM over pack_padded_sequence(lengths.cpu(), enforce_sorted="
         "False) reading h_n[-1], with a WeightedRandomSampler of per-sample weights 1 / count(class).")
def build_activities() -> dict:
    seed(0)
    x, lengths, y = activities(1500, 43)
    weights = (1.0 / torch.bincount(y).float())[y]
    sampler = WeightedRandomSampler(weights, num_samples=len(y), replacement=True, generator=gen(44))
    model = PackedActivityLSTM()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=DataLoader(tensors(x, lengths, y), batch_size=32, sampler=sampler),
                loss_fn=activity_loss, max_steps=300)


# --------------------------------------------------------------------------------------------------------------
# Metric learning on identity embeddings: TripletMarginLoss, 4-step accumulation, clipping, Nesterov SGD.

def triplets(n: int, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = gen(s)
    centres = torch.randn(50, 32, generator=g)
    who = torch.randint(0, 50, (n,), generator=g)
    other = (who + torch.randint(1, 50, (n,), generator=g)) % 50
    noise = lambda: 0.7 * torch.randn(n, 32, generator=g)                    # noqa: E731
    return centres[who] + noise(), centres[who] + noise(), centres[other] + noise()


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


def triplet_loss(model, batch):
    anchor, positive, negative = batch
    return F.triplet_margin_loss(model(anchor), model(positive), model(negative), margin=0.3)


@healthy("healthy_triplet_accumulated_nesterov", "Identity embeddings trained with triplet_margin_loss(margin=0.3) "
         "on precomputed (anchor, positive, negative) triplets, 4-step accumulation, clip_grad_norm=1.0, Nesterov SGD.")
def build_triplets() -> dict:
    seed(0)
    a, p, n = triplets(3000, 45)
    model = Embedder()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True),
                train_loader=loader(tensors(a, p, n), 32), loss_fn=triplet_loss,
                accumulation_steps=4, clip_grad_norm=1.0, max_steps=200)
