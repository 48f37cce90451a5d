"""DLRover's safe calls: a training event never raises into training.

Every public method of the event classes, and of users' subclasses of them, is
wrapped here; a failure is logged once and returns ``SafeCallable``, an inert
object that accepts any further call, attribute or ``with``. Kept apart so the
emitter and the predefined processes share one wrapping and one no-op.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from otel_training._contain import contain, contained, log_once


class SafeCallable:
    """What a failed safe call returns: any call, attribute or ``with`` on it does nothing.

    So ``trainer.step(...).begin()`` or ``with trainer.step(...):`` after a failure
    inside ``step`` still runs the user's code, without events.
    """

    _instance: ClassVar[SafeCallable | None] = None

    def __new__(cls) -> SafeCallable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __call__(self, *args: Any, **kwargs: Any) -> SafeCallable:
        return self

    def __getattr__(self, name: str) -> SafeCallable:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __enter__(self) -> SafeCallable:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        return False  # the user's exception goes on

    def __repr__(self) -> str:
        return "SafeCallable()"


#: A method of a Process or Duration (or of your subclass) that raises is logged once and returns
#: the chaining no-op, as DLRover's safe calls do: a training event must never raise into training.
_safe = contained(SafeCallable(), "otel_training: %s raised; the event is skipped and training continues")


class _SafeCalls(type):
    """Makes every public method of the class, and of its subclasses (yours), a safe call."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> _SafeCalls:
        for key, value in list(namespace.items()):
            if key.startswith("_"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                namespace[key] = type(value)(_safe(value.__func__))
            elif callable(value) and not isinstance(value, type):
                namespace[key] = _safe(value)
        return super().__new__(mcs, name, bases, namespace)


class _SafeAttributes:
    """A method that does not exist logs and returns a ``SafeCallable``, as in DLRover.

    Dunder names still raise ``AttributeError``: copy, pickle and ``Mock(spec=...)`` rely on it.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        log_once(f"dlrover-compat:missing:{type(self).__qualname__}.{name}",
                 "otel_training: %s has no attribute %r; the call is ignored", type(self).__name__, name,
                 exc_info=False)
        return SafeCallable()


def _as_dict(content: Any) -> dict[Any, Any]:
    if content is None:
        return {}
    # Content that is no mapping (or whose iteration raises) is dropped, logged once.
    with contain("dlrover-compat:content", "otel_training: DLRover event content must be a mapping, not %s; it "
                 "is dropped", type(content).__name__, exc_info=False):
        return dict(content)
    return {}
