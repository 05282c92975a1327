"""Section results, ``gpu_validation.json`` and the Markdown table (standard library only).

A section is one GPU claim. Its ``status`` is ``passed`` (it ran and the claim held),
``failed`` (it ran and the claim did not hold), ``error`` (the check itself broke or ran
past its time budget), ``skipped`` (nothing of it could run here; ``reason`` says why)
or ``partial`` (its CPU part ran, its GPU part was skipped). Each row carries its own
``status`` (the same words, plus ``info`` for a measurement that makes no claim) and a
``reason`` when skipped.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
JSON_NAME = "gpu_validation.json"
MARKDOWN_NAME = "gpu_validation.md"
STATUSES = ("passed", "failed", "error", "skipped", "partial")
NO_CUDA = "no CUDA"
# The sections, in the order they run (the ddp section forks its CPU ranks before CUDA starts).
SECTION_TITLES = {
    "ddp": "DDP gradient accumulation with no_sync through StepRunner (gloo 2 ranks on CPU, NCCL 1 rank)",
    "memory": 'estimate_step_memory(device="cuda") vs torch.cuda.max_memory_allocated / max_memory_reserved',
    "check_model_gpu_memory": "check_model_gpu_memory's synthetic step on the GPU vs max_memory_allocated",
    "oom_observer": "OOMObserver on a real CUDA out-of-memory error",
    "fp16_grad_scaler": "fp16 with a real GradScaler: skipped steps, falling scale, scheduler held, warnings",
    "vram_headroom": "the memory.vram_headroom verdict vs a real run on a card of the target size",
    "throughput": "the default recipe's throughput on the GPU, eager and compiled",
    "fsdp": "trainer.strategy=fsdp under torchrun: train, checkpoint, resume",
}


@dataclass
class Section:
    name: str
    title: str
    status: str = "pending"
    reason: str | None = None
    headline: str = ""
    elapsed_s: float = 0.0
    budget_s: float = 0.0
    # The row keys the Markdown detail table shows, in order.
    columns: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # What this section leaves unchecked (e.g. what needs two GPUs).
    left: list[str] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        self.status, self.reason = "skipped", reason

    def add(self, status: str, reason: str | None = None, **values: Any) -> dict[str, Any]:
        row = {"status": status, **({"reason": reason} if reason else {}), **values}
        self.rows.append(row)
        return row

    def finish(self) -> None:
        """Derive the status from the rows unless the section set one itself."""
        if self.status in STATUSES:
            return
        states = [row.get("status") for row in self.rows]
        ran = [s for s in states if s != "skipped"]
        if not states:
            self.status, self.reason = "error", self.reason or "the section recorded nothing"
        elif "error" in ran:
            self.status = "error"
        elif "failed" in ran:
            self.status = "failed"
        elif not ran:
            self.status = "skipped"
            self.reason = self.reason or next((r.get("reason") for r in self.rows if r.get("reason")), "skipped")
        elif len(ran) < len(states):
            self.status = "partial"
            self.reason = self.reason or next((r.get("reason") for r in self.rows if r.get("status") == "skipped"), None)
        else:
            self.status = "passed"

    def to_dict(self) -> dict[str, Any]:
        payload = asdict(self)
        payload["elapsed_s"] = round(self.elapsed_s, 2)
        payload["budget_s"] = round(self.budget_s, 1)
        return _jsonable(payload)


def _jsonable(value: Any) -> Any:
    """NaN/inf as strings (JSON has none), tuples as lists, unknown objects as text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def fmt_bytes(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "" if value is None else str(value)
    if abs(value) >= 1 << 30:
        return f"{value / (1 << 30):.2f} GiB"
    return f"{value / (1 << 20):.1f} MiB"


def fmt_cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key.endswith("_bytes"):
        return fmt_bytes(value)
    if key.endswith("_pct") and isinstance(value, (int, float)):
        return f"{value:+.1f}%"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."


def markdown(report: dict[str, Any]) -> str:
    env = report.get("environment", {})
    lines = [
        "# GPU validation",
        "",
        f"torch {env.get('torch')} (CUDA {env.get('torch_cuda') or 'none'}), device: {env.get('device') or 'none'}, "
        f"mode {report.get('mode')}, {report.get('elapsed_s', 0):.0f} s of a {report.get('budget_s', 0):.0f} s budget. "
        f"Written {report.get('finished_at') or report.get('started_at')}.",
    ]
    setup = env.get("setup")
    if isinstance(setup, dict):
        lines.append(f"Set-up: torch from {setup.get('torch_python')}, checks run by {setup.get('python')} "
                     f"({setup.get('seconds')} s; {len(setup.get('steps') or [])} steps, see environment.setup).")
    lines += [
        "",
        "| section | status | result | time |",
        "| --- | --- | --- | --- |",
    ]
    sections = report.get("sections", [])
    for section in sections:
        result = section.get("headline") or section.get("reason") or ""
        if section.get("status") in ("skipped", "partial", "error") and section.get("reason") and section.get("headline"):
            result = f"{section['headline']} ({section['reason']})"
        lines.append(
            f"| {section['name']} | {section['status']} | {fmt_cell('result', result)} | {section.get('elapsed_s', 0):.1f} s |"
        )
    for section in sections:
        lines += ["", f"## {section['name']}: {section['title']}", ""]
        if section.get("reason"):
            lines += [f"Status: {section['status']} ({section['reason']}).", ""]
        columns = section.get("columns") or []
        if section.get("rows") and columns:
            lines.append("| " + " | ".join(columns) + " |")
            lines.append("| " + " | ".join("---" for _ in columns) + " |")
            for row in section["rows"]:
                lines.append("| " + " | ".join(fmt_cell(c, row.get(c)) for c in columns) + " |")
            lines.append("")
        for note in section.get("notes") or []:
            lines.append(f"- {note}")
        for item in section.get("left") or []:
            lines.append(f"- not covered: {item}")
    return "\n".join(lines).rstrip() + "\n"


@dataclass
class Report:
    out_dir: Path
    mode: str
    budget_s: float
    environment: dict[str, Any] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    started_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))
    finished: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "mode": self.mode,
            "started_at": self.started_at,
            "finished_at": time.strftime("%Y-%m-%d %H:%M:%S") if self.finished else None,
            "complete": self.finished,
            "elapsed_s": round(time.monotonic() - self.started, 2),
            "budget_s": self.budget_s,
            "environment": _jsonable(self.environment),
            "sections": [section.to_dict() for section in self.sections],
        }

    def write(self) -> tuple[Path, Path]:
        """Both files, atomically: a run killed mid-way still leaves the sections done so far."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        payload = self.to_dict()
        paths = self.out_dir / JSON_NAME, self.out_dir / MARKDOWN_NAME
        for path, text in zip(paths, (json.dumps(payload, indent=2) + "\n", markdown(payload))):
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text(text)
            os.replace(temporary, path)
        return paths
