"""Processes a test starts (Ray, `ray job submit`, the job, ...), with their output kept in files.

When a test fails, tests/conftest.py adds the tail of every such process's stdout and stderr to
the failure report, so the cause a child process printed is never captured and dropped.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent  # the venv's `ray` and `python`


@dataclass
class Started:
    command: list[str]
    stdout: Path
    stderr: Path
    popen: subprocess.Popen

    def tail(self, chars: int) -> str:
        parts = [f"$ {shlex.join(self.command)}  (exit {self.popen.poll()})"]
        for name, path in (("stdout", self.stdout), ("stderr", self.stderr)):
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {name} (last {chars} chars) ---\n{text[-chars:]}")
        return "\n".join(parts)


class Processes:
    def __init__(self, directory: Path):
        self.directory = directory
        self.started: list[Started] = []

    def start(self, command: list[str], **kwargs) -> subprocess.Popen:
        """Popen with stdout and stderr going to files that a failing test shows."""
        index = len(self.started)
        self.directory.mkdir(parents=True, exist_ok=True)
        stdout, stderr = self.directory / f"{index}.stdout", self.directory / f"{index}.stderr"
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            popen = subprocess.Popen(
                [str(c) for c in command], stdout=out, stderr=err, stdin=subprocess.DEVNULL, **kwargs
            )
        self.started.append(Started([str(c) for c in command], stdout, stderr, popen))
        return popen

    def run(self, command: list[str], timeout: float, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """Runs to the end; with check, a non-zero exit fails the test with the process's output."""
        popen = self.start(command, **kwargs)
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
            raise AssertionError(f"timed out after {timeout} s:\n{self.started[-1].tail(4000)}") from None
        done = self.started[-1]
        result = subprocess.CompletedProcess(
            done.command,
            popen.returncode,
            done.stdout.read_text(errors="replace"),
            done.stderr.read_text(errors="replace"),
        )
        if check and popen.returncode != 0:
            raise AssertionError(f"exit status {popen.returncode}:\n{done.tail(4000)}")
        return result

    def tails(self, chars: int = 3000) -> str:
        return "\n\n".join(started.tail(chars) for started in self.started)

    def stop_all(self) -> None:
        for started in self.started:
            if started.popen.poll() is None:
                started.popen.kill()
                started.popen.wait()


def free_port() -> int:
    """A TCP port nobody listens on right now (so a test never needs a fixed port to be free)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(**changes: str) -> dict[str, str]:
    """This process's environment (already isolated by conftest) with the venv first on PATH."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    env.update(changes)
    return env


def start_ray_head(
    processes: Processes,
    env: dict[str, str],
    num_cpus: float = 2,
    extra: tuple[str, ...] = (),
    port: int | None = None,
    ray: Path = BIN / "ray",
    **kwargs,
) -> dict[str, str]:
    """`ray start --head` (with `extra` flags; `ray`: another environment's command, `kwargs` to
    Popen) on ports that are free now (no fixed port: another Ray may be running) and a temporary
    directory of its own; returns its GCS, dashboard and metrics addresses and that directory. The
    caller stops it with `stop_ray_head`."""
    temp_dir = tempfile.mkdtemp(prefix="ngr-head-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ports = {
        flag: free_port()
        for flag in (
            "--dashboard-port",
            "--ray-client-server-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
    }
    ports["--port"] = port or free_port()
    command = [
        ray,
        "start",
        "--head",
        f"--num-cpus={num_cpus}",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        *(f"{flag}={port}" for flag, port in ports.items()),
        *extra,
    ]
    processes.run(command, timeout=180, env=env, **kwargs)
    dashboard = f"http://127.0.0.1:{ports['--dashboard-port']}"
    wait_for_dashboard(dashboard, env, timeout=180)
    return {
        "gcs": f"127.0.0.1:{ports['--port']}",
        "dashboard": dashboard,
        "metrics_port": str(ports["--metrics-export-port"]),
        "temp_dir": temp_dir,
    }


def stop_ray_head(head: dict[str, str], timeout: float = 30) -> None:
    """Stops the Ray that start_ray_head started, and only it: the processes whose command line
    names its temporary directory (its GCS, raylets, dashboard, autoscaler; a fake cluster's
    worker nodes too) and their children (its workers). Not `ray stop`, which stops every Ray on
    the machine: another test run's, a benchmark's, a user's."""
    import psutil

    found = {}
    for process in psutil.process_iter(["cmdline"]):
        if any(head["temp_dir"] in part for part in process.info["cmdline"] or ()):
            found[process.pid] = process
            try:
                found.update({child.pid: child for child in process.children(recursive=True)})
            except psutil.NoSuchProcess:
                pass
    found.pop(os.getpid(), None)
    for process in found.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(list(found.values()), timeout=timeout)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=timeout)
    shutil.rmtree(head["temp_dir"], ignore_errors=True)


def wait_for_dashboard(dashboard: str, env: dict[str, str], timeout: float) -> None:
    """Waits until the dashboard's job API answers its version as JSON. `ray start` can return
    before it does on a loaded machine (its job module starts in a process of its own), and
    `ray job submit` then fails on an empty answer."""
    token_file = Path(env.get("HOME", "~")).expanduser() / ".ray" / "auth_token"
    headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"} if token_file.is_file() else {}
    deadline, last = time.monotonic() + timeout, "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(
                urllib.request.Request(f"{dashboard}/api/version", headers=headers), timeout=10
            ) as answer:
                body = answer.read()
            if b"ray_version" in body:
                return
            last = f"answer {body[:200]!r}"
        except OSError as error:  # not listening yet, or an HTTP error
            last = repr(error)
        time.sleep(1)
    raise AssertionError(f"the dashboard at {dashboard} did not answer its version in {timeout} s: {last}")


def scrape_counters(port: str, run_id: str, expected: dict, timeout: float = 60) -> dict:
    """Our counters for `run_id` on Ray's metrics endpoint, polled until they reach `expected`
    (the actors report every second here) or the timeout."""
    import re

    deadline, found = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        found = {}
        for name, labels, value in re.findall(r"^ray_ngrammys_(\w+)_total\{([^}]*)\} (\S+)$", text, re.M):
            if f'run_id="{run_id}"' in labels:
                found[name] = found.get(name, 0.0) + float(value)
        if all(found.get(name, 0) >= value for name, value in expected.items()):
            break
        time.sleep(2)
    return found
