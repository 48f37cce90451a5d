"""The options of ``configure()``, and how they are resolved.

Every option has one declaration here (its type, default and meaning), and is
read from, in order of precedence: the ``configure()`` argument, the
``OTEL_TRAINING_<OPTION>`` environment variable, the config file named by
``OTEL_TRAINING_CONFIG`` (JSON, or TOML), then the default. Bad input raises
``ConfigError`` before training starts and names where the bad value came from,
because a typo found after an hour of training costs an hour of a cluster.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from otel_training.config.parsers import (
    MAX_INT64,
    MAX_SIZE,
    _choice,
    _non_negative,
    _optional,
    _parse_bool,
    _parse_bool_or_auto,
    _parse_exit_code,
    _parse_int,
    _parse_path,
    _parse_seconds,
    _parse_signal,
    _parse_span_rules,
    _parse_str,
    _parse_stuck_seconds,
    _positive,
)
from otel_training.config.parsers import ConfigError as ConfigError  # re-exported: callers import it from here

ENV_PREFIX = "OTEL_TRAINING_"
ENV_CONFIG_FILE = "OTEL_TRAINING_CONFIG"
#: A config file holds a few dozen options; anything bigger is the wrong file.
MAX_CONFIG_BYTES = 1 << 20


#: The GPU state sampler's shortest interval: NVML's reads take up to milliseconds, and a faster sampler
#: shows nothing a step span's own timing does not (docs/gpu-state.md).
MIN_GPU_STATE_INTERVAL_S = 0.1


def _parse_gpu_state_interval(value: Any) -> float:
    expected = f"expected 0 (off) or a number of seconds >= {MIN_GPU_STATE_INTERVAL_S}"
    try:
        seconds = _parse_seconds(value)
    except ValueError as error:
        raise ValueError(f"{expected}: {error}") from None
    if 0 < seconds < MIN_GPU_STATE_INTERVAL_S:
        raise ValueError(expected)
    return seconds


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


_UNSET = object()

#: The declaration of every option. docs/configuration.md is generated from it
#: (see ``otel_training.config.options.markdown_table``) and checked by a test.
OPTIONS: tuple[Option, ...] = (
    # Where the telemetry goes.
    Option("exporter", _optional(_choice("otlp", "file", "console", "none")), None,
           'Span exporter: "otlp", "file", "console" or "none". Default: "otlp" when '
           "OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, else \"file\"."),
    Option("output_dir", _parse_path, "./otel-traces",
           "Directory of the file exporter: traces-r<rank>.jsonl and metrics-r<rank>.jsonl (OTLP JSON Lines)."),
    Option("service_name", _optional(_parse_str), None,
           'service.name when OTEL_SERVICE_NAME is not set. Default "training".'),
    Option("set_global", _parse_bool, True,
           "Install the providers as OpenTelemetry's global ones (first configure only)."),
    Option("metrics", _parse_bool, True, "Set up a MeterProvider exporting like the traces."),
    Option("span_queue_policy", _choice("wait", "drop"), "wait",
           'When the batch span queue is full: "wait" for the exporter while it is making progress (at most '
           '`span_queue_max_wait_s` a span; against a failing or hung exporter it drops), or "drop" the oldest span '
           "at once as the SDK does. Either way every span dropped is counted "
           "([Delivery guarantees](#delivery-guarantees))."),
    Option("spool_dir", _optional(_parse_path), None,
           "With the otlp exporter: spool what the collector could not take (failed exports, and what is still "
           "queued at exit) to spool-r<rank>-<pid>.jsonl here, OTLP JSON Lines that `otel-training report` reads "
           "and `otel-training spool send` posts to a collector later. Off by default "
           "([Delivery guarantees](#delivery-guarantees))."),
    Option("spool_max_mb", _positive(_parse_int, MAX_SIZE), 1024,
           "Bound of each process's spool file, in MiB; past it undelivered spans are dropped and counted."),
    Option("span_queue_max_wait_s", _parse_seconds, 0.5,
           "Bound on one wait for room in a full span queue (`span_queue_policy` \"wait\")."),
    Option("values_hold_s", _parse_seconds, 30.0,
           "How long an ended span waits for export for the values logged in it that were still being read (a "
           "one-element device tensor, read once its device work is done; docs/trace-layout.md#logged-values); past it the "
           "span is exported without them, saying how many are missing (`training.values.unresolved`)."),
    Option("offload", _parse_bool_or_auto, "auto",
           "Build, process and export spans in a drain process: this process only writes records to shared "
           "memory, about 1 µs a span instead of 20-40 µs and no thread of ours holding its GIL; the drain also "
           "does the stuck detector's and the watchdog's work. Linux (x86-64; aarch64 with the C extension). "
           "\"auto\" (the default): wherever it runs, except with the console exporter; false keeps spans, "
           "your own span processors and the stuck detector's callbacks in this process "
           "([offload.md](offload.md))."),
    Option("native", _choice("auto", "on", "off"), "auto",
           'The offload path\'s core: "auto" takes the C extension built with the package and falls back to pure '
           'Python, saying so once in the log, where it did not build or load; "on" requires it (refused before '
           'training without it); "off" forces the fallback ([offload.md](offload.md#native-core)).'),
    Option("offload_ring_mb", _positive(_parse_int, 4096), 16,
           "Size of the offload ring in MiB (a step's two records take about 260 bytes: 16 MiB hold six seconds of "
           "10 000 steps/s while the drain is behind)."),
    # Who is emitting: explicit values override what is detected from the launcher.
    Option("role", _choice("trainer", "agent", "master"), "trainer", "training.role of this process."),
    Option("job_id", _optional(_parse_str), None, "training.job.id (default: from torchrun/Slurm/DLRover)."),
    Option("run_id", _optional(_parse_str), None, "training.run.id, one launch attempt (default: derived)."),
    Option("rank", _optional(_non_negative(_parse_int, MAX_INT64)), None,
           "training.rank (default: RANK / SLURM_PROCID)."),
    Option("local_rank", _optional(_non_negative(_parse_int, MAX_INT64)), None, "training.local_rank."),
    Option("world_size", _optional(_positive(_parse_int, MAX_INT64)), None, "training.world_size."),
    Option("node_rank", _optional(_non_negative(_parse_int, MAX_INT64)), None, "training.node.rank."),
    Option("restart_count", _optional(_non_negative(_parse_int, MAX_INT64)), None, "training.restart.count."),
    # Continual training lineage, stamped on every span.
    Option("pipeline_id", _optional(_parse_str), None, "training.pipeline.id on every span."),
    Option("trigger_id", _optional(_parse_str), None, "training.trigger.id on every span."),
    Option("trigger_training_id", _optional(_parse_str), None, "training.trigger.training_id on every span."),
    # Trace layout.
    Option("trace_max_spans", _positive(_parse_int, MAX_SIZE), 10_000,
           "Spans per trace before a long-lived span (train, epoch) continues in a new, linked trace."),
    Option("trace_max_age_s", _parse_seconds, 3600.0,
           "Age of a trace before a long-lived span continues in a new, linked trace."),
    # Failure handling.
    Option("exception_hooks", _parse_bool, True,
           "Record uncaught exceptions (sys/threading excepthook), end open spans as ERROR, flush."),
    Option("signal_hooks", _parse_bool, True,
           "Record termination signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGABRT), end open spans, flush; on "
           "Linux a small helper process makes sure the signal still kills a rank that holds the GIL "
           "([Delivery guarantees](#delivery-guarantees))."),
    Option("exit_timeout_s", _parse_seconds, 2.0,
           "Bound on the way out: the flushes at process exit, on a fatal signal and on an uncaught exception "
           "share it (an exception's flush and the exit-time shutdown after it take `exit_timeout_s` together, "
           "not each)."),
    # DLRover-compatible event log.
    Option("dlrover_log", _optional(_parse_path), None,
           "Write a DLRover-format event log to this file (BEGIN at span start, END at span end)."),
    Option("dlrover_log_format", _choice("text", "json"), "text", 'DLRover log line format: "text" or "json".'),
    Option("dlrover_log_queue_size", _positive(_parse_int, MAX_SIZE), 8192,
           "Bound of the DLRover log writer queue; lines past it are dropped and counted."),
    # Stuck-step detection (see docs/stuck-detection.md).
    Option("stuck_threshold_s", _optional(_parse_stuck_seconds), None,
           "Alert when a watched span stays open longer than this. Unset and not adaptive: detection off."),
    Option("stuck_span_names", _parse_span_rules, ("training.step",),
           'Span names (or fnmatch patterns, optionally "name=seconds") the stuck detector watches.'),
    Option("stuck_adaptive", _parse_bool, False, "Learn each watched span name's threshold from its history."),
    Option("stuck_action", _choice("none", "exit", "signal"), "none",
           'What to do on a stuck alert besides reporting it: "none", "exit" or "signal".'),
    Option("stuck_exit_code", _parse_exit_code, 75, 'Exit code of the "exit" stuck action.'),
    Option("stuck_signal", _parse_signal, "SIGTERM", 'Signal sent to the process by the "signal" stuck action.'),
    Option("stuck_escalation_s", _optional(_parse_stuck_seconds), None,
           "Repeat the stuck alert every this many seconds while the span stays open (default: the threshold)."),
    Option("watchdog", _parse_bool, False,
           "Start a sidecar watchdog process that reports frozen (GIL held) or killed training processes."),
    # Goodput (see docs/goodput.md).
    Option("goodput", _parse_bool, True, "Derive goodput/badput and step-time metrics from spans."),
    Option("device_timeline", _parse_bool, True,
           "Time steps on the accelerator's timeline (CUDA events) when torch uses CUDA; false: host timing only."),
    Option("collective_tracking", _choice("auto", "hooks", "sequence", "off"), "auto",
           'How the torch instrumentor follows each process group\'s collectives for the hang verdict: "hooks" '
           "(torch's ProcessGroup pre/post hooks, newer torch), \"sequence\" (torch's per-group sequence number, "
           'read at step ends, alerts and gauges: every torch with torch.distributed), "auto" the first this torch '
           'has, "off" none. The rank says once in its log which it took ([hang-diagnosis.md]'
           "(hang-diagnosis.md#which-torch-which-route))."),
    Option("device_events", _choice("torch", "torch.cuda"), "torch",
           "CUDA events that time device steps: torch.Event (recorded on the current stream from C++) or "
           "torch.cuda.Event (builds a Python Stream for each record; a fallback)."),
    Option("evaluation_is_productive", _parse_bool, False, "Count evaluation time as goodput."),
    Option("ideal_step_time_s", _optional(_parse_seconds), None,
           "Ideal step time for step-time deviation (default: mean of the normal steps)."),
    # The GPU's own state (see docs/gpu-state.md).
    Option("gpu_state_interval_s", _parse_gpu_state_interval, 1.0,
           "Seconds between samples of the rank's GPU through NVML (the `gpu` extra), in the drain process "
           "(offload only); 0: off, else at least 0.1 ([gpu-state.md](gpu-state.md))."),
)

OPTIONS_BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


def _unknown(name: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(name, OPTIONS_BY_NAME, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known options: {', '.join(OPTIONS_BY_NAME)}"
    return ConfigError(f"unknown option {name!r} in {where}{hint}")


#: Variables of the project's own tools, not options of ``configure()``: the native stack's binaries, cache and
#: webhook, its gateway collector's settings, the test command's passes. Exported in the shell a job is started
#: from, they must not stop training as unknown options (issue 30).
TOOL_VARIABLES = frozenset({
    "OTEL_TRAINING_JAEGER_BIN", "OTEL_TRAINING_OTELCOL_BIN", "OTEL_TRAINING_CACHE", "OTEL_TRAINING_WEBHOOK_URL",
    "OTEL_TRAINING_JAEGER_MODULE_VERSION", "OTEL_TRAINING_TEST_PATHS", "OTEL_TRAINING_SAMPLE_PERCENT",
    "OTEL_TRAINING_DECISION_WAIT", "OTEL_TRAINING_SLOW_STEP_NS",
})


def _check_variable_name(key: str) -> None:
    """Our variables are upper case; any other spelling would be silently ignored, so it is an error."""
    upper = key.upper()
    if not upper.startswith(ENV_PREFIX) or key in TOOL_VARIABLES:
        return
    if upper.startswith(ENV_PREFIX + "_"):
        # OTEL_TRAINING__* (double underscore) is reserved for the library's own plumbing
        # between processes (launcher, watchdog) and is not an option; an option's name
        # there is a typo that would be silently ignored.
        name = upper[len(ENV_PREFIX) + 1:].lower()
        if name in OPTIONS_BY_NAME:
            raise ConfigError(f"environment variable {key}: OTEL_TRAINING__ (two underscores) is reserved for "
                              f"the library's own use, and this option would be ignored; did you mean "
                              f"{ENV_PREFIX}{name.upper()}?")
        return
    name = key[len(ENV_PREFIX):].lower()
    if upper != ENV_CONFIG_FILE and name not in OPTIONS_BY_NAME:
        raise _unknown(name, f"environment variable {key}")
    if key != upper:
        raise ConfigError(f"environment variable {key}: variable names are upper case, and this one would be "
                          f"ignored; did you mean {upper}?")


def _read_config_bytes(path: str) -> bytes:
    """The file's bytes, refusing what is no config file rather than blocking configure() on it.

    Opening a FIFO waits for a writer and reading a device or a mistaken
    checkpoint path may not end: only a regular file of a sane size is read.
    """
    # O_NONBLOCK: a FIFO would block the open itself; a regular file ignores the flag.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ConfigError(f"{ENV_CONFIG_FILE}={path!r}: not a regular file")
    with open(descriptor, "rb") as file:
        raw = file.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{ENV_CONFIG_FILE}={path!r}: larger than 1 MiB, which no config file is")
    return raw


def _load_file(path: str) -> dict[str, Any]:
    """Read the config file; any problem is a ConfigError naming the file."""
    file = Path(path)
    try:
        raw = _read_config_bytes(path)
    except OSError as error:
        raise ConfigError(f"{ENV_CONFIG_FILE}={path!r}: cannot read the config file: {error.strerror or error}") from None
    except ValueError as error:  # an embedded NUL
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{ENV_CONFIG_FILE}={path!r}: cannot read the config file: {error}") from None
    try:
        if file.suffix.lower() == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # Python 3.10
                import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]  # tomli: the 3.10-only dependency, absent where mypy runs on 3.11
            data = tomllib.loads(raw.decode("utf-8"))
        else:
            data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path!r} is malformed: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r}: expected a table/object of options, got {type(data).__name__}")
    return data


def resolve(
    arguments: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
    *,
    given_as: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Merge arguments, environment, file and defaults into one validated dict.

    ``config_file`` overrides ``OTEL_TRAINING_CONFIG``. ``given_as``: how the user wrote each argument, for the
    error (``otel-training run``'s ``-o name=value``); ``configure(name=...)`` by default. Raises ``ConfigError``.
    """
    environ = os.environ if environ is None else environ
    given_as = given_as or {}
    for name in arguments:
        if name not in OPTIONS_BY_NAME:
            raise _unknown(name, given_as.get(name, "configure() arguments"))
    path = config_file or environ.get(ENV_CONFIG_FILE) or None
    file_values: dict[str, Any] = {}
    if path:
        file_values = _load_file(path)
        for name in file_values:
            if name not in OPTIONS_BY_NAME:
                raise _unknown(name, f"config file {path!r}")
    for key in environ:
        _check_variable_name(key)

    resolved: dict[str, Any] = {}
    for option in OPTIONS:
        if option.name in arguments:
            value, where = arguments[option.name], given_as.get(option.name, f"configure({option.name}=...)")
        elif option.env in environ:
            value, where = environ[option.env], f"environment variable {option.env}"
        elif option.name in file_values:
            value, where = file_values[option.name], f"config file {path!r}, key {option.name!r}"
        else:
            resolved[option.name] = option.default
            continue
        try:
            resolved[option.name] = option.parse(value)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{where}: invalid value {value!r} for option {option.name!r}: {error}") from None
    return resolved


def markdown_table() -> str:
    """The configuration table of the docs, generated so it cannot drift."""
    lines = ["| option | environment variable | default | meaning |", "|---|---|---|---|"]
    for option in OPTIONS:
        default = option.default
        if isinstance(default, tuple):
            default = ",".join(default)
        lines.append(f"| `{option.name}` | `{option.env}` | `{default}` | {option.help} |")
    return "\n".join(lines) + "\n"
