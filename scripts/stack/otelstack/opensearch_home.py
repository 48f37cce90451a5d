"""An OpenSearch home (``lib/`` and three modules) laid out from Maven artifacts, built once and
cached like the Go builds: ``<cache>/opensearch/opensearch-<version>-<hash>/``, where the hash
covers everything written here (artifacts, plugin descriptors, security policies), under a lock
(``<cache>/build-opensearch.lock``) so concurrent runs build it once.

OpenSearch publishes its server and its modules to Maven, not a whole distribution: ``mvn
dependency:copy-dependencies`` on a generated pom fetches the server and its libraries (``lib/``),
and one pom per module its jars, less those ``lib/`` (or the module it extends) already has. The
modules' jars carry no ``plugin-descriptor.properties``: written here, with the security policies
of OpenSearch's sources. Three modules are enough for Jaeger: the HTTP and transport layer
(transport-netty4), Painless (lang-painless) and the analyzers Jaeger's mappings use
(analysis-common, which extends Painless). Needs ``java`` (11 to 23: OpenSearch 2.x runs under a
security manager) and, for the build only, ``mvn``; about 45 MB, 15 s with a warm Maven cache.

    python scripts/stack/stack.py build-opensearch
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from ._base import StackError, cache_dir

VERSION = "2.19.6"
#: The server, and what its pom leaves optional but a node needs (logging, geo shapes, module class loaders).
CORE = (("org.opensearch", "opensearch", VERSION), ("org.apache.logging.log4j", "log4j-core", "2.25.4"),
        ("org.locationtech.spatial4j", "spatial4j", "0.7"), ("org.locationtech.jts", "jts-core", "1.15.0"),
        ("org.opensearch", "opensearch-plugin-classloader", VERSION))


@dataclass(frozen=True)
class Module:
    name: str
    artifact: tuple[str, str, str]
    classname: str
    extends: tuple[str, ...] = ()
    policy: str = ""


#: In load order: a module after the one it extends. Policies: OpenSearch's plugin-security.policy of each.
MODULES = (
    Module("transport-netty4", ("org.opensearch.plugin", "transport-netty4-client", VERSION),
           "org.opensearch.transport.Netty4Plugin", policy="""grant {
  // reading the system's backlog of established sockets
  permission java.io.FilePermission "/proc/sys/net/core/somaxconn", "read";
  // netty makes and accepts socket connections
  permission java.net.SocketPermission "*", "accept,connect";
  // netty sets its own context class loader on some of its threads
  permission java.lang.RuntimePermission "*", "setContextClassLoader";
  permission java.lang.RuntimePermission "getClassLoader";
  // NioEventLoop (JDK-6427854)
  permission java.util.PropertyPermission "sun.nio.ch.bugLevel", "write";
};
"""),
    Module("lang-painless", ("org.opensearch.plugin", "lang-painless", VERSION),
           "org.opensearch.painless.PainlessPlugin", policy="""grant {
  // generates runtime classes
  permission java.lang.RuntimePermission "createClassLoader";
  // finds the class loader of allowlisted classes
  permission java.lang.RuntimePermission "getClassLoader";
};
"""),
    Module("analysis-common", ("org.opensearch.plugin", "analysis-common", VERSION),
           "org.opensearch.analysis.common.CommonAnalysisPlugin", extends=("lang-painless",)),
)
#: A console-only logging configuration (each node's log is its process's output, as the stack's others are).
LOG4J2 = """status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d{ISO8601}][%-5p][%-25c{1.}] [%node_name]%marker %m%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
"""
MAIN_CLASS = "org.opensearch.bootstrap.OpenSearch"
#: OpenSearch 2.x installs a security manager: Java 18+ asks for permission, Java 24 removed it.
JAVA_RANGE = (11, 23)


def _spec_hash() -> str:
    spec = {"version": VERSION, "pom": _pom("core", CORE), "modules": [asdict(m) for m in MODULES],
            "descriptors": [_descriptor(m) for m in MODULES], "log4j2": LOG4J2}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def home_path() -> Path:
    """Where the home of this spec is (or will be) cached."""
    return cache_dir() / "opensearch" / f"opensearch-{VERSION}-{_spec_hash()}"


def java_major(java: str | None = None) -> int | None:
    """The major version of ``java`` (default: the one on PATH), or None when there is none."""
    java = java or shutil.which("java")
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def missing_prerequisites() -> list[str]:
    """What is missing to build (when not cached) and run OpenSearch here, as human-readable reasons."""
    missing = []
    major = java_major()
    if major is None:
        missing.append("java (a JDK or JRE 11-23, Debian package 'default-jre-headless': runs OpenSearch)")
    elif not JAVA_RANGE[0] <= major <= JAVA_RANGE[1]:
        missing.append(f"java {JAVA_RANGE[0]}-{JAVA_RANGE[1]} (found {major}: OpenSearch {VERSION} needs a "
                       "security manager)")
    if not (home_path() / "lib").is_dir() and shutil.which("mvn") is None:
        missing.append("mvn (Debian package 'maven': fetches OpenSearch's artifacts once, scripts/setup --all)")
    return missing


def _pom(name: str, artifacts: tuple[tuple[str, str, str], ...]) -> str:
    deps = "".join(f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                   "</dependency>\n" for g, a, v in artifacts)
    return ("<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n  <modelVersion>4.0.0</modelVersion>\n"
            f"  <groupId>local.otel-training</groupId><artifactId>{name}</artifactId><version>1</version>\n"
            f"  <packaging>pom</packaging>\n  <dependencies>\n{deps}  </dependencies>\n</project>\n")


def _copy_dependencies(work: Path, name: str, artifacts: tuple[tuple[str, str, str], ...], log) -> Path:
    """The jars of ``artifacts`` and their dependencies, copied by Maven into ``work/name/jars``."""
    where = work / name
    where.mkdir(parents=True)
    (where / "pom.xml").write_text(_pom(name, artifacts))
    argv = ["nice", "-n", "19", "mvn", "-B", "-q", "-Dstyle.color=never", "dependency:copy-dependencies",
            "-DoutputDirectory=jars"]
    log.write(f"[opensearch] {name}: {' '.join(argv)}\n".encode())
    log.flush()
    proc = subprocess.run(argv, cwd=where, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise StackError(f"mvn dependency:copy-dependencies for {name} failed with exit code {proc.returncode}")
    return where / "jars"


def _descriptor(m: Module) -> str:
    return "\n".join([f"description={m.name} (OpenSearch module, laid out from Maven artifacts)", f"version={VERSION}",
                      f"name={m.name}", f"classname={m.classname}", "java.version=11", f"opensearch.version={VERSION}",
                      f"extended.plugins={','.join(m.extends)}", "has.native.controller=false", ""])


def _lay_out(work: Path, home: Path, log) -> None:
    lib = home / "lib"
    shutil.copytree(_copy_dependencies(work, "core", CORE, log), lib)
    for sub in ("bin", "plugins", "config"):
        (home / sub).mkdir()
    (home / "config" / "log4j2.properties").write_text(LOG4J2)
    for m in MODULES:
        jars = _copy_dependencies(work, f"module-{m.name}", (m.artifact,), log)
        have = {p.name for p in lib.iterdir()}
        for extended in m.extends:
            have |= {p.name for p in (home / "modules" / extended).iterdir()}
        target = home / "modules" / m.name
        target.mkdir(parents=True)
        for jar in sorted(jars.glob("*.jar")):
            if jar.name not in have:
                shutil.copy2(jar, target / jar.name)
        if not (target / f"{m.artifact[1]}-{VERSION}.jar").is_file():
            raise StackError(f"Maven did not fetch {':'.join(m.artifact)}")
        (target / "plugin-descriptor.properties").write_text(_descriptor(m))
        if m.policy:
            (target / "plugin-security.policy").write_text(m.policy)


def check_home(home: Path, java: str = "java") -> str:
    """``OpenSearch --version`` of ``home`` (the server's classes load on this Java), or a StackError."""
    argv = [java, "-Xmx64m", "-XX:+UseSerialGC", *jvm_security_flags(), f"-Dopensearch.path.home={home}",
            f"-Dopensearch.path.conf={home / 'config'}", "-cp", f"{home / 'lib'}/*", MAIN_CLASS, "--version"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("Version:")), "")
    if proc.returncode != 0 or VERSION not in line:
        raise StackError(f"the OpenSearch home {home} does not run: {(proc.stdout + proc.stderr)[-1500:]}")
    return line


def jvm_security_flags(major: int | None = None) -> list[str]:
    """Java 18+ refuses a security manager unless allowed (OpenSearch's own jvm.options does the same)."""
    major = java_major() if major is None else major
    return ["-Djava.security.manager=allow"] if major is not None and major >= 18 else []


def ensure_home(log_path: Path | None = None) -> Path:
    """The cached OpenSearch home, built first when missing (a StackError naming the log if that fails)."""
    home = home_path()
    if (home / "lib").is_dir():
        return home
    missing = missing_prerequisites()
    if missing:
        raise StackError("cannot build the OpenSearch home, missing: " + "; ".join(missing))
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    log_path = log_path or root / "logs" / "opensearch-build.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(root / "build-opensearch.lock", "w") as lock, open(log_path, "ab") as log:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent run builds it: wait, then find it built
        if (home / "lib").is_dir():
            return home
        work = root / "build" / f"{home.name}.{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        staged = work / "home"
        try:
            _lay_out(work, staged, log)
            log.write(f"[opensearch] {check_home(staged)}\n".encode())
            home.parent.mkdir(parents=True, exist_ok=True)
            staged.rename(home)  # atomic: a home is whole or absent
        except StackError as exc:
            raise StackError(f"{exc}; see {log_path}") from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return home
