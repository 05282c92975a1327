"""Set-up on a GPU machine, standard library only: find a CUDA build of torch, make a venv that
reuses it, install the project and its small dependencies (offline from carried wheels when
there is no package index), then run the checks inside that venv.

Why not ``make install``: it pins ``torch==2.13.0`` through constraints.txt, a CPU wheel here,
which is the wrong torch on a GPU box and would pull gigabytes where an index is reachable.
The venv instead sees the CUDA torch already installed (a ``.pth`` file lists that
interpreter's site-packages: a venv made from another venv does not see the parent's
packages through ``--system-site-packages``), and only the project (editable, no deps) and
what is missing of hydra-core/omegaconf/antlr4/psutil/tqdm/numpy/PyYAML go into it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# import name -> the distributions to install when it does not import. hydra and omegaconf
# bring antlr4 4.9 along: an antlr4 of another version elsewhere on the path (4.13 is common)
# imports fine but breaks omegaconf's grammar, so the three are installed together.
DEPENDENCIES = {
    "hydra": ("hydra-core", "omegaconf", "antlr4-python3-runtime"),
    "omegaconf": ("omegaconf", "antlr4-python3-runtime"),
    "yaml": ("PyYAML",),
    "psutil": ("psutil",),
    "tqdm": ("tqdm",),
    "numpy": ("numpy",),
    "packaging": ("packaging",),
}
# Versions fetched when this environment has none installed (omegaconf 2.3 needs antlr4 4.9.*).
DEFAULT_VERSIONS = {"hydra-core": "1.3.2", "omegaconf": "2.3.0", "antlr4-python3-runtime": "4.9.3", "tqdm": "4.67.1"}
# Fetched by --fetch-wheels: pure-Python wheels that work with any CPython 3. antlr4 4.9.3 is
# published as an sdist only, so it is built into a wheel here.
FETCHED = ("hydra-core", "omegaconf", "tqdm")
BUILT = ("antlr4-python3-runtime",)
KNOWN_TORCH_PYTHONS = ("/opt/torch/.venv/bin/python3",)

PROBE = r"""
import json, sys, sysconfig
info = {"executable": sys.executable, "python": "%d.%d.%d" % sys.version_info[:3],
        "purelib": sysconfig.get_paths()["purelib"], "platlib": sysconfig.get_paths()["platlib"],
        "prefix": sys.prefix, "missing": []}
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    info["device"] = torch.cuda.get_device_name(0) if info["cuda_available"] else None
except Exception as error:
    info.update(torch=None, torch_cuda=None, cuda_available=False, device=None, torch_error=repr(error))
for name in sys.argv[1].split(","):
    try:
        __import__(name)
    except Exception:
        info["missing"].append(name)
try:
    import optimus_preflight
    info["project"] = optimus_preflight.__file__
except Exception as error:
    info["project"] = None
print("PROBE " + json.dumps(info))
"""


def torch_build(version: str | None, cuda: str | None) -> str:
    """``cuda``, ``cpu`` (e.g. the ``+cpu`` wheel constraints.txt pins), ``rocm`` or ``none``."""
    if not version:
        return "none"
    if cuda:
        return "cuda"
    if "rocm" in version:
        return "rocm"
    return "cpu"


@dataclass
class Interpreter:
    path: str
    info: dict = field(default_factory=dict)

    @property
    def build(self) -> str:
        return torch_build(self.info.get("torch"), self.info.get("torch_cuda"))

    @property
    def usable_gpu(self) -> bool:
        return self.build == "cuda" and bool(self.info.get("cuda_available"))


def probe(python: str, timeout_s: float = 180.0) -> dict | None:
    """What ``python`` has: torch and its CUDA, the project, the missing dependencies."""
    try:
        done = subprocess.run(
            # Not from the repo root: the source tree there would import without being installed.
            [python, "-c", PROBE, ",".join(DEPENDENCIES)], capture_output=True, text=True, timeout=timeout_s,
            cwd=tempfile.gettempdir(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[len("PROBE "):])
    return None


def candidates(explicit: str | None, repo: Path | None = None) -> list[str]:
    """Interpreters that may hold a CUDA torch, most specific first (paths kept as given:
    a venv's python is a link to the base interpreter, which does not see the venv). The
    project's own .venv comes last: it holds the CPU wheel unless someone installed a CUDA one."""
    if explicit:
        return [explicit]
    own = str(repo / ".venv" / "bin" / "python") if repo else None
    found = [sys.executable, shutil.which("python3"), *KNOWN_TORCH_PYTHONS, shutil.which("python"), own]
    unique: list[str] = []
    for path in found:
        if path and os.path.exists(path) and os.path.abspath(path) not in unique:
            unique.append(os.path.abspath(path))
    return unique


def choose(interpreters: list[Interpreter]) -> Interpreter | None:
    """The first that sees a GPU; else the first CUDA build; else the first with any torch."""
    for test in (lambda i: i.usable_gpu, lambda i: i.build == "cuda", lambda i: i.build != "none"):
        for interpreter in interpreters:
            if interpreter.info and test(interpreter):
                return interpreter
    return None


def wheel_files(folder: Path | None) -> list[Path]:
    if folder is None or not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz"))


def normalise(name: str) -> str:
    return name.replace("_", "-").replace(".", "-").lower()


def distributions_in(folder: Path | None) -> dict[str, Path]:
    """Normalised project name -> its wheel (or sdist) in ``folder``."""
    found: dict[str, Path] = {}
    for path in sorted(wheel_files(folder), key=lambda p: p.suffix != ".whl"):  # a wheel over an sdist
        stem = path.name[: -len(".tar.gz")] if path.name.endswith(".tar.gz") else path.name
        project = stem.split("-")[0] if path.suffix == ".whl" else stem.rsplit("-", 1)[0]
        found.setdefault(normalise(project), path)
    return found


def missing_distributions(missing_imports: list[str]) -> list[str]:
    needed: list[str] = []
    for name in missing_imports:
        needed += [d for d in DEPENDENCIES.get(name, ()) if d not in needed]
    return needed


def venv_site_packages(venv: Path) -> Path:
    """The venv's purelib, computed the way the venv's own interpreter will."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = sorted(venv.glob("lib/python3*/site-packages"))
    return found[0] if found else venv / "lib" / version / "site-packages"


def default_venv(torch_python: str) -> Path:
    key = hashlib.sha256(torch_python.encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"optimus-gpu-validation-{key}"


@dataclass
class SetupLog:
    steps: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def run(self, what: str, command: list[str], timeout_s: float, env: dict | None = None) -> bool:
        started = time.monotonic()
        print(f"[setup] {what}: {' '.join(command)}", flush=True)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})})
            ok, tail = done.returncode == 0, (done.stdout + done.stderr)[-1500:]
        except (OSError, subprocess.TimeoutExpired) as error:
            ok, tail = False, f"{type(error).__name__}: {error}"
        self.steps.append({"what": what, "ok": ok, "seconds": round(time.monotonic() - started, 1),
                           "command": " ".join(command), **({} if ok else {"output_tail": tail})})
        if not ok:
            print(f"[setup] {what} failed:\n{tail}", flush=True)
        return ok

    def note(self, what: str, ok: bool = True, **extra: object) -> None:
        print(f"[setup] {what}", flush=True)
        self.steps.append({"what": what, "ok": ok, **extra})


@dataclass
class SetupResult:
    python: str | None  # the interpreter that runs the checks
    status: str  # ready | no_torch | failed
    reason: str = ""
    torch_python: str | None = None
    torch_info: dict = field(default_factory=dict)
    venv: str | None = None
    probed: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def prepare(repo: Path, *, explicit_python: str | None, venv: Path | None, wheels: Path | None,
            install_torch: bool, timeout_s: float = 300.0) -> SetupResult:
    """Find the torch to use and make an environment in which the project imports."""
    log = SetupLog()
    interpreters = []
    for path in candidates(explicit_python, repo):
        info = probe(path) or {}
        interpreters.append(Interpreter(path, info))
        log.note(f"probed {path}: torch {info.get('torch')} ({torch_build(info.get('torch'), info.get('torch_cuda'))}"
                 f" build, CUDA {info.get('torch_cuda')}), GPU visible: {info.get('cuda_available')}", bool(info))
        if Interpreter(path, info).usable_gpu:
            break
    chosen = choose(interpreters)
    probed = [{"python": i.path, **{k: i.info.get(k) for k in ("torch", "torch_cuda", "cuda_available", "device", "project")}}
              for i in interpreters]
    gpu_present = shutil.which("nvidia-smi") is not None
    result = SetupResult(None, "failed", probed=probed, steps=log.steps)
    if install_torch and gpu_present and (chosen is None or not chosen.usable_gpu):
        # No CUDA torch anywhere: install one from a package index, if one can be reached.
        base = chosen.path if chosen else sys.executable
        target = venv or default_venv(base)
        if not _make_venv(log, base, target, None, with_pip=True):
            result.reason = "could not create a venv to install torch into"
            return _done(result, log)
        if not log.run("install a CUDA build of torch from the package index (no constraints.txt)",
                       [str(target / "bin" / "python"), "-m", "pip", "install", "--retries", "1", "--timeout", "30",
                        "torch"], timeout_s=900):
            result.reason = "no CUDA build of torch is installed and none could be downloaded"
            return _done(result, log)
        chosen = Interpreter(str(target / "bin" / "python"), probe(str(target / "bin" / "python")) or {})
    if chosen is None or not chosen.info:
        result.status, result.reason = "no_torch", "no Python interpreter with torch was found"
        return _done(result, log)
    result.torch_python, result.torch_info = chosen.path, chosen.info
    missing = chosen.info.get("missing", [])
    project = chosen.info.get("project") or ""
    if not missing and project.startswith(str(repo)):
        log.note(f"{chosen.path} already has the project from {repo} and every dependency: using it as it is")
        result.python, result.status = chosen.path, "ready"
        return _done(result, log)
    target = venv or default_venv(chosen.path)
    python = str(target / "bin" / "python")
    if not _make_venv(log, chosen.path, target, chosen.info):
        result.reason = f"could not create the venv {target}"
        return _done(result, log)
    result.venv = str(target)
    info = probe(python) or {}
    if info.get("torch") != chosen.info.get("torch"):
        result.reason = f"the venv {target} does not see {chosen.path}'s torch {chosen.info.get('torch')} ({info.get('torch')})"
        return _done(result, log)
    needed = missing_distributions(info.get("missing", []))
    if needed and not _install_dependencies(log, python, needed, wheels):
        result.reason = (f"missing {', '.join(needed)} and they could not be installed: carry wheels "
                         "(python benchmarks/gpu_validation.py --fetch-wheels benchmarks/tmp_gpu_wheels on a machine "
                         "with an index, then --wheels benchmarks/tmp_gpu_wheels here)")
        return _done(result, log)
    installed = bool(needed)
    if not (info.get("project") or "").startswith(str(repo)):
        installed = True
        # No build isolation and no index: setuptools comes from the torch environment.
        if not log.run("install the project (editable, no dependencies)",
                       [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-e",
                        str(repo)], timeout_s=timeout_s):
            result.reason = "pip could not install the project in editable mode (is setuptools>=64 there?)"
            return _done(result, log)
    final = (probe(python) or {}) if installed else info
    if final.get("missing") or not (final.get("project") or "").startswith(str(repo)):
        result.reason = f"after set-up the venv still misses {final.get('missing')} / project {final.get('project')}"
        return _done(result, log)
    result.python, result.status, result.torch_info = python, "ready", final
    return _done(result, log)


def _done(result: SetupResult, log: SetupLog) -> SetupResult:
    result.steps, result.seconds = log.steps, round(time.monotonic() - log.started, 1)
    return result


def _make_venv(log: SetupLog, base: str, target: Path, base_info: dict | None, with_pip: bool = False) -> bool:
    """A venv (reused when its interpreter still runs) that sees ``base``'s packages."""
    python = target / "bin" / "python"
    if not (python.exists() and subprocess.run([str(python), "-c", "import sys"]).returncode == 0):
        shutil.rmtree(target, ignore_errors=True)
        # --without-pip: ensurepip is often missing on distribution Pythons; pip comes
        # from the torch environment through the .pth file below.
        command = [base, "-m", "venv", "--system-site-packages", *([] if with_pip else ["--without-pip"]), str(target)]
        if not log.run("create the venv", command, timeout_s=120):
            return False
    if base_info:
        site = venv_site_packages(target)
        site.mkdir(parents=True, exist_ok=True)
        paths = dict.fromkeys(p for p in (base_info.get("purelib"), base_info.get("platlib")) if p)
        # addsitedir, not a bare path: the .pth files there (setuptools' distutils hack,
        # namespace packages) must be processed too.
        (site / "_optimus_gpu_torch.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in paths))
        log.note(f"venv {target} sees the packages of {base} through {site / '_optimus_gpu_torch.pth'}")
    return True


def _install_dependencies(log: SetupLog, python: str, needed: list[str], wheels: Path | None) -> bool:
    """From the carried files when they have it (installed by path: another version elsewhere
    on the path does not count as satisfying it), else from the index."""
    have = distributions_in(wheels)
    files = [str(have[normalise(d)]) for d in needed if normalise(d) in have]
    rest = [d for d in needed if normalise(d) not in have]
    if files and not log.run(
        f"install {', '.join(Path(f).name for f in files)} from the carried wheels",
        [python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation", *files], timeout_s=300,
    ):
        return False
    if rest:
        pins = [f"{d}=={DEFAULT_VERSIONS[d]}" if d in DEFAULT_VERSIONS else d for d in rest]
        return log.run(f"install {', '.join(rest)} from the package index", [
            python, "-m", "pip", "install", "--ignore-installed", "--no-deps", "--retries", "0", "--timeout", "15",
            *pins], timeout_s=300)
    return True


def fetch_wheels(folder: Path) -> int:
    """On a machine with a package index: the wheels the GPU machine lacks, into ``folder``
    (ignored by git under benchmarks/tmp*/; the device tool's ``carry`` takes it along)."""
    folder.mkdir(parents=True, exist_ok=True)

    # The known-good set, never this interpreter's versions: omegaconf's generated grammar
    # loads only with the antlr4 runtime it was generated by (4.9), and an interpreter that
    # lacks omegaconf may well hold a newer antlr4 (4.13 here broke the GPU machine's set-up).
    def pin(name: str) -> str:
        return f"{name}=={DEFAULT_VERSIONS[name]}"

    pip = [sys.executable, "-m", "pip"]
    commands = [
        [*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(folder), *(pin(n) for n in FETCHED)],
        [*pip, "wheel", "--no-deps", "-w", str(folder), *(pin(n) for n in BUILT)],
    ]
    for command in commands:
        print(" ".join(command), flush=True)
        if subprocess.run(command).returncode != 0:
            return 1
    print(f"wheels in {folder}: {', '.join(p.name for p in wheel_files(folder))}")
    return 0

