"""The report at job scale: streamed, in parallel, with the figures of the report that held every span.

``tests/fixtures/report_figures.json`` holds the figures main's report gave (every
span in memory) on six jobs; the streamed reading (one worker or two, folding as
rarely or as often as it can) and the in-memory path must give them exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import goodput_traces as crafted
import pytest
from report_figures import CASES, figures
from report_job import generate  # bench/report_job.py (pythonpath in pyproject.toml)

from otel_training.analysis.goodput import RunAccountant
from otel_training.report import (
    build_report,
    read_paths,
    render_html,
    render_summary,
    stats,
    stream,
)
from otel_training.report import files as report_files_module
from otel_training.report.files import report_files

FROZEN = json.loads((Path(__file__).parent / "fixtures" / "report_figures.json").read_text())


def _figures(report: Any) -> dict[str, Any]:
    return json.loads(json.dumps(figures(report)))  # as the frozen file holds them (tuples as lists)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    written = {}
    for name, (write, _options) in CASES.items():
        directory = tmp_path_factory.mktemp(name) / "traces"
        write(directory)
        written[name] = directory
    return written


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Folds of streamed lives and ranks recomputed in memory: to see which path gave the figures."""
    seen: dict[str, list[Any]] = {"folds": [], "recomputed": []}
    fold, recompute = RunAccountant.fold, report_files_module._recompute

    def counting_fold(self: RunAccountant, until_ns: int, marks: Any = ()) -> list[int]:
        seen["folds"].append(until_ns)
        return fold(self, until_ns, marks)

    def counting_recompute(part: Any, ranks: list[int], *args: Any) -> None:
        seen["recomputed"].extend(ranks)
        recompute(part, ranks, *args)

    monkeypatch.setattr(RunAccountant, "fold", counting_fold)
    monkeypatch.setattr(report_files_module, "_recompute", counting_recompute)
    return seen


@pytest.mark.parametrize("name", list(CASES))
def test_in_memory_report_gives_the_frozen_figures(name: str, jobs: dict[str, Path]) -> None:
    result = read_paths([jobs[name]], progress=False)
    assert _figures(build_report(result.records, result.problems, **CASES[name][1])) == FROZEN[name]


@pytest.mark.parametrize("name", list(CASES))
def test_the_streamed_report_gives_the_in_memory_step_spread(name: str, jobs: dict[str, Path]) -> None:
    """The MAD (after the frozen figures were taken): streamed as the in-memory report computes it."""
    result = read_paths([jobs[name]], progress=False)
    in_memory = build_report(result.records, result.problems, **CASES[name][1])
    streamed = report_files([jobs[name]], workers=1, progress=False, **CASES[name][1])
    assert {rank: stats.mad for rank, stats in streamed.rank_steps.items()} == pytest.approx(
        {rank: stats.mad for rank, stats in in_memory.rank_steps.items()})
    if in_memory.job_steps is not None:
        assert streamed.job_steps is not None and streamed.job_steps.mad == pytest.approx(in_memory.job_steps.mad)
        assert in_memory.job_steps.mad >= 0.0


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_streamed_report_gives_the_frozen_figures(name: str, workers: int, jobs: dict[str, Path],
                                                  counted: dict[str, list[Any]]) -> None:
    report = report_files([jobs[name]], workers=workers, progress=False, **CASES[name][1])
    assert _figures(report) == FROZEN[name]
    assert report.problems == []
    if workers == 1:
        assert counted["recomputed"] == []  # streamed, not the in-memory fallback


@pytest.mark.parametrize("name", [name for name in CASES if name != "crafted"])
def test_folding_after_every_few_spans_changes_nothing(name: str, jobs: dict[str, Path],
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       counted: dict[str, list[Any]]) -> None:
    """Lives folded a few spans at a time, two seconds behind: the incremental path, exercised hard.

    (The jobs write an alert 5 s of span time after its step: the reorder window must cover that.)
    """
    monkeypatch.setattr(stream, "SETTLE_EVERY", 3)
    monkeypatch.setattr(stream, "LAG_NS", 2 * 10**9)
    monkeypatch.setattr(stream, "REORDER_NS", 6 * 10**9)
    report = report_files([jobs[name]], workers=1, progress=False, **CASES[name][1])
    assert _figures(report) == FROZEN[name]
    assert counted["recomputed"] == []
    lives = len(report.goodput.runs)
    assert len(counted["folds"]) > 5 * lives  # folded as it read, not once per life at the end


def test_a_life_too_far_out_of_order_is_recomputed_in_memory_with_the_same_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: dict[str, list[Any]]) -> None:
    CASES["job-8-ranks-1-restart"][0](tmp_path / "traces")
    rank1 = tmp_path / "traces" / "traces-r1.jsonl"
    rank1.write_text("".join(reversed(rank1.read_text().splitlines(keepends=True))))  # latest batches first
    monkeypatch.setattr(stream, "SETTLE_EVERY", 16)
    monkeypatch.setattr(stream, "REORDER_NS", 10**9)
    report = report_files([tmp_path / "traces"], workers=2, progress=False)
    assert counted["recomputed"] == [1]
    # Each batch's spans in memory are in another order, but sorted by end they are the same spans.
    assert _figures(report) == FROZEN["job-8-ranks-1-restart"]


def test_a_rank_split_over_two_files_gives_the_figures_of_one(tmp_path: Path, counted: dict[str, list[Any]]) -> None:
    crafted.write_otlp(tmp_path / "traces")
    whole = _figures(report_files([tmp_path / "traces"], workers=1, progress=False))
    rank0 = tmp_path / "traces" / "traces-r0.jsonl"
    lines = rank0.read_text().splitlines(keepends=True)
    rank0.write_text("".join(lines[:1]))
    (tmp_path / "traces" / "traces-r0-later.jsonl").write_text("".join(lines[1:]))
    split = report_files([tmp_path / "traces"], workers=2, progress=False)
    assert counted["recomputed"] == []  # the two files read again as one stream, in time order: no spans held
    assert _figures(split) == whole


def test_a_copy_of_a_file_counts_once(tmp_path: Path) -> None:
    r0, _ = crafted.write_otlp(tmp_path / "traces")
    copy = tmp_path / "copy-of-r0.jsonl"
    copy.write_bytes(r0.read_bytes())
    report = report_files([tmp_path / "traces", tmp_path / "traces", r0, copy], progress=False)
    assert _figures(report) == FROZEN["crafted"] | {"span_count": len(crafted.SPANS)}
    assert [str(problem) for problem in report.problems] == [
        f"{copy}: the same content as {r0}: already read; counted once"]


def test_damaged_files_are_named_by_file_and_line_and_the_rest_is_used(tmp_path: Path) -> None:
    _, r1 = crafted.write_otlp(tmp_path / "traces")
    lines = r1.read_text().splitlines()
    r1.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2] + "\n")
    metrics = tmp_path / "metrics-r0.jsonl"
    metrics.write_text(json.dumps({"resourceMetrics": []}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n" * 9)
    streamed = report_files([tmp_path / "traces", metrics, bad, tmp_path / "missing"], workers=2, progress=False)
    messages = [str(problem) for problem in streamed.problems]
    assert f"{r1}:4: truncated JSON line" in "\n".join(messages)
    assert f"{metrics}:1: OTLP metrics, not traces; skipped" in messages
    assert f"{bad}: 4 more unreadable line(s) not listed" in messages
    assert f"{tmp_path / 'missing'}: no such file or directory" in messages
    result = read_paths([tmp_path / "traces", metrics, bad, tmp_path / "missing"])
    assert _figures(streamed) == _figures(build_report(result.records, result.problems))
    assert sorted(messages) == sorted(str(problem) for problem in result.problems)


def test_the_page_and_the_summary_of_a_streamed_report(tmp_path: Path) -> None:
    generate(tmp_path / "traces", 6000, 3, 1, seed=7)
    report = report_files([tmp_path / "traces"], progress=False)
    assert "stragglers: rank 2" in render_summary(report)
    page = render_html(report)
    assert page.count("<svg") == 4 and 'id="timeline"' in page


def test_progress_bar_on_stderr_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate(tmp_path / "traces", 4000, 2, 0)
    report_files([tmp_path / "traces"], workers=2, progress=True)
    assert "reading traces" in capsys.readouterr().err
    report_files([tmp_path / "traces"], workers=2, progress=False)
    assert capsys.readouterr().err == ""


def test_exact_statistics_with_numpy_equal_the_analysis_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's partitions give the very floats ``statistics`` gives (without numpy they are what runs)."""
    import random
    from array import array

    rng = random.Random(5)
    for count in (1, 2, 9, 10, 11, 1000, 1001):
        ranks = [array("d", (rng.lognormvariate(-2, 0.5) for _ in range(count))) for _ in range(3)]
        ranks[0].append(ranks[1][0])  # ties
        for configured in (None, 0.1):
            threshold, ideal, job = stats.job_figures(ranks, configured)
            per_rank = [(stats.stats_of(durations, ideal, threshold), stats.median_of(durations)) for durations in ranks]
            monkeypatch.setattr(stats, "_numpy", lambda: None)
            assert stats.job_figures(ranks, configured) == (threshold, ideal, job)
            assert [(stats.stats_of(durations, ideal, threshold), stats.median_of(durations))
                    for durations in ranks] == per_rank
            monkeypatch.undo()


def test_a_life_of_steps_faster_than_the_settle_batch_is_sorted_a_logarithmic_number_of_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """20 000 steps 1 ms apart all lie within the 60 s reorder window, so no settle can release any: each push
    past SETTLE_EVERY used to settle (sort the whole buffer) again, 230 us a span on a 20 000-step file. Now the
    next settle waits for the buffer to double."""
    from otel_training import semconv as sc
    from otel_training.analysis import RunKey, SpanRecord
    from otel_training.report import stream

    settles = []
    shipped = stream._Run.settle

    def counted(self: Any, *, final: bool) -> None:
        settles.append(len(self.buffer))
        shipped(self, final=final)

    monkeypatch.setattr(stream._Run, "settle", counted)
    key = RunKey("job", 0, 0, "run", "svc", 0)
    run = stream._Run(key, False)
    t0 = 1_700_000_000 * 10**9
    run.min_start = t0  # as the reader sets it from the file's spans
    for index in range(20_000):
        run.push(SpanRecord(sc.SPAN_STEP, t0 + index * 10**6, t0 + index * 10**6 + 500_000, key,
                            {sc.STEP: index}, span_id=f"{index + 1:016x}"))
    run.settle(final=True)
    assert len(settles) <= 6, settles  # 4096, 8192, 16384, then the final one
    assert run.broken is None and run.fed_end == t0 + 19_999 * 10**6 + 500_000  # every span fed, in order
