"""PAIRS_MISALIGNED: training sources and targets taken apart (one side sorted on its own)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.pair_lengths import PairLengthsCheck, sequence_lengths


def padded_pairs(rows: int, seed: int, layout: str) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 10, (rows,), generator=g).tolist()
    sources = [torch.randint(2, 16, (k,), generator=g) for k in lengths]
    if layout == "unrelated":  # a question and its answer: lengths of their own
        targets = [torch.randint(2, 16, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g) for _ in lengths]
    else:
        targets = [(s + 3) % 16 for s in sources]  # a cipher: one target token per source token
    if layout == "sorted_sources_only":
        sources.sort(key=len)
    elif layout == "sorted_together":
        pairs = sorted(zip(sources, targets), key=lambda pair: len(pair[0]))
        sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    src, tgt = torch.zeros(rows, 10, dtype=torch.long), torch.full((rows, 10), -100)
    for i, (s, t) in enumerate(zip(sources, targets)):
        src[i, :len(s)], tgt[i, :len(t)] = s, t
    return TensorDataset(src, tgt)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(16, 16), nn.Linear(16, 16)

    def forward(self, src):
        return self.out(self.embed(src))


@pytest.mark.parametrize("layout, fires", [("sorted_sources_only", True), ("sorted_together", False),
                                           ("unrelated", False)])
def test_sources_sorted_without_their_targets(layout, fires):
    model = Tagger()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(padded_pairs(1500, 0, layout), batch_size=64, shuffle=True),
                           val_loader=DataLoader(padded_pairs(400, 1, "shuffled" if layout != "unrelated" else layout),
                                                 batch_size=100),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0]).permute(0, 2, 1), b[1], ignore_index=-100),
                           checks=[FirstBatchCheck(), PairLengthsCheck()])
    issues = report.check("data.pair_lengths").issues
    assert [i.code for i in issues] == (["PAIRS_MISALIGNED"] if fires else [])
    if issues:
        assert "srcs.sort(key=len)" in issues[0].message and "sorted(zip(srcs, tgts)" in issues[0].fix


def test_sequence_lengths_read_the_padding_at_the_end():
    rows = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0], [1, 2, 3, 4]])
    targets = torch.tensor([[5, 6, -100, -100], [7, -100, -100, -100], [1, 2, 3, 4]])
    lengths = sequence_lengths((rows, targets))
    assert lengths[0].tolist() == [2.0, 1.0, 4.0] and lengths[1].tolist() == [2.0, 1.0, 4.0]


def test_a_seq_first_target_beside_batch_first_sources_is_no_pair_to_compare():
    # sources (B, S) right-padded, targets collated seq-first (T, B): their rows are not one per sample
    from optimus_preflight.preflight.checks.pair_lengths import correlation

    assert correlation(torch.arange(8.0), torch.arange(12.0)) is None
    g = torch.Generator().manual_seed(0)
    sources = torch.randint(1, 30, (256, 10), generator=g)
    sources[torch.arange(10)[None] >= torch.randint(4, 11, (256, 1), generator=g)] = 0
    targets = torch.randint(1, 30, (256, 12), generator=g)
    targets[torch.arange(12)[None] >= torch.randint(4, 13, (256, 1), generator=g)] = 0

    def seq_first(rows):
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]).t()

    model = nn.Embedding(30, 30)
    loss = lambda m, b: F.cross_entropy(m(b[0])[:, :1].expand(-1, b[1].shape[0], -1).reshape(-1, 30),  # noqa: E731
                                        b[1].t().reshape(-1))
    loaders = [DataLoader(TensorDataset(sources, targets), batch_size=32, shuffle=shuffle, collate_fn=seq_first)
               for shuffle in (True, False)]
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loaders[0], val_loader=loaders[1],
                           loss_fn=loss, checks=[FirstBatchCheck(), PairLengthsCheck()])
    assert report.check("data.pair_lengths").status.value != "crashed"


def utterances(rows: int, seed: int, sort_features_only: bool = False, sort_both: bool = False) -> TensorDataset:
    """CTC batches (frames (N, T, F), transcripts (N, S), input lengths, target lengths): each
    symbol spoken for 3 frames, so an utterance's duration follows its transcript's length."""
    g = torch.Generator().manual_seed(seed)
    target_lengths = torch.randint(2, 7, (rows,), generator=g)
    input_lengths = 3 * target_lengths
    frames = torch.randn(rows, 21, 4, generator=g) * (torch.arange(21)[None] < input_lengths[:, None])[..., None]
    transcripts = torch.randint(1, 6, (rows, 6), generator=g) * (torch.arange(6)[None] < target_lengths[:, None])
    if sort_features_only or sort_both:
        order = torch.argsort(input_lengths, stable=True)
        frames, input_lengths = frames[order], input_lengths[order]
        if sort_both:
            transcripts, target_lengths = transcripts[order], target_lengths[order]
    return TensorDataset(frames, transcripts, input_lengths, target_lengths)


@pytest.mark.parametrize("features_only", [True, False])
def test_utterances_sorted_by_duration_without_their_transcripts(features_only):
    model = nn.Linear(4, 6)

    def ctc(m, batch):
        frames, transcripts, input_lengths, target_lengths = batch
        log_probs = m(frames).log_softmax(-1).transpose(0, 1)
        return F.ctc_loss(log_probs, transcripts, input_lengths, target_lengths, zero_infinity=True)

    train = utterances(960, 0, sort_features_only=features_only, sort_both=not features_only)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(train, batch_size=32, shuffle=True),
                           val_loader=DataLoader(utterances(256, 1), batch_size=64), loss_fn=ctc,
                           checks=[FirstBatchCheck(), PairLengthsCheck()])
    issues = report.check("data.pair_lengths").issues
    assert [i.code for i in issues] == (["PAIRS_MISALIGNED"] if features_only else [])
    if issues:
        assert "utterances and the transcripts are misaligned" in issues[0].message
        assert "transcripts and target lengths were not sorted with them" in issues[0].message
        assert "torch.argsort(input_lengths)" in issues[0].fix


def test_class_ids_beside_padded_sequences_are_not_lengths():
    from optimus_preflight.preflight.checks.pair_lengths import length_vector

    assert length_vector(torch.tensor([3, 5, 9]), 10) and not length_vector(torch.tensor([0, 2, 1]), 10)
    assert not length_vector(torch.tensor([3, 12]), 10) and not length_vector(torch.tensor([3.0, 5.0]), 10)
