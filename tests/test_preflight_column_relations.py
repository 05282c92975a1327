"""VAL_COLUMNS_RECODED (data.split_labels): one-hot columns built per split, so a category
missing from validation shifts every column after it, and continuous features listed in
another order; the same encoding on both splits (an unseen validation category as an all-zero
row), a random split, and a slow drift between the splits stay quiet."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.column_relations import relation_change
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck
from tests.preflight_support import assert_quiet

NAME = "data.split_labels"
EFFECT = dict(zip("ABCDEFGHI", [2.0, -2.0, 1.5, -1.5, 1.0, -1.0, 2.5, -2.5, 0.0]))


def customers(rows: int, seed: int, cities: str) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    city = rng.choice(list(cities), rows)
    numbers = torch.from_numpy(rng.standard_normal((rows, 3))).float()
    logit = torch.tensor([EFFECT[c] for c in city]) + numbers @ torch.tensor([0.6, -0.4, 0.0])
    return city, numbers, (logit > 0).long()


def one_hot(city: np.ndarray, categories) -> torch.Tensor:
    return torch.from_numpy(city[:, None] == np.asarray(categories)[None, :]).float()


def run(train_x, train_y, val_x, val_y):
    model = nn.Sequential(nn.Linear(train_x.shape[1], 16), nn.ReLU(), nn.Linear(16, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(train_x, train_y), batch_size=32, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_x, val_y), batch_size=100),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    return report.check(NAME)


def splits(per_split: bool):
    city, numbers, y = customers(2000, 1, "ABCDEFGH")
    val_city, val_numbers, val_y = customers(500, 2, "ABDEFGHI")  # no C in validation, a new I
    train_categories = np.unique(city)
    x = torch.cat([one_hot(city, train_categories), numbers], 1)
    val_x = torch.cat([one_hot(val_city, np.unique(val_city) if per_split else train_categories), val_numbers], 1)
    return x, y, val_x, val_y


def test_one_hot_columns_built_per_split_fire():
    result = run(*splits(per_split=True))
    issues = [i for i in result.issues if i.code == "VAL_COLUMNS_RECODED"]
    assert issues, result.data
    assert "get_dummies" in issues[0].message and "handle_unknown='ignore'" in issues[0].fix
    assert {2, 3, 4, 5, 6, 7} & set(result.data["recoded_columns"])


def test_the_training_categories_applied_to_validation_stay_quiet():
    assert_quiet(run(*splits(per_split=False)))


def test_features_listed_in_another_order_fire():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2500, 6, generator=g)  # standardised features: the same scale, whatever the order
    y = (x @ torch.tensor([1.5, -1.0, 0.8, 0.0, 0.0, 0.0]) > 0).long()
    found = relation_change(x[:2000], y[:2000], x[2000:][:, [1, 0, 2, 3, 4, 5]], y[2000:])
    assert found is not None and {c.column for c in found.changed} == {0, 1}


def test_a_random_split_and_a_slow_drift_stay_quiet():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2500, 8, generator=g)
    weights = torch.tensor([1.0, -1.0, 0.7, 0.5, 0.0, 0.0, 0.3, -0.3])
    y = (x @ weights + 0.5 * torch.randn(2500, generator=g) > 0).long()
    assert relation_change(x[:2000], y[:2000], x[2000:], y[2000:]) is None
    drifted = (x[2000:] @ (weights * 0.8 + 0.1) > 0).long()  # the relation weakens a little later on
    assert relation_change(x[:2000], y[:2000], x[2000:], drifted) is None


def _documents(rows: int, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (rows,), generator=g)
    docs = []
    for label in labels.tolist():
        words = torch.randint(0, 300, (20,), generator=g)
        words[:3] = 300 + 3 * label + torch.randint(0, 3, (3,), generator=g)  # the words that name the class
        docs.append(words)
    return docs, labels


def _vocabulary(docs: list[torch.Tensor]) -> dict[int, int]:
    counts = torch.bincount(torch.cat(docs), minlength=320)
    return {int(word): rank + 1 for rank, word in enumerate(counts.argsort(descending=True)) if counts[word] > 0}


def test_a_vocabulary_built_per_split_fires_and_one_vocabulary_stays_quiet():
    docs, labels = _documents(2000, 1)
    val_docs, val_labels = _documents(500, 2)
    train_vocab = _vocabulary(docs)
    ids = torch.stack([torch.tensor([train_vocab[int(w)] for w in doc]) for doc in docs])

    def run_with(vocab):
        val_ids = torch.stack([torch.tensor([vocab.get(int(w), 0) for w in doc]) for doc in val_docs])
        model = nn.Sequential(nn.EmbeddingBag(330, 16), nn.Linear(16, 3))
        report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                               DataLoader(TensorDataset(ids, labels), batch_size=32, shuffle=True),
                               val_loader=DataLoader(TensorDataset(val_ids, val_labels), batch_size=100),
                               loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
        return report.check(NAME)

    per_split = run_with(_vocabulary(val_docs))
    issues = [i for i in per_split.issues if i.code == "VAL_COLUMNS_RECODED"]
    assert issues and "vocabulary" in issues[0].message, per_split.data
    assert_quiet(run_with(train_vocab))


def codes_of(city: np.ndarray, order) -> torch.Tensor:
    index = {name: code for code, name in enumerate(order)}
    return torch.tensor([index[c] for c in city])


def first_appearance(city: np.ndarray) -> list:
    return list(dict.fromkeys(city.tolist()))  # pandas factorize's order


class CityEmbedding(nn.Module):
    """Category codes into an embedding, numeric columns beside them: model(codes, numbers)."""

    def __init__(self):
        super().__init__()
        self.city, self.head = nn.Embedding(9, 4), nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, codes, numbers):
        return self.head(torch.cat([self.city(codes), numbers], 1))


def run_codes(per_split: bool):
    city, numbers, y = customers(2000, 1, "ABCDEFGH")
    val_city, val_numbers, val_y = customers(500, 2, "ABCDEFGH")
    train_order = first_appearance(city)
    val_codes = codes_of(val_city, first_appearance(val_city) if per_split else train_order)
    model = CityEmbedding()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(codes_of(city, train_order), numbers, y), batch_size=32, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_codes, val_numbers, val_y), batch_size=100),
                           loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), SplitLabelsCheck()])
    return report.check(NAME)


def test_category_codes_factorized_per_split_beside_numbers_fire():
    result = run_codes(per_split=True)
    issues = [i for i in result.issues if i.code == "VAL_COLUMNS_RECODED"]
    assert len(issues) == 1, result.data
    assert "input 0 = code" in issues[0].message and "factorize" in issues[0].message
    assert "encode every split with it" in issues[0].fix


def test_category_codes_from_one_table_beside_numbers_stay_quiet():
    assert_quiet(run_codes(per_split=False))


def run_regression(per_split: bool):
    """Claim amounts from a city (one-hot) and numbers; validation lacks city C."""
    from optimus_preflight.preflight.checks.split_scale import SplitScaleCheck

    def amounts(rows: int, seed: int, cities: str):
        city, numbers, _ = customers(rows, seed, cities)
        target = torch.tensor([EFFECT[c] for c in city]) + numbers @ torch.tensor([0.6, -0.4, 0.0])
        return city, numbers, target[:, None].float()

    city, numbers, y = amounts(2000, 1, "ABCDEFGH")
    val_city, val_numbers, val_y = amounts(500, 2, "ABDEFGH")
    train_columns = np.unique(city)
    val_columns = np.unique(val_city) if per_split else train_columns
    x = torch.cat([one_hot(city, train_columns), numbers], 1)
    val_x = torch.cat([one_hot(val_city, val_columns), torch.zeros(len(val_city), len(train_columns) - len(val_columns)),
                       val_numbers], 1)  # the shorter table padded to the model's width
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Linear(16, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           val_loader=DataLoader(TensorDataset(val_x, val_y), batch_size=100),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), SplitScaleCheck()])
    return report.check("data.split_scale")


def test_one_hot_columns_built_per_split_fire_for_a_regression_target_too():
    result = run_regression(per_split=True)
    issues = [i for i in result.issues if i.code == "VAL_COLUMNS_RECODED"]
    assert len(issues) == 1, result.data
    assert "relate to the regression target" in issues[0].message and "reindex(columns=train_columns" in issues[0].fix


def test_one_encoding_for_both_splits_of_a_regression_target_stays_quiet():
    assert_quiet(run_regression(per_split=False))


def _imbalanced_classes(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes at 70/20/7/3 percent, each shifting its own feature columns."""
    g = torch.Generator().manual_seed(seed)
    y = torch.multinomial(torch.tensor([0.70, 0.20, 0.07, 0.03]), rows, replacement=True, generator=g)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))  # one relation for both splits
    return centres[y] + torch.randn(rows, 8, generator=g), y


def test_a_sampler_that_rebalances_the_classes_stays_quiet():
    """A WeightedRandomSampler given one weight per row (1 / its class count) trains on balanced
    batches while validation keeps the natural mix: class-vs-rest statistics weighted by rows
    would differ between the splits though no column was recoded."""
    x, y = _imbalanced_classes(3000, 6)
    val_x, val_y = _imbalanced_classes(600, 7)
    weights = (1.0 / torch.bincount(y).double())[y]
    sampler = torch.utils.data.WeightedRandomSampler(weights, num_samples=len(y), replacement=True,
                                                     generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=64, sampler=sampler),
                           val_loader=DataLoader(TensorDataset(val_x, val_y), batch_size=100),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    assert "VAL_COLUMNS_RECODED" not in [i.code for i in report.check(NAME).issues]
    balanced = torch.cat([torch.nonzero(y == c).flatten()[:90] for c in range(4)])  # drawn evenly, as the sampler does
    assert relation_change(x[balanced], y[balanced], val_x, val_y) is None
    # The same balanced rows against validation columns listed in another order still fire.
    assert relation_change(x[balanced], y[balanced], val_x[:, [1, 0, 3, 2, 5, 4, 7, 6]], val_y) is not None
