"""The command line a new user meets first: help, version, bad numbers and unwritable outputs, without a traceback."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import goodput_traces as crafted
import pytest

from otel_training._version import __version__


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_training.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False, cwd=cwd)


def test_bare_otel_training_prints_its_help_and_version_is_a_flag() -> None:
    bare = _cli()
    assert bare.returncode == 0 and "usage: otel-training" in bare.stdout and "report" in bare.stdout
    assert bare.stderr == ""
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"otel-training {__version__}"


@pytest.mark.parametrize(("args", "option", "value"), [
    (("report", "x", "--ideal-step-time", "-1"), "--ideal-step-time", "-1"),
    (("report", "x", "--ideal-step-time", "soon"), "--ideal-step-time", "soon"),
    (("report", "--jaeger", "http://127.0.0.1:9", "--service", "s", "--limit", "-5"), "--limit", "-5"),
    (("report", "x", "--lookback", "0"), "--lookback", "0"),
    (("report", "x", "--straggler-threshold", "7"), "--straggler-threshold", "7"),
    (("demo", "--steps", "0"), "--steps", "0"),
    (("demo", "--step-time", "-1"), "--step-time", "-1"),
    (("demo", "--stuck-threshold", "nan"), "--stuck-threshold", "nan"),
])
def test_a_bad_number_is_refused_naming_the_option_and_value_before_anything_runs(
        tmp_path: Path, args: tuple[str, ...], option: str, value: str) -> None:
    result = _cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    assert f"argument {option}: must be" in result.stderr and repr(value) in result.stderr
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []  # nothing ran, nothing written


def test_unwritable_report_outputs_are_one_line_each_and_the_summary_still_prints(tmp_path: Path) -> None:
    crafted.write_otlp(tmp_path / "traces")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = _cli("report", str(tmp_path / "traces"), "--html", str(blocker / "r.html"), "--chrome",
                  str(blocker / "t.json"), "--json", str(blocker / "r.json"))
    assert result.returncode == 1
    assert "goodput: " in result.stdout and "Traceback" not in result.stderr
    for option, name in (("--html", "r.html"), ("--chrome", "t.json"), ("--json", "r.json")):
        assert f"otel-training report: {option} '{blocker / name}': cannot write it: Not a directory" in result.stderr


def test_reports_are_owner_only_as_the_traces_are(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the HTML report needs the report extra (matplotlib)")
    crafted.write_otlp(tmp_path / "traces")
    out = tmp_path / "out"
    result = _cli("report", str(tmp_path / "traces"), "--html", str(out / "r.html"), "--chrome",
                  str(out / "t.json"), "--json", str(out / "r.json"))
    assert result.returncode == 0, result.stderr
    for name in ("r.html", "t.json", "r.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name  # stacks and attributes, like the traces


@pytest.mark.parametrize(("typed", "said"), [
    ("stuck_treshold_s=5", "unknown option 'stuck_treshold_s' in -o stuck_treshold_s=5; did you mean "
                           "'stuck_threshold_s'?"),
    ("stuck_threshold_s=-3", "-o stuck_threshold_s=-3: invalid value '-3' for option 'stuck_threshold_s': expected "
                             "a number of seconds >= 0.01 and <= 604800"),
    ("stuck_threshold_s=0", "-o stuck_threshold_s=0: invalid value '0' for option 'stuck_threshold_s': expected "
                            "a number of seconds >= 0.01 and <= 604800"),
    ("stuck_threshold_s=soon", "-o stuck_threshold_s=soon: invalid value 'soon' for option 'stuck_threshold_s': "
                               "expected a number of seconds >= 0.01 and <= 604800"),
])
def test_an_option_error_names_what_was_typed_and_one_range(tmp_path: Path, typed: str, said: str) -> None:
    """``-o`` values reach the program as variables, but the error is about what the user typed; -3, 0 and
    'soon' get the one range that holds, not three different stories."""
    from environ import child_environ

    result = subprocess.run([sys.executable, "-m", "otel_training.cli.main", "run", "-o", typed, "--", "true"],
                            capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path, env=child_environ())
    assert result.returncode == 2
    assert said in result.stderr and "environment variable" not in result.stderr and "Traceback" not in result.stderr


def test_a_missing_or_empty_input_says_why_without_an_empty_summary(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for path, why in ((tmp_path / "missing", "no such file or directory"),
                      (tmp_path / "empty", "no OTLP JSON trace files")):
        result = _cli("report", str(path), "--no-html")
        assert result.returncode == 1
        assert result.stdout == ""  # not "0 spans, 0 rank(s) ... stragglers: none"
        lines = result.stderr.splitlines()
        assert lines[0].startswith(f"otel-training report: {path}: {why}"), lines
        assert lines[-1] == f"otel-training report: no spans to report on in {path}"


def test_the_demo_ends_with_a_report_command_that_works_from_where_it_ran(tmp_path: Path) -> None:
    """scripts/demo leaves otel-training in .venv/bin, which the user's PATH does not hold: the demo's last
    line names the command as it can be run, and running it works."""
    import os

    pytest.importorskip("matplotlib", reason="the demo's HTML report needs the report extra (matplotlib)")
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env["PATH"] = "/usr/bin:/bin"  # a shell outside the virtualenv
    result = subprocess.run([sys.executable, "-m", "otel_training.cli.main", "demo", "--epochs", "1", "--steps", "4",
                             "--step-time", "0.002", "--no-stuck", "--output-dir", str(tmp_path / "traces")],
                            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    hint = last.partition("(")[2].rpartition(" for more)")[0]
    command, _, rest = hint.partition(" report ")
    assert command == str(Path(sys.executable).parent / "otel-training"), last
    again = subprocess.run([command, "report", rest, "--no-html"], capture_output=True, text=True, timeout=120,
                           check=False, env=env)
    assert again.returncode == 0 and "goodput: " in again.stdout


def test_run_help_lists_every_option_name_that_o_takes() -> None:
    from otel_training.config.options import OPTIONS

    result = _cli("run", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # argparse wraps the epilog
    listed = text.partition("options for -o (docs/configuration.md): ")[2]
    assert [name.strip() for name in listed.split(",")] == [option.name for option in OPTIONS]


def test_the_readmes_own_loop_runs_as_written_and_counts_its_data_wait_as_data_loading(tmp_path: Path) -> None:
    """The README's "Instrument your own loop" snippet, run as written with small stand-ins: the wait for each
    batch is data_loading (not time outside the steps), and the evaluation and the checkpoint are there."""
    import re
    import time

    from otel_training import semconv as sc
    from otel_training.report import build_report, read_paths

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.partition("## Instrument your own loop")[2]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    snippet = snippet.replace("otel_training.configure()",
                              f"otel_training.configure(reconfigure=True, exporter='file', "
                              f"output_dir={str(tmp_path / 'traces')!r}, signal_hooks=False, exception_hooks=False)")

    class Loader:
        def __len__(self) -> int:
            return 4

        def __iter__(self):
            for index in range(4):
                time.sleep(0.05)  # the wait for data
                yield [index] * 8

    namespace = {"epochs": 2, "loader": Loader(), "train_step": lambda batch: time.sleep(0.01) or 0.5,
                 "evaluate": lambda: time.sleep(0.01), "save_checkpoint": lambda path: None,
                 "ckpt_path": str(tmp_path / "ckpt.pt")}
    exec(compile(snippet, "README.md", "exec"), namespace)
    import otel_training

    otel_training.get_telemetry().shutdown(timeout_s=10)
    report = build_report(read_paths([tmp_path / "traces"]).records)
    seconds = report.goodput.seconds
    assert seconds.get(sc.BADPUT_DATA_LOADING, 0.0) >= 8 * 0.05 * 0.9  # every batch's wait
    assert seconds.get(sc.BADPUT_HOST_OUTSIDE_STEPS, 0.0) < 0.1
    assert seconds.get(sc.BADPUT_EVALUATION, 0.0) > 0 and report.job_steps is not None
    assert report.job_steps.count == 8


RUN = """
import sys, time, otel_training
otel_training.configure(exporter="file", output_dir=sys.argv[1], offload=False)
trainer = otel_training.TrainerProcess()
with trainer.train():
    for step in range(int(sys.argv[2])):
        with trainer.step(global_step=step):
            time.sleep(0.01)
"""


def test_two_runs_into_one_directory_report_the_last_one_and_name_the_other(tmp_path: Path) -> None:
    """Issue 30 item 8: two runs into the same directory read as one job with a restart ("recovery 19.4%,
    downtime 6.5%"). A report is of the job that ran last, the others named on standard error; --all-jobs
    gives the old merged view, --job any one of them."""
    import json

    out = tmp_path / "traces"
    for steps in ("3", "5"):  # the second run has 5 steps
        done = subprocess.run([sys.executable, "-c", RUN, str(out), steps], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    result = _cli("report", str(out), "--no-html", "--json", "-")
    assert result.returncode == 0, result.stderr
    latest = json.loads(result.stdout)
    assert len(latest["job_ids"]) == 1 and latest["steps"]["job"]["count"] == 5, latest["steps"]
    (note,) = [line for line in result.stderr.splitlines() if "jobs" in line]
    assert "hold 2 jobs" in note and repr(latest["job_ids"][0]) in note and "--all-jobs" in note
    both = json.loads(_cli("report", str(out), "--no-html", "--json", "-", "--all-jobs").stdout)
    assert len(both["job_ids"]) == 2
    other = next(job for job in both["job_ids"] if job != latest["job_ids"][0])
    first = json.loads(_cli("report", str(out), "--no-html", "--json", "-", "--job", other).stdout)
    assert first["job_ids"] == [other] and first["steps"]["job"]["count"] == 3
    assert both["runs"] == 2 and latest["runs"] == first["runs"] == 1
