"""Configuration: precedence, validation errors that name the culprit, resource detection."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import otel_training
from otel_training import ConfigError
from otel_training import semconv as sc
from otel_training.config.options import resolve
from otel_training.config.resource import build_resource


def test_precedence_argument_over_environment_over_file_over_default(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"output_dir": "from-file", "trace_max_spans": 7, "exporter": "console"}))
    environ = {"OTEL_TRAINING_CONFIG": str(config), "OTEL_TRAINING_TRACE_MAX_SPANS": "9", "OTEL_TRAINING_EXPORTER": "none"}
    options = resolve({"exporter": "file"}, environ)
    assert options["exporter"] == "file"  # argument beats environment
    assert options["trace_max_spans"] == 9  # environment beats file
    assert options["output_dir"] == "from-file"  # file beats default
    assert options["exit_timeout_s"] == 2.0  # default


def test_toml_config_file(tmp_path: Path) -> None:
    config = tmp_path / "otel.toml"
    config.write_text('exporter = "console"\nstuck_span_names = ["training.step", "training.evaluate"]\n')
    options = resolve({}, {"OTEL_TRAINING_CONFIG": str(config)})
    assert options["exporter"] == "console"
    assert options["stuck_span_names"] == ("training.step", "training.evaluate")


@pytest.mark.parametrize(
    ("arguments", "environ", "expected"),
    [
        ({"exporter": "zipkin"}, {}, r"configure\(exporter=...\).*'zipkin'.*otlp, file, console, none"),
        ({}, {"OTEL_TRAINING_EXPORTER": "jaeger"}, r"OTEL_TRAINING_EXPORTER.*'jaeger'"),
        ({"exit_timeout_s": -1}, {}, r"exit_timeout_s.*-1.*>= 0"),
        ({}, {"OTEL_TRAINING_STUCK_THRESHOLD_S": "soon"}, r"OTEL_TRAINING_STUCK_THRESHOLD_S.*'soon'"),
        ({"trace_max_spans": "many"}, {}, r"trace_max_spans.*'many'"),
        ({"metrics": "perhaps"}, {}, r"metrics.*'perhaps'.*boolean"),
        ({"rank": True}, {}, r"rank.*True"),
        ({"exporterr": "file"}, {}, r"unknown option 'exporterr'.*did you mean 'exporter'"),
        ({}, {"OTEL_TRAINING_OUTPUTDIR": "x"}, r"unknown option 'outputdir'.*OTEL_TRAINING_OUTPUTDIR"),
        ({}, {"OTEL_TRAINING_STUCK_SIGNAL": "SIGFOO"}, r"OTEL_TRAINING_STUCK_SIGNAL.*'SIGFOO'.*signal name"),
        ({"stuck_span_names": ["training.step=abc"]}, {}, r"stuck_span_names.*'abc' of 'training.step'"),
        # Issue 13 item 6: a zero threshold raised thousands of alert spans a second.
        ({"stuck_threshold_s": 0}, {}, r"stuck_threshold_s.*0.*>= 0.01 and <= 604800"),
        ({}, {"OTEL_TRAINING_STUCK_ESCALATION_S": "0.001"}, r"OTEL_TRAINING_STUCK_ESCALATION_S.*0.001.*>= 0.01"),
        ({"stuck_span_names": ["training.step=0"]}, {}, r"stuck_span_names.*'0' of 'training.step'.*>= 0.01"),
        ({}, {"OTEL_TRAINING_STUCK_SPAN_NAMES": "training.step=-5"}, r"OTEL_TRAINING_STUCK_SPAN_NAMES.*>= 0"),
        ({"stuck_exit_code": 300}, {}, r"stuck_exit_code.*300.*0\.\.255"),
        # Durations and sizes are range-checked: past the bound they break timers at exit.
        ({"exit_timeout_s": 1e10}, {}, r"exit_timeout_s.*10000000000.0.*604800"),
        ({"exit_timeout_s": 10**400}, {}, r"exit_timeout_s.*604800"),
        ({}, {"OTEL_TRAINING_EXIT_TIMEOUT_S": "1e10"}, r"OTEL_TRAINING_EXIT_TIMEOUT_S.*'1e10'.*604800"),
        ({}, {"OTEL_TRAINING_TRACE_MAX_AGE_S": "99999999999"}, r"OTEL_TRAINING_TRACE_MAX_AGE_S.*604800"),
        ({}, {"OTEL_TRAINING_STUCK_SPAN_NAMES": "training.step,ckpt.*=1e10"},
         r"OTEL_TRAINING_STUCK_SPAN_NAMES.*threshold 1e\+10 of 'ckpt.\*'.*604800"),
        ({"trace_max_spans": 2**31}, {}, r"trace_max_spans.*2147483648.*2147483647"),
        ({}, {"OTEL_TRAINING_DLROVER_LOG_QUEUE_SIZE": str(10**30)}, r"DLROVER_LOG_QUEUE_SIZE.*2147483647"),
        # Variable names are case-sensitive: a mixed-case one would be silently ignored.
        ({}, {"OTEL_TRAINING_Stuck_Threshold_S": "soon"},
         r"OTEL_TRAINING_Stuck_Threshold_S.*upper case.*did you mean OTEL_TRAINING_STUCK_THRESHOLD_S"),
        # The reserved prefix differs by one underscore: an option there would be ignored.
        ({}, {"OTEL_TRAINING__STUCK_THRESHOLD_S": "5"},
         r"OTEL_TRAINING__STUCK_THRESHOLD_S.*reserved.*did you mean OTEL_TRAINING_STUCK_THRESHOLD_S\?"),
        ({}, {"otel_training_exporter": "console"}, r"otel_training_exporter.*OTEL_TRAINING_EXPORTER"),
        ({}, {"Otel_Training_Config": "x.json"}, r"Otel_Training_Config.*OTEL_TRAINING_CONFIG"),
        ({}, {"otel_training_colour": "blue"}, r"unknown option 'colour'.*otel_training_colour"),
        ({"output_dir": "a\0b"}, {}, r"output_dir.*'a\\x00b'.*NUL"),
        ({"dlrover_log": "events\0.log"}, {}, r"dlrover_log.*NUL"),
        # OTLP integers are int64: a bigger rank would vanish from every export.
        ({}, {"OTEL_TRAINING_RANK": str(2**64)}, r"OTEL_TRAINING_RANK.*'18446744073709551616'.*9223372036854775807"),
    ],
)
def test_bad_values_name_option_and_value(arguments: dict, environ: dict, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        resolve(arguments, environ)


def test_the_tools_own_variables_in_the_shell_do_not_stop_training() -> None:
    """Issue 30: the native stack's OTEL_TRAINING_JAEGER_BIN, _CACHE, _WEBHOOK_URL... exported in the shell a job
    starts from were refused as unknown options; a misspelt one still is."""
    from otel_training.config.options import TOOL_VARIABLES

    options = resolve({}, {name: "x" for name in TOOL_VARIABLES} | {"OTEL_TRAINING_EXPORTER": "file"})
    assert options["exporter"] == "file"
    with pytest.raises(ConfigError, match="OTEL_TRAINING_JAEGER_BINN"):
        resolve({}, {"OTEL_TRAINING_JAEGER_BINN": "x"})


def test_an_unusable_output_directory_fails_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"output_dir=.*a-file/traces.*cannot create the trace directory"):
        otel_training.configure(reconfigure=True, exporter="file", output_dir=str(blocker / "traces"))


def test_a_failed_configure_publishes_no_half_built_pipeline(configure, monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_training.processors.stuck import StuckSpanProcessor

    good = configure(exporter="none")

    def broken_processor(*args, **kwargs) -> None:
        raise RuntimeError("processor bug")

    with monkeypatch.context() as patched:
        patched.setattr(StuckSpanProcessor, "from_options", broken_processor)
        with pytest.raises(RuntimeError, match="processor bug"):
            otel_training.configure(reconfigure=True, exporter="console", stuck_threshold_s=5)
    assert otel_training.get_telemetry() is good or otel_training.get_telemetry().is_shut_down
    rebuilt = configure(exporter="console", stuck_threshold_s=5)
    assert rebuilt.exporter_name == "console" and isinstance(rebuilt.stuck, StuckSpanProcessor)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_bad_config_files_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ConfigError, match=f"OTEL_TRAINING_CONFIG='{missing}'.*cannot read"):
        resolve({}, {"OTEL_TRAINING_CONFIG": str(missing)})
    malformed = tmp_path / "bad.json"
    malformed.write_text('{"exporter": "file",')
    with pytest.raises(ConfigError, match=f"config file '{malformed}' is malformed"):
        resolve({}, {"OTEL_TRAINING_CONFIG": str(malformed)})
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("exporter = \n")
    with pytest.raises(ConfigError, match="bad.toml' is malformed"):
        resolve({}, {"OTEL_TRAINING_CONFIG": str(bad_toml)})
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"exporter": "file", "colour": "blue"}))
    with pytest.raises(ConfigError, match=f"unknown option 'colour' in config file '{unknown}'"):
        resolve({}, {"OTEL_TRAINING_CONFIG": str(unknown)})
    wrong_value = tmp_path / "wrong.json"
    wrong_value.write_text(json.dumps({"trace_max_age_s": "an hour"}))
    with pytest.raises(ConfigError, match=r"wrong.json', key 'trace_max_age_s': invalid value 'an hour'"):
        resolve({}, {"OTEL_TRAINING_CONFIG": str(wrong_value)})
    not_a_table = tmp_path / "list.json"
    not_a_table.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a table/object"):
        resolve({}, {"OTEL_TRAINING_CONFIG": str(not_a_table)})


def test_a_config_file_that_is_no_regular_file_fails_at_once(tmp_path: Path) -> None:
    import os
    import threading

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            resolve({}, {"OTEL_TRAINING_CONFIG": str(fifo)})
        except BaseException as error:  # noqa: BLE001
            outcome.append(error)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=30)
    if thread.is_alive():  # blocked in open(): give it a writer and an EOF so the test ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], ConfigError), outcome
    assert f"OTEL_TRAINING_CONFIG='{fifo}'" in str(outcome[0]) and "not a regular file" in str(outcome[0])
    with pytest.raises(ConfigError, match="not a regular file"):
        resolve({}, {"OTEL_TRAINING_CONFIG": str(tmp_path)})
    huge = tmp_path / "huge.json"
    huge.write_text(" " * (2 << 20) + "{}")
    with pytest.raises(ConfigError, match=r"huge.json.*larger than 1 MiB"):
        resolve({}, {"OTEL_TRAINING_CONFIG": str(huge)})
    with pytest.raises(ConfigError, match="cannot read the config file"):
        resolve({}, {}, config_file="bad\0name.json")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_RESOURCE_ATTRIBUTES", "team"),
        # Durations (ms) and sizes past what the SDK's threads and queues take kill them later.
        ("OTEL_BSP_SCHEDULE_DELAY", "99999999999999"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "99999999999999"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", str(2**63)),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "5000"),  # above the default queue size, 2048
        ("OTEL_METRIC_EXPORT_INTERVAL", "99999999999999"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "inf"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "-1"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "1e10"),
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "many"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "-1"),
        # Endpoints, compression, resource attributes and files the SDK would take, then fail on or ignore.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "garbage"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector:4317"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:99999"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "https://"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "bogus"),
        ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),  # the gRPC exporter knows gzip only
        ("OTEL_RESOURCE_ATTRIBUTES", "training.rank=abc"),
        ("OTEL_RESOURCE_ATTRIBUTES", "team=vision,training.world_size=0"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent.pem"),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/"),
        ("OTEL_METRICS_EXEMPLAR_FILTER", "sometimes"),
    ],
)
def test_bad_standard_variables_raise_before_training(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=re.escape(f"{variable}={value!r}")):
        otel_training.configure(reconfigure=True, exporter="none")


def test_the_bounds_themselves_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_training.config import otel_env

    options = resolve({"exit_timeout_s": 604800, "trace_max_spans": 2**31 - 1}, {})
    assert (options["exit_timeout_s"], options["trace_max_spans"]) == (604800.0, 2**31 - 1)
    otel_env.validate({"OTEL_BSP_SCHEDULE_DELAY": "604800000", "OTEL_METRIC_EXPORT_INTERVAL": "604800000",
                       "OTEL_BSP_MAX_QUEUE_SIZE": str(2**31 - 1), "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096",
                       "OTEL_EXPORTER_OTLP_TIMEOUT": "604800", "OTEL_SPAN_EVENT_COUNT_LIMIT": "0",
                       "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": ""})


def test_the_batch_may_not_exceed_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_training.config import otel_env

    otel_env.validate({"OTEL_BSP_MAX_QUEUE_SIZE": "10000", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5000"})
    with pytest.raises(ConfigError, match=r"OTEL_BSP_MAX_EXPORT_BATCH_SIZE='5000'.*OTEL_BSP_MAX_QUEUE_SIZE.*1000"):
        otel_env.validate({"OTEL_BSP_MAX_QUEUE_SIZE": "1000", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5000"})


def test_endpoints_compression_and_certificates_that_work_are_accepted(tmp_path: Path) -> None:
    from otel_training.config import otel_env

    certificate = tmp_path / "ca.pem"
    certificate.write_text("-----BEGIN CERTIFICATE-----\n")
    otel_env.validate({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://[::1]:4317", "OTEL_EXPORTER_OTLP_CERTIFICATE":
                       str(certificate), "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
    otel_env.validate({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate",
                       "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "none",
                       "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})


def test_resource_attributes_name_the_pair_and_identity_numbers_become_integers() -> None:
    from otel_training.config import otel_env

    with pytest.raises(ConfigError, match=r"OTEL_RESOURCE_ATTRIBUTES='training.rank=abc'.*training.rank.*'abc'"):
        otel_env.validate({"OTEL_RESOURCE_ATTRIBUTES": "training.rank=abc"})
    attributes = build_resource({}, {"OTEL_RESOURCE_ATTRIBUTES": "training.rank=5,training.world_size=8"}).attributes
    assert (attributes[sc.TRAINING_RANK], attributes[sc.TRAINING_WORLD_SIZE]) == (5, 8)


def test_undecodable_environment_values_reach_the_resource_escaped() -> None:
    # os.environ decodes bytes that are not UTF-8 as lone surrogates, which no exporter can encode.
    environ = {"OTEL_SERVICE_NAME": "svc\udce9", "SLURM_JOB_ID": "job\udce9",
               "OTEL_RESOURCE_ATTRIBUTES": "team=vis%C3%A9on,owner=a%ffb"}
    attributes = build_resource({}, environ).attributes
    assert attributes[sc.SERVICE_NAME] == "svc\\udce9"
    assert attributes[sc.TRAINING_JOB_ID] == "job\\udce9"
    assert attributes["team"] == "visé" + "on"
    for value in attributes.values():
        if isinstance(value, str):
            value.encode("utf-8")  # raises on a lone surrogate


def test_launcher_ranks_beyond_int64_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"RANK='18446744073709551616'"):
        build_resource({}, {"RANK": str(2**64)})


@pytest.mark.parametrize(
    ("variable", "value"),
    [("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "5000"), ("OTEL_EXPORTER_OTLP_COMPRESSION", "bogus"),
     ("OTEL_RESOURCE_ATTRIBUTES", "training.rank=abc"), ("OTEL_SPAN_EVENT_COUNT_LIMIT", "many")],
)
def test_a_bad_environment_without_configure_fails_once_then_runs_disabled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, variable: str, value: str
) -> None:
    import logging

    from otel_training.assembly import configure as telemetry_module
    from otel_training.events import runtime as runtime_module
    from otel_training.lifecycle import hooks

    monkeypatch.setattr(telemetry_module, "_current", None)  # no configure() call: the events API configures
    monkeypatch.setattr(runtime_module, "_runtime", None)
    monkeypatch.setenv(variable, value)
    attempts = []
    real_resolve = telemetry_module.resolve
    monkeypatch.setattr(telemetry_module, "resolve", lambda *args, **kwargs: attempts.append(1) or
                        real_resolve(*args, **kwargs))
    trainer = otel_training.TrainerProcess()
    with caplog.at_level(logging.ERROR, logger="otel_training"):
        for step in range(20):
            with trainer.step(global_step=step):
                trainer.log(loss=1.0)
    assert len(attempts) == 1  # tried once, not on every step
    stand_in = otel_training.get_telemetry()
    assert stand_in.disabled and isinstance(stand_in.config_error, ConfigError)
    errors = [record.getMessage() for record in caplog.records if f"{variable}=" in record.getMessage()]
    assert len(errors) == 1 and "records no telemetry" in errors[0], errors
    # An explicit configure() still raises the error; once fixed, it replaces the stand-in.
    with pytest.raises(ConfigError, match=variable):
        otel_training.configure()
    monkeypatch.delenv(variable)
    fixed = otel_training.configure(exporter="none", signal_hooks=False, exception_hooks=False)
    try:
        assert fixed is not stand_in and not fixed.disabled and stand_in.is_shut_down
        assert otel_training.get_telemetry() is fixed
    finally:
        fixed.shutdown(timeout_s=2)
        hooks.uninstall()


def test_configure_returns_the_same_handle(configure) -> None:
    telemetry = configure(exporter="none")
    assert otel_training.configure() is telemetry
    assert otel_training.configure(exporter="none", output_dir=telemetry.options["output_dir"],
                                   signal_hooks=False, exception_hooks=False) is telemetry
    with pytest.raises(ConfigError, match="reconfigure=True"):
        otel_training.configure(exporter="console")
    replaced = configure(exporter="console")
    assert replaced is not telemetry and telemetry.is_shut_down


def test_default_exporter_is_file_unless_an_endpoint_is_set(configure, monkeypatch: pytest.MonkeyPatch) -> None:
    assert configure().exporter_name == "file"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    assert configure().exporter_name == "otlp"


def test_resource_from_torchrun_environment() -> None:
    environ = {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "job-42", "TORCHELASTIC_RESTART_COUNT": "2",
    }
    attributes = build_resource({"role": "trainer"}, environ).attributes
    assert attributes[sc.TRAINING_RANK] == 3
    assert attributes[sc.TRAINING_LOCAL_RANK] == 1
    assert attributes[sc.TRAINING_WORLD_SIZE] == 8
    assert attributes[sc.TRAINING_NODE_RANK] == 1
    assert attributes[sc.TRAINING_JOB_ID] == "job-42"
    assert attributes[sc.TRAINING_RESTART_COUNT] == 2
    assert attributes[sc.TRAINING_RUN_ID] == "job-42-2"  # shared by all ranks of one attempt
    assert attributes[sc.TRAINING_ROLE] == "trainer"
    assert attributes[sc.SERVICE_NAME] == "training"
    assert {sc.HOST_NAME, sc.PROCESS_PID, sc.SERVICE_INSTANCE_ID} <= set(attributes)


def test_resource_from_slurm_and_kubernetes() -> None:
    environ = {"SLURM_JOB_ID": "777", "SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_NODEID": "2",
               "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-pod-5"}
    attributes = build_resource({}, environ).attributes
    assert (attributes[sc.TRAINING_JOB_ID], attributes[sc.TRAINING_RANK]) == ("777", 5)
    assert (attributes[sc.TRAINING_WORLD_SIZE], attributes[sc.TRAINING_NODE_RANK]) == (16, 2)
    assert attributes[sc.K8S_POD_NAME] == "trainer-pod-5"
    # Outside Kubernetes HOSTNAME is not a pod name.
    assert sc.K8S_POD_NAME not in build_resource({}, {"HOSTNAME": "laptop"}).attributes


def test_explicit_options_override_detection_and_service_name_precedence() -> None:
    environ = {"RANK": "3", "OTEL_RESOURCE_ATTRIBUTES": "training.job.id=from-env,team=vision"}
    attributes = build_resource({"rank": 0, "service_name": "option-name"}, environ).attributes
    assert attributes[sc.TRAINING_RANK] == 0
    assert attributes[sc.TRAINING_JOB_ID] == "from-env"
    assert attributes["team"] == "vision"
    assert attributes[sc.SERVICE_NAME] == "option-name"
    environ["OTEL_SERVICE_NAME"] = "env-name"
    assert build_resource({"service_name": "option-name"}, environ).attributes[sc.SERVICE_NAME] == "env-name"


def test_configuration_doc_is_generated_from_the_options() -> None:
    from otel_training.config.options import markdown_table

    doc = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    assert markdown_table() in doc, "docs/configuration.md is stale: regenerate with `.venv/bin/python scripts/gen_config_doc.py`"


def test_a_pipeline_replaced_by_reconfigure_is_not_kept_alive_by_its_exit_hook(tmp_path: Path) -> None:
    import gc
    import weakref

    options = {"exporter": "none", "signal_hooks": False, "exception_hooks": False, "reconfigure": True}
    otel_training.configure(**options)  # may become the global providers, which OpenTelemetry keeps for good
    gone = weakref.ref(otel_training.configure(**options))
    current = otel_training.configure(**options)
    try:
        gc.collect()
        assert gone() is None  # nothing (its atexit hook included) holds the pipeline that was replaced
    finally:
        current.shutdown(timeout_s=2)
