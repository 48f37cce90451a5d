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
import math
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ENV_PREFIX = "OTEL_TRAINING_"
ENV_CONFIG_FILE = "OTEL_TRAINING_CONFIG"


#: The longest duration any setting takes, ours or a standard ``OTEL_*`` one: longer
#: than any sensible bound on a flush, a step or a trace, and far inside what a
#: timed wait accepts (past ~292 years it raises ``OverflowError``, at exit or in
#: an exporter thread, hours after the typo).
MAX_SECONDS = 7 * 24 * 3600
#: The largest size or count (queue, batch, spans per trace): a 32-bit int, as the
#: other OpenTelemetry SDKs take; beyond it a queue is unbounded in all but name.
MAX_SIZE = 2**31 - 1
#: The largest identity number (rank, world size...): OTLP's integers are int64,
#: and a bigger one vanishes from every export.
MAX_INT64 = 2**63 - 1
#: A config file holds a few dozen options; anything bigger is the wrong file.
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the option and where it came from."""


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
    raise ValueError("expected a boolean (true/false)")


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError("expected an integer") from None
    raise ValueError("expected an integer")


def _parse_seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number of seconds, got a boolean")
    expected = f"expected a number of seconds >= 0 and <= {MAX_SECONDS} (a week)"
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        elif isinstance(value, str):
            seconds = float(value.strip())
        else:
            raise ValueError("expected a number of seconds")
    except OverflowError:  # an int beyond any float, e.g. 10**400
        raise ValueError(expected) from None
    if math.isnan(seconds) or not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(expected)
    return seconds


def _parse_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _parse_path(value: Any) -> str:
    path = _parse_str(value)
    if "\0" in path:  # the OS refuses it, with an error naming nothing
        raise ValueError("a path cannot contain a NUL character")
    return path


def _parse_str_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",")]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ValueError("expected a list of strings (or a comma-separated string)")
    if not all(isinstance(item, str) and item for item in items):
        raise ValueError("expected non-empty strings")
    return tuple(items)


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def parse_optional(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return None
        return parse(value)

    return parse_optional


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse_choice(value: Any) -> str:
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value.strip().lower()

    return parse_choice


def _non_negative(parse: Callable[[Any], int], maximum: int) -> Callable[[Any], int]:
    def parse_non_negative(value: Any) -> int:
        number = parse(value)
        if not 0 <= number <= maximum:
            raise ValueError(f"expected an integer in 0..{maximum}")
        return number

    return parse_non_negative


def _positive(parse: Callable[[Any], int], maximum: int) -> Callable[[Any], int]:
    def parse_positive(value: Any) -> int:
        number = parse(value)
        if not 0 < number <= maximum:
            raise ValueError(f"expected an integer in 1..{maximum}")
        return number

    return parse_positive


def _parse_stuck_seconds(value: Any) -> float:
    """A stuck threshold or escalation interval: at least ``MIN_THRESHOLD_S``, at most a week."""
    from otel_training.processors.stuck import MIN_THRESHOLD_S

    seconds = _parse_seconds(value)
    if seconds < MIN_THRESHOLD_S:
        raise ValueError(f"expected at least {MIN_THRESHOLD_S} s (shorter, a stuck span raises alerts every "
                         "few milliseconds)")
    return seconds


def _parse_span_rules(value: Any) -> tuple[str, ...]:
    names = _parse_str_list(value)
    from otel_training.processors.stuck import parse_span_names  # the one grammar of "name=seconds"

    rules = parse_span_names(names)  # raises ValueError naming the bad item
    for name, seconds in rules.items():
        if seconds is not None and seconds > MAX_SECONDS:
            raise ValueError(f"threshold {seconds:g} of {name!r} must be <= {MAX_SECONDS} seconds (a week)")
    return names


def _parse_signal(value: Any) -> str:
    import signal

    text = str(value).strip().upper() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    try:
        number = int(text) if text.isdigit() else None
        return signal.Signals(number).name if number is not None else signal.Signals[
            text if text.startswith("SIG") else "SIG" + text].name
    except (KeyError, ValueError):
        raise ValueError("expected a signal name or number, e.g. SIGTERM") from None


def _parse_exit_code(value: Any) -> int:
    code = _parse_int(value)
    if not 0 <= code <= 255:
        raise ValueError("expected an exit code in 0..255")
    return code


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
    Option("evaluation_is_productive", _parse_bool, False, "Count evaluation time as goodput."),
    Option("ideal_step_time_s", _optional(_parse_seconds), None,
           "Ideal step time for step-time deviation (default: mean of the normal steps)."),
)

OPTIONS_BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


def _unknown(name: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(name, OPTIONS_BY_NAME, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known options: {', '.join(OPTIONS_BY_NAME)}"
    return ConfigError(f"unknown option {name!r} in {where}{hint}")


def _check_variable_name(key: str) -> None:
    """Our variables are upper case; any other spelling would be silently ignored, so it is an error."""
    upper = key.upper()
    if not upper.startswith(ENV_PREFIX):
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
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef]
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
) -> dict[str, Any]:
    """Merge arguments, environment, file and defaults into one validated dict.

    ``config_file`` overrides ``OTEL_TRAINING_CONFIG``. Raises ``ConfigError``.
    """
    environ = os.environ if environ is None else environ
    for name in arguments:
        if name not in OPTIONS_BY_NAME:
            raise _unknown(name, "configure() arguments")
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
            value, where = arguments[option.name], f"configure({option.name}=...)"
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
