"""The HTML report opened in headless Chromium: it renders offline, with its plots drawn.

Skipped only when Chromium is missing and CI is unset; under CI a missing
browser is a failure, so the check cannot silently disappear.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import goodput_traces as crafted
import pytest

from otel_training.report import build_report, read_paths, render_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         # Offline for real: any network fetch the page attempted would fail.
         "--host-resolver-rules=MAP * ~NOTFOUND"]
PLOTS = ("step-time", "breakdown", "histogram", "timeline")


def _chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed and CI is set: the HTML report must be checked in a browser")
        pytest.skip("chromium is not installed (apt-get install chromium); set CI to make this a failure")
    return CHROMIUM


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "profile"
    return subprocess.run([_chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def report_html(tmp_path: Path) -> Path:
    crafted.write_otlp(tmp_path / "traces")
    result = read_paths([tmp_path / "traces"])
    page = tmp_path / "report.html"
    # As the CLI draws it: the plots in forked processes (test_plots_drawn_by_forked_processes_...).
    page.write_text(render_html(build_report(result.records, result.problems), processes=2), encoding="utf-8")
    return page


def test_plots_drawn_by_forked_processes_are_the_plots_drawn_here(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib

    from otel_training.report import html as html_module

    crafted.write_otlp(tmp_path / "traces")
    result = read_paths([tmp_path / "traces"])
    report = build_report(result.records, result.problems)
    drawn_by = tmp_path / "drawn-by"

    def recording(plot):
        def draw(report):
            with drawn_by.open("a") as out:
                out.write(f"{os.getpid()}\n")
            return plot(report)
        return draw

    for _, function, _ in html_module._PLOTS:  # looked up by name where they are drawn: a fork sees these
        monkeypatch.setattr(html_module, function, recording(getattr(html_module, function)))
    undated = lambda page: re.sub(r"<dc:date>[^<]*</dc:date>", "", page)  # noqa: E731 - when each SVG was drawn
    with matplotlib.rc_context({"svg.hashsalt": "fixed"}):  # the SVGs' element ids
        forked, here = render_html(report, processes=2), render_html(report)
    assert undated(forked) == undated(here)
    pids = drawn_by.read_text().split()
    assert len(pids) == 2 * len(PLOTS)  # each plot drawn twice: forked, then here
    assert str(os.getpid()) not in pids[:len(PLOTS)] and pids[len(PLOTS):] == [str(os.getpid())] * len(PLOTS)


def test_report_is_self_contained(report_html: Path) -> None:
    text = report_html.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", text), "the report loads something remote"
    assert "<script" not in text


def test_plots_render_in_headless_chromium(report_html: Path, tmp_path: Path) -> None:
    dom = _run(["--dump-dom", report_html.as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for plot in PLOTS:
        match = re.search(rf'<figure class="plot" id="{plot}">(.*?)</figure>', html, re.S)
        assert match, f"plot {plot} missing from the rendered DOM"
        svg = match.group(1)
        assert svg.lstrip().startswith("<svg") and svg.count("<path") >= 10, f"plot {plot} has no drawing"
    assert "rank 1" in html and "straggler" in html

    shot = tmp_path / "report.png"
    done = _run([f"--screenshot={shot}", "--window-size=1400,2400", report_html.as_uri()], tmp_path)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    from matplotlib import image

    pixels = image.imread(str(shot))
    height, width = pixels.shape[:2]
    assert (width, height) == (1400, 2400)
    # The plot area (below the header cards) is drawn, not blank: many distinct colours.
    region = (pixels[200:1200, :, :3] * 255).astype(int).reshape(-1, 3)
    colours = {tuple(pixel) for pixel in region[::7]}
    assert len(colours) > 50, f"only {len(colours)} colours in the plot area: plots did not render"
