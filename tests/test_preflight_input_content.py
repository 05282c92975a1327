"""data.input_content: INPUT_MOSTLY_PADDING, waveforms read along the wrong axis (two values
then zeros); PAIR_SEGMENTS_IDENTICAL, sentence pairs encoded from one text twice. Quiet on
the same data read right."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.input_content import InputContentCheck

CLIP = 2000


class Clips(Dataset):
    """Stereo clips stored (frames, channels), as soundfile returns them."""

    def __init__(self, channel_first_habit: bool):
        g = torch.Generator().manual_seed(0)
        self.clips = [torch.randn(int(torch.randint(1500, CLIP, (1,), generator=g)), 2, generator=g) for _ in range(64)]
        self.labels = torch.randint(0, 3, (64,), generator=g)
        self.channel_first_habit = channel_first_habit

    def __len__(self):
        return len(self.clips)

    def __getitem__(self, i):
        wav = self.clips[i][0] if self.channel_first_habit else self.clips[i][:, 0]  # wav[0]: the first frame
        return F.pad(wav, (0, CLIP - wav.shape[0]))[None], self.labels[i]


@pytest.mark.parametrize("channel_first_habit", [True, False], ids=["wav_0", "wav_colon_0"])
def test_a_waveform_read_along_the_wrong_axis_is_mostly_padding(channel_first_habit):
    model = nn.Sequential(nn.Conv1d(1, 4, 16, stride=8), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(4, 3))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Clips(channel_first_habit), batch_size=16, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), InputContentCheck()])
    codes = [issue.code for issue in report.check("data.input_content").issues]
    assert codes == (["INPUT_MOSTLY_PADDING"] if channel_first_habit else [])


def pairs(same_text: bool) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(64):
        premise, hypothesis = torch.randint(5, 90, (7,), generator=g), torch.randint(5, 90, (5,), generator=g)
        second = premise if same_text else hypothesis
        ids = torch.cat([torch.tensor([1]), premise, torch.tensor([2]), second, torch.tensor([2])])
        types = torch.cat([torch.zeros(len(premise) + 2, dtype=torch.long), torch.ones(len(second) + 1, dtype=torch.long)])
        ids, types = F.pad(ids, (0, 20 - len(ids))), F.pad(types, (0, 20 - len(types)))
        mask = (ids != 0).long()
        rows.append({"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
                     "labels": torch.randint(0, 3, (), generator=g)})
    return rows


class PairClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(100, 16), nn.Linear(16, 3)

    def forward(self, input_ids, token_type_ids, attention_mask):
        return self.head(self.emb(input_ids + 50 * token_type_ids % 100).mean(1))


@pytest.mark.parametrize("same_text", [True, False], ids=["premise_twice", "premise_and_hypothesis"])
def test_sentence_pairs_encoded_from_one_text_twice(same_text):
    model = PairClassifier()

    def loss_fn(model, batch):
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        return F.cross_entropy(logits, batch["labels"])

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(pairs(same_text), batch_size=16, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), InputContentCheck()])
    codes = [issue.code for issue in report.check("data.input_content").issues]
    assert codes == (["PAIR_SEGMENTS_IDENTICAL"] if same_text else [])
