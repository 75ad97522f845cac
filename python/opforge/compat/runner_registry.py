"""The runner registry pattern (integer IDs for stateful kernel objects),
backed by opforge handles.

    from opforge.compat.runner_registry import register_runner, get_runner, release_runner

    rid = register_runner(runner)     # an int, e.g. 4611686022722355200
    get_runner(rid) is runner         # True
    release_runner(rid)
    get_runner(rid)                   # RunnerNotFoundError: the id was released

As with the usual dict-based registry, a registered runner stays alive until
it is released. Unlike it, an id is never reused: a released id stays an
error, and every new registration gets a new id. Registering the same object
twice returns the same id. For new code, `opforge.Handle[Runner]` parameters
take the runner itself and do this bookkeeping for you.

Under torch.compile the id is a graph input, not a constant (where the
installed torch allows it, see docs/handles.md): layers that each hold their
own id share one compiled graph, as long as the op declares the id `int`
(`SymInt` in the schema, which is what `torch.library.custom_op` infers).
"""

from __future__ import annotations

from typing import Any

from .. import handles

__all__ = ["RunnerNotFoundError", "get_runner", "register_runner", "release_runner"]


class RunnerNotFoundError(KeyError):
    """No runner is registered under an id. A KeyError (and so a
    LookupError), as a lookup in the usual dict-based registry raises."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def register_runner(runner: Any) -> int:
    """The runner's id (an int); the registry keeps the runner alive until
    `release_runner`."""
    return handles.dynamic(handles.pin(runner))


def get_runner(runner_id: int) -> Any:
    """The runner registered under `runner_id`."""
    if isinstance(runner_id, bool) or not isinstance(runner_id, int):
        raise TypeError(f"get_runner: runner ids are ints, got {type(runner_id).__name__}. "
                        f"Pass the id register_runner returned.")
    try:
        return handles.resolve(runner_id)
    except (LookupError, TypeError, OverflowError):
        raise RunnerNotFoundError(
            f"get_runner({int(runner_id)}): no runner is registered under this id; it was released, or "
            f"register_runner never returned it. Register the runner and use the id register_runner returns."
        ) from None


def release_runner(runner_or_id: Any) -> bool:
    """Drops a runner from the registry; its id then raises in `get_runner`.
    Returns False when it was not registered."""
    try:
        return handles.release(runner_or_id)
    except (TypeError, OverflowError):  # an int no handle can be
        return False
