"""Hugging Face models built from configs compute their loss inside ``forward``; the loss
spy sees the criterion call there. None of the loss-shape and label findings fire on
their healthy training batches: a causal LM (labels = inputs, shifted inside the model,
padding -100), masked LM labels (~85% ignored, every row with targets), a T5 seq2seq
with padded labels, and a sequence classifier."""

from __future__ import annotations

import pytest
import torch

from tests.test_preflight_loss_shapes import NEW_CODES, issues, preflight

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
VOCAB, LENGTH, SAMPLES = 97, 16, 32


def token_batches(make_batch, batch_size: int = 8) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    rows = [make_batch(generator, index) for index in range(SAMPLES)]
    return torch.utils.data.DataLoader(rows, batch_size=batch_size, shuffle=True)


def padded_ids(generator, index):
    length = 6 + index % (LENGTH - 6)
    ids = torch.randint(3, VOCAB, (LENGTH,), generator=generator)
    mask = (torch.arange(LENGTH) < length).long()
    return ids * mask, mask


def causal_lm(generator, index):
    ids, mask = padded_ids(generator, index)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def masked_lm(generator, index):
    ids, mask = padded_ids(generator, index)
    chosen = (torch.rand(LENGTH, generator=generator) < 0.15) & (mask == 1)
    chosen[0] = True  # the collator's guarantee of one target per row, kept simple
    return {"input_ids": ids.masked_fill(chosen, 2), "attention_mask": mask, "labels": ids.masked_fill(~chosen, -100)}


def seq2seq(generator, index):
    ids, mask = padded_ids(generator, index)
    labels, label_mask = padded_ids(generator, index + 3)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels.masked_fill(label_mask == 0, -100)}


def classification(generator, index):
    ids, mask = padded_ids(generator, index)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(index % 3)}


@pytest.mark.parametrize(("build", "make_batch"), [
    (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32,
                                                                  n_layer=1, n_head=2)), causal_lm),
    (lambda: transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                                  num_attention_heads=2, intermediate_size=64)), masked_lm),
    (lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64,
                                                                           num_layers=1, num_heads=2,
                                                                           decoder_start_token_id=0)), seq2seq),
    (lambda: transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        num_labels=3)), classification),
], ids=["gpt2", "bert-mlm", "t5", "bert-classifier"])
def test_hugging_face_losses_are_quiet(build, make_batch):
    torch.manual_seed(0)
    report = preflight(build(), token_batches(make_batch), None)
    assert report.check("step.targets").data["targets"], "the spy sees the criterion inside the model"
    assert not set(issues(report)) & NEW_CODES, issues(report)


def test_a_time_major_batch_into_a_hugging_face_model():
    def time_major(rows):
        ids = torch.nn.utils.rnn.pad_sequence([row["input_ids"][:8 + i % 5] for i, row in enumerate(rows)])
        return {"input_ids": ids, "labels": ids}  # (T, B): pad_sequence's default layout

    generator = torch.Generator().manual_seed(0)
    rows = [causal_lm(generator, index) for index in range(SAMPLES)]
    loader = torch.utils.data.DataLoader(rows, batch_size=8, collate_fn=time_major)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32,
                                                                 n_layer=1, n_head=2))
    issue = issues(preflight(model, loader, None))["BATCH_TIME_MAJOR"]
    assert "'input_ids' has shape (12, 8)" in issue.message and "batch_first=True" in issue.fix


def float_labels(make_batch, offset: float = 0.0, fraction: float = 0.0):
    def made(generator, index):
        row = make_batch(generator, index)
        return {**row, "labels": row["labels"].float() + offset + fraction * torch.rand((), generator=generator)}
    return made


@pytest.mark.parametrize("num_labels,labels,fires", [
    (1, "ids", True), (3, "ids", False), (1, "ids_cast_to_float", True), (1, "ratings_from_1", False),
    (1, "fractional_scores", False), (1, "binary_cast_to_float", True)])
def test_a_classifier_built_with_num_labels_1_regresses_the_class_ids(num_labels, labels, fires):
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        num_labels=num_labels))
    make = {"ids": classification, "ids_cast_to_float": float_labels(classification),
            "ratings_from_1": float_labels(classification, offset=1.0),
            "fractional_scores": float_labels(classification, fraction=0.9),
            "binary_cast_to_float": lambda g, i: {**classification(g, i), "labels": torch.tensor(float(i % 2))}}[labels]
    found = issues(preflight(model, token_batches(make), None))
    assert ("TARGET_CLASS_IDS_REGRESSED" in found) == fires
    if fires:
        issue = found["TARGET_CLASS_IDS_REGRESSED"]
        assert "num_labels=1" in issue.message
        assert ("num_labels=2" if labels == "binary_cast_to_float" else "num_labels=3") in issue.fix
        assert ("cast to float" in issue.message) == labels.endswith("cast_to_float")


def test_mlm_labels_cloned_after_masking_are_named_as_a_copy_of_the_inputs():
    def masked_then_cloned(generator, index):
        ids, mask = padded_ids(generator, index)
        chosen = (torch.rand(LENGTH, generator=generator) < 0.15) & (mask == 1)
        chosen[0] = True
        ids = ids.masked_fill(chosen, 2)  # masked in place first ...
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone().masked_fill(~chosen, -100)}  # ... cloned

    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                                 num_attention_heads=2, intermediate_size=64))
    issue = issues(preflight(model, token_batches(masked_then_cloned), None))["TARGET_ONE_CLASS"]
    assert "labels equal input_ids" in issue.message and "Clone the labels before masking" in issue.fix
