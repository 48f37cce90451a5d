"""The seams between layers are typed: nothing outside ``Telemetry`` sets its attributes or probes them.

Read from the source (``ast``): an assignment to ``<something>telemetry.<name>`` or a ``getattr(...telemetry...,
"name")`` anywhere in the package but the pipeline's own ``Telemetry`` classes fails here. What another layer
hands the pipeline goes through a method that says what it is for (``add_stuck_detector``,
``serve_process_span``), and what it reads is a typed property or method (``stuck``, ``metrics_exported``,
``stuck_threshold_s``, ``shutdown_share_s``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import otel_training

PACKAGE = Path(otel_training.__file__).resolve().parent
#: The Telemetry classes themselves (they set their own attributes on ``self``).
OWNERS = {PACKAGE / "pipeline" / name for name in ("telemetry.py", "offload.py", "drain.py")}


def _telemetry_name(node: ast.expr) -> bool:
    """``telemetry``, ``self.telemetry``, ``runtime.telemetry``, ``self._telemetry``: a Telemetry by its name."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lstrip("_").endswith("telemetry")


def findings(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            if isinstance(target, ast.Attribute) and _telemetry_name(target.value):
                found.append(f"{where}:{node.lineno}: sets {ast.unparse(target)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr") and node.args
                and _telemetry_name(node.args[0])):
            found.append(f"{where}:{node.lineno}: probes {ast.unparse(node)}")
    return found


def test_no_layer_sets_or_probes_telemetry_attributes() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path not in OWNERS:
            found += findings(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert found == [], "\n".join(found)


def test_the_check_sees_what_it_should() -> None:
    source = ("telemetry.stuck = detector\nself.telemetry.process_span = f\n"
              "x = getattr(telemetry, 'stuck', None)\nhasattr(runtime.telemetry, 'stuck')\n"
              "telemetry.add_stuck_detector(detector)\nself.stuck = None\nt = telemetry.stuck\n")
    assert [line.split(": ", 1)[1] for line in findings(source, "f")] == [
        "sets telemetry.stuck", "sets self.telemetry.process_span",
        "probes getattr(telemetry, 'stuck', None)", "probes hasattr(runtime.telemetry, 'stuck')"]
