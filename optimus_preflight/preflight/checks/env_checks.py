"""Environment checks: devices, CPU cores, shared memory, host RAM, the run directory and its disk."""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import torch

from optimus_preflight.preflight.analyses.sizes import checkpoint_bytes_estimate
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

GIB = 1024**3
SHM_PATH = "/dev/shm"
# Docker's default /dev/shm is 64 MiB; a few workers moving ordinary batches overrun it.
SHM_MIN_BYTES = 512 * 1024**2
RAM_WARN_BYTES = 2 * GIB
RAM_ERROR_BYTES = GIB // 2
# The start of torch's own warning about the same worker count, printed by every DataLoader
# at construction and again at its first iteration.
TORCH_WORKERS_WARNING = r"This DataLoader will create \d+ worker processes in total"


def device_findings(
    requested: str,
    resolved: str,
    cuda_available: bool,
    device_count: int,
    world_size: int,
    local_world_size: int,
    local_rank: int,
) -> list[tuple[str, str, str, str]]:
    """(severity, code, message, fix) for a device request this machine cannot serve."""
    found = []
    if requested == "cuda" and not cuda_available:
        found.append(("error", "ENV_NO_CUDA", "trainer.device=cuda but torch sees no CUDA device",
                      "Set trainer.device=cpu, or run on a GPU machine with a CUDA build of torch."))
    if resolved == "cuda" and local_world_size > device_count:
        found.append(("error", "ENV_GPU_COUNT",
                      f"{local_world_size} processes on this node share {device_count} visible GPU(s): ranks "
                      "would collide on one device (NCCL errors or OOM)",
                      "Launch with torchrun --nproc_per_node equal to the GPU count, or fix CUDA_VISIBLE_DEVICES."))
    elif resolved == "cuda" and local_rank >= device_count:
        found.append(("error", "ENV_GPU_COUNT", f"LOCAL_RANK={local_rank} but only {device_count} GPU(s) are visible",
                      "Check CUDA_VISIBLE_DEVICES and torchrun's --nproc_per_node."))
    if resolved == "cpu" and requested == "auto":
        build = "a CPU-only torch build" if torch.version.cuda is None else "no visible CUDA device"
        found.append(("info", "ENV_CPU", f"training on the CPU ({build})", ""))
    if resolved == "cpu" and world_size > 1:
        found.append(("info", "ENV_CPU_DISTRIBUTED", f"{world_size} CPU processes (gloo backend)", ""))
    return found


class DeviceCheck(Check):
    name = "env.device"
    stage = Stage.ENVIRONMENT
    codes = ("ENV_CPU", "ENV_CPU_DISTRIBUTED", "ENV_GPU_COUNT", "ENV_NO_CUDA")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
        dist = ctx.training.dist
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size))
        for severity, code, message, fix in device_findings(
            ctx.cfg.trainer.device, ctx.device.type, available, count, dist.world_size, local_world, dist.local_rank
        ):
            findings.add(severity, code, message, fix, "trainer.device")
        findings.data.update(
            device=str(ctx.device),
            cuda_available=available,
            device_count=count,
            world_size=dist.world_size,
            torch=torch.__version__,
            cuda=torch.version.cuda,
        )
        if available:
            findings.data["gpus"] = [
                {"name": torch.cuda.get_device_name(i), "total_gib": round(torch.cuda.get_device_properties(i).total_memory / GIB, 2)}
                for i in range(count)
            ]
        findings.data["summary"] = f"{ctx.device}, {count} GPU(s) visible, world size {dist.world_size}"


def available_cores() -> int:
    """CPU cores this process may run on, counted as torch's DataLoader counts them: the
    affinity mask (taskset, a container's cpuset) where the OS has one."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def workers_finding(workers: int, cores: int) -> tuple[str, str, str] | None:
    """(message, fix, code_fix) when more loader workers than cores would share the CPU."""
    if workers <= cores:
        return None
    return (
        f"data.num_workers={workers} starts {workers} worker processes but this process may use {cores} CPU "
        "core(s): the workers crowd out each other and the training loop, so loading gets slower, not faster",
        f"Set data.num_workers={cores} (or fewer).",
        f"Pass num_workers={cores} (or fewer) to the DataLoader your build_dataloaders() returns.",
    )


class CpuCoresCheck(Check):
    """More DataLoader workers than usable cores: each is a process competing for them."""

    name = "env.cpu_cores"
    stage = Stage.ENVIRONMENT
    codes = ("ENV_WORKERS",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        cores = available_cores()
        # The loader's own count: a recipe's build_dataloaders() may not read data.num_workers.
        workers = int(getattr(ctx.train_loader, "num_workers", 0) or 0)
        findings.data.update(cores=cores, num_workers=workers)
        findings.data["summary"] = f"{cores} CPU core(s) available, {workers} loader worker(s)"
        found = workers_finding(workers, cores)
        if found is None:
            return
        message, fix, code_fix = found
        findings.warning("ENV_WORKERS", message, fix, "data.num_workers", code_fix)
        # This issue names the key and the fix; torch would repeat it at the first batch.
        warnings.filterwarnings("ignore", message=TORCH_WORKERS_WARNING, category=UserWarning)


class SharedMemoryCheck(Check):
    """DP15: DataLoader workers pass batches through /dev/shm; containers often cap it at 64 MiB."""

    name = "env.shared_memory"
    stage = Stage.ENVIRONMENT
    codes = ("DP15",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if not os.path.isdir(SHM_PATH):
            findings.data["summary"] = "no /dev/shm on this system"
            return
        usage = shutil.disk_usage(SHM_PATH)
        findings.data.update(total_bytes=usage.total, free_bytes=usage.free)
        findings.data["summary"] = f"/dev/shm {usage.free / GIB:.1f} GiB free of {usage.total / GIB:.1f} GiB"
        # The loader's own count: a recipe's data config may have no num_workers at all.
        workers = getattr(ctx.train_loader, "num_workers", 0) or 0
        if workers > 0 and usage.total < SHM_MIN_BYTES:
            findings.warning(
                "DP15",
                f"/dev/shm holds only {usage.total / 1024**2:.0f} MiB and data.num_workers={workers}: workers "
                "pass batches through shared memory and die with 'Bus error' when it fills",
                "Start the container with --shm-size=8g (or --ipc=host); otherwise call "
                "torch.multiprocessing.set_sharing_strategy('file_system') or lower data.num_workers.",
                "data.num_workers",
            )


class HostRamCheck(Check):
    name = "env.host_ram"
    stage = Stage.ENVIRONMENT
    codes = ("ENV_LOW_RAM",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        memory = psutil.virtual_memory()
        findings.data.update(total_bytes=memory.total, available_bytes=memory.available)
        findings.data["summary"] = f"{memory.available / GIB:.1f} GiB available of {memory.total / GIB:.1f} GiB"
        fix = "Stop other jobs on this machine, or lower data.num_workers / data.batch_size."
        if memory.available < RAM_ERROR_BYTES:
            findings.error("ENV_LOW_RAM", f"only {memory.available / GIB:.2f} GiB of host RAM is available", fix)
        elif memory.available < RAM_WARN_BYTES:
            findings.warning("ENV_LOW_RAM", f"only {memory.available / GIB:.2f} GiB of host RAM is available", fix)


def probe_writable(directory: Path) -> str | None:
    """None if a file can be created, written, synced and removed in ``directory``."""
    probe = directory / f".preflight-write-{uuid.uuid4().hex}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"preflight")
            handle.flush()
            os.fsync(handle.fileno())
        probe.unlink()
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


class RunDirCheck(Check):
    name = "env.run_dir"
    stage = Stage.ENVIRONMENT
    codes = ("ENV_RUN_DIR",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["run_dir"] = str(ctx.run_dir)
        # checkpoints/ too: it may be another mount, a leftover of another user, or a file.
        for directory in (Path(ctx.run_dir), Path(ctx.run_dir) / "checkpoints"):
            problem = probe_writable(directory)
            if problem:
                findings.data["summary"] = f"{directory} is not writable"
                findings.error(
                    "ENV_RUN_DIR",
                    f"cannot write in {directory} ({problem}): metrics and checkpoints would be lost",
                    "Point hydra.run.dir at a writable directory with free space.",
                    "hydra.run.dir",
                )
                return
        findings.data["summary"] = f"{ctx.run_dir} and its checkpoints/ are writable"


class DiskSpaceCheck(Check):
    """Free disk in the run dir vs the checkpoints the run will keep."""

    name = "env.disk_space"
    stage = Stage.ENVIRONMENT
    codes = ("ENV_DISK",)
    # A model kept on the meta device does not fit this machine: it will train elsewhere.
    needs_weights = True

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        directory = Path(ctx.run_dir)
        while not directory.exists() and directory != directory.parent:
            directory = directory.parent
        free = shutil.disk_usage(directory).free
        one = checkpoint_bytes_estimate(ctx.model, ctx.optimizer)
        keep = ctx.cfg.checkpoint.keep_last
        # One more than kept: the newest is written in full before the oldest is deleted.
        needed = one * (keep + 1)
        findings.data.update(checkpoint_bytes=one, keep_last=keep, needed_bytes=needed, free_bytes=free)
        findings.data["summary"] = f"~{one / 1024**2:.1f} MiB per checkpoint x {keep + 1}, {free / GIB:.1f} GiB free"
        message = (
            f"checkpoints need ~{needed / GIB:.2f} GiB ({keep} kept + 1 being written, ~{one / GIB:.2f} GiB each) "
            f"but {directory} has {free / GIB:.2f} GiB free"
        )
        fix = "Free disk space, point hydra.run.dir at a larger disk, or lower checkpoint.keep_last."
        if needed > free:
            findings.error("ENV_DISK", message + ": the run will fail at a checkpoint", fix, "checkpoint.keep_last")
        elif needed > 0.8 * free:
            findings.warning("ENV_DISK", message + ": less than 20% margin", fix, "checkpoint.keep_last")
