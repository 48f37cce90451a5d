"""torch's flight recorder, read for a stuck alert: the collectives still in flight, and the ops' names.

Why a module of its own: the collective tracker (``collectives.py``) keeps the state the hooks or the
sequence numbers give; this reads what torch itself recorded (``TORCH_FR_BUFFER_SIZE``), only when an alert
asks, and names the sequence route's ops from it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from otel_training import semconv as sc

if TYPE_CHECKING:
    from otel_training.integrations.torch.collective_state import GroupState

#: The flight recorder's in-flight entries put on a stuck alert: at most this many, this many characters.
MAX_FR_ENTRIES = 16
MAX_FR_CHARS = 8192
_FR_FIELDS = ("collective_seq_id", "profiling_name", "state", "input_sizes", "output_sizes",
              "time_created_ns", "time_discovered_started_ns", "process_group", "timeout_ms")


def flight_recorder_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    for variable in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = environ.get(variable, "").strip()
        if value.isdigit() and int(value) > 0:
            return True
    return False


def flight_recorder(backends: Iterable[str], max_entries: int = MAX_FR_ENTRIES,
                    max_chars: int = MAX_FR_CHARS, only_active: bool = True) -> dict[str, Any]:
    """torch's flight recorder entries still in flight (``only_active``; else the latest, completed ones too),
    newest last, bounded; or why there are none."""
    if not flight_recorder_enabled():
        return {sc.COLLECTIVE_FLIGHT_RECORDER_ERROR: "flight recorder off (set TORCH_FR_BUFFER_SIZE, e.g. 2000)"}
    try:
        import torch._C._distributed_c10d as c10d
    except Exception as error:  # noqa: BLE001 - a torch without c10d: the alert says why there are no entries
        return {sc.COLLECTIVE_FLIGHT_RECORDER_ERROR: f"flight recorder unavailable: {error}"}
    entries: list[dict[str, Any]] = []
    errors = []
    for backend in sorted(set(backends)):
        try:
            if backend == "nccl":
                raw = c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=only_active)  # type: ignore[attr-defined]  # NCCL builds register it; torch's _distributed_c10d.pyi omits it  # noqa: SLF001 - torch's only way to read its NCCL flight recorder
            else:
                try:
                    raw = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=only_active,  # noqa: SLF001 - torch's only way to read its flight recorder
                                                   backend=backend)
                except TypeError:  # torch before the recorder per backend (2.11): one recorder for every group
                    raw = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=only_active)  # noqa: SLF001 - torch's only way to read its flight recorder
            dump = json.loads(raw)
        except Exception as error:  # noqa: BLE001 - no recorder for this backend
            errors.append(f"{backend}: {str(error).splitlines()[0][:200] if str(error) else type(error).__name__}")
            continue
        for entry in dump.get("entries", []):
            if not (only_active and entry.get("retired", False)):
                entries.append({key: entry[key] for key in _FR_FIELDS if key in entry})
    attributes: dict[str, Any] = {}
    if errors:
        attributes[sc.COLLECTIVE_FLIGHT_RECORDER_ERROR] = "; ".join(errors)
    entries = entries[-max_entries:]
    text = json.dumps(entries, separators=(",", ":"))
    while len(text) > max_chars and entries:
        entries = entries[1:]
        text = json.dumps(entries, separators=(",", ":"))
    attributes[sc.COLLECTIVE_FLIGHT_RECORDER] = text
    return attributes


def name_ops(states: Iterable[GroupState], recorder: Mapping[str, Any]) -> None:
    """The sequence route: each group's last op, named by the flight recorder's entry of its sequence number."""
    unnamed = {state.name: state for state in states if state.sequence is not None and state.op is None}
    text = recorder.get(sc.COLLECTIVE_FLIGHT_RECORDER)
    if not unnamed or not text:
        return
    try:
        entries = json.loads(text)
    except ValueError:
        return
    for entry in entries:
        group = entry.get("process_group")
        state = unnamed.get(str(group[0]) if isinstance(group, list) and group else "")
        if state is not None and entry.get("collective_seq_id") == state.entered:
            state.op = str(entry.get("profiling_name", "")).rpartition(":")[2].replace("_", "")


#: How long the sequence route holds a new collective's gauges back while the flight recorder has not named its op.
NAME_HOLD_NS = 1_000_000_000


class OpLabels:
    """The op label of each group's entered gauge: fixed at a collective's first observation, or None while the
    sequence route waits (``NAME_HOLD_NS`` at most) for the flight recorder to name it.

    Why fixed: a rank whose label changed within one collective (unnamed, then named) would have two series at
    the group's highest sequence number until the older one expires (the collector's Prometheus exporter keeps
    it for minutes), and the hang rules read two labels there as two ranks in different ops: a mismatch named on
    a rank that only waits. Holding the group's rows back a moment keeps the previous collective's values on the
    gauges meanwhile; past the hold the label stays unnamed for this collective.
    """

    def __init__(self) -> None:
        self._fixed: dict[str, tuple[int, str]] = {}  # group -> (sequence number, label)

    def of(self, states: list[GroupState], now_ns: int) -> dict[str, str]:
        """Each group's label; a group left out is held back. The sequence route's new ops are named first, from
        the flight recorder when it is on."""
        recorder_on = flight_recorder_enabled() and any(s.sequence is not None and s.op is None for s in states)
        if recorder_on:
            name_ops(states, flight_recorder({state.backend for state in states}, only_active=False))
        labels = {state.name: self.label(state, now_ns, recorder_on) for state in states}
        return {name: label for name, label in labels.items() if label is not None}

    def label(self, state: GroupState, now_ns: int, recorder_on: bool) -> str | None:
        fixed = self._fixed.get(state.name)
        if fixed is not None and fixed[0] == state.entered:
            return fixed[1]
        if recorder_on and state.sequence is not None and state.op is None and \
                now_ns - state.entered_ns < NAME_HOLD_NS:
            return None
        label = state.op_name
        self._fixed[state.name] = (state.entered, label)
        return label
