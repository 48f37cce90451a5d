"""A multi-node OpenSearch cluster on loopback, from the cached home of
:mod:`~otelstack.opensearch_home`: the trace store of Jaeger v2 on ``jaeger-opensearch.yaml``.

Each node is a :class:`~otelstack.supervisor.Component` (its own process group, log, free HTTP
and transport ports, ``config/``, ``data/``, ``logs/``, ``tmp/`` under ``run_dir/os-<i>``), so it
can be killed and restarted by name on the same ports and data, as a pod on its volume. Started,
the cluster is green with every node in it, and, with three nodes or more, every node votes
(the last committed voting configuration lists them all): only then can it lose its elected
cluster manager and elect another. Two nodes cannot lose either (a voting configuration of
two is never used); one node is a cluster too.

OpenSearch refuses to run as root: as root each node runs in a user namespace as uid 1000
(``unshare --user``; its files are still root's). ``OTEL_TRAINING_OPENSEARCH_NICE`` runs the
nodes under ``nice`` (a shared machine). Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import opensearch_home
from ._base import LOOPBACK, StackError
from .polling import http_get, wait_until
from .ports import free_ports
from .render import clean_env
from .supervisor import Component, Supervisor

NICE_ENV = "OTEL_TRAINING_OPENSEARCH_NICE"
#: Inside the user namespace (root only), the nodes run as this uid and gid.
USERNS_ID = 1000
_BIND_FAILURES = ("BindTransportException", "BindHttpException", "Address already in use")


def userns_argv() -> list[str] | None:
    """The wrapper that keeps a node from running as root: [] when not root, None when root and no user
    namespace can be made here."""
    if os.geteuid() != 0:
        return []
    argv = ["unshare", "--user", f"--map-user={USERNS_ID}", f"--map-group={USERNS_ID}"]
    if shutil.which("unshare") is None:
        return None
    try:
        ok = subprocess.run([*argv, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return argv if ok else None


def missing_prerequisites() -> list[str]:
    """What is missing to run the cluster here (human-readable), the home's build included."""
    missing = opensearch_home.missing_prerequisites()
    if userns_argv() is None:
        missing.append("unshare --user (OpenSearch refuses root, and no user namespace can be made here)")
    return missing


@dataclass
class Node:
    name: str
    http_port: int
    transport_port: int
    proc: Component

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"


class OpenSearchCluster:
    """``nodes`` OpenSearch nodes of one cluster. A context manager; ``start()`` waits until it is whole."""

    def __init__(self, run_dir: Path | str, *, nodes: int = 3, home: Path | None = None, heap_mb: int = 256,
                 quick_jit: bool = True, startup_timeout: float = 180.0, cluster_name: str = "otel-training") -> None:
        self.run_dir = Path(run_dir).resolve()
        self.n_nodes, self.home, self.heap_mb, self.quick_jit = nodes, home, heap_mb, quick_jit
        self.startup_timeout, self.cluster_name = startup_timeout, cluster_name
        self.nodes: list[Node] = []
        self.supervisor = Supervisor(self.run_dir, startup_timeout=startup_timeout)

    def __enter__(self) -> OpenSearchCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    # -- lifecycle ------------------------------------------------------------
    def start(self, attempts: int = 3) -> OpenSearchCluster:
        if self.home is None:
            self.home = opensearch_home.ensure_home(self.run_dir / "logs" / "opensearch-build.log")
        wrapper = userns_argv()
        if wrapper is None:
            raise StackError("OpenSearch refuses to run as root and 'unshare --user' cannot make a user namespace here")
        for attempt in range(1, attempts + 1):
            self._declare(wrapper)
            try:
                self.supervisor.start()
                self.wait_whole(self.startup_timeout)
                return self
            except BaseException as exc:
                logs = "".join(n.proc.log_tail(200) for n in self.nodes)
                self.stop()
                if isinstance(exc, StackError) and attempt < attempts and any(b in logs for b in _BIND_FAILURES):
                    for node in self.nodes:  # a port taken between choosing and binding it: afresh, on fresh ports
                        shutil.rmtree(self.run_dir / node.name, ignore_errors=True)
                    continue
                if isinstance(exc, TimeoutError):
                    tail = self.nodes[0].proc.log_tail()
                    raise StackError(f"{exc}; logs under {self.run_dir / 'logs'}:\n{tail}") from None
                raise
        raise AssertionError("unreachable")

    def _declare(self, wrapper: list[str]) -> None:
        assert self.home is not None
        ports = free_ports(2 * self.n_nodes)
        names = [f"os-{i}" for i in range(self.n_nodes)]
        seeds = json.dumps([f"{LOOPBACK}:{ports[2 * i + 1]}" for i in range(self.n_nodes)])
        nice = int(os.environ.get(NICE_ENV) or 0)
        java = shutil.which("java") or "java"
        flags = [f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", "-Xss1m",
                 *(["-XX:TieredStopAtLevel=1"] if self.quick_jit else []), *opensearch_home.jvm_security_flags(),
                 "-Dfile.encoding=UTF-8", "-Djava.awt.headless=true", "-Djna.nosys=true",
                 "-XX:-OmitStackTraceInFastThrow", "-Dio.netty.noUnsafe=true", "-Dio.netty.noKeySetOptimization=true",
                 "-Dio.netty.recycler.maxCapacityPerThread=0", "-Dlog4j.shutdownHookEnabled=false",
                 "-Dlog4j2.disable.jmx=true", "-Djava.locale.providers=SPI,COMPAT",
                 "-Dopensearch.distribution.type=tar", "-Dopensearch.bundled_jdk=false"]
        self.supervisor = Supervisor(self.run_dir, startup_timeout=self.startup_timeout)
        self.nodes = []
        for i, name in enumerate(names):
            where = self.run_dir / name
            http_port, transport_port = ports[2 * i], ports[2 * i + 1]
            config = "\n".join([
                f"cluster.name: {self.cluster_name}", f"node.name: {name}", f"path.data: {where / 'data'}",
                f"path.logs: {where / 'logs'}", f"network.host: {LOOPBACK}", f"http.port: {http_port}",
                f"transport.port: {transport_port}", f"discovery.seed_hosts: {seeds}",
                f"cluster.initial_cluster_manager_nodes: {json.dumps(names)}", "bootstrap.memory_lock: false",
                "# a test cluster on a shared disk: no allocation stops at a disk watermark",
                "cluster.routing.allocation.disk.threshold_enabled: false", ""])
            argv = [*(["nice", "-n", str(nice)] if nice else []), *wrapper, java, *flags,
                    f"-Djava.io.tmpdir={where / 'tmp'}", f"-Dopensearch.path.home={self.home}",
                    f"-Dopensearch.path.conf={where / 'config'}", "-cp", f"{self.home / 'lib'}/*",
                    opensearch_home.MAIN_CLASS]
            proc = Component(name, argv, clean_env(), self.run_dir / "logs" / f"{name}.log",
                             f"http://{LOOPBACK}:{http_port}/",
                             configs={where / "config" / "opensearch.yml": config,
                                      where / "config" / "log4j2.properties": opensearch_home.LOG4J2},
                             data_dirs=(where / "data", where / "logs", where / "tmp"))
            self.supervisor.add(proc)
            self.nodes.append(Node(name, http_port, transport_port, proc))

    def stop(self, timeout: float = 20.0) -> None:
        self.supervisor.stop(timeout)

    def running(self) -> list[str]:
        return [n.name for n in self.nodes if n.proc.running()]

    # -- one node ---------------------------------------------------------------
    def kill_node(self, index: int, sig: int = signal.SIGKILL) -> None:
        self.supervisor.kill(self.nodes[index].name, sig)

    def restart_node(self, index: int) -> None:
        """Start a stopped node again on its ports and data; returns once it answers HTTP (not yet joined)."""
        self.supervisor.restart(self.nodes[index].name)

    def pause(self, sig: int = signal.SIGSTOP) -> None:
        """SIGSTOP (or SIGCONT) every node at once: a cluster that takes requests and answers none."""
        for node in self.nodes:
            if node.proc.pid is not None and node.proc.running():
                os.killpg(node.proc.pid, sig)

    # -- the cluster's API --------------------------------------------------------
    def request(self, path: str, method: str = "GET", body: Any = None, timeout: float = 10.0) -> Any:
        """The JSON answer of the first running node that answers 2xx; StackError with the last failure."""
        last = "no node running"
        for node in self.nodes:
            if not node.proc.running():
                continue
            if method == "GET" and body is None:
                try:
                    status, raw = http_get(node.url + path, timeout=timeout)
                except OSError as exc:
                    last = f"{node.name}: {exc}"
                    continue
            else:
                data = None if body is None else json.dumps(body).encode()
                req = urllib.request.Request(node.url + path, data=data, method=method,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=timeout) as resp:
                        status, raw = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    status, raw = exc.code, exc.read()
                except OSError as exc:
                    last = f"{node.name}: {exc}"
                    continue
            if 200 <= status < 300:
                return json.loads(raw) if raw else None
            last = f"{node.name}: HTTP {status} {raw[:300]!r}"
        raise StackError(f"{path}: {last}")

    def health(self) -> dict[str, Any]:
        return self.request("/_cluster/health", timeout=5.0)

    def voters(self) -> tuple[set[str], dict[str, str]]:
        """The node ids of the last committed voting configuration, and every node's id by name."""
        state = self.request("/_cluster/state/nodes,metadata?filter_path=nodes.*.name,"
                             "metadata.cluster_coordination.last_committed_config", timeout=5.0)
        ids = {info["name"]: node_id for node_id, info in state.get("nodes", {}).items()}
        return set(state["metadata"]["cluster_coordination"]["last_committed_config"]), ids

    def wait_whole(self, timeout: float) -> None:
        """Every node joined, green, and (3+ nodes) every node in the voting configuration."""
        n = len(self.nodes)
        wanted_voters = n if n % 2 else n - 1

        def whole() -> bool:
            health = self.health()
            if health["number_of_nodes"] != n or health["status"] != "green":
                return False
            voters, ids = self.voters()
            return len(ids) == n and len(voters & set(ids.values())) == wanted_voters

        wait_until(whole, timeout=timeout, interval=0.25, what=f"{n} OpenSearch nodes green, all voting")

    def wait_status(self, status: str, nodes: int, timeout: float) -> float:
        """Wait until the cluster is ``status`` with ``nodes`` nodes; the seconds it took."""
        begin = time.monotonic()

        def there() -> bool:
            health = self.health()
            return health["status"] == status and health["number_of_nodes"] == nodes

        wait_until(there, timeout=timeout, interval=0.1, what=f"OpenSearch {status} with {nodes} nodes")
        return time.monotonic() - begin

    def index_stats(self, pattern: str) -> dict[str, int]:
        """After a refresh and a flush of the indices matching ``pattern``: their documents (``_count``: spans,
        not the Lucene documents of their nested tags and logs), the store bytes of the primaries and of every
        copy, and the Lucene documents and segments of the primaries."""
        self.request(f"/{pattern}/_refresh", method="POST", timeout=60.0)
        self.request(f"/{pattern}/_flush", method="POST", timeout=60.0)
        stats = self.request(f"/{pattern}/_stats/docs,store,segments", timeout=30.0)["_all"]
        return {"docs": self.request(f"/{pattern}/_count", timeout=30.0)["count"],
                "primary_bytes": stats["primaries"]["store"]["size_in_bytes"],
                "total_bytes": stats["total"]["store"]["size_in_bytes"],
                "lucene_docs": stats["primaries"]["docs"]["count"], "segments": stats["primaries"]["segments"]["count"]}
