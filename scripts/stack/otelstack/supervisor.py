"""A generic supervisor: each process is a declared :class:`Component` (argv, environment,
log, health URL, rendered config files, data directories), started in order, waited on
until healthy, and stopped, killed or restarted by name.

Each component runs in its own process group (``start_new_session``), so signalling it
reaches its children too; stopping sends SIGTERM to every group, then SIGKILL after a
deadline. The state file records pids and argv so another process (the CLI's ``status``
and ``down``) can take over, and it never signals a pid whose command line changed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from otel_training._pids import pid_running

from ._base import StackError
from .polling import http_ok, wait_until


@dataclass
class Component:
    """One supervised process, declared: what runs, where it logs, how to tell it is up."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    health_url: str
    #: Files written (text) before every start, so a restart reads what a start read.
    configs: dict[Path, str] = field(default_factory=dict)
    #: Directories created before every start (data, queues, sinks); kept across restarts.
    data_dirs: tuple[Path, ...] = ()
    pid: int | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.pid is not None and _pid_alive(self.pid)

    def healthy(self, timeout: float = 1.0) -> bool:
        """Running and answering 200 on its health URL now."""
        if not self.running():
            return False
        try:
            return http_ok(self.health_url, timeout)
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


_pid_alive = pid_running  # the name the tests know


def _cmdline_matches(pid: int, exe: str) -> bool:
    """Whether ``pid`` still runs ``exe``: its first argument, or its second where ``exe`` is a script run by
    the interpreter its first line names (a wrapper of a release binary; it was left running by ``down``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0", 2)[:2]
    except OSError:
        return False
    return exe in (arg.decode(errors="replace") for arg in argv)


def _signal_group(c: Component, sig: int) -> None:
    if c.pid is None:
        return
    try:
        os.killpg(c.pid, sig)  # start_new_session: pgid == pid
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(c.pid, sig)


class Supervisor:
    """Components by name, in start order (stopped in reverse)."""

    def __init__(self, cwd: Path, *, startup_timeout: float = 60.0, state_file: Path | None = None) -> None:
        self.cwd = Path(cwd)
        self.startup_timeout = startup_timeout
        self.state_file = state_file
        self.components: dict[str, Component] = {}
        #: Saved with the components (e.g. the stack's ports and endpoints).
        self.meta: dict[str, object] = {}

    def add(self, *components: Component) -> None:
        for c in components:
            if c.name in self.components:
                raise StackError(f"two components named {c.name!r}")
            self.components[c.name] = c

    def __getitem__(self, name: str) -> Component:
        try:
            return self.components[name]
        except KeyError:
            raise StackError(f"no component named {name!r} (have: {', '.join(self.components)})") from None

    # -- starting -------------------------------------------------------------
    def start(self, names: Iterable[str] | None = None) -> None:
        """Spawn the named components (default: all, in order), then wait until each is healthy.

        Spawning the whole group before waiting lets its members start in parallel; a group
        that needs another one healthy first is started by a later call.
        """
        group = [self[n] for n in (self.components if names is None else names)]
        for c in group:
            self.spawn(c.name)
        for c in group:
            self.wait_healthy(c.name)

    def spawn(self, name: str) -> None:
        """Write its configs, create its directories, and start it in its own process group."""
        c = self[name]
        for d in (c.log.parent, *c.data_dirs, *(p.parent for p in c.configs)):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o700)  # the alerts sink holds stacks, and the collector writes it 0644 whatever the umask
        for path, text in c.configs.items():
            path.write_text(text)
        with open(c.log, "ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(c.argv)}\n".encode())
            log.flush()
            c.popen = subprocess.Popen(
                c.argv,
                env=c.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,  # own process group: stop() signals the group
                umask=0o077,  # what they write is the owner's alone (traces, alerts, metrics)
            )
        c.pid = c.popen.pid

    def wait_healthy(self, name: str, timeout: float | None = None) -> None:
        """Wait until it answers 200 on its health URL; a StackError with its log's tail if it exits or times out."""
        c = self[name]
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            if not c.running():
                code = c.popen.poll() if c.popen else "?"
                raise StackError(f"{c.name} exited with code {code}; log {c.log}:\n{c.log_tail()}")
            try:
                if http_ok(c.health_url):
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise StackError(
                    f"{c.name} not healthy at {c.health_url} after {timeout:.0f}s; log {c.log}:\n{c.log_tail()}"
                )
            time.sleep(0.1)

    # -- stopping -------------------------------------------------------------
    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every process group (last started first), SIGKILL what is left after ``timeout``, reap."""
        group = list(reversed(self.components.values()))
        for c in group:
            _signal_group(c, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for c in group:
            while c.running() and time.monotonic() < deadline:
                time.sleep(0.05)
            if c.running():
                _signal_group(c, signal.SIGKILL)
        for c in group:
            if c.popen is not None:
                try:
                    c.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        if self.state_file is not None and self.state_file.exists():
            self.state_file.unlink()

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send ``sig`` to one component's process group and wait for it to exit."""
        c = self[name]
        _signal_group(c, sig)
        wait_until(lambda: not c.running(), timeout=timeout, what=f"{c.name} to exit")
        if c.popen is not None:
            c.popen.wait(timeout=5)

    def restart(self, name: str) -> None:
        """(Re)start one component as declared (same argv, env, ports) and wait until it is healthy."""
        if self[name].running():
            self.kill(name, signal.SIGTERM)
        self.spawn(name)
        self.wait_healthy(name)
        if self.state_file is not None:
            self.save_state()

    # -- state ----------------------------------------------------------------
    def status(self) -> dict[str, dict[str, object]]:
        return {n: {"pid": c.pid, "binary": c.argv[0], "running": c.running(), "healthy": c.healthy(),
                    "log": str(c.log)} for n, c in self.components.items()}

    def save_state(self, **meta: object) -> None:
        """Write the state file: ``meta`` (kept for later saves) and every component's pid, argv, log, health URL."""
        if self.state_file is None:
            raise StackError("this supervisor has no state file")
        self.meta.update(meta)
        procs = {n: {"pid": c.pid, "argv": c.argv, "log": str(c.log), "health_url": c.health_url}
                 for n, c in self.components.items()}
        self.state_file.write_text(json.dumps({**self.meta, "procs": procs}, indent=2))

    @classmethod
    def from_state(cls, state_file: Path, cwd: Path) -> Supervisor:
        """The supervisor that wrote ``state_file``, as far as can be known: a pid whose command
        line is no longer the recorded binary (pids get reused) is forgotten, never signalled."""
        if not state_file.exists():
            raise StackError(f"no running stack recorded in {state_file}")
        state = json.loads(state_file.read_text())
        sup = cls(cwd, state_file=state_file)
        sup.meta = {k: v for k, v in state.items() if k != "procs"}
        for n, d in state["procs"].items():
            c = Component(n, d["argv"], {}, Path(d["log"]), d["health_url"], pid=d["pid"])
            if c.pid and not _cmdline_matches(c.pid, c.argv[0]):
                c.pid = None
            sup.add(c)
        return sup
