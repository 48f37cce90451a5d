"""``compat.dlrover.config``: DLRover's ``DLROVER_EVENT_*`` variables and JSON file, read as DLRover reads them.

The expectations are what DLRover's ``Config`` promises its users: eight
settings with DLRover's defaults, typed by DLRover's rules (its spellings of a
boolean, an integer or a string of one), read from the defaults, then a JSON
file, then the environment, each later one winning. Beyond DLRover: input it
would silently drop, or raise on at import, is ignored or replaced by the
default *and logged once*, naming the variable or file and the value, and never
raises into the program.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_training import _contain
from otel_training.compat import dlrover
from otel_training.compat.dlrover.config import (
    ENV_PREFIX,
    Config,
    get_env_key,
    is_dlrover_event_enabled,
    parse_bool,
    parse_int,
    parse_str,
)

#: DLRover's settings, their variables and their defaults.
DEFAULTS: dict[str, Any] = {
    "event_exporter": "TEXT_FILE", "async_exporter": False, "queue_size": 1024, "file_dir": "/tmp/dlrover",
    "text_formatter": "LOG", "enable": True, "debug_mode": False, "hook_error": False,
}
#: A value other than the default for each setting.
OTHERS: dict[str, Any] = {
    "event_exporter": "CONSOLE", "async_exporter": True, "queue_size": 64, "file_dir": "/var/log/events",
    "text_formatter": "JSON", "enable": False, "debug_mode": True, "hook_error": True,
}


def settings(config: Config) -> dict[str, Any]:
    return {key: getattr(config, key) for key in DEFAULTS}


@pytest.fixture
def no_spans(configure: Callable[..., Any]) -> None:
    """Spans go nowhere (not to the embedded default's ./otel-traces) in a test that emits an event."""
    configure(exporter="none")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No DLROVER_EVENT_* from the developer's shell, warnings logged afresh; the process's Config rebuilt after."""
    for name in list(os.environ):
        if name.startswith("DLROVER_EVENT_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(_contain, "_seen", set())
    yield
    monkeypatch.undo()
    dlrover._reset()
    dlrover.close_default_exporter()


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The otel_training warnings logged so far."""
    caplog.set_level(logging.WARNING, logger="otel_training")
    return lambda: [record.getMessage() for record in caplog.records if record.name == "otel_training"]


def write_json(path: Path, content: Any) -> Path:
    path.write_text(json.dumps(content), encoding="utf-8")
    return path


# -- names, defaults and types ------------------------------------------------
def test_dlrovers_variable_names_and_defaults_with_nothing_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ENV_PREFIX == "DLROVER_EVENT"
    assert get_env_key("event_exporter") == "DLROVER_EVENT_EVENT_EXPORTER"
    assert get_env_key("queue_size") == "DLROVER_EVENT_QUEUE_SIZE"
    config = Config()
    assert settings(config) == DEFAULTS
    assert (config.rank, config.pid) == ("0", str(os.getpid()))
    monkeypatch.setenv("RANK", "5")
    assert Config().rank == "5"
    monkeypatch.setenv("RANK", "")
    assert Config().rank == "empty"


@pytest.mark.parametrize("spelling", ["true", "1", "yes", "y", "on", "enable", "enabled", "TRUE", "Yes", " on "])
def test_every_dlrover_spelling_of_true(spelling: str) -> None:
    assert parse_bool(spelling) is True


@pytest.mark.parametrize("spelling", ["false", "0", "no", "n", "off", "disable", "disabled", "False", "OFF"])
def test_every_dlrover_spelling_of_false(spelling: str) -> None:
    assert parse_bool(spelling) is False


def test_what_is_not_a_boolean_an_integer_or_a_string_is_none() -> None:
    assert parse_bool(True) is True and parse_bool(False) is False
    assert [parse_bool(value) for value in ("maybe", "", 1, 0, None, [])] == [None] * 6
    assert [parse_int(value) for value in ("2048", " -1 ", 7, "0")] == [2048, -1, 7, 0]
    assert [parse_int(value) for value in ("12x", "1.5", "", 3.0, True, None, [1])] == [None] * 7
    assert parse_str("TEXT_FILE") == "TEXT_FILE" and parse_str("123") == "123"
    assert [parse_str(value) for value in (123, True, None, ["a"], {"a": 1})] == [None] * 5


# -- where the values come from ---------------------------------------------------
def test_every_variable_is_read_and_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    spelled = {"event_exporter": "CONSOLE", "async_exporter": "Yes", "queue_size": " 64 ",
               "file_dir": "/var/log/events", "text_formatter": "JSON", "enable": "off", "debug_mode": "on",
               "hook_error": "1"}
    for key, value in spelled.items():
        monkeypatch.setenv(get_env_key(key), value)
    config = Config()
    assert settings(config) == OTHERS
    assert config.origin("queue_size") == "DLROVER_EVENT_QUEUE_SIZE"


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in DEFAULTS:
        monkeypatch.setenv(get_env_key(key), "")
    assert settings(Config()) == DEFAULTS


def test_the_file_sets_every_setting_and_a_variable_beats_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_json(tmp_path / "events.json", OTHERS)
    assert settings(Config(path)) == OTHERS
    assert settings(Config(str(path))) == OTHERS
    monkeypatch.setenv("DLROVER_EVENT_QUEUE_SIZE", "32")
    monkeypatch.setenv("DLROVER_EVENT_ENABLE", "yes")
    config = Config(path)
    assert settings(config) == {**OTHERS, "queue_size": 32, "enable": True}
    assert config.origin("queue_size") == "DLROVER_EVENT_QUEUE_SIZE"
    assert config.origin("file_dir") == f"'file_dir' in {path}"
    assert config.origin("debug_mode") == f"'debug_mode' in {path}"
    assert settings(Config()) == {**DEFAULTS, "queue_size": 32}  # the file only when given


def test_file_values_may_be_dlrovers_strings_and_null_is_unset(tmp_path: Path) -> None:
    path = write_json(tmp_path / "events.json",
                      {"queue_size": "16", "enable": "off", "hook_error": "Enabled", "file_dir": None})
    assert settings(Config(path)) == {**DEFAULTS, "queue_size": 16, "enable": False, "hook_error": True}


def test_the_process_config_is_made_once_from_its_first_arguments(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Config, "_instance", None)
    first = Config.singleton_instance(write_json(tmp_path / "events.json", {"enable": False}))
    assert first.enable is False and is_dlrover_event_enabled() is False
    assert Config.singleton_instance() is first and Config.singleton_instance(config_file=None) is first
    first.enable = True
    assert is_dlrover_event_enabled() is True


# -- bad input: ignored as DLRover does, and said once ---------------------------
def test_a_bad_value_is_ignored_and_logged_once_naming_where_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings: Callable[[], list[str]]) -> None:
    path = write_json(tmp_path / "events.json", {"queue_size": 64, "file_dir": 5, "hook_error": "sometimes"})
    monkeypatch.setenv("DLROVER_EVENT_QUEUE_SIZE", "12x")
    monkeypatch.setenv("DLROVER_EVENT_ENABLE", "maybe")
    for _ in range(3):
        config = Config(path)
        # The value before the bad one stays: the file's queue size, the defaults for the others.
        assert settings(config) == {**DEFAULTS, "queue_size": 64}
    logged = warnings()
    assert len(logged) == 4, logged
    for place, value in (("DLROVER_EVENT_QUEUE_SIZE", "'12x'"), ("DLROVER_EVENT_ENABLE", "'maybe'"),
                         (f"'file_dir' in {path}", "5"), (f"'hook_error' in {path}", "'sometimes'")):
        assert sum(f"{place} is {value}, not " in message for message in logged) == 1, (place, logged)
    assert any("queue_size stays 64" in message for message in logged)


@pytest.mark.parametrize("content", [None, b"{not json", b'["a list"]', b'{"queue_size": "\xff"}', "directory"])
def test_a_file_that_cannot_be_used_is_logged_and_the_environment_still_applies(
        content: bytes | str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        warnings: Callable[[], list[str]]) -> None:
    path = tmp_path / "events.json"
    if content == "directory":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    monkeypatch.setenv("DLROVER_EVENT_QUEUE_SIZE", "8")
    assert settings(Config(path)) == {**DEFAULTS, "queue_size": 8}
    (message,) = warnings()
    assert str(path) in message and "ignored" in message


def test_a_name_dlrover_does_not_read_is_ignored_with_a_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings: Callable[[], list[str]]) -> None:
    monkeypatch.setenv("DLROVER_EVENT_EXPORTER", "CONSOLE")  # DLRover's is DLROVER_EVENT_EVENT_EXPORTER
    path = write_json(tmp_path / "events.json", {"queue_sise": 5, "rank": "7"})
    config = Config(path)
    assert settings(config) == DEFAULTS and config.rank == "0"
    logged = warnings()
    assert len(logged) == 3, logged
    assert any("DLROVER_EVENT_EXPORTER is not" in m and "did you mean DLROVER_EVENT_EVENT_EXPORTER?" in m
               for m in logged)
    assert any("'queue_sise' in" in m and "did you mean queue_size?" in m for m in logged)
    assert any("'rank' in" in m for m in logged)


# -- what the process's exporter makes of the settings ------------------------------
@pytest.mark.usefixtures("no_spans")
def test_the_default_exporter_follows_the_settings(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DLROVER_EVENT_EVENT_EXPORTER", "CONSOLE")
    monkeypatch.setenv("DLROVER_EVENT_TEXT_FORMATTER", "JSON")
    monkeypatch.setenv("DLROVER_EVENT_QUEUE_SIZE", "8")
    dlrover._reset()
    exporter = dlrover.get_default_exporter()
    assert isinstance(exporter, dlrover.AsyncExporter) and exporter.get_metrics()["queue_maxsize"] == 8
    dlrover.TrainerProcess("AtorchTrainerV2").finish()
    assert exporter.force_flush(5)
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["name"] == "#finish"


@pytest.mark.usefixtures("no_spans")
def test_a_setting_the_exporter_cannot_use_is_logged_by_name_and_the_default_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings: Callable[[], list[str]]) -> None:
    monkeypatch.setenv("DLROVER_EVENT_FILE_DIR", str(tmp_path))
    monkeypatch.setenv("DLROVER_EVENT_TEXT_FORMATTER", "TEXT")
    monkeypatch.setenv("DLROVER_EVENT_EVENT_EXPORTER", "console")  # DLRover's names are case-sensitive
    monkeypatch.setenv("DLROVER_EVENT_QUEUE_SIZE", "0")  # unbounded in DLRover; always bounded here
    dlrover._reset()
    assert Config.singleton_instance().text_formatter == "TEXT"  # Config keeps what was set, as DLRover's does
    exporter = dlrover.get_default_exporter()
    assert isinstance(exporter, dlrover.AsyncExporter) and exporter.get_metrics()["queue_maxsize"] == 1024
    dlrover.TrainerProcess("AtorchTrainerV2").finish()
    assert exporter.force_flush(5)
    (line,) = (tmp_path / "events_0.log").read_text(encoding="utf-8").splitlines()
    assert "[#finish] [INSTANT]" in line  # DLRover's text line, the default formatter
    logged = warnings()
    for expected in ("DLROVER_EVENT_TEXT_FORMATTER is 'TEXT', not one of LOG, JSON; using LOG",
                     "DLROVER_EVENT_EVENT_EXPORTER is 'console', not one of TEXT_FILE, CONSOLE; using TEXT_FILE",
                     "DLROVER_EVENT_QUEUE_SIZE is 0, not an integer above 0; using 1024"):
        assert sum(expected in message for message in logged) == 1, (expected, logged)


def test_importing_with_bad_settings_never_raises_into_the_program(tmp_path: Path) -> None:
    env = {**os.environ, "DLROVER_EVENT_FILE_DIR": str(tmp_path), "DLROVER_EVENT_QUEUE_SIZE": "lots",
           "DLROVER_EVENT_EVENT_EXPORTER": "KAFKA", "DLROVER_EVENT_HOOK_ERROR": "sure", "RANK": "0",
           "OTEL_TRAINING_EXPORTER": "none", "PYTHONPATH": str(Path(dlrover.__file__).parents[3])}
    program = ("import otel_training.compat.dlrover as d\n"
               "d.TrainerProcess('AtorchTrainerV2').finish()\n"
               "d.close_default_exporter()\n"
               "print('trained')\n")
    done = subprocess.run([sys.executable, "-c", program], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "trained\n", done.stderr
    assert "Traceback" not in done.stderr
    for said in ("DLROVER_EVENT_QUEUE_SIZE is 'lots'", "DLROVER_EVENT_EVENT_EXPORTER is 'KAFKA'",
                 "DLROVER_EVENT_HOOK_ERROR is 'sure'"):
        assert said in done.stderr, done.stderr
    assert "[#finish] [INSTANT]" in (tmp_path / "events_0.log").read_text(encoding="utf-8")
