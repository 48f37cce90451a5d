"""``otel-training run [options] -- command ...``: run a program auto-instrumented.

Options become ``OTEL_TRAINING_*`` variables, a ``sitecustomize`` that
instruments at interpreter start goes first on ``PYTHONPATH`` (as
``opentelemetry-instrument`` does), and the command is exec'd: it keeps this
process, so its exit status and the signals sent to it are exactly its own.
Launchers (``torchrun``) pass the environment on, so every worker is
instrumented with its own rank, and the launcher itself is not; processes the
program starts (``torch.multiprocessing.spawn`` ranks) are traced from their
first training work on (``otel_training.integrations.auto``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

SITE_DIR = str(Path(__file__).resolve().parent.parent / "integrations" / "auto" / "_site")


def register(subparsers: Any) -> None:
    from otel_training.config.options import OPTIONS

    parser = subparsers.add_parser(
        "run",
        help="run a training command auto-instrumented (e.g. run -- torchrun --nproc-per-node 2 train.py)",
        description="Run COMMAND with PyTorch auto-instrumentation; every Python process it starts "
        "(torchrun workers included) traces to its own rank's output.",
        # The names -o takes, so nobody has to guess them (docs/configuration.md says what each does).
        epilog="options for -o (docs/configuration.md): " + ", ".join(option.name for option in OPTIONS),
    )
    parser.add_argument("--exporter", help="otlp, file, console or none (OTEL_TRAINING_EXPORTER)")
    parser.add_argument("--output-dir", help="directory of the trace files (OTEL_TRAINING_OUTPUT_DIR)")
    parser.add_argument("--service-name", help="service.name of the resource (OTEL_TRAINING_SERVICE_NAME)")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="NAME=VALUE",
                        help="any configure() option, e.g. -o stuck_threshold_s=600 (repeatable); "
                        "here offload and the watchdog are on by default: -o offload=false keeps the spans in "
                        "the training process, -o watchdog=false turns the watchdog off")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    parser.set_defaults(handler=run)


def build_environment(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """The child's environment; raises ConfigError for an unknown option or a bad value."""
    from otel_training.config import otel_env
    from otel_training.config.options import ENV_PREFIX, ConfigError, resolve
    from otel_training.integrations.auto import ENV_JOB_ID, ENV_OWNER
    from otel_training.pipeline.outputs import check_output_dir, default_exporter

    env = dict(environ)
    # Under the launcher a sidecar watchdog reports ranks that freeze or die (docs/stuck-detection.md);
    # -o watchdog=false turns it off. With offload the drain does its work (docs/offload.md).
    env.setdefault(ENV_PREFIX + "WATCHDOG", "true")
    # Offload by default where it runs: spans built, processed and exported by a drain process, nothing of
    # ours waking in the training process (docs/offload.md); -o offload=false keeps them in this process.
    offload_given = ENV_PREFIX + "OFFLOAD" in env or any(
        item.partition("=")[0].strip().lower() == "offload" for item in args.option)
    settings = [("exporter", args.exporter, "--exporter"), ("output_dir", args.output_dir, "--output-dir"),
                ("service_name", args.service_name, "--service-name")]
    for item in args.option:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--option {item!r}: expected NAME=VALUE")
        settings.append((name.strip().lower(), value, f"-o {item}"))
    given = {name: value for name, value, _ in settings if value is not None}
    # Fail here, before the job starts: a worker that cannot configure runs uninstrumented. An error names
    # what was typed (-o name=value), not the variable it is handed down in.
    options = resolve(given, {key: value for key, value in env.items()
                              if key not in {ENV_PREFIX + name.upper() for name in given}},
                      given_as={name: flag for name, value, flag in settings if value is not None})
    for name, value in given.items():
        env[ENV_PREFIX + name.upper()] = value
    if not offload_given or options["offload"] == "auto":
        from otel_training.pipeline.offload import offload_by_default

        options["offload"] = offload_by_default(options["native"])
        env[ENV_PREFIX + "OFFLOAD"] = "true" if options["offload"] else "false"
    if options["offload"]:
        from otel_training.pipeline.offload import check_offload

        check_offload(options)
    otel_env.validate(env)
    if (options["exporter"] or default_exporter(env)) == "file":
        check_output_dir(options["output_dir"])
    path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != SITE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *path])
    env.pop(ENV_OWNER, None)  # a new process tree
    env.pop(ENV_JOB_ID, None)
    return env


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("otel-training run: no command given (usage: otel-training run [options] -- COMMAND ...)",
              file=sys.stderr)
        return 2
    env = build_environment(args, dict(os.environ))
    executable = shutil.which(command[0], path=env.get("PATH"))
    if executable is None:
        print(f"otel-training run: command not found: {command[0]}", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(executable, command, env)
    return 0  # not reached
