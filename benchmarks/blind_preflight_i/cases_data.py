"""Set i, data: what the loader really yields (6 broken cases)."""

from __future__ import annotations

import math
import random
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, Sampler, Subset, TensorDataset

from benchmarks.blind_preflight_i.cases_targets import _bars, tiny_bert_config
from benchmarks.blind_preflight_i.cases_trained import bn_cnn
from benchmarks.blind_preflight_i.registry import accuracy, case, fix, gen, loader, seed, teacher_classes, val_acc


# --------------------------------------------------------------------------------------------------------------------
# 1. Molecule-style graph classification with a hand-written collate that concatenates the graphs' edge_index
#    tensors without shifting each graph's node ids by the nodes before it: every edge of the batch points into the
#    first graph's nodes, and the other graphs have no edges at all.
# --------------------------------------------------------------------------------------------------------------------
def _colour_graphs(n: int, s: int):
    """Graphs of 6-12 nodes, exactly 3 red; label 1 iff some edge joins two red nodes (balanced)."""
    g = gen(s)
    graphs, want = [], 0
    while len(graphs) < n:
        size = int(torch.randint(6, 13, (1,), generator=g))
        red = torch.zeros(size, dtype=torch.long)
        red[torch.randperm(size, generator=g)[:3]] = 1
        perm = torch.randperm(size, generator=g)
        edges = set()
        for k in range(1, size):
            j = perm[int(torch.randint(0, k, (1,), generator=g))].item()
            edges.add((perm[k].item(), j))
        for _ in range(2):
            a, b = torch.randint(0, size, (2,), generator=g).tolist()
            if a != b:
                edges.add((a, b))
        label = int(any(red[a] and red[b] for a, b in edges))
        if label != want:
            continue
        want = 1 - want
        src, dst = zip(*edges)
        ei = torch.tensor([list(src) + list(dst), list(dst) + list(src)])
        x = torch.cat([F.one_hot(red, 2).float(), torch.ones(size, 1)], 1)
        graphs.append((x, ei, torch.tensor(label)))
    return graphs


def make_graph_collate(offset_nodes: bool):
    def collate(batch):
        xs, edges, owner, ys, offset = [], [], [], [], 0
        for k, (x, edge_index, y) in enumerate(batch):
            xs.append(x)
            edges.append(edge_index + offset if offset_nodes else edge_index)
            owner.append(torch.full((len(x),), k))
            ys.append(y)
            offset += len(x)
        return torch.cat(xs), torch.cat(edges, 1), torch.cat(owner), torch.stack(ys)
    return collate


class GIN(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.inp = nn.Linear(3, d)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d)) for _ in range(2)])
        self.head = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 2))

    def forward(self, x, edge_index, owner, num_graphs):
        h = self.inp(x)
        src, dst = edge_index
        for mlp in self.layers:
            agg = torch.zeros_like(h).index_add_(0, dst, h[src])
            h = F.relu(mlp(h + agg))
        pooled = torch.zeros(num_graphs, h.shape[1]).index_add_(0, owner, h)
        return self.head(pooled)


def graph_ce(model, batch):
    x, edge_index, owner, y = batch
    return F.cross_entropy(model(x, edge_index, owner, len(y)), y)


def graph_val_acc(model, kw):
    batches = loader(_colour_graphs(400, 2), 100, shuffle=False, collate_fn=make_graph_collate(True))
    return accuracy(model, batches, fwd=lambda m, b: (m(b[0], b[1], b[2], len(b[3])).argmax(-1), b[3]))


@case("molecule_gin_collate_edges_without_node_offsets", "data",
      bug="the hand-written graph collate concatenates the node features of the batch's graphs but their edge_index "
          "tensors unshifted: each graph's node ids still start at 0, so every edge in the batch points into the "
          "first graph's nodes and all other graphs arrive with no edges of their own; the label (does an edge join "
          "two red atoms) is then invisible (edge_index + offset, the number of nodes before the graph, was needed)",
      cause_pattern=r"offset|node (ids?|indices)[^.]*(shift|start|first)|(shift|increment)\w*[^.]*(node|edge)|"
                    r"edge_index|collate[^.]*(edge|graph)|(edges?|messages?)[^.]*(first graph|wrong (graph|nodes?))|"
                    r"(no|without) edges|cumulative (node )?count|batch(ing)? (of )?graphs")
def molecule_gin_collate_edges_without_node_offsets(offset_nodes=False):
    seed(0)
    collate = make_graph_collate(offset_nodes)
    model = GIN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_colour_graphs(1200, 1), 32, collate_fn=collate),
                val_loader=loader(_colour_graphs(400, 2), 100, shuffle=False, collate_fn=collate), loss_fn=graph_ce)


def _graph_fact():
    batch = make_graph_collate(False)(_colour_graphs(4, 1))
    x, edge_index, owner, _ = batch
    print(f"  collated batch of 4 graphs: nodes per graph {torch.bincount(owner).tolist()}; edges whose endpoints "
          f"belong to graph {sorted(set(owner[edge_index[0]].tolist()))} only")


fix("molecule_gin_collate_edges_without_node_offsets",
    partial(molecule_gin_collate_edges_without_node_offsets, offset_nodes=True), graph_val_acc,
    "val accuracy (correctly collated)", _graph_fact)


# --------------------------------------------------------------------------------------------------------------------
# 2. Subset given a boolean mask instead of indices: Subset(ds, [split == 'train' for ...]) keeps len(ds) entries
#    whose "indices" are True/False, and a Python list indexed with a bool returns row 1 or row 0.
# --------------------------------------------------------------------------------------------------------------------
class CustomerRecords(Dataset):
    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        return torch.tensor(r["features"]), r["segment"]


def _customer_records(n: int = 2500):
    x, y = teacher_classes(n, 16, 4, s=7)
    rng = np.random.default_rng(7)
    split = np.where(rng.random(n) < 0.8, "train", "val")
    return [dict(features=x[i].tolist(), segment=int(y[i]), split=str(split[i])) for i in range(n)]


def customer_val_acc(model, kw):
    records = _customer_records()
    ds = CustomerRecords(records)
    val = Subset(ds, [i for i, r in enumerate(records) if r["split"] == "val"])
    return accuracy(model, loader(val, 250, shuffle=False))


@case("customer_segments_subset_given_boolean_mask", "data",
      bug="the split is made with Subset(dataset, [r['split'] == 'train' for r in records]): Subset expects indices, "
          "gets a list of booleans of the full length, and the records list indexed with True/False returns record "
          "1 or record 0, so the 'training set' is two customers repeated 2500 times, the mask's length (the "
          "indices where the mask is True were meant)",
      cause_pattern=r"Subset|bool\w*[^.]*(mask|indices|index)|(mask|indices)[^.]*bool|True/False|(two|2|few) "
                    r"(distinct|unique|different) (samples|rows|records|examples|inputs)|(only|just) (two|2) "
                    r"(distinct|unique|different)?\s*(samples|rows|records|examples|inputs)|(same|identical) (two|2)|"
                    r"(duplicat|repeat)\w*[^.]*(two|2|same) (samples|rows|records)")
def customer_segments_subset_given_boolean_mask(as_indices=False):
    seed(0)
    records = _customer_records()
    ds = CustomerRecords(records)
    is_train = [r["split"] == "train" for r in records]
    is_val = [r["split"] == "val" for r in records]
    if as_indices:
        is_train = [i for i, m in enumerate(is_train) if m]
        is_val = [i for i, m in enumerate(is_val) if m]
    train, val = Subset(ds, is_train), Subset(ds, is_val)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _subset_fact():
    records = _customer_records()
    sub = Subset(CustomerRecords(records), [r["split"] == "train" for r in records])
    distinct = {tuple(sub[i][0].tolist()) for i in range(len(sub))}
    print(f"  Subset with the boolean list: {len(sub)} items, {len(distinct)} distinct feature rows")


fix("customer_segments_subset_given_boolean_mask",
    partial(customer_segments_subset_given_boolean_mask, as_indices=True), customer_val_acc, "val accuracy",
    _subset_fact)


# --------------------------------------------------------------------------------------------------------------------
# 3. Stereo clips as soundfile returns them, (frames, channels), read with wav[0] as in torchaudio's (channels,
#    frames) layout: wav[0] is the first FRAME (2 samples), zero-padded to the clip length.
# --------------------------------------------------------------------------------------------------------------------
CLIP_LEN, AUDIO_SR = 4000, 8000
TONES = (300.0, 550.0, 900.0, 1400.0)


def _stereo_clips(n: int, s: int):
    rng = np.random.default_rng(s)
    t = np.arange(CLIP_LEN) / AUDIO_SR
    clips, labels = [], []
    for _ in range(n):
        y = int(rng.integers(4))
        f = TONES[y] * (1 + 0.03 * rng.standard_normal())
        mono = np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi)) * rng.uniform(0.3, 1.0)
        stereo = np.stack([mono, 0.8 * mono], axis=1) + 0.1 * rng.standard_normal((CLIP_LEN, 2))
        clips.append(stereo.astype(np.float32))            # (frames, channels), like soundfile.read
        labels.append(y)
    return clips, labels


class ClipDataset(Dataset):
    def __init__(self, clips, labels, channels_last_aware: bool):
        self.clips, self.labels, self.aware = clips, labels, channels_last_aware

    def __len__(self):
        return len(self.clips)

    def __getitem__(self, i):
        wav = torch.from_numpy(self.clips[i])
        wav = wav[:, 0] if self.aware else wav[0]                 # first channel
        wav = F.pad(wav, (0, CLIP_LEN - wav.shape[0]))[:CLIP_LEN]
        return wav.unsqueeze(0), self.labels[i]


def wave_cnn():
    return nn.Sequential(nn.Conv1d(1, 16, 64, stride=16), nn.ReLU(), nn.Conv1d(16, 32, 8, stride=4), nn.ReLU(),
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 4))


def clip_val_acc(model, kw):
    return accuracy(model, loader(ClipDataset(*_stereo_clips(300, 2), True), 100, shuffle=False))


@case("machine_tones_soundfile_frames_channels_read_as_channels_first", "data",
      bug="the stereo clips are stored as soundfile returns them, (frames, channels), but the Dataset takes the first "
          "channel with wav[0] as for torchaudio's (channels, frames): wav[0] is the first frame, two samples, "
          "which F.pad then pads with 3998 zeros, so every input is two samples and silence (wav[:, 0] was meant)",
      cause_pattern=r"\[:, ?0\]|wav\[0\]|(frames?|samples?), ?channels|channels?, ?(frames?|samples?)|"
                    r"channels?[^.]*(axis|dim|layout)\b|(axis|dim|layout)[^.]*channel|soundfile|torchaudio|"
                    r"(mostly|almost (all|entirely)|nearly all|all but \d+)[^.]*(zero|padding|silen)|(zero|"
                    r"padding|silen)\w*[^.]*(\d+%|almost all|nearly all|most) of (the|each|every) (input|clip|"
                    r"sample|waveform)")
def machine_tones_soundfile_frames_channels_read_as_channels_first(channels_last_aware=False):
    seed(0)
    train = ClipDataset(*_stereo_clips(1000, 1), channels_last_aware)
    val = ClipDataset(*_stereo_clips(300, 2), channels_last_aware)
    model = wave_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _clip_fact():
    wav, _ = ClipDataset(*_stereo_clips(1, 1), False)[0]
    print(f"  stored clip shape {_stereo_clips(1, 1)[0][0].shape}; wav[0] gives {int((wav != 0).sum())} non-zero "
          f"samples of {wav.shape[-1]}")


fix("machine_tones_soundfile_frames_channels_read_as_channels_first",
    partial(machine_tones_soundfile_frames_channels_read_as_channels_first, channels_last_aware=True),
    clip_val_acc, "val accuracy", _clip_fact)


# --------------------------------------------------------------------------------------------------------------------
# 4. BPR recommender whose negative sampler has its rejection loop inverted: `while j not in seen: draw again`
#    keeps drawing until j IS one of the user's items, so every "negative" is another positive.
# --------------------------------------------------------------------------------------------------------------------
BPR_USERS, BPR_ITEMS = 300, 200


def _implicit_feedback():
    g = gen(800)
    user_group = torch.randint(0, 5, (BPR_USERS,), generator=g)
    item_group = torch.randint(0, 5, (BPR_ITEMS,), generator=g)
    rng = np.random.default_rng(800)
    train, held_out = {}, {}
    for u in range(BPR_USERS):
        liked = np.flatnonzero((item_group == user_group[u]).numpy())
        other = np.flatnonzero((item_group != user_group[u]).numpy())
        items = np.concatenate([rng.choice(liked, 12, replace=False), rng.choice(other, 3, replace=False)])
        rng.shuffle(items)
        train[u], held_out[u] = set(items[:12].tolist()), [int(i) for i in rng.choice(liked, 4) if i not in items[:12]]
    return train, held_out


class BPRTriples(Dataset):
    def __init__(self, seen: dict, rejection_inverted: bool, s: int = 0):
        self.seen, self.inverted = seen, rejection_inverted
        self.pairs = [(u, i) for u, items in seen.items() for i in sorted(items)]
        self.rng = random.Random(s)

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, idx):
        u, i = self.pairs[idx]
        j = self.rng.randrange(BPR_ITEMS)
        if self.inverted:
            while j not in self.seen[u]:
                j = self.rng.randrange(BPR_ITEMS)
        else:
            while j in self.seen[u]:
                j = self.rng.randrange(BPR_ITEMS)
        return u, i, j


class MF(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.user, self.item = nn.Embedding(BPR_USERS, d), nn.Embedding(BPR_ITEMS, d)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1)


def bpr_loss(model, batch):
    u, i, j = batch
    return -F.logsigmoid(model(u, i) - model(u, j)).mean()


@torch.no_grad()
def held_out_auc(model, kw):
    seen, held = _implicit_feedback()
    rng = np.random.default_rng(3)
    wins, total = 0.0, 0
    for u, items in held.items():
        if not items:
            continue
        negatives = [j for j in rng.integers(0, BPR_ITEMS, 40) if j not in seen[u] and j not in items][:20]
        users = torch.full((len(items) + len(negatives),), u)
        scores = model(users, torch.tensor(list(items) + negatives))
        pos, neg = scores[:len(items)], scores[len(items):]
        wins += (pos[:, None] > neg[None, :]).float().sum().item()
        total += len(items) * len(negatives)
    return wins / total


@case("shop_bpr_negative_sampler_rejection_inverted", "data",
      bug="the BPR negative sampler's rejection loop is inverted: `while j not in seen[u]: j = randrange(...)` keeps "
          "drawing until j IS one of the user's own items, so every (user, positive, negative) triple pairs two "
          "positives and the ranking loss has nothing to separate (`while j in seen[u]` was meant)",
      cause_pattern=r"negative[^.]*(sampl|positive|seen|interact|own items)|(sampl|rejection)\w*[^.]*negative|"
                    r"(positive|seen|interacted)[^.]*(as|are|also) (the )?negatives?|while j|rejection|"
                    r"(pos|positive) and (neg|negative)[^.]*(same|identical|indistinguishable|overlap)")
def shop_bpr_negative_sampler_rejection_inverted(rejection_inverted=True):
    seed(0)
    seen, _ = _implicit_feedback()
    model = MF()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(BPRTriples(seen, rejection_inverted), 64), loss_fn=bpr_loss)


def _bpr_fact():
    seen, _ = _implicit_feedback()
    ds = BPRTriples(seen, True)
    triples = [ds[k] for k in range(200)]
    print(f"  inverted sampler: {sum(j in seen[u] for u, _, j in triples)}/200 'negatives' are the user's own items")


fix("shop_bpr_negative_sampler_rejection_inverted",
    partial(shop_bpr_negative_sampler_rejection_inverted, rejection_inverted=False), held_out_auc,
    "held-out AUC", _bpr_fact)


# --------------------------------------------------------------------------------------------------------------------
# 5. Tiny BERT NLI whose pair encoding is called with the premise twice, encode_pair(ex["premise"], ex["premise"]):
#    the hypothesis never reaches the model, and whether it is entailed cannot be read from the input.
# --------------------------------------------------------------------------------------------------------------------
NLI_TOPICS, NLI_PER_TOPIC = 4, 8
NLI_VOCAB, NLI_CLS, NLI_SEP = 3 + NLI_TOPICS * NLI_PER_TOPIC, 1, 2


def _nli_examples(n: int, s: int):
    """Premise: 6 words of one topic; hypothesis: 2 words, of the same topic (label 1) or of another (label 0)."""
    g = gen(s)
    out = []
    for k in range(n):
        topic = int(torch.randint(0, NLI_TOPICS, (1,), generator=g))
        label = k % 2
        other = (topic + 1 + int(torch.randint(0, NLI_TOPICS - 1, (1,), generator=g))) % NLI_TOPICS
        premise = 3 + topic * NLI_PER_TOPIC + torch.randint(0, NLI_PER_TOPIC, (6,), generator=g)
        hypothesis = 3 + (topic if label else other) * NLI_PER_TOPIC + torch.randint(0, NLI_PER_TOPIC, (2,), generator=g)
        out.append(dict(premise=premise, hypothesis=hypothesis, label=label))
    return out


def encode_pair(a, b):
    ids = torch.cat([torch.tensor([NLI_CLS]), a, torch.tensor([NLI_SEP]), b, torch.tensor([NLI_SEP])])
    types = torch.cat([torch.zeros(len(a) + 2, dtype=torch.long), torch.ones(len(b) + 1, dtype=torch.long)])
    return ids, types


class NLIDataset(Dataset):
    def __init__(self, examples, second: str):
        self.examples, self.second = examples, second

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        ex = self.examples[i]
        ids, types = encode_pair(ex["premise"], ex[self.second])
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids),
                "labels": torch.tensor(ex["label"])}


def nli_val_acc(model, kw):
    batches = loader(NLIDataset(_nli_examples(400, 2), "hypothesis"), 100, shuffle=False)

    def fwd(m, b):
        return m(**{k: v for k, v in b.items() if k != "labels"}).logits.argmax(-1), b["labels"]
    return accuracy(model, batches, fwd=fwd)


@case("nli_tiny_bert_pair_encoded_with_the_premise_twice", "data",
      bug="the NLI Dataset encodes each example with encode_pair(ex['premise'], ex['premise']) (a copy-paste slip for "
          "ex['hypothesis']): segment B is the premise again, the hypothesis never reaches BertForSequenceClassification, "
          "and whether it fits the premise cannot be read from the input",
      cause_pattern=r"hypothesis|premise|(second|both) (segment|sentence|text)|segment b|sentence pair|"
                    r"(pair|segments?)[^.]*(identical|same|duplicat)|(identical|same|duplicat)\w*[^.]*(segments?|"
                    r"halves|pair)")
def nli_tiny_bert_pair_encoded_with_the_premise_twice(second="premise"):
    from transformers import BertForSequenceClassification
    seed(0)
    model = BertForSequenceClassification(tiny_bert_config(vocab_size=NLI_VOCAB, num_labels=2))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(NLIDataset(_nli_examples(1600, 1), second), 32),
                val_loader=loader(NLIDataset(_nli_examples(400, 2), second), 100, shuffle=False), loss_fn=None)


def _nli_fact():
    item = NLIDataset(_nli_examples(1, 1), "premise")[0]
    ids, types = item["input_ids"], item["token_type_ids"]
    print(f"  segment A {ids[types == 0][1:-1].tolist()} / segment B {ids[types == 1][:-1].tolist()}")


fix("nli_tiny_bert_pair_encoded_with_the_premise_twice",
    partial(nli_tiny_bert_pair_encoded_with_the_premise_twice, second="hypothesis"), nli_val_acc, "val accuracy",
    _nli_fact)


# --------------------------------------------------------------------------------------------------------------------
# 6. A "balanced" batch sampler that serves one class per batch (round-robin over the classes) into a BatchNorm CNN:
#    in training mode BatchNorm normalises every batch with its own statistics, which here are one class's, so the
#    class shows up in no batch's normalised features; eval with the running statistics then sees another model.
# --------------------------------------------------------------------------------------------------------------------
class OneClassPerBatchSampler(Sampler):
    def __init__(self, labels: torch.Tensor, batch_size: int, s: int = 0):
        self.labels, self.batch_size, self.g = labels, batch_size, gen(s)

    def __iter__(self):
        batches = []
        for c in self.labels.unique():
            idx = (self.labels == c).nonzero().flatten()
            idx = idx[torch.randperm(len(idx), generator=self.g)]
            batches += [idx[k:k + self.batch_size].tolist() for k in range(0, len(idx), self.batch_size)]
        order = torch.randperm(len(batches), generator=self.g).tolist()
        return iter([batches[k] for k in order])

    def __len__(self):
        return sum(math.ceil(int((self.labels == c).sum()) / self.batch_size) for c in self.labels.unique())


@case("plankton_bn_cnn_one_class_per_batch_sampler", "data",
      bug="the 'balanced' batch sampler serves one class per batch (all 32 images of a batch share the label) into "
          "a BatchNorm CNN: in training mode BatchNorm normalises each batch with its own statistics, which are one "
          "class's, so the class-level differences are normalised away inside every batch, and at eval the "
          "running statistics give features the head never saw (batches must mix the classes)",
      cause_pattern=r"(one|single|a single|the same|only one) (class|label) (per|in each|in every|for each|"
                    r"for every) batch|(each|every) batch[^.]*(only|one|single|a single|the same) (class|label)|"
                    r"(class|label).?(grouped|homogeneous|pure|sorted) batch|grouped by (class|label)|"
                    r"batch.?sampler|(homogeneous|pure) batch|(all|every) batch(es)? (are|is|contain)[^.]*(single|"
                    r"one|same).?(class|label)")
def plankton_bn_cnn_one_class_per_batch_sampler(mixed=False):
    seed(0)
    x, y = _bars(1600, 1)
    train = TensorDataset(x, y)
    val = TensorDataset(*_bars(400, 2))
    model = bn_cnn()
    train_loader = loader(train, 32) if mixed else \
        torch.utils.data.DataLoader(train, batch_sampler=OneClassPerBatchSampler(y, 32))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3), train_loader=train_loader,
                val_loader=loader(val, 200, shuffle=False), loss_fn=nn.CrossEntropyLoss())


def _one_class_fact():
    x, y = _bars(1600, 1)
    dl = torch.utils.data.DataLoader(TensorDataset(x, y), batch_sampler=OneClassPerBatchSampler(y, 32))
    print(f"  distinct labels per batch over one epoch: {sorted({len(b[1].unique()) for b in dl})}")


fix("plankton_bn_cnn_one_class_per_batch_sampler", partial(plankton_bn_cnn_one_class_per_batch_sampler, mixed=True),
    val_acc, "val accuracy", _one_class_fact)
