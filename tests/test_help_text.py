"""help_text: field docs read from the schemas' comments, and the --help / --version text."""

from __future__ import annotations

import dataclasses
import platform
import re
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import OmegaConf

from optimus_preflight import compose
from optimus_preflight.config import schema
from optimus_preflight.config.help_text import TARGET_DOC, config_help, field_docs, version_text


@dataclass
class Inner:
    # Steps to wait.
    patience: int = 3
    floor: float = 0.0  # Smallest change that counts.


@dataclass
class Documented:
    # First line of a doc
    # that goes on here.
    multi: int = 1
    trailing: str = "x"  # said after the field
    # Above and
    both: int = 2  # after.
    # A comment followed by a blank line documents nothing.

    detached: int = 0
    plain: bool = False
    # Metadata wins over this comment.
    helped: int = field(default=5, metadata={"help": "From metadata."})
    spread: list[int] = field(
        default_factory=list,  # inside the call
    )
    pragma: int = 0  # type: ignore
    inner: Inner = field(default_factory=Inner)
    maybe: Optional[Inner] = None


@dataclass
class Child(Documented):
    # The child's own field.
    extra: int = 7
    multi: int = 10  # Redeclared with a doc of its own: this one wins.


@dataclass
class SilentChild(Documented):
    plain: bool = True
    multi: int = 11


def test_docs_from_comments() -> None:
    docs = field_docs(Documented)
    assert docs["multi"] == "First line of a doc that goes on here."
    assert docs["trailing"] == "said after the field"
    assert docs["both"] == "Above and after."
    assert docs["detached"] == ""
    assert docs["plain"] == ""
    assert docs["helped"] == "From metadata."
    assert docs["spread"] == "inside the call"
    assert docs["pragma"] == ""
    assert docs["inner"] == ""
    assert list(docs) == [f.name for f in dataclasses.fields(Documented)]


def test_docs_inherited_through_the_mro() -> None:
    silent = field_docs(SilentChild)
    # Redeclared (a new default) without a comment: the base class's doc still applies.
    assert silent["multi"] == "First line of a doc that goes on here."
    assert silent["trailing"] == "said after the field"
    child = field_docs(Child)
    assert child["extra"] == "The child's own field."
    assert child["multi"] == "Redeclared with a doc of its own: this one wins."


def test_docs_of_a_nested_dataclass_and_of_a_local_one() -> None:
    assert field_docs(Inner) == {"patience": "Steps to wait.", "floor": "Smallest change that counts."}

    @dataclass
    class Local:
        # Defined inside a function: the source is still found.
        size: int = 4

    assert field_docs(Local) == {"size": "Defined inside a function: the source is still found."}


def test_no_source_and_not_a_dataclass() -> None:
    made = dataclasses.make_dataclass("Made", [("a", int, dataclasses.field(default=1))])
    assert field_docs(made) == {"a": ""}
    assert field_docs(int) == {}
    # An instance is documented by its class; the cache hands out copies.
    docs = field_docs(Inner())
    docs["patience"] = "changed"
    assert field_docs(Inner)["patience"] == "Steps to wait."


def test_schema_docs() -> None:
    docs = field_docs(schema.TrainerConfig)
    assert docs["max_steps"].startswith("Optimizer steps to run;")
    assert "\n" not in docs["dist_timeout_s"] and "  " not in docs["dist_timeout_s"]
    assert field_docs(schema.EarlyStoppingConfig)["patience"].startswith("Evaluations in a row")


def _lines(text: str) -> dict[str, str]:
    """Dotted key -> 'value<sep>doc' rest of its line."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"  (\S+) = (.*)$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def test_config_help_on_a_structured_config() -> None:
    cfg = OmegaConf.create({"trainer": OmegaConf.structured(schema.TrainerConfig), "extra": {"a": "${trainer.seed}"}})
    cfg.trainer.max_steps = 400
    text = config_help(cfg, {})
    lines = _lines(text)
    assert text.splitlines()[0] == "trainer (TrainerConfig):"
    assert re.fullmatch(r"400 +Optimizer steps to run;.*", lines["trainer.max_steps"])
    assert lines["trainer.early_stopping.patience"].split(None, 1) == ["3", field_docs(schema.EarlyStoppingConfig)["patience"]]
    assert lines["trainer.grad_scaler.init_scale"].startswith("65536.0 ")
    assert lines["trainer.fsdp.block_classes"].startswith("[] ")
    assert lines["trainer.seed"] == "0"  # no doc: the value only, no trailing spaces
    assert lines["extra.a"] == "${trainer.seed}"  # interpolations stay unresolved
    assert "extra:" in text.splitlines()
    # The docs start in one column.
    rows = text.splitlines()
    max_steps = next(row for row in rows if "trainer.max_steps =" in row)
    patience = next(row for row in rows if "trainer.early_stopping.patience =" in row)
    assert max_steps.index("Optimizer") == patience.index("Evaluations")


def test_config_help_values_and_schemas_fallback() -> None:
    cfg = OmegaConf.create(
        {
            "opt": {"_target_": "torch.optim.SGD", "lr": 0.1, "betas": [0.9, 0.99], "name": "true", "empty": ""},
            "data": {"path": "a" * 30 + "b" * 30, "train": None, "missing": "???"},
            "inner": {"patience": 5, "unknown": 1},
            "scheduler": None,
            # Plain dicts: the dataclass comes from `schemas`, nested ones from its type hints.
            "tr": {"early_stopping": {"patience": 2}},
            "doc": {"maybe": {"floor": 0.5}},
        }
    )
    text = config_help(cfg, {"inner": Inner, "tr": schema.TrainerConfig, "doc": Documented})
    lines = _lines(text)
    assert lines["opt._target_"].split(None, 1) == ["torch.optim.SGD", TARGET_DOC]
    assert lines["opt.betas"] == "[0.9, 0.99]"
    assert lines["opt.name"] == "'true'"  # a string that would read back as a bool is quoted
    assert lines["opt.empty"] == "''"
    assert lines["data.path"] == "a" * 18 + "..." + "b" * 19  # 40 characters, both ends kept
    assert lines["data.train"] == "null"
    assert lines["data.missing"] == "???"
    assert lines["inner.patience"].split(None, 1) == ["5", "Steps to wait."]
    assert lines["inner.unknown"] == "1"
    assert lines["scheduler"] == "null"
    assert "inner (Inner):" in text.splitlines()
    assert lines["tr.early_stopping.patience"].split(None, 1) == ["2", field_docs(schema.EarlyStoppingConfig)["patience"]]
    assert lines["doc.maybe.floor"].split(None, 1) == ["0.5", "Smallest change that counts."]


def test_config_help_on_the_composed_config() -> None:
    cfg = compose([])
    text = config_help(cfg, {})
    lines = _lines(text)
    headings = [line for line in text.splitlines() if line and not line.startswith(" ")]
    assert [heading.split()[0].rstrip(":") for heading in headings] == list(cfg.keys())

    def documented(cls: type, prefix: str) -> dict[str, str]:
        out = {}
        for item in dataclasses.fields(cls):
            default = getattr(cls(), item.name)
            if dataclasses.is_dataclass(default):
                out.update(documented(type(default), f"{prefix}.{item.name}"))
            elif field_docs(cls)[item.name]:
                out[f"{prefix}.{item.name}"] = field_docs(cls)[item.name]
        return out

    expected = documented(schema.TrainerConfig, "trainer")
    assert "trainer.max_steps" in expected and "trainer.early_stopping.patience" in expected
    for key, doc in expected.items():
        assert key in lines, key
        assert lines[key].endswith("   " + doc), (key, lines[key])
    for key in (OmegaConf.to_container(cfg.trainer) or {}):
        assert any(line == f"trainer.{key}" or line.startswith(f"trainer.{key}.") for line in lines), key


def test_version_text() -> None:
    text = version_text()
    assert re.fullmatch(r"optimus-train \S+ \(torch \S+, hydra-core \S+, python \S+\)", text), text
    assert text.endswith(f"python {platform.python_version()})")
