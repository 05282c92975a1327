"""Sections that run the recipe CLI (``python -m optimus_preflight.cli``) on the GPU: fp16 with a
real GradScaler, the ``memory.vram_headroom`` verdict against a real run, throughput eager and
compiled, FSDP. The analysis of each run's files is in pure functions (tested on the CPU)."""

from __future__ import annotations

import functools
import math
import statistics
from typing import Any

import torch

from benchmarks.gpu_checks.context import GIB, Completed, Context, error_text, free_cuda, run_cli
from benchmarks.gpu_checks.report import NO_CUDA, Section

RECIPES = "benchmarks.gpu_checks.recipes"
QUIET = ["trainer.eval_every_n_steps=0", "trainer.eval_max_batches=1", "checkpoint.every_n_steps=0"]


# ------------------------------------------------------------------ config support
@functools.lru_cache(maxsize=1)
def _tiny_config() -> Any:
    from optimus_preflight import compose

    return compose(["recipe=char_lm_tiny"])


def config_supports(key: str, value: str) -> tuple[bool, str]:
    """Whether this checkout's config has ``key`` and accepts ``value`` (composed, validated)."""
    from omegaconf import OmegaConf

    from optimus_preflight import compose

    group, _, leaf = key.rpartition(".")
    try:
        node = OmegaConf.select(_tiny_config(), group)
        if node is None or leaf not in node:
            return False, f"{key} does not exist in this checkout's config"
        compose(["recipe=char_lm_tiny", f"{key}={value}"])
        return True, f"{key}={value} is accepted"
    except Exception as error:
        return False, f"{key}={value} is rejected: {error_text(error)}"


# --------------------------------------------------------------- fp16 GradScaler
def analyze_scaler(records: list[dict[str, Any]], overflowing: bool) -> list[dict[str, Any]]:
    """Claims about an fp16 run's metrics.jsonl records (logged every step). For an
    overflowing run: every step skipped and counted, the scale halving each step, the LR held
    (the scheduler does not step on a skipped step), O24_SKIPS and O24 warnings fired. For a
    healthy run: no skip, the scale never falls, no scaler warning."""
    steps = [r for r in records if "loss" in r]
    skipped = [r.get("skipped_steps") for r in steps]
    scales = [r.get("grad_scale") for r in steps]
    lrs = [r.get("lr") for r in steps]
    codes = sorted({w.get("code") for r in steps for w in r.get("warnings", [])})
    claims = []

    def claim(name: str, ok: bool, observed: Any, expected: str) -> None:
        claims.append({"claim": name, "status": "passed" if ok else "failed", "observed": observed, "expected": expected})

    if not steps:
        return [{"claim": "metrics logged", "status": "failed", "observed": "no step records", "expected": "one per step"}]
    if overflowing:
        claim("every step skipped and counted", skipped == list(range(1, len(steps) + 1)), skipped[-1],
              f"skipped_steps 1..{len(steps)}")
        halving = all(b is not None and a is not None and math.isclose(b, a / 2) for a, b in zip(scales, scales[1:]))
        claim("grad_scale halves on each overflow", halving and len(scales) > 1, scales[:3] + ["..."] + scales[-2:],
              "each value half the previous")
        claim("scheduler held (LR unchanged while skipping)", len(set(lrs)) == 1, sorted(set(lrs)), "one LR")
        claim("skip-rate warning (O24_SKIPS)", "O24_SKIPS" in codes, codes, "O24_SKIPS among the warnings")
        claim("collapsed-scale warning (O24)", "O24" in codes, codes, "O24 among the warnings")
    else:
        claim("no step skipped", not any(skipped), skipped[-1], "skipped_steps 0")
        claim("grad_scale never falls", all(b >= a for a, b in zip(scales, scales[1:])), scales[-1], "non-decreasing")
        claim("no scaler warning", not {"O24", "O24_SKIPS"} & set(codes), codes, "neither O24 nor O24_SKIPS")
    return claims


def fp16_section(ctx: Context, section: Section) -> None:
    section.columns = ["run", "claim", "observed", "expected", "status"]
    if not ctx.runs_cli(section):
        return
    steps = 12  # the scale falls below O24's floor of 16 at step 7 and must stay there 3 observations
    common = ["recipe=char_lm_tiny", f"trainer.device={ctx.cli_device}", "trainer.precision=fp16", f"trainer.max_steps={steps}",
              "trainer.max_consecutive_skips=100", "trainer.grad_scaler.init_scale=1024", "logging.every_n_steps=1",
              "logging.dynamics_every_n_steps=1", "preflight.fail_on=never", *QUIET]
    runs = [("overflowing", True, [f"recipe._target_={RECIPES}.OverflowCharLM"])]
    if not ctx.tiny:
        runs.append(("healthy", False, []))
    for name, overflowing, extra in runs:
        if not ctx.has_time(15):
            section.add("skipped", "the section's time budget ran out", run=name)
            continue
        done = run_cli(ctx, f"fp16_{name}", [*common, *extra], timeout_s=ctx.left() - 3)
        if done.returncode != 0:
            section.add("error", None, run=name, claim="the run completes", observed=f"exit {done.returncode}",
                        expected="exit 0", error=done.tail(600))
            continue
        for claim in analyze_scaler(done.metrics(), overflowing):
            section.add(claim.pop("status"), None, run=name, **claim)
        preflight = done.json_file("preflight.json") or {}
        section.data[f"{name}_preflight"] = {
            "status": preflight.get("status"),
            "issues": sorted({i.get("code") for c in preflight.get("checks", []) for i in c.get("issues", [])}),
        }
    held = [r for r in section.rows if r.get("status") in ("passed", "failed")]
    section.headline = f"{sum(r['status'] == 'passed' for r in held)}/{len(held)} GradScaler claims held"
    section.notes.append("The overflowing run is the tiny char-LM with its loss times 1e8 (recipes.OverflowCharLM): "
                         "fp16's backward overflows at every scale the run reaches, the fp32 loss stays finite.")
    section.left.append("bf16 runs use no scaler: see the memory section's bf16 rows and the throughput section")


# ------------------------------------------------------------ vram_headroom verdict
def vram_verdict(preflight: dict[str, Any] | None) -> dict[str, Any]:
    """The memory.vram_headroom check's verdict and figures from a preflight.json."""
    if not preflight:
        return {"verdict": "missing", "codes": []}
    check = next((c for c in preflight.get("checks", []) if c.get("name") == "memory.vram_headroom"), None)
    if check is None:
        return {"verdict": "missing", "codes": []}
    codes = sorted({i.get("code") for i in check.get("issues", [])})
    data = check.get("data", {})
    verdict = "will not fit" if "MEM1" in codes else "fits" if check.get("status") in ("passed", "warning") else check.get("status")
    return {"verdict": verdict, "check_status": check.get("status"), "codes": codes, "need_bytes": data.get("need_bytes"),
            "limit_bytes": data.get("limit_bytes"), "largest_micro_batch": data.get("largest_micro_batch")}


def real_outcome(done: Completed) -> str:
    """``ran`` (completed), ``oom`` (a CUDA out-of-memory error), ``timeout`` or ``failed``."""
    if done.timed_out:
        return "timeout"
    text = done.output
    if "OutOfMemoryError" in text or "CUDA out of memory" in text or "out of memory" in text.lower():
        return "oom"
    summary = done.json_file("summary.json") or {}
    return "ran" if done.returncode == 0 and summary.get("status") == "completed" else "failed"


def only_check(name: str) -> str:
    """A ``preflight.disable=[...]`` override that leaves ``name`` and the checks it requires."""
    from optimus_preflight.preflight.defaults import DEFAULT_CHECKS

    by_name = {check.name: check for check in DEFAULT_CHECKS}
    keep, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in keep:
            keep.add(current)
            todo += list(getattr(by_name.get(current), "requires", ()))
    disabled = [n for n in by_name if n not in keep]
    return "preflight.disable=[" + ",".join(f"'{n}'" for n in disabled) + "]"


def target_limit(cfg: Any, target_gib: float) -> int:
    """The bytes the vram check allows on a target of ``target_gib`` (its own function when it
    has the signature this was written against, else the same formula)."""
    try:
        from optimus_preflight.preflight.analyses.memory_limit import gpu_memory_limit

        return int(gpu_memory_limit(cfg, torch.device("cpu")).bytes)
    except Exception:
        from optimus_preflight.memory import cuda_rules

        memory = cfg.preflight.memory
        total = target_gib * GIB
        usable = min(float(memory.usable_fraction) * total, total - float(memory.reserve_gib) * GIB)
        return int(usable - cuda_rules.CUDA_CONTEXT_BYTES)


def pick_batches(need_a: int, batch_a: int, need_b: int, batch_b: int, limit: int, capacity: int) -> tuple[int, int]:
    """From two estimates (a linear need(n) = fixed + per_sample * n): the batch whose need is
    ~95% of the check's limit (just fits, a MEM2 warning), and the one whose need is ~108% of
    what the emulated card really offers (just does not fit, whatever the check's margins)."""
    per_sample = (need_b - need_a) / (batch_b - batch_a)
    fixed = need_a - per_sample * batch_a
    if per_sample <= 0:
        raise ValueError(f"the estimate does not grow with the batch ({need_a} at {batch_a}, {need_b} at {batch_b})")
    fit = max(int((0.95 * limit - fixed) // per_sample), 1)
    over = max(int(math.ceil((1.08 * capacity - fixed) / per_sample)), fit + 1)
    return fit, over


def vram_section(ctx: Context, section: Section) -> None:
    from omegaconf import OmegaConf

    from optimus_preflight import compose
    from optimus_preflight.config.instantiate import instantiate_node
    from optimus_preflight.memory import cuda_rules, estimate_training_step
    from optimus_preflight.recipes.char_lm import CharLMRecipe
    from optimus_preflight.training.optim import build_optimizer

    section.columns = ["case", "batch_size", "need_bytes", "limit_bytes", "verdict", "codes", "real", "real_peak_bytes",
                       "match", "status"]
    if not ctx.runs_cli(section):
        return
    target = 4.0 if ctx.tiny else 8.0
    size = (["model.d_model=256", "model.n_layer=2", "model.n_head=4", "data.train.block_size=512"] if ctx.tiny else
            ["model.d_model=512", "model.n_layer=8", "model.n_head=8", "data.train.block_size=512"])
    base = ["recipe=char_lm", f"trainer.device={ctx.cli_device}", "trainer.precision=bf16", *size,
            f"preflight.memory.target_gib={target:g}"]
    cfg = compose(base)
    limit = target_limit(cfg, target)
    capacity = int(target * GIB - cuda_rules.CUDA_CONTEXT_BYTES)
    recipe_loss = CharLMRecipe.compute_loss
    block = int(cfg.data.train.block_size)

    def need(batch: int) -> int:
        ids = torch.empty(batch, block, dtype=torch.long, device="meta")
        estimate = estimate_training_step(
            lambda: instantiate_node(cfg.model, "model"), (ids, ids), lambda m, b: recipe_loss(None, m, b),
            lambda m: build_optimizer(OmegaConf.to_container(cfg.optimizer, resolve=True), m),
            precision="bf16", device="cuda")
        return estimate.required_bytes - estimate.context_bytes

    fit, over = pick_batches(need(8), 8, need(16), 16, limit, capacity)
    section.data.update(target_gib=target, limit_bytes=limit, emulated_capacity_bytes=capacity, batches=[fit, over])
    env = {}
    if ctx.cuda:
        free_cuda()
        free, total = torch.cuda.mem_get_info(ctx.device)
        env = {"GPU_CHECK_EMULATED_GIB": f"{target:g}", "GPU_CHECK_BASELINE_USED_BYTES": str(total - free)}
    # Only the check under test (and what it requires): the rest of the preflight costs time here.
    only = only_check("memory.vram_headroom")
    for case, batch in (("just fits", fit), ("just does not fit", over)):
        if not ctx.has_time(25):
            section.add("skipped", "the section's time budget ran out", case=case, batch_size=batch)
            continue
        overrides = [*base, f"data.batch_size={batch}"]
        checked = run_cli(ctx, f"vram_{batch}_preflight", [*overrides, "preflight.only=true", "preflight.fail_on=never",
                                                           only], timeout_s=min(ctx.left() - 15, 120))
        verdict = vram_verdict(checked.json_file("preflight.json"))
        row = {"case": case, "batch_size": batch, **verdict}
        if verdict["verdict"] == "missing":
            section.add("error", None, **row, error=checked.tail(400))
            continue
        if not ctx.cuda:
            section.add("skipped", f"{NO_CUDA}: the real run needs a GPU to cap", **row)
            continue
        real = run_cli(ctx, f"vram_{batch}_real", [*overrides, f"recipe._target_={RECIPES}.CappedCharLM",
                                                   "preflight.enabled=false", "trainer.max_steps=3", *QUIET],
                       timeout_s=min(ctx.left() - 3, 120), env=env)
        outcome = real_outcome(real)
        peaks = [r.get("memory/cuda_max_allocated_bytes") for r in real.metrics() if r.get("memory/cuda_max_allocated_bytes")]
        expected = "ran" if case == "just fits" else "oom"
        predicted = {"fits": "ran", "will not fit": "oom"}.get(verdict["verdict"])
        row.update(real=outcome, real_peak_bytes=max(peaks) if peaks else None, match=predicted == outcome)
        if outcome in ("failed", "timeout"):
            section.add("error", None, **row, error=real.tail(400))
        else:
            # The sizing aims each case at its side of the line; a verdict that matches reality passes.
            section.add("passed" if row["match"] else "failed", None, **row, aimed_at=expected)
    section.headline = "; ".join(f"{r['case']} (batch {r['batch_size']}): check says {r.get('verdict')}, real run "
                                 f"{r.get('real')}" for r in section.rows if r["status"] != "skipped")
    section.notes += [
        f"preflight.memory.target_gib={target:g} on the real GPU; the real run's caching allocator is capped "
        "(torch.cuda.set_per_process_memory_fraction, recipes.CappedCharLM) so the card behaves like one of that "
        "size with this process's CUDA context in it.",
        "The check keeps margins (usable_fraction 0.95, reserve_gib 0.5, a 512 MiB context allowance): batches between "
        "the check's limit and the card's real capacity are refused by the check yet may run; the two cases sit "
        "outside that band (need ~95% of the limit, ~108% of the capacity).",
    ]
    section.left.append("the verdict on the real card's full memory (target_gib=null): a run filling ~75 GiB takes longer")


# ------------------------------------------------------------------------ throughput
def throughput(records: list[dict[str, Any]], tokens_per_sample: int) -> dict[str, Any]:
    """Median samples/s over the logged windows after the first (warm-up, compilation)."""
    steps = [r for r in records if "samples_per_s" in r]
    if len(steps) < 2:
        return {"samples_per_s": None, "tokens_per_s": None, "windows": len(steps)}
    rate = statistics.median(r["samples_per_s"] for r in steps[1:])
    first = steps[0]
    return {"samples_per_s": round(rate, 1), "tokens_per_s": round(rate * tokens_per_sample),
            "first_window_samples_per_s": round(first["samples_per_s"], 1), "windows": len(steps),
            "final_loss": steps[-1].get("loss")}


def throughput_section(ctx: Context, section: Section) -> None:
    section.columns = ["mode", "samples_per_s", "tokens_per_s", "first_window_samples_per_s", "final_loss", "seconds",
                       "status", "reason"]
    compiled, why = config_supports("trainer.compile", "true")
    section.data["compile_supported"] = compiled
    if not ctx.cuda and not ctx.rehearse:
        section.skip(NO_CUDA + ("" if compiled else f"; {why}"))
        return
    ctx.runs_cli(section)
    steps = 40 if ctx.tiny else 300
    common = ["recipe=char_lm", f"trainer.device={ctx.cli_device}", f"trainer.max_steps={steps}", "logging.every_n_steps=20",
              "logging.dynamics_every_n_steps=0", "preflight.enabled=false", *QUIET]
    block = 128
    for mode, extra in (("eager", []), ("compiled", ["trainer.compile=true"])):
        if mode == "compiled" and not compiled:
            section.add("skipped", why, mode=mode)
            continue
        if not ctx.has_time(20):
            section.add("skipped", "the section's time budget ran out", mode=mode)
            continue
        done = run_cli(ctx, f"throughput_{mode}", [*common, *extra], timeout_s=ctx.left() - 3)
        if done.returncode != 0:
            section.add("error", None, mode=mode, seconds=round(done.seconds, 1), error=done.tail(600))
            continue
        figures = throughput(done.metrics(), block)
        section.add("passed" if figures["samples_per_s"] else "failed", None, mode=mode, seconds=round(done.seconds, 1),
                    **figures)
    rates = {r["mode"]: r.get("samples_per_s") for r in section.rows if r.get("samples_per_s")}
    section.headline = ", ".join(f"{mode} {rate:,.0f} samples/s" for mode, rate in rates.items())
    if len(rates) == 2:
        section.headline += f" (compiled/eager {rates['compiled'] / rates['eager']:.2f}x)"
    section.notes.append(f"The default recipe (char-LM, batch 32 x {block}, precision auto), {steps} steps; the median "
                         "of the logged windows after the first, from metrics.jsonl samples_per_s.")


# ------------------------------------------------------------------------------ FSDP
def fsdp_section(ctx: Context, section: Section) -> None:
    section.columns = ["run", "exit", "summary_status", "steps", "resumed_from", "strategy_lines", "status", "reason"]
    supported, why = config_supports("trainer.strategy", "fsdp")
    section.data["fsdp_supported"] = supported
    if not ctx.cuda and not ctx.rehearse:
        section.skip(NO_CUDA + ("" if supported else f"; {why}"))
        return
    if not supported:
        section.skip(why)
        return
    ctx.runs_cli(section)
    common = ["recipe=char_lm_tiny", f"trainer.device={ctx.cli_device}", "trainer.strategy=fsdp", "preflight.fail_on=never",
              "trainer.eval_every_n_steps=0", "trainer.eval_max_batches=1", "checkpoint.every_n_steps=5"]
    for name, steps in (("first", 10), ("resumed", 15)):
        if not ctx.has_time(20):
            section.add("skipped", "the section's time budget ran out", run=name)
            continue
        done = run_cli(ctx, "fsdp", [*common, f"trainer.max_steps={steps}", "checkpoint.resume=auto"],
                       timeout_s=ctx.left() - 3, torchrun=1) if name == "first" else _rerun(ctx, common, steps)
        summary = done.json_file("summary.json") or {}
        lines = strategy_lines(done.output)
        ok = done.returncode == 0 and summary.get("status") == "completed" and summary.get("steps") == steps
        if name == "resumed":
            ok = ok and bool(summary.get("resumed_from"))
        section.add("passed" if ok else "failed", None if ok else done.tail(300), run=name, exit=done.returncode,
                    summary_status=summary.get("status"), steps=summary.get("steps"),
                    resumed_from=summary.get("resumed_from"), strategy_lines=lines)
    section.headline = "; ".join(f"{r['run']}: {r['status']}" for r in section.rows)
    section.left.append("sharding across ranks: torchrun with one process shards nothing; it needs 2 or more GPUs")


def strategy_lines(output: str) -> list[str]:
    """The log messages that say how the model was placed (sharded or not)."""
    messages = [line.split("] - ", 1)[-1].strip() for line in output.splitlines()]
    return [m[:200] for m in messages if "shard" in m.lower() or "fsdp" in m.lower().split("/")[0]][:3]


def _rerun(ctx: Context, common: list[str], steps: int) -> Completed:
    """The same run dir again with more steps: resumes from the FSDP checkpoint."""
    import sys

    from benchmarks.gpu_checks.context import run_process

    run_dir = ctx.work_dir / "runs" / "fsdp"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m",
               "optimus_preflight.cli", f"hydra.run.dir={run_dir}", "logging.progress=none", *common,
               f"trainer.max_steps={steps}", "checkpoint.resume=auto"]
    ctx.say("  run fsdp (resumed)")
    return run_process(command, ctx.left() - 3, log_path=ctx.work_dir / "logs" / "fsdp_resumed.log", run_dir=run_dir)
