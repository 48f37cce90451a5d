"""Which way a rank tracks its collectives: torch's ProcessGroup hooks, its per-group sequence number, or not.

Why a module of its own: the choice depends on the torch a cluster pins (the hooks came late), the option
``collective_tracking`` can force it, and the rank says once in its log which it took and why
(``collectives.py`` describes both routes).
"""

from __future__ import annotations


def supported() -> bool:
    """torch has the ProcessGroup collective hooks (newer torch); older torch has the sequence route."""
    try:
        import torch.distributed as dist

        return dist.is_available() and hasattr(dist.ProcessGroup, "register_pre_hook")
    except Exception:  # noqa: BLE001 - a torch whose distributed package fails to import has no hooks
        return False


#: What the ``collective_tracking`` option takes.
ROUTES = ("auto", "hooks", "sequence", "off")


def route(option: str = "auto") -> tuple[str, str]:
    """(the route this torch and ``option`` give: "hooks", "sequence" or "off"; why, for the log)."""
    try:
        import torch
        import torch.distributed as dist

        available = dist.is_available()
        version = torch.__version__
    except Exception as error:  # noqa: BLE001 - a broken torch.distributed import: tracking off, and the log says why
        return "off", f"torch.distributed is not available ({error})"
    if not available:
        return "off", f"torch {version} was built without torch.distributed"
    if option == "off":
        return "off", "collective_tracking=off"
    hooks = hasattr(dist.ProcessGroup, "register_pre_hook")
    sequence = hasattr(dist.ProcessGroup, "_get_sequence_number_for_group")
    if option in ("auto", "hooks") and hooks:
        return "hooks", f"torch {version}'s ProcessGroup collective hooks"
    if option in ("auto", "sequence") and sequence:
        why = "" if option == "sequence" else f"torch {version} has no ProcessGroup collective hooks; "
        return "sequence", (f"{why}entered from torch's per-group sequence number, completed at each step's end, "
                            "ops named by the flight recorder when it is on (docs/hang-diagnosis.md)")
    return "off", (f"torch {version} has neither ProcessGroup collective hooks nor a per-group sequence number"
                   if option == "auto" else f"collective_tracking={option}: torch {version} does not have it")
