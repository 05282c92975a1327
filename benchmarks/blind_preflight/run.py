"""Run the blind preflight evaluation set and score it.

    .venv/bin/python -m benchmarks.blind_preflight.run [--only NAME[,NAME]] [--json out.json] [--verbose]
    .venv/bin/python -m benchmarks.blind_preflight.run --set b ...    # sets b, c, d: benchmarks/blind_preflight_{b,c,d}

Each case runs ``run_preflight(...)`` in its own subprocess (a crash or a hang in one case
does not stop the rest; ``--timeout`` seconds per case). Scoring, from the findings of
severity warning or error only (info is ignored):

- broken case: DIAGNOSED if a finding's message or fix matches the case's ``cause_pattern``
  (case-insensitive); WRONG_CAUSE if something fired but nothing matches; MISSED if nothing fired.
- healthy case: FALSE_ALARM if any warning or error fired (or a check crashed), else OK.
- HARNESS_ERROR: the case could not be built or ``run_preflight`` itself raised / timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

REGISTRIES = {"a": "benchmarks.blind_preflight.registry", "b": "benchmarks.blind_preflight_b.registry",
              "c": "benchmarks.blind_preflight_c.registry", "d": "benchmarks.blind_preflight_d.registry",
              "e": "benchmarks.blind_preflight_e.registry", "f": "benchmarks.blind_preflight_f.registry",
              "g": "benchmarks.blind_preflight_g.registry", "h": "benchmarks.blind_preflight_h.registry",
              "i": "benchmarks.blind_preflight_i.registry", "j": "benchmarks.blind_preflight_j.registry",
              "k": "benchmarks.blind_preflight_k.registry",
              "l": "benchmarks.blind_preflight_l.registry", "m": "benchmarks.blind_preflight_m.registry",
              "n": "benchmarks.blind_preflight_n.registry",
              "o": "benchmarks.blind_preflight_o.registry", "p": "benchmarks.blind_preflight_p.registry",
              "q": "benchmarks.blind_preflight_q.registry", "r": "benchmarks.blind_preflight_r.registry",
              "s": "benchmarks.blind_preflight_s.registry", "t": "benchmarks.blind_preflight_t.registry",
              "u": "benchmarks.blind_preflight_u.registry", "v": "benchmarks.blind_preflight_v.registry",
              "w": "benchmarks.blind_preflight_w.registry", "x": "benchmarks.blind_preflight_x.registry",
              "y": "benchmarks.blind_preflight_y.registry", "z": "benchmarks.blind_preflight_z.registry",
              "aa": "benchmarks.blind_preflight_aa.registry", "ab": "benchmarks.blind_preflight_ab.registry",
              "ac": "benchmarks.blind_preflight_ac.registry", "ad": "benchmarks.blind_preflight_ad.registry",
              "ae": "benchmarks.blind_preflight_ae.registry", "af": "benchmarks.blind_preflight_af.registry",
              "ag": "benchmarks.blind_preflight_ag.registry", "ah": "benchmarks.blind_preflight_ah.registry",
              "ai": "benchmarks.blind_preflight_ai.registry", "aj": "benchmarks.blind_preflight_aj.registry",
              "ak": "benchmarks.blind_preflight_ak.registry", "al": "benchmarks.blind_preflight_al.registry",
              "am": "benchmarks.blind_preflight_am.registry", "an": "benchmarks.blind_preflight_an.registry",
              "ao": "benchmarks.blind_preflight_ao.registry", "ap": "benchmarks.blind_preflight_ap.registry",
              "aq": "benchmarks.blind_preflight_aq.registry", "ar": "benchmarks.blind_preflight_ar.registry",
              "as": "benchmarks.blind_preflight_as.registry", "at": "benchmarks.blind_preflight_at.registry",
              "au": "benchmarks.blind_preflight_au.registry",
              "av": "benchmarks.blind_preflight_av.registry", "aw": "benchmarks.blind_preflight_aw.registry",
              "ax": "benchmarks.blind_preflight_ax.registry",
              "ay": "benchmarks.blind_preflight_ay.registry",
              "az": "benchmarks.blind_preflight_az.registry", "ba": "benchmarks.blind_preflight_ba.registry",
              "bb": "benchmarks.blind_preflight_bb.registry",
              "bc": "benchmarks.blind_preflight_bc.registry", "bd": "benchmarks.blind_preflight_bd.registry",
              "be": "benchmarks.blind_preflight_be.registry",
              "bf": "benchmarks.blind_preflight_bf.registry", "bg": "benchmarks.blind_preflight_bg.registry",
              "bh": "benchmarks.blind_preflight_bh.registry", "bi": "benchmarks.blind_preflight_bi.registry",
              "bj": "benchmarks.blind_preflight_bj.registry", "bk": "benchmarks.blind_preflight_bk.registry"}


def load_cases(which: str = "a"):
    import importlib
    return importlib.import_module(REGISTRIES[which]).load_all()


def move_to(kwargs: dict, device: str) -> None:
    """Move a case's model (and a loss module's buffers) to ``device`` in place, so the optimizer
    built on the CPU still holds the same parameters; the loaders stay on the CPU, as a user's do."""
    import torch

    kwargs["model"].to(device)
    if isinstance(kwargs.get("loss_fn"), torch.nn.Module):
        kwargs["loss_fn"].to(device)


def child(name: str, out_path: str, which: str = "a", device: str = "cpu") -> None:
    cases = load_cases(which)
    result: dict = {"name": name}
    try:
        kwargs = cases[name].build()
        if device != "cpu":
            move_to(kwargs, device)
        from optimus_preflight.preflight import run_preflight

        kwargs.setdefault("first_batch_timeout_s", 60.0)
        # A set's metric may keep its own data among the kwargs (set bg's val_views): not the user's call.
        import inspect
        accepted = inspect.signature(run_preflight).parameters
        kwargs = {key: value for key, value in kwargs.items() if key in accepted}
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = run_preflight(**kwargs)
        result["elapsed_s"] = round(time.perf_counter() - start, 2)
        result["status"] = report.status
        findings = []
        for check in report.checks:
            for issue in check.issues:
                findings.append({"check": check.name, "severity": issue.severity.value, "code": issue.code,
                                 "message": issue.message, "fix": issue.fix})
            if check.status.value == "crashed":
                findings.append({"check": check.name, "severity": "crashed", "code": "CRASHED",
                                 "message": str(check.detail or "")[-2000:], "fix": ""})
        result["findings"] = findings
    except BaseException:  # noqa: BLE001 - report whatever stopped the case
        result["harness_error"] = traceback.format_exc()[-4000:]
    with open(out_path, "w") as f:
        json.dump(result, f)


def run_case(name: str, timeout: float, which: str = "a", device: str = "cpu") -> dict:
    with tempfile.TemporaryDirectory(prefix="blind-") as tmp:
        out = os.path.join(tmp, "result.json")
        env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                   TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TRANSFORMERS_VERBOSITY="error")
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "benchmarks.blind_preflight.run", "--child", name, "--out", out,
                                   "--set", which, "--device", device],
                                  capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"name": name, "harness_error": f"timed out after {timeout:.0f} s",
                    "wall_s": round(time.perf_counter() - start, 1)}
        wall = round(time.perf_counter() - start, 1)
        if not os.path.exists(out):
            return {"name": name, "harness_error": f"exit {proc.returncode}: {proc.stderr[-3000:]}", "wall_s": wall}
        with open(out) as f:
            result = json.load(f)
        result["wall_s"] = wall
        return result


def fired(result: dict) -> list[dict]:
    return [f for f in result.get("findings", []) if f["severity"] in ("warning", "error", "crashed")]


# The cases were written for the CPU: on CUDA, a tensor a case's forward or loss makes without
# device= (torch.arange, torch.eye, a mask), or pack_padded_sequence lengths left on the GPU,
# fails the case's own step. The preflight is right to say so, but that measures the case.
_CASE_NOT_ON_DEVICE = re.compile(
    r"(Expected all tensors to be on the same device|expected self and mask to be on the same device|"
    r"'lengths' argument should be a 1D CPU int64 tensor).* at \S*benchmarks/blind_preflight")


def _case_not_on_device(finding: dict) -> bool:
    return finding.get("code") == "STEP_ERROR" and bool(_CASE_NOT_ON_DEVICE.search(finding["message"]))


def score(case, result: dict) -> tuple[str, list[dict]]:
    if "harness_error" in result:
        return "HARNESS_ERROR", []
    alarms = fired(result)
    if any(_case_not_on_device(f) for f in alarms):
        alarms = [f for f in alarms if not _case_not_on_device(f)]
        if case.healthy or not alarms:
            return "NOT_ON_DEVICE", []
    if case.healthy:
        return ("FALSE_ALARM" if alarms else "OK"), []
    pattern = re.compile(case.cause_pattern, re.IGNORECASE)
    matched = [f for f in alarms if f["severity"] != "crashed"
               and (pattern.search(f["message"]) or pattern.search(f["fix"]))]
    if matched:
        return "DIAGNOSED", matched
    return ("WRONG_CAUSE" if alarms else "MISSED"), []


def codes_of(result: dict) -> str:
    tags = []
    for f in fired(result):
        tag = {"error": "E", "warning": "W", "crashed": "C"}[f["severity"]] + ":" + (
            f["code"] if f["severity"] != "crashed" else f["check"])
        if tag not in tags:
            tags.append(tag)
    return " ".join(tags) or "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated case names (or substrings)")
    parser.add_argument("--json", help="write every case's findings and outcome here")
    parser.add_argument("--verbose", action="store_true", help="print every finding (message and fix) per case")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--set", default="a", choices=sorted(REGISTRIES),
                        help="a: benchmarks/blind_preflight (default); b: benchmarks/blind_preflight_b")
    parser.add_argument("--device", default="cpu", help="move each case's model there before the preflight (cuda: the GPU run)")
    parser.add_argument("--healthy-only", action="store_true", help="run the healthy cases only")
    parser.add_argument("--jobs", type=int, default=1, help="cases run side by side (each in its own process)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.out, args.set, args.device)
        return 0

    cases = load_cases(args.set)
    names = list(cases)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        names = [n for n in names if any(w == n for w in wanted)] or [n for n in names if any(w in n for w in wanted)]
        if not names:
            print(f"no case matches {args.only!r}", file=sys.stderr)
            return 2
    if args.healthy_only:
        names = [n for n in names if cases[n].healthy]

    rows, records = [], []
    total_start = time.perf_counter()
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    # map yields in order as each case finishes, so a serial run still prints case by case
    results = pool.map(lambda n: run_case(n, args.timeout, args.set, args.device), names)
    for name, result in zip(names, results):
        case = cases[name]
        outcome, matched = score(case, result)
        rows.append((name, case.family, outcome, codes_of(result), result.get("wall_s", 0.0)))
        records.append({"name": name, "family": case.family, "bug": case.bug, "cause_pattern": case.cause_pattern,
                        "outcome": outcome, "matched": matched, **result})
        print(f"{name:44s} {case.family:16s} {outcome:14s} {result.get('wall_s', 0.0):6.1f}s  {codes_of(result)}",
              flush=True)
        if args.verbose:
            if "harness_error" in result:
                print("    harness error: " + result["harness_error"].strip().replace("\n", "\n    "))
            for f in result.get("findings", []):
                print(f"    [{f['severity']}] {f['check']} {f['code']}: {f['message']}")
                if f["fix"]:
                    print(f"        fix: {f['fix']}")
    pool.shutdown()
    elapsed = time.perf_counter() - total_start

    broken = [r for r in rows if cases[r[0]].cause_pattern is not None]
    good = [r for r in rows if cases[r[0]].cause_pattern is None]
    print()
    print(f"{'case':44s} {'family':16s} {'outcome':14s} codes fired (E/W: error/warning, C: check crashed)")
    print("-" * 110)
    for name, family, outcome, codes, _ in rows:
        print(f"{name:44s} {family:16s} {outcome:14s} {codes}")
    print("-" * 110)
    diagnosed = sum(r[2] == "DIAGNOSED" for r in broken)
    wrong = sum(r[2] == "WRONG_CAUSE" for r in broken)
    missed = sum(r[2] == "MISSED" for r in broken)
    harness = sum(r[2] == "HARNESS_ERROR" for r in rows)
    off_device = sum(r[2] == "NOT_ON_DEVICE" for r in rows)
    alarms = sum(r[2] == "FALSE_ALARM" for r in good)
    pct = 100.0 * diagnosed / len(broken) if broken else 0.0
    print(f"broken diagnosed {diagnosed}/{len(broken)} ({pct:.0f}%), healthy false alarms {alarms}/{len(good)}")
    print(f"broken: {diagnosed} diagnosed, {wrong} wrong cause, {missed} missed; harness errors {harness}; "
          + (f"cases whose own code fails on {args.device} (not scored as alarms) {off_device}; " if off_device else "")
          + f"{elapsed:.0f} s in all")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": records, "diagnosed": diagnosed, "broken": len(broken),
                       "false_alarms": alarms, "healthy": len(good)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
