"""Per rank, per process group: the last collective entered and the last known completed.

When a distributed job hangs every rank stops, and the one question is which
rank is the culprit. Each rank answers its part cheaply, live: the sequence
number, op and size of the last collective it entered on each process group,
and the last one it knows completed. Ranks of one job then compare (the
Prometheus rules, ``analysis.hang``): a rank that has not entered the
collective the others wait in, or entered a different one, is the culprit.

Where it comes from: torch's ProcessGroup pre/post collective hooks (torch
with ``ProcessGroup.register_pre_hook``). They fire in the dispatcher for
every collective issued through the group, from Python (``all_reduce``,
``all_gather_into_tensor``, ...) or from C++ (DDP's reducer), on the issuing
thread. Sequence numbers are torch's own per-group counter (the flight
recorder's ``collective_seq_id``), so ranks compare even if tracking began at
different times. Point-to-point ops are not tracked.

What "completed" means: the ``Work`` of the last collective issued is kept (one
per group) and asked ``is_completed()`` when someone looks (the metric
reader's thread, a step's end, a stuck alert). For gloo that is the host
finishing the exchange; for NCCL it is the collective finishing *on the
device* (its CUDA event), which is later than the host call's return: an NCCL
call returns once launched. Collectives of one group complete in order, so the
last one completing vouches for the earlier ones.

**Torch without those hooks** (they came in 2.15 of the versions this project
runs on; torch 2.11's wheel has none): the *sequence* route. Nothing runs per
collective. ``entered`` is torch's per-group counter read when someone looks (a
step's end, a stuck alert, the gauges), which counts every collective issued
through the group, DDP's included; ``completed`` is what had been entered when
the last step ended (a step ends after its collectives were waited for: DDP's
reducer waits before ``optimizer.step()``); the op's name comes from the flight
recorder's entry with that sequence number when it is on, else it is unknown.
So a rank that has not entered the collective the others wait in still shows
a lower sequence number than theirs, which is what names the culprit. The
``collective_tracking`` option picks the route (``auto``: hooks where torch has
them, else the sequence route; ``off``); the rank says once in its log which.

Costs on the issuing thread (``bench/bench_collectives.py``): two Python calls
from C++ per collective; no span, no lock, no allocation beyond the hook's
arguments. The ``Work`` and the hook's arguments of the last collective are
kept until the next one on the group (the size is computed from them only when
read), so the last collective's input tensors stay alive that long.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from otel_training import semconv as sc
from otel_training._contain import contained, log_once
from otel_training.integrations.torch.collective_state import GroupState, describe
from otel_training.integrations.torch.flight_recorder import OpLabels, flight_recorder, name_ops

#: Hook id of ours on every process group (hooks fire in id order; this keeps us after torch's own).
HOOK_ID = 0x07E1_0017
_P2P = frozenset({"SEND", "RECV"})


class CollectiveTracker:
    """The process's groups; ``step_number`` names the step a collective was entered in."""

    def __init__(self, step_number: Callable[[], int | None] = lambda: None, route: str = "hooks") -> None:
        self.step_number = step_number
        #: "hooks" (torch's pre/post hooks write the state) or "sequence" (read when someone looks).
        self.route = route
        self.groups: dict[str, GroupState] = {}
        #: The group of the most recent collective (what a step span and a stuck alert describe).
        self.last: GroupState | None = None
        self._attached: list[tuple[weakref.ref[Any] | Any, GroupState]] = []
        self._known_groups = 0
        self._step_start: dict[str, int] = {}
        self._meters: weakref.WeakSet[Any] = weakref.WeakSet()
        #: The op label each group's entered gauge carries, fixed per collective (``flight_recorder.OpLabels``).
        self._op_labels = OpLabels()

    # -- attaching --------------------------------------------------------
    @contained(default=False)
    def attach(self, pg: Any) -> bool:
        """Hook ``pg``'s collectives, or read its sequence number from now on (the route; idempotent)."""
        if pg is None or not hasattr(pg, "register_pre_hook" if self.route == "hooks"
                                     else "_get_sequence_number_for_group"):
            return False
        name = _group_name(pg) or str(len(self.groups))
        if name in self.groups:
            return True
        try:
            backend = str(pg.name())
        except Exception:  # noqa: BLE001 - a fake or exotic group
            backend = ""
        sequence = pg._get_sequence_number_for_group  # noqa: SLF001 - torch's per-group counter, public nowhere else
        if self.route == "sequence":
            state = GroupState(name, backend, sequence, self.step_number)
            state.refresh()
            state.completed = state.entered  # what came before tracking began is done
            self.groups[name] = state
            self._step_start[name] = state.entered
            self._attached.append((weakref.ref(pg), state))
            return True
        state = GroupState(name, backend)
        clock, step_number, p2p = time.monotonic_ns, self.step_number, _p2p_values()

        # The hot path: run for every collective on the issuing thread, so no frame more
        # than needed (an exception is still contained: a failing hook would fail the collective).
        def pre(args: Any) -> None:
            try:
                op = args.name
                if int(op) in p2p:
                    return
                state.entered = sequence() + 1
                state.op, state.args, state.op_id = op, args, args.op_id
                state.entered_ns = clock()
                state.step = step_number()
                self.last = state
            except Exception:  # noqa: BLE001 - raised in torch's pre-hook it would fail the user's collective: logged
                _hook_failed("pre")

        def post(args: Any) -> None:
            try:
                if args.op_id == state.op_id:
                    # the previous one is kept too: DDP's bucket all-reduces overlap, and the
                    # earlier one's completion must not wait for a poll that never sees it
                    state.previous, state.previous_seq = state.work, state.work_seq
                    state.work, state.work_seq = args.work, state.entered
            except Exception:  # noqa: BLE001 - raised in torch's post-hook it would fail the user's collective: logged
                _hook_failed("post")

        pg.register_pre_hook(HOOK_ID, pre)
        pg.register_post_hook(HOOK_ID, post)
        self.groups[name] = state
        self._step_start[name] = state.entered
        self._attached.append((pg, state))
        return True

    @contained(default=None)
    def detach(self, pg: Any = None) -> None:
        """Unhook ``pg`` (every group when None): a group's hooks keep it alive until then."""
        keep = []
        for group, state in self._attached:
            if isinstance(group, weakref.ref):  # the sequence route holds its groups weakly, hooks nothing
                group = group()
                if pg is None or group is pg or group is None:
                    self.groups.pop(state.name, None)
                    if self.last is state:
                        self.last = None
                else:
                    keep.append((weakref.ref(group), state))
                continue
            if pg is None or group is pg:
                for unregister in (group.unregister_pre_hook, group.unregister_post_hook):
                    try:
                        unregister(HOOK_ID)
                    except Exception:  # noqa: BLE001 - already destroyed
                        pass
                self.groups.pop(state.name, None)
                if self.last is state:
                    self.last = None
            else:
                keep.append((group, state))
        self._attached = keep

    def close(self) -> None:
        """Unhook every group and stop adding to stuck alerts (uninstrument)."""
        from otel_training.processors import alert_context
        self.detach()
        alert_context.remove(self.alert_attributes)

    def attach_new_groups(self) -> None:
        """Hook groups created since the last look (new_group, DeviceMesh, split_group); cheap when none."""
        try:
            from torch.distributed import distributed_c10d as c10d

            pg_map = c10d._world.pg_map  # noqa: SLF001 - torch's only list of every live group, whoever created it
        except Exception:  # noqa: BLE001 - a torch without that registry: only the groups attached so far are tracked
            return
        if len(pg_map) == self._known_groups:
            return
        self._known_groups = len(pg_map)
        for pg in list(pg_map):
            self.attach(pg)

    # -- reading ----------------------------------------------------------
    @contained(default={})
    def step_attributes(self) -> dict[str, Any]:
        """The step span's view at its end: the last collective, and how many this step entered."""
        self.attach_new_groups()
        count = 0
        state: GroupState | None  # declared apart: the loop narrows it to GroupState, self.last below may be None
        for name, state in self.groups.items():
            if state.sequence is not None:
                state.step_ended()
                if state.entered > self._step_start.get(name, state.entered):
                    self.last = state
            count += state.entered - self._step_start.get(name, state.entered)
            self._step_start[name] = state.entered
        state = self.last
        if state is None:
            return {sc.STEP_COLLECTIVES: count} if self.groups else {}
        state.poll()
        attributes: dict[str, Any] = {sc.STEP_COLLECTIVES: count}
        attributes.update(describe(state))
        return attributes

    @contained(default={})
    def alert_attributes(self) -> dict[str, Any]:
        """For a stuck alert: the pending collective (else the last one) and the flight recorder."""
        return self._now(recorder=True)

    @contained(default={})
    def interrupted_attributes(self) -> dict[str, Any]:
        """For a step the way out ends (an exception, a signal): where its collectives stand, vouching for none.

        A step's own end marks what it entered completed (``step_attributes``); a step that failed in a
        collective (a peer gone) did not complete it, so its rank must not look behind the others. No flight
        recorder here: a dying process's budget is the flush's, and its op is then not named (matching any).
        """
        return self._now(recorder=False)

    def _now(self, recorder: bool) -> dict[str, Any]:
        """The pending collective (else the last one), read now; ``recorder``: with the flight recorder's entries,
        which name the sequence route's ops."""
        if not self.groups:
            return {}
        state: GroupState | None  # declared apart: the loop narrows it to GroupState, the pick below may be None
        for state in self.groups.values():
            state.refresh()
            state.poll()
        entries = flight_recorder({s.backend for s in self.groups.values()}) if recorder else {}
        name_ops(self.groups.values(), entries)
        pending = [state for state in self.groups.values() if state.pending]
        state = max(pending, key=lambda s: s.entered_ns) if pending else self.last
        attributes: dict[str, Any] = describe(state, wait=True) if state is not None else {}
        attributes.update(entries)
        return attributes

    def observe(self) -> list[tuple[str, float, dict[str, Any]]]:
        """(metric, value, attributes) per group: read by the metric reader's thread."""
        rows: list[tuple[str, float, dict[str, Any]]] = [(sc.METRIC_HEARTBEAT, time.time(), {})]
        now = time.monotonic_ns()
        states = list(self.groups.values())
        for state in states:
            try:
                state.refresh()
                state.poll()
            except Exception:  # noqa: BLE001 - a destroyed group's Work
                pass
        # The ops' labels (the sequence route's named from the flight recorder); a group left out waits a moment.
        labels = self._op_labels.of(states, now)
        for state in (state for state in states if state.name in labels):
            group = {sc.COLLECTIVE_GROUP: state.name}
            rows.append((sc.METRIC_COLLECTIVE_ENTERED, state.entered,
                         dict(group, **{sc.COLLECTIVE_OP: labels[state.name]})))
            rows.append((sc.METRIC_COLLECTIVE_COMPLETED, state.completed, group))
            rows.append((sc.METRIC_COLLECTIVE_WAIT, state.wait_s(now), group))
            if state.step is not None:
                rows.append((sc.METRIC_COLLECTIVE_STEP, state.step, group))
        return rows

    # -- gauges -----------------------------------------------------------
    @contained(default=None)
    def register_gauges(self, meter: Any) -> None:
        """Observable gauges on ``meter`` (once per meter): exported by the reader's own thread,
        so they keep flowing while the training thread is blocked in a collective."""
        if meter is None or meter in self._meters:
            return
        self._meters.add(meter)
        from opentelemetry.metrics import Observation
        cache: dict[str, Any] = {"at": 0.0, "rows": []}

        def rows_for(metric: str) -> Iterable[Any]:
            now = time.monotonic()
            if now - cache["at"] > 0.1:  # one poll serves the five callbacks of one collection
                cache["rows"], cache["at"] = self.observe(), now
            return [Observation(value, attributes) for name, value, attributes in cache["rows"] if name == metric]

        for metric, unit, description in GAUGES:
            meter.create_observable_gauge(metric, callbacks=[_callback(rows_for, metric)], unit=unit,
                                          description=description)


GAUGES = (
    (sc.METRIC_HEARTBEAT, "s", "Unix time of the observation, from the metric reader's thread."),
    (sc.METRIC_COLLECTIVE_ENTERED, "{collective}", "Sequence number of the last collective entered, per group."),
    (sc.METRIC_COLLECTIVE_COMPLETED, "{collective}", "Sequence number of the last collective known completed."),
    (sc.METRIC_COLLECTIVE_WAIT, "s", "Seconds inside the collective entered last and not completed (0: none)."),
    (sc.METRIC_COLLECTIVE_STEP, "{step}", "The training step in which the last collective was entered."),
)


def _callback(rows_for: Callable[[str], Iterable[Any]], metric: str) -> Callable[[Any], Iterable[Any]]:
    def callback(options: Any) -> Iterable[Any]:
        try:
            return rows_for(metric)
        except Exception:  # noqa: BLE001 - a failing gauge callback must not fail the metric reader's collection
            return []

    return callback


def _hook_failed(where: str) -> None:
    log_once(f"collectives:{where}", "otel_training: internal error in the collective %s-hook; training continues",
             where)


def _p2p_values() -> frozenset[int]:
    """HookOpName values of point-to-point ops (not tracked: they have no group-wide order)."""
    import torch._C._distributed_c10d as c10d

    names = getattr(c10d, "HookOpName", None)
    return frozenset(int(getattr(names, name)) for name in _P2P if names is not None and hasattr(names, name))


def _group_name(pg: Any) -> str:
    """The group's name as torch (and its flight recorder) calls it: ``pg.group_name``, or, on torch before
    that attribute (2.1), the name ``distributed_c10d`` keeps for it; "" when neither says."""
    name = getattr(pg, "group_name", None)
    if name:
        return str(name)
    try:
        from torch.distributed import distributed_c10d as c10d

        return str(c10d._world.pg_names.get(pg, ""))  # noqa: SLF001 - torch's only record of a group's name there
    except Exception:  # noqa: BLE001 - a stand-in group in a test, or a torch without it
        return ""
