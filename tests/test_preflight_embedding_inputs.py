"""model.embedding_inputs: EMBEDDING_PADDING_IDX, an Embedding whose padding_idx is a real
token (it occurs inside the sequences), quiet when padding_idx is the id the collate pads
with; EMBEDDING_ONE_TOKEN, most words encoded as <unk>, quiet on text-like ids."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.embedding_inputs import EmbeddingInputsCheck, dominant_token, inside_occurrences
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

UNK, PAD = 1, 0


def sentences() -> list[tuple[torch.Tensor, int]]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(256):
        ids = torch.randint(2, 50, (int(torch.randint(4, 20, (1,), generator=g)),), generator=g)
        ids[torch.rand(len(ids), generator=g) < 0.1] = UNK  # out-of-vocabulary words
        rows.append((ids, int(torch.randint(0, 2, (1,), generator=g))))
    return rows


def collate(rows):
    return pad_sequence([r[0] for r in rows], batch_first=True, padding_value=PAD), torch.tensor([r[1] for r in rows])


class BagOfWords(nn.Module):
    def __init__(self, padding_idx):
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 16, padding_idx=padding_idx), nn.Linear(16, 2)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


@pytest.mark.parametrize("padding_idx, fires", [(UNK, True), (PAD, False)], ids=["unk_as_padding", "pad_id"])
def test_a_padding_idx_that_is_a_real_token_fires(padding_idx, fires):
    model = BagOfWords(padding_idx)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(sentences(), batch_size=32, shuffle=True, collate_fn=collate),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    issues = report.check("model.embedding_inputs").issues
    assert bool(issues) == fires
    if fires:
        assert "tokenizer.pad_token_id" in issues[0].fix


def test_padding_runs_at_either_end_and_holes_near_them_are_not_inside():
    ids = torch.tensor([[5, 6, 5, 6, 5, 0, 0, 0], [0, 0, 7, 8, 7, 8, 7, 8], [5, 6, 5, 6, 5, 6, 0, 6],
                        [5, 6, 0, 6, 5, 6, 5, 6]])
    assert inside_occurrences(ids, 0) == (1, 25)  # only row 3's 0, at position 2 of 8


def test_most_words_encoded_as_unknown_fire_and_text_like_ids_stay_quiet():
    vocab = {w: i + 2 for i, w in enumerate(["the", "a", "good", "bad", "movie", "film", "plot"])}
    words = ["The", "Movie", "was", "good", "Bad", "plot", "Acting", "Great"] * 40
    encoded = [vocab.get(w, UNK) for w in words]  # case-sensitive lookup of capitalised text
    rows = torch.tensor(encoded).reshape(20, 16)
    model = BagOfWords(PAD)
    loader = DataLoader([(row, 0) for row in rows], batch_size=20, collate_fn=collate)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    issues = [i for i in report.check("model.embedding_inputs").issues if i.code == "EMBEDDING_ONE_TOKEN"]
    assert issues and "(1)" in issues[0].message
    text_like = torch.randint(2, 50, (20, 16), generator=torch.Generator().manual_seed(0))
    assert dominant_token(text_like)[1] < 0.2


def test_a_time_major_batch_pads_along_its_first_axis():
    lengths = torch.randperm(16, generator=torch.Generator().manual_seed(0)) + 4  # unsorted samples
    ids = pad_sequence([torch.randint(2, 50, (int(n),)) for n in lengths], padding_value=PAD)  # (T, B)
    assert inside_occurrences(ids, PAD)[0] > 0  # read along the batch axis, the padding is everywhere
    assert inside_occurrences(ids.t(), PAD)[0] == 0  # along time, only at the ends


class CityModel(nn.Module):
    """One categorical id per sample (a city) looked up in its own table."""

    def __init__(self, rows, padding_idx):
        super().__init__()
        self.city, self.head = nn.Embedding(rows, 8, padding_idx=padding_idx), nn.Linear(8, 2)

    def forward(self, ids):
        return self.head(self.city(ids))


def city_run(codes: torch.Tensor, rows: int, padding_idx: int | None):
    from optimus_preflight.preflight.checks.zero_features import ZeroFeaturesCheck

    model = CityModel(rows, padding_idx)
    labels = (codes % 2).long()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(list(zip(codes, labels)), batch_size=64, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck(), ZeroFeaturesCheck()])
    return report.check("model.embedding_inputs").issues, report.check("step.zero_features").issues


def test_a_padding_idx_on_a_column_coded_from_zero_is_a_real_category():
    codes = torch.randint(0, 6, (512,), generator=torch.Generator().manual_seed(0))  # LabelEncoder: 0..5
    (issue,), (zeros,) = city_run(codes, rows=6, padding_idx=0)
    assert issue.code == "EMBEDDING_PADDING_IDX" and "one id per sample" in issue.message
    assert "Drop padding_idx" in issue.fix and "codes + 1" in issue.fix
    assert "padding_idx 0" in zeros.message and "pad_packed_sequence" not in zeros.message


@pytest.mark.parametrize("codes, rows, padding_idx", [
    (torch.randint(0, 6, (512,), generator=torch.Generator().manual_seed(0)), 6, None),
    # 0 kept for 'missing' (codes 1..6 in a table of 7), missing in a few rows only
    (torch.where(torch.rand(512, generator=torch.Generator().manual_seed(1)) < 0.04, 0,
                 torch.randint(1, 7, (512,), generator=torch.Generator().manual_seed(0))), 7, 0),
], ids=["no_padding_idx", "missing_kept_apart"])
def test_a_categorical_column_without_a_misused_padding_idx_is_quiet(codes, rows, padding_idx):
    issues, _ = city_run(codes, rows, padding_idx)
    assert issues == []


class PretrainedBag(nn.Module):
    def __init__(self, matrix: torch.Tensor, freeze: bool):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(matrix, freeze=freeze, padding_idx=0)
        self.head = nn.Linear(matrix.shape[1], 4)

    def forward(self, tokens):
        return self.head(self.embed(tokens).mean(1))


@pytest.mark.parametrize("zero_rows, freeze, fires", [
    ([0, 4, 5, 6, 7], True, True),   # the topic words missing from the vectors, frozen
    ([0, 4, 5, 6, 7], False, False),  # they train
    ([0], True, False),               # only the padding row is zero
    ([0, 1], True, False),            # one zero <unk> row: a common, deliberate choice
], ids=["oov_rows_frozen", "oov_rows_trained", "padding_only", "one_unk_row"])
def test_words_read_as_frozen_zero_vectors(zero_rows, freeze, fires):
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (512,), generator=g)
    ids = torch.randint(8, 60, (512, 16), generator=g)
    ids[:, 3] = 4 + labels  # the topic word
    ids[:, 5] = 1  # an <unk>
    matrix = torch.randn(60, 16, generator=g)
    matrix[zero_rows] = 0.0
    model = PretrainedBag(matrix, freeze)
    report = run_preflight(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3),
                           DataLoader(list(zip(ids, labels)), batch_size=64, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "FROZEN_ZERO_VECTORS"]
    assert bool(found) == fires
    if found:
        assert "4, 5, 6, 7" in found[0].message and "freeze=False" in found[0].fix
