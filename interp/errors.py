"""Exceptions with messages that name the problem and what was expected."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable


class InterpError(Exception):
    """Base class for every error this library raises on purpose."""


class UnknownSourceError(InterpError, ValueError):
    """``load_model`` could not resolve its ``source``."""


class UnsupportedModelError(InterpError, ValueError):
    """The model's architecture has no adapter."""


class OfflineError(InterpError, OSError):
    """A hub id was requested while the hub is unreachable or disabled."""


class InputError(InterpError, ValueError):
    """An input has the wrong kind, dtype or shape for the model."""


class MissingWeightsError(InterpError, FileNotFoundError):
    """A zoo model's weights are absent or corrupt in the local cache."""


class ActivationError(InterpError, FloatingPointError):
    """NaN or inf found in a recorded activation."""


class RegistryError(InterpError, ValueError):
    """A model family was registered twice, or looked up under a name nobody registered."""


class StaleResultsError(InterpError, ValueError):
    """A results folder holds results of another model, data or settings than this run's."""


class CheckpointError(StaleResultsError):
    """A training checkpoint cannot be read (truncated, empty, not a checkpoint) or belongs to another
    arm or seed than the run resuming from it (a ``StaleResultsError``, so one ``except`` catches both)."""


class StepFailedError(InterpError, RuntimeError):
    """A pipeline step failed; the earlier steps' results and a report saying so were written."""


class InternalError(InterpError, RuntimeError):
    """An unexpected failure inside interp: a bug to report (raised by ``public``, the last line of defence, when
    no specific check caught the problem first, and by an internal function called where its precondition does
    not hold, e.g. ``fused.tile_sums`` without its compiled kernel)."""


_PASS_THROUGH = ("MemoryError", "OutOfMemoryError")  # resources, not bugs: they leave unchanged


def _describe(value: Any) -> str:
    """A short, safe description of an argument for an error message."""
    info = getattr(value, "interp", None)
    if getattr(info, "name", None) is not None:
        return f"model {info.name!r}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} {value.dtype} {tuple(value.shape)}"
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, (list, tuple, dict)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def public(func: Callable) -> Callable:
    """Guard a public function: arguments that do not fit its signature are an ``InputError``
    naming its parameters, and any exception outside ``InterpError`` (KeyboardInterrupt, SystemExit,
    MemoryError and CUDA out-of-memory excepted) leaves as ``InternalError``, saying what failed, on
    which input, and that it is a bug to report (the original exception is its ``__cause__``).
    Specific, clear errors are raised by the checks inside; this only catches what they missed.

    Applied where each public function is defined (``@public``), so every import path is guarded
    (``interp.X``, ``interp.ablation.X``, ``interp.analysis.sinks.X``); guarding twice is guarding once."""
    if getattr(func, "__interp_public__", False):
        return func
    sig = inspect.signature(func)

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise InputError(f"{func.__qualname__}(): {exc}; its parameters are {sig}") from None
        try:
            return func(*args, **kwargs)
        except InterpError:
            raise
        except Exception as exc:
            if isinstance(exc, Warning) or any(c.__name__ in _PASS_THROUGH for c in type(exc).__mro__):
                raise
            on = ", ".join(f"{k}={_describe(v)}" for k, v in bound.arguments.items())
            raise InternalError(
                f"{func.__qualname__} failed unexpectedly on ({on}): {type(exc).__name__}: {exc}. This is a bug in "
                "interp (an input it should have checked, or an internal error): please report it with this "
                "message; the original traceback is this error's __cause__ (--debug on the command line)") from exc

    guarded.__interp_public__ = True  # type: ignore[attr-defined]
    return guarded
