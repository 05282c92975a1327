"""Set g, family `shapes`: shape / axis / indexing bugs at the model or the loss."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_g.registry import accuracy, case, fix, loader, seed, val_acc

# --------------------------------------------------------------------------- 1: NLL indexed with the label vector


def galaxy_images(n=1600, s=0):
    """1x16x16 'galaxy cutouts': the class is the morphology (round blob, horizontal bar, vertical bar, ring)."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 4, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    cy = 7.5 + torch.randn(n, generator=g) * 1.5
    cx = 7.5 + torch.randn(n, generator=g) * 1.5
    dy, dx = yy - cy[:, None, None], xx - cx[:, None, None]
    r2 = dy ** 2 + dx ** 2
    blob = torch.exp(-r2 / 8)
    hbar = torch.exp(-dy ** 2 / 2 - dx ** 2 / 30)
    vbar = torch.exp(-dx ** 2 / 2 - dy ** 2 / 30)
    ring = torch.exp(-(r2.sqrt() - 4.5) ** 2 / 1.5)
    img = torch.stack([blob, hbar, vbar, ring], 1)[torch.arange(n), y]
    img = img * (0.7 + 0.6 * torch.rand(n, 1, 1, generator=g)) + 0.25 * torch.randn(n, 16, 16, generator=g)
    return img[:, None], y


class GalaxyCNN(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x):
        return self.head(self.features(x))


def nll_label_vector(model, batch):
    images, labels = batch
    log_probs = F.log_softmax(model(images), dim=1)
    return -log_probs[:, labels].mean()


def nll_per_sample(model, batch):
    images, labels = batch
    log_probs = F.log_softmax(model(images), dim=1)
    return -log_probs[torch.arange(len(labels)), labels].mean()


def _galaxy(fix=False):
    seed(0)
    x, y = galaxy_images(s=1)
    model = GalaxyCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1280], y[:1280]), 32),
                val_loader=loader(TensorDataset(x[1280:], y[1280:]), 64, shuffle=False),
                loss_fn=nll_per_sample if fix else nll_label_vector, max_steps=3000)


@case("galaxy_cnn_nll_indexed_with_label_vector", "shapes",
      bug="the hand-written NLL picks the true-class log-probabilities with log_probs[:, labels]: indexing dim 1 with "
          "the (B,) label vector returns a (B, B) matrix (every sample's log-probability of every label in the batch), "
          "so .mean() fits each image to the whole batch's label mix and the CNN learns the class frequencies, not "
          "the morphology (log_probs[torch.arange(B), labels] or gather is the fix)",
      cause_pattern=r"arange|gather|advanced index|fancy index|\[:, ?(y|labels?|targets?)\]|range\(len|"
                    r"\((\d+|B), ?\2\)|(each|every) (sample|example|image|row)[^.]*(all|every|other) (labels?|targets?)"
                    r"|(every|all) (labels?|targets?) (of|in) the batch|(log.?prob\w*|nll)[^.]*(index|select)\w*")
def galaxy_cnn_nll_indexed_with_label_vector():
    return _galaxy()


def _fact_galaxy():
    kw = _galaxy()
    x, y = next(iter(kw["train_loader"]))
    lp = F.log_softmax(kw["model"](x), 1)
    print(f"  log_probs {tuple(lp.shape)}, log_probs[:, labels] {tuple(lp[:, y].shape)}")


fix("galaxy_cnn_nll_indexed_with_label_vector", lambda: _galaxy(True), val_acc, "val acc", _fact_galaxy)

# --------------------------------------------------------------------------- 2: GCN aggregates outgoing edges


def citation_graphs(n=600, nodes=12, feats=6, classes=3, s=0):
    """Directed citation graphs: a paper's field is decided by the papers it is cited by (incoming edges,
    A[src, dst] = 1 for src -> dst); its own features and the papers it cites are noise."""
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, nodes, feats, generator=g)
    a = (torch.rand(n, nodes, nodes, generator=g) < 0.25).float() * (1 - torch.eye(nodes))
    w = torch.randn(feats, classes, generator=g)
    incoming = a.transpose(1, 2) @ x / a.sum(1).clamp(min=1)[..., None]
    y = (incoming @ w).argmax(-1)
    y[a.sum(1) == 0] = -100
    return x, a, y


class CitationGCN(nn.Module):
    def __init__(self, feats=6, hidden=64, classes=3, incoming=True):
        super().__init__()
        self.incoming = incoming
        self.msg1, self.self1 = nn.Linear(feats, hidden), nn.Linear(feats, hidden)
        self.msg2, self.self2 = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def aggregate(self, h, adj):
        if self.incoming:
            adj = adj.transpose(1, 2)            # row dst: its sources
        return adj @ h / adj.sum(-1, keepdim=True).clamp(min=1)

    def forward(self, x, adj):
        h = F.relu(self.msg1(self.aggregate(x, adj)) + self.self1(x))
        h = F.relu(self.msg2(self.aggregate(h, adj)) + self.self2(h))
        return self.out(h)


def node_ce(model, batch):
    x, adj, y = batch
    return F.cross_entropy(model(x, adj).flatten(0, 1), y.flatten(), ignore_index=-100)


def node_acc(model, kw):
    return accuracy(model, kw["val_loader"], lambda m, b: (m(b[0], b[1]).argmax(-1), b[2]))


def _citation(fix=False):
    seed(0)
    x, a, y = citation_graphs(s=2)
    model = CitationGCN(incoming=fix)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:500], a[:500], y[:500]), 16),
                val_loader=loader(TensorDataset(x[500:], a[500:], y[500:]), 50, shuffle=False),
                loss_fn=node_ce, max_steps=2000)


@case("citation_gcn_aggregates_outgoing_edges", "shapes",
      bug="the adjacency is built as A[src, dst] = 1 from edge_index (src -> dst), and the GCN aggregates with A @ h "
          "normalised by A.sum(-1): row i sums the papers i cites (its out-neighbours), not the papers citing it; "
          "the field label is carried by the incoming edges, so messages flow the wrong way and the labels cannot be "
          "learned (aggregate with A.transpose(1, 2), the in-neighbours)",
      cause_pattern=r"transpos\w*[^.]*(adjacen|\bA\b|edges?|graph)|(adjacen\w*|\bA\b)[^.]*transpos|(edge|message|aggre"
                    r"gat\w*|graph)[^.]*direction|direction[^.]*(edge|message|aggregat|graph)|edge_index|(source|src|d"
                    r"st)s?[^.]*(swap|revers)|(source|target)s? (and|/) (targets?|sources?)[^.]*(swap|revers)|\bin.?(c"
                    r"oming|neighbou?rs?|edges?|degree)|\bout.?(going|neighbou?rs?|edges?)|successor|predecessor|\bA\."
                    r"T\b|adjacency[^.]*(transpos|orient|direction|revers)")
def citation_gcn_aggregates_outgoing_edges():
    return _citation()


def _fact_citation():
    x, a, _ = citation_graphs(n=50, s=2)
    print(f"  A @ h sums out-neighbours; A and A^T rows agree on {(a == a.transpose(1, 2)).float().mean():.2f} of "
          f"entries (edges are directed)")


fix("citation_gcn_aggregates_outgoing_edges", lambda: _citation(True), node_acc, "val node acc", _fact_citation)

# --------------------------------------------------------------------------- 3: packed GRU read at out[:, -1]


def command_clips(n=1600, feats=8, classes=4, s=0):
    """Variable-length (5-24 frames) feature sequences; the class is which band bursts somewhere in the clip."""
    g = torch.Generator().manual_seed(s)
    lengths = torch.randint(5, 25, (n,), generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, 24, feats, generator=g) * 0.6
    start = (torch.rand(n, generator=g) * (lengths - 3).float()).long()
    for i in range(n):
        x[i, start[i]:start[i] + 3, y[i]] += 2.0
        x[i, lengths[i]:] = 0.0
    return x, lengths, y


class ClipDataset(Dataset):
    def __init__(self, x, lengths, y):
        self.x, self.lengths, self.y = x, lengths, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i, :self.lengths[i]], self.y[i]


def pad_clips(items):
    seqs, ys = zip(*items)
    lengths = torch.tensor([len(s) for s in seqs])
    return nn.utils.rnn.pad_sequence(list(seqs), batch_first=True), lengths, torch.stack(ys)


class PackedGRUClassifier(nn.Module):
    def __init__(self, feats=8, hidden=48, classes=4, last_valid=True):
        super().__init__()
        self.last_valid = last_valid
        self.gru = nn.GRU(feats, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, h_n = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True)
        if self.last_valid:
            last = out[torch.arange(len(lengths)), lengths - 1]
        else:
            last = out[:, -1]
        return self.head(last)


def clip_ce(model, batch):
    x, lengths, y = batch
    return F.cross_entropy(model(x, lengths), y)


def clip_acc(model, kw):
    return accuracy(model, kw["val_loader"], lambda m, b: (m(b[0], b[1]).argmax(-1), b[2]))


def _commands(fix=False):
    seed(0)
    x, lengths, y = command_clips(s=3)
    model = PackedGRUClassifier(last_valid=fix)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ClipDataset(x[:1300], lengths[:1300], y[:1300]), 32, collate_fn=pad_clips),
                val_loader=loader(ClipDataset(x[1300:], lengths[1300:], y[1300:]), 100, shuffle=False,
                                  collate_fn=pad_clips),
                loss_fn=clip_ce, max_steps=2000)


@case("speech_packed_gru_reads_padded_last_step", "shapes",
      bug="the GRU runs on a PackedSequence and the output is unpacked with pad_packed_sequence, then the classifier "
          "reads out[:, -1]: for every clip shorter than the longest of its batch that position is padding, which "
          "pad_packed_sequence fills with zeros, so most clips are classified from a zero vector (read "
          "out[arange(B), lengths - 1] or h_n, the last valid step)",
      cause_pattern=r"pad_packed|h_n|lengths? ?- ?1|last (valid|real|non.?pad\w*|actual|true) (time )?(step|token|"
                    r"position|frame|output)|(padding|padded) (positions?|steps?|frames?)[^.]*(zeros?|read)|"
                    r"out(put)?\[:, ?-1\]|(zeros?|all.zero)[^.]*(last|final) (time )?(step|position|output)|"
                    r"(last|final) (time )?(step|position|output)[^.]*(zeros?|padding)")
def speech_packed_gru_reads_padded_last_step():
    return _commands()


def _fact_commands():
    kw = _commands()
    x, lengths, y = next(iter(kw["train_loader"]))
    m = kw["model"]
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, _ = pad_packed_sequence(m.gru(packed)[0], batch_first=True)
    print(f"  rows of out[:, -1] that are exactly zero: {(out[:, -1].abs().sum(1) == 0).sum().item()} of {len(y)}")


fix("speech_packed_gru_reads_padded_last_step", lambda: _commands(True), clip_acc, "val acc", _fact_commands)

# --------------------------------------------------------------------------- 4: FM interaction over the wrong axis

FIELDS = (30, 30, 12, 24)          # user, ad, site, hour


def ad_clicks(n=6000, s=0):
    """Clicks decided by a user x ad affinity only (no main effects): only a model with cross-field interactions
    can predict them."""
    g = torch.Generator().manual_seed(s)
    cols = torch.stack([torch.randint(0, c, (n,), generator=g) for c in FIELDS], 1)
    u, a = torch.randn(FIELDS[0], 3, generator=g), torch.randn(FIELDS[1], 3, generator=g)
    logit = 2.0 * (u[cols[:, 0]] * a[cols[:, 1]]).sum(1)
    y = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    offsets = torch.tensor([0, *torch.tensor(FIELDS).cumsum(0)[:-1].tolist()])
    return cols + offsets, y


class FactorizationMachine(nn.Module):
    def __init__(self, dim=8, fields_axis=True):
        super().__init__()
        self.fields_axis = fields_axis
        self.emb = nn.Embedding(sum(FIELDS), dim)
        self.linear = nn.Embedding(sum(FIELDS), 1)
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.normal_(self.emb.weight, std=0.3)
        nn.init.zeros_(self.linear.weight)

    def forward(self, ids):
        e = self.emb(ids)                                  # (B, fields, dim)
        axis = 1 if self.fields_axis else 2
        inter = 0.5 * (e.sum(axis).pow(2) - e.pow(2).sum(axis)).sum(1)
        return self.bias + self.linear(ids).sum((1, 2)) + inter


def click_bce(model, batch):
    ids, y = batch
    return F.binary_cross_entropy_with_logits(model(ids), y)


def click_acc(model, kw):
    return accuracy(model, kw["val_loader"], lambda m, b: ((m(b[0]) > 0).float(), b[1]))


def _ctr(fix=False):
    seed(0)
    ids, y = ad_clicks(s=4)
    model = FactorizationMachine(fields_axis=fix)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(ids[:5000], y[:5000]), 64),
                val_loader=loader(TensorDataset(ids[5000:], y[5000:]), 250, shuffle=False),
                loss_fn=click_bce, max_steps=3000)


@case("ad_ctr_fm_interaction_summed_over_embedding_axis", "shapes",
      bug="the factorisation machine's pairwise term is 0.5 * (e.sum(2) ** 2 - (e ** 2).sum(2)).sum(1) on the "
          "(B, fields, dim) embeddings: summed over the embedding axis instead of the field axis, it only multiplies "
          "coordinates of the same field's vector and contains no cross-field interaction, so the user x ad "
          "affinity that decides the clicks cannot be represented (sum over dim 1, the fields, then over dim)",
      cause_pattern=r"factori[sz]ation machine|\bFM\b|(cross.?field|cross.?feature|pairwise|second.order|feature) inte"
                    r"raction|interaction[^.]*(term|axis|dim|fields?)|(sum|reduc)\w*[^.]*(embedding|field)s? (axis|dim"
                    r")|field (axis|dim)|within.?field")
def ad_ctr_fm_interaction_summed_over_embedding_axis():
    return _ctr()


def _fact_ctr():
    m = FactorizationMachine(fields_axis=False)
    ids = torch.tensor([[0, 30, 60, 72], [0, 31, 60, 72], [1, 30, 60, 72], [1, 31, 60, 72]])
    t = m(ids).detach()
    print(f"  user x ad interaction contrast of the broken term: {(t[0] - t[1] - t[2] + t[3]).item():.2e} (always 0)")


fix("ad_ctr_fm_interaction_summed_over_embedding_axis", lambda: _ctr(True), click_acc, "val click acc", _fact_ctr)

# --------------------------------------------------------------------------- 5: source reversed along the batch axis

V, BOS = 10, 1


def reverse_pairs(n=3000, length=6, s=0):
    g = torch.Generator().manual_seed(s)
    src = torch.randint(2, V, (n, length), generator=g)
    return src, src.flip(1)


class ReversingSeq2Seq(nn.Module):
    """GRU encoder-decoder with the Sutskever source-reversal trick."""

    def __init__(self, hidden=96, time_axis=1):
        super().__init__()
        self.time_axis = time_axis
        self.src_emb, self.tgt_emb = nn.Embedding(V, 32), nn.Embedding(V, 32)
        self.encoder = nn.GRU(32, hidden, batch_first=True)
        self.decoder = nn.GRU(32, hidden, batch_first=True)
        self.out = nn.Linear(hidden, V)

    def forward(self, src, tgt_in):
        src = src.flip(self.time_axis)          # reverse the source sentence
        _, h = self.encoder(self.src_emb(src))
        dec, _ = self.decoder(self.tgt_emb(tgt_in), h)
        return self.out(dec)


def seq2seq_ce(model, batch):
    src, tgt = batch
    tgt_in = torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], 1)
    return F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt.flatten())


def seq2seq_token_acc(model, kw):
    def fwd(m, b):
        src, tgt = b
        tgt_in = torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], 1)
        return m(src, tgt_in).argmax(-1), tgt
    return accuracy(model, kw["val_loader"], fwd)


def _reverse(fix=False):
    seed(0)
    src, tgt = reverse_pairs(s=5)
    model = ReversingSeq2Seq(time_axis=1 if fix else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src[:2600], tgt[:2600]), 32),
                val_loader=loader(TensorDataset(src[2600:], tgt[2600:]), 100, shuffle=False),
                loss_fn=seq2seq_ce, max_steps=3000)


@case("reverser_gru_source_flipped_along_batch_axis", "shapes",
      bug="the encoder-decoder applies the source-reversal trick with src.flip(0), copied from time-major code, to "
          "batch-first (B, T) sources: dim 0 is the batch, so the batch order is reversed and every target is paired "
          "with the source of another sample (B-1-b), never its own (src.flip(1) reverses the time axis)",
      cause_pattern=r"\.?flip\(|flipped|(batch|sample)s? (axis|dim|order)[^.]*(revers|flip)|revers\w*[^.]*(batch (axis"
                    r"|dim|order)|order of the (batch|samples))|(source|input)s?[^.]*(another|other|different|wrong) ("
                    r"sample|example|sequence|pair|row)|misalign|(flip|revers)\w*[^.]*time (axis|dim)|time (axis|dim)["
                    r"^.]*(flip|revers)")
def reverser_gru_source_flipped_along_batch_axis():
    return _reverse()


def _fact_reverse():
    src = torch.arange(12).view(3, 4)
    print(f"  src.flip(0) of [[0..3],[4..7],[8..11]] -> first row {src.flip(0)[0].tolist()} (another sample's source)")


fix("reverser_gru_source_flipped_along_batch_axis", lambda: _reverse(True), seq2seq_token_acc,
    "val token acc (teacher forced)", _fact_reverse)

# --------------------------------------------------------------------------- 6: deltas across the batch axis


def pitch_contours(n=2000, t=20, feats=3, s=0):
    """Pitch-like contours: rising / falling / flat; each clip has a random level, so only the slope tells."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 3, (n,), generator=g)
    slope = torch.tensor([0.15, -0.15, 0.0])[y]
    level = torch.randn(n, 1, feats, generator=g) * 2
    ramp = torch.arange(t, dtype=torch.float32)[None, :, None] * slope[:, None, None]
    return level + ramp + 0.2 * torch.randn(n, t, feats, generator=g), y


class ContourNet(nn.Module):
    """Mean-pooled features and their deltas (the delta helper was written for one (T, F) utterance)."""

    def __init__(self, feats=3, time_dim=1):
        super().__init__()
        self.time_dim = time_dim
        self.mlp = nn.Sequential(nn.Linear(2 * feats, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        delta = torch.diff(x, dim=self.time_dim, prepend=x.narrow(self.time_dim, 0, 1))   # same length as x
        return self.mlp(torch.cat([x.mean(1), delta.mean(1)], -1))


def _contour(fix=False):
    seed(0)
    x, y = pitch_contours(s=6)
    model = ContourNet(time_dim=1 if fix else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("pitch_contour_deltas_taken_across_batch", "shapes",
      bug="the delta features come from torch.diff(x, dim=0), a helper written for one (T, F) utterance applied to the "
          "(B, T, F) batch: the differences are taken between neighbouring clips of the batch instead of neighbouring "
          "frames, so the mean delta is a level difference between two unrelated clips and the rising / falling slope "
          "that defines the class is never computed (diff over dim=1, the time axis)",
      cause_pattern=r"delta (features?|channels?)|\bdeltas\b|\bdiff\(|torch\.diff|(batch|sample)s? (axis|dim)[^.]*(dif"
                    r"feren|delta)|(neighbou?ring|adjacent|consecutive|previous) (clips?|samples?|examples?|utterances"
                    r"?|rows?)|(diff|delta)\w*[^.]*time (axis|dim)")
def pitch_contour_deltas_taken_across_batch():
    return _contour()


def _fact_contour():
    x, _ = pitch_contours(n=4, s=6)
    d = torch.diff(x, dim=0, prepend=x[:1])
    print(f"  torch.diff(x, dim=0, prepend=x[:1])[1] equals x[1] - x[0] (clip 1 minus clip 0): "
          f"{torch.allclose(d[1], x[1] - x[0])}")


fix("pitch_contour_deltas_taken_across_batch", lambda: _contour(True), val_acc, "val acc", _fact_contour)

# --------------------------------------------------------------------------- 7: fields share one id space

CARDS = (10, 10, 10, 10)              # region, vehicle class, driver age band, policy type


def claims_table(n=5000, s=0):
    """Each field is label-encoded 0..9 on its own; the claim risk is a sum of field-specific effects."""
    g = torch.Generator().manual_seed(s)
    cols = torch.stack([torch.randint(0, c, (n,), generator=g) for c in CARDS], 1)
    effects = [torch.randn(c, generator=g) for c in CARDS]
    risk = sum(e[cols[:, f]] for f, e in enumerate(effects))
    y = (risk + 0.3 * torch.randn(n, generator=g) > 0).long()
    return cols, y


class ClaimsBagModel(nn.Module):
    """One EmbeddingBag over all the row's categorical ids (sum), sized for every field's categories."""

    def __init__(self, dim=16, offsets=False):
        super().__init__()
        self.bag = nn.EmbeddingBag(sum(CARDS), dim, mode="sum")
        self.register_buffer("offsets", torch.tensor([0, *torch.tensor(CARDS).cumsum(0)[:-1].tolist()])
                             if offsets else torch.zeros(len(CARDS), dtype=torch.long))
        self.mlp = nn.Sequential(nn.ReLU(), nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, cols):
        return self.mlp(self.bag(cols + self.offsets))


def _claims(fix=False):
    seed(0)
    cols, y = claims_table(s=7)
    model = ClaimsBagModel(offsets=fix)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(cols[:4000], y[:4000]), 64),
                val_loader=loader(TensorDataset(cols[4000:], y[4000:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("claims_embeddingbag_fields_share_id_space", "shapes",
      bug="the four categorical columns are each label-encoded 0..9 and looked up in one EmbeddingBag(sum(cards), "
          "mode='sum') without per-field offsets: region 3, vehicle class 3 and age band 3 all read row 3, so the "
          "bag cannot tell which field a category came from (and rows 10-39 are never used); the field-specific "
          "risk effects cannot be learned (add the cumulative field offsets to the ids)",
      cause_pattern=r"(field|column|categor\w*)[^.]*offsets?|offsets?[^.]*(field|column|embedding)|collid|collision|(s"
                    r"har\w*|same|one|single) (embedding )?(table|id|index|row|vector)s?[^.]*(fields?|columns?)|(field"
                    r"s?|columns?)[^.]*(same|shared|overlapping|identical) (ids?|indices|index|rows?|range|vectors?)|("
                    r"ids?|indices) (of|from) different (fields|columns)|(rows?|ids?|indices)[^.]*never (used|looked u"
                    r"p|read|indexed)|unused (embedding )?rows")
def claims_embeddingbag_fields_share_id_space():
    return _claims()


def _fact_claims():
    cols, _ = claims_table(s=7)
    print(f"  id range of every field: {[(int(c.min()), int(c.max())) for c in cols.T]} for a table of {sum(CARDS)}")


fix("claims_embeddingbag_fields_share_id_space", lambda: _claims(True), val_acc, "val acc", _fact_claims)
