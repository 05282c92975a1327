"""A pre-warmed launcher for the tests' `optimus-train` runs (``conftest.run_cli``).

A CLI process spends ~5 s of CPU before it trains: importing torch, hydra and this
package, then ``torch._dynamo``, which torch imports on the first
``Optimizer.add_param_group``. The tests start about a hundred such runs on two cores,
so that start-up was most of ``make test``. This server does the imports once and forks
a fresh process per run, which then runs ``python -m optimus_preflight.cli`` from there:
its own pid and process group, the run's cwd, environment, argv and stdout/stderr files,
freshly seeded Python and NumPy RNGs, the default signal dispositions, and a real
interpreter exit (non-daemon threads joined, atexit handlers run; a signal that kills it
is its exit status, as for a subprocess). What it cannot check is the import itself,
so the tests that are about the process start (``--help``, import errors of a recipe
module, the installed wheel) keep starting real processes, as does everything when
OPTIMUS_TESTS_COLD_START=1.

Protocol (a Unix socket, one connection per run): the client sends one JSON line
``{"argv", "cwd", "env", "stdout", "stderr"}``; the server answers ``pid <n>`` once the
run started and ``exit <returncode>`` when it ended. Each connection gets its own
forked waiter, so the server never holds a thread and can always fork safely.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import random
import runpy
import signal
import socket
import sys
import threading

# What every run imports anyway; nothing of the tests (a run imports its recipe module
# itself, after the fork, from its own cwd).
import hydra  # noqa: F401
import numpy as np
import omegaconf  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401

import optimus_preflight  # noqa: F401
import optimus_preflight.app  # noqa: F401  # not .cli: runpy must import the module it runs
import optimus_preflight.recipes.char_lm  # noqa: F401

CLI_MODULE = "optimus_preflight.cli"


def _exit_status(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _redirect(request: dict) -> None:
    stdin = os.open(os.devnull, os.O_RDONLY)
    stdout = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for source, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(source, target)
        os.close(source)
    unbuffered = request["env"].get("PYTHONUNBUFFERED") not in (None, "")

    def text(fd: int, mode: str, **options: object) -> io.TextIOWrapper:
        return io.TextIOWrapper(io.FileIO(fd, mode, closefd=False), encoding="utf-8", line_buffering=True, **options)

    sys.stdin = text(0, "r")
    sys.stdout = text(1, "w", write_through=unbuffered)
    sys.stderr = text(2, "w", errors="backslashreplace", write_through=True)
    sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin


def _run(request: dict) -> None:
    """In the forked run process: become `python -m optimus_preflight.cli ARGV`, then exit."""
    os.setpgid(0, 0)  # as its own group: a killpg of the run's reaches its workers, not the server
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _redirect(request)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # as `python -m` from that directory
    random.seed()
    np.random.seed()
    sys.argv = [CLI_MODULE, *request["argv"]]
    code = 0
    try:
        runpy.run_module(CLI_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does at exit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:  # killed by an uncaught KeyboardInterrupt: Python re-raises SIGINT at exit
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def _serve_one(connection: socket.socket) -> None:
    """In a forked waiter: start the run, report its pid, wait for it, report its status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with connection, connection.makefile("rwb", buffering=0) as stream:
        request = json.loads(stream.readline())
        pid = os.fork()
        if pid == 0:
            connection.close()
            _run(request)
        stream.write(f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        stream.write(f"exit {_exit_status(status)}\n".encode())
    os._exit(0)


def serve(path: str) -> None:
    # The waiters exit on their own; nobody waits for them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    # Forking is safe only from a process with one thread: say how many there are.
    print(f"ready {len(os.listdir('/proc/self/task'))}", flush=True)
    while True:
        connection, _ = server.accept()
        if os.fork() == 0:
            server.close()
            _serve_one(connection)
        connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
