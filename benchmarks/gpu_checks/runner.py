"""Runs the sections in order, each within its share of the time budget, and rewrites
``gpu_validation.json`` and the Markdown table after every section."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_checks.context import Context, SectionTimeout, error_text, hard_limit
from benchmarks.gpu_checks.ddp import ddp_section
from benchmarks.gpu_checks.memory import check_model_section, memory_section, oom_section
from benchmarks.gpu_checks.report import NO_CUDA, SECTION_TITLES, Report, Section
from benchmarks.gpu_checks.runs import fp16_section, fsdp_section, throughput_section, vram_section

SETUP_ENV = "OPTIMUS_GPU_VALIDATION_SETUP"
GRACE_S = 30.0  # past its soft budget, a section is stopped by SIGALRM after this long


@dataclass(frozen=True)
class SectionSpec:
    name: str
    title: str
    run: Callable[[Context, Section], None]
    budget_s: float  # on an H100, full mode


# Budgets in seconds on an H100 in full mode; scaled down together when the total is short.
BUDGETS = {"ddp": 25, "memory": 95, "check_model_gpu_memory": 15, "oom_observer": 20, "fp16_grad_scaler": 30,
           "vram_headroom": 85, "throughput": 60, "fsdp": 30}
RUNS = {"ddp": ddp_section, "memory": memory_section, "check_model_gpu_memory": check_model_section,
        "oom_observer": oom_section, "fp16_grad_scaler": fp16_section, "vram_headroom": vram_section,
        "throughput": throughput_section, "fsdp": fsdp_section}
SECTIONS = tuple(SectionSpec(name, title, RUNS[name], BUDGETS[name]) for name, title in SECTION_TITLES.items())
NAMES = tuple(spec.name for spec in SECTIONS)


def environment() -> dict[str, Any]:
    """Versions and the device; the device's properties only once CUDA is initialised
    (querying them initialises it, and the ddp section must fork before that)."""
    info: dict[str, Any] = {
        "python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            props = torch.cuda.get_device_properties(0)
            info.update(device=props.name, total_memory_bytes=props.total_memory,
                        capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                        cudnn=torch.backends.cudnn.version())
            info["nccl"] = str(torch.cuda.nccl.version())
        except Exception as error:  # descriptive only
            info["device_error"] = error_text(error)
    if shutil.which("nvidia-smi"):
        try:
            query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=30)
            info["nvidia_smi"] = query.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    setup = os.environ.get(SETUP_ENV)
    info["setup"] = json.loads(setup) if setup else "none: ran in this interpreter (--no-setup)"
    return info


def no_cuda_reason() -> str:
    if torch.version.cuda is None:
        return f"{NO_CUDA}: torch {torch.__version__} is not a CUDA build"
    return f"{NO_CUDA}: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no device"


def run(out_dir: Path, work_dir: Path, *, tiny: bool, budget_s: float, only: list[str] | None = None,
        force_cpu: bool = False, rehearse: bool = False) -> int:
    started = time.monotonic()
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    cuda = torch.cuda.is_available() and not force_cpu
    reason = no_cuda_reason() if not cuda else ""
    if force_cpu and torch.cuda.is_available():
        reason = f"{NO_CUDA}: --cpu given"
    ctx = Context(out_dir=out_dir, work_dir=work_dir, tiny=tiny, cuda=cuda, no_cuda_reason=reason,
                  rehearse=rehearse and not cuda)
    report = Report(out_dir, "tiny" if tiny else "full", budget_s, environment())
    ctx.say(f"gpu_validation: torch {torch.__version__}, CUDA {'yes' if cuda else reason}, mode {report.mode}, "
            f"budget {budget_s:.0f} s, output {out_dir}")
    specs = [s for s in SECTIONS if not only or s.name in only]
    for index, spec in enumerate(specs):
        remaining = budget_s - (time.monotonic() - started)
        planned = sum(s.budget_s for s in specs[index:])
        # Sections share what is left in proportion to their planned times: a larger
        # --budget-s (a slow or busy machine, the CPU test) gives each one more.
        share = spec.budget_s * remaining / planned if planned else 0.0
        section = Section(spec.name, spec.title, budget_s=share)
        report.sections.append(section)
        if share < 5:
            section.skip("the run's time budget was spent before this section")
        else:
            ctx.say(f"== {spec.name} (budget {share:.0f} s)")
            ctx.deadline = time.monotonic() + share
            begun = time.monotonic()
            try:
                with hard_limit(share + GRACE_S):
                    spec.run(ctx, section)
            except SectionTimeout as error:
                section.status, section.reason = "error", f"stopped: {error}"
            except Exception as error:
                section.status, section.reason = "error", error_text(error)
                section.data["traceback"] = traceback.format_exc()[-3000:]
            finally:
                section.elapsed_s = time.monotonic() - begun
        section.finish()
        if ctx.rehearse and section.status not in ("skipped",) and any("REHEARSAL" in n for n in section.notes):
            # A CPU rehearsal proves the plumbing, not the GPU claim.
            section.status, section.reason = "skipped", f"{NO_CUDA}; the CPU rehearsal {section.status}"
        if section.reason and section.reason.startswith(NO_CUDA) and reason and not section.reason.startswith(reason):
            section.reason = reason + section.reason[len(NO_CUDA):]  # say why there is no CUDA
        ctx.say(f"   {spec.name}: {section.status}{f' ({section.reason})' if section.reason else ''}"
                f"{f' - {section.headline}' if section.headline else ''} [{section.elapsed_s:.1f} s]")
        report.environment = {**environment(), **{k: v for k, v in report.environment.items() if k == "setup"}}
        report.write()
    report.finished = True
    paths = report.write()
    (out_dir / "gpu_validation.log").write_text("\n".join(ctx.log_lines) + "\n")
    ctx.say(f"wrote {paths[0]} and {paths[1]} in {time.monotonic() - started:.0f} s")
    print(paths[1].read_text(), flush=True)
    bad = [s.name for s in report.sections if s.status in ("failed", "error")]
    return 1 if bad else 0
