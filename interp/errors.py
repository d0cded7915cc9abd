"""Exceptions with messages that name the problem and what was expected."""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Iterator, Optional


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


def _resource(exc: BaseException) -> bool:
    """Out of memory (host or device) or a warning raised as an error: these leave unchanged, never rewrapped."""
    return isinstance(exc, Warning) or any(c.__name__ in _PASS_THROUGH for c in type(exc).__mro__)


@contextlib.contextmanager
def boundary(what: str, fix: str, error: type = InputError) -> Iterator[None]:
    """A construction boundary (a model built from a config or ``model_args``, a table or text file read, a log
    opened): whatever the third-party library raises inside becomes one ``error`` (an ``InputError`` unless
    said) naming ``what`` was being built or read, the library's own words, and ``fix``; errors of ours and
    resource errors (out of memory) pass unchanged. The original is the error's ``__cause__`` (``--debug``)."""
    try:
        yield
    except InterpError:
        raise
    except Exception as exc:
        if _resource(exc):
            raise
        words = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise error(f"{what} failed ({type(exc).__name__}{': ' + words[:300] if words else ''}): {fix}") from exc


def _describe(value: Any) -> str:
    """A short, safe description of an argument for an error message."""
    info = getattr(value, "interp", None)
    if getattr(info, "name", None) is not None:
        return f"model {info.name!r}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        if tuple(value.shape) == () and hasattr(value, "item"):  # a numpy / torch scalar: its value and dtype
            return f"{value.item()!r} as {value.dtype}"
        return f"{type(value).__name__} {value.dtype} {tuple(value.shape)}"
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, (list, tuple, dict)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def _unknown_keywords(func: Callable, sig: inspect.Signature, kwargs: dict) -> Optional[str]:
    """One sentence for keyword names ``func`` does not take, each with the nearest one it does (difflib), or None."""
    params = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in kwargs if k not in params]
    if not unknown:
        return None
    said = []
    for name in unknown:
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        said.append(f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    return (f"{func.__qualname__}() has no option {', '.join(said)}; its options are "
            f"{', '.join(n for n in names if n not in ('self', 'cls'))}")


# -- the typed door: every option of a public function is checked against its annotation before use ----------------

_NOT_AN_OPTION = object()  # an annotation the door does not check (a model, data, a callable, a table, Any)


def _strict_hint(hint: Any) -> Any:
    """``hint`` with its scalars strict (a bool is a ``bool``, an int an ``int``: not a bool, not a float; a str a
    ``str``; a pair of them a pair), or ``_NOT_AN_OPTION`` when it names anything else."""
    from pydantic import StrictBool, StrictFloat, StrictInt, StrictStr

    if hint is bool:
        return StrictBool
    if hint is int:
        return StrictInt
    if hint is str:
        return StrictStr
    if hint is float:
        return StrictFloat  # an int too, as Python reads it; never a bool or text
    if hint in (type(None), Path, None):
        return type(None) if hint is None else hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        # the choices are the function's own check, with its own message; the door only says it is text
        return StrictStr if all(isinstance(a, str) for a in args) else _NOT_AN_OPTION
    if origin is typing.Union or (sys.version_info >= (3, 10) and origin is __import__("types").UnionType):
        inner = [_strict_hint(a) for a in args]
        return _NOT_AN_OPTION if any(i is _NOT_AN_OPTION for i in inner) else typing.Union[tuple(inner)]
    if origin is tuple and args and Ellipsis not in args:  # a pair: (rank, world), (height, width)
        inner = [_strict_hint(a) for a in args]
        return _NOT_AN_OPTION if any(i is _NOT_AN_OPTION for i in inner) else typing.Tuple[tuple(inner)]
    # a selection (layers, heads, kinds: one item or several, a range, an array) is parsed by its own reader,
    # ``interp.checks.index_selection`` / ``check_kinds``, whose messages say what a mask or a float would mean
    return _NOT_AN_OPTION


def _plain(value: Any) -> Any:
    """numpy and torch numbers and arrays as Python's (a numpy integer is an integer, an integer array a list of
    them), lists and tuples item by item; anything else unchanged. Only the door reads this copy."""
    if type(value).__module__.split(".")[0] in ("numpy", "torch") and hasattr(value, "tolist") and hasattr(
            value, "ndim"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value) if type(value) in (list, tuple) else value
    return value


def option_checkers(owner: Any, annotations: dict) -> dict:
    """name -> pydantic ``TypeAdapter`` of the strict annotation, for each annotated option of ``owner`` (a
    function or class: its module's names resolve string annotations) the door checks; the others are left out."""
    from pydantic import TypeAdapter

    module = sys.modules.get(getattr(owner, "__module__", ""), None)
    namespace = dict(vars(module)) if module is not None else {}
    namespace.setdefault("Optional", Optional)
    checkers = {}
    for name, annotation in annotations.items():
        if name == "return":
            continue
        try:
            hint = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # noqa: S307
        except Exception:  # a name imported for type checking only: not an option
            continue
        strict = _strict_hint(hint)
        if strict is not _NOT_AN_OPTION:
            checkers[name] = (TypeAdapter(strict), hint)
    return checkers


def check_option_types(where: str, checkers: dict, values: dict) -> None:
    """One ``InputError`` for the first value whose type does not fit its option's annotation, in the words the
    library's own checks use: ``top_k must be an integer; got 'x' (str)``."""
    from pydantic import ValidationError

    for name, value in values.items():
        if name not in checkers:
            continue
        checker, hint = checkers[name]
        try:
            checker.validate_python(_plain(value))
        except ValidationError as exc:
            first = exc.errors()[0]
            indices = [i for i in first["loc"] if isinstance(i, int)]
            at = "".join(f"[{i}]" for i in indices)
            got = first.get("input", value) if at else value
            whole = f" ({name} must be {_expected(hint)})" if at else ""
            raise InputError(f"{where}: {name}{at} must be {_expected(_part(hint, indices))}; got {_describe(got)} "
                             f"({type(got).__name__}){whole}") from None


def _part(hint: Any, indices: list) -> Any:
    """The annotation of ``value[i][j]...`` within ``hint`` (a tuple's items, through ``Optional``)."""
    for i in indices:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        while len(args) == 1 and typing.get_origin(args[0]) is not None and typing.get_origin(hint) is not tuple:
            hint, args = args[0], list(typing.get_args(args[0]))
        if typing.get_origin(hint) is not tuple or i >= len(args):
            return hint
        hint = args[i]
    return hint


_WORDS = {bool: "True or False", int: "an integer", float: "a number", str: "a str", Path: "a path",
          type(None): "None"}


def _expected(hint: Any) -> str:
    """What an annotation asks for, as a sentence says it: ``an integer or None``, ``a pair (an integer, an
    integer)``, ``True or False``."""
    if hint in _WORDS:
        return _WORDS[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is typing.Union or (sys.version_info >= (3, 10) and origin is __import__("types").UnionType):
        words = [_expected(a) for a in args if a is not type(None)]
        if set(args) >= {str, Path}:
            words = [w for w in words if w not in ("a str", "a path")] + ["a path (str or Path)"]
        return " or ".join(words + (["None"] if type(None) in args else []))
    if origin is tuple:
        return f"a tuple of {len(args)} (" + ", ".join(_expected(a) for a in args) + ")"
    return _hint_text(hint)


def _hint_text(hint: Any) -> str:
    """An annotation as a reader writes it: ``Optional[int]``, ``tuple[int, int]``, ``bool``."""
    text = hint.__name__ if isinstance(hint, type) else repr(hint)
    for old, new in (("typing.", ""), ("NoneType", "None"), ("collections.abc.", ""), ("pathlib.", "")):
        text = text.replace(old, new)
    return text


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
    door: list = []  # the option checkers, built on the first call (pydantic is imported then, not at import)

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            unknown = _unknown_keywords(func, sig, kwargs)
            raise InputError(unknown or f"{func.__qualname__}(): {exc}; its parameters are {sig}") from None
        if not door:
            door.append(option_checkers(func, getattr(func, "__annotations__", {})))
        check_option_types(f"{func.__qualname__}()", door[0], bound.arguments)
        try:
            return func(*args, **kwargs)
        except InterpError:
            raise
        except Exception as exc:
            if _resource(exc):
                raise
            on = ", ".join(f"{k}={_describe(v)}" for k, v in bound.arguments.items())
            raise InternalError(
                f"{func.__qualname__} failed unexpectedly on ({on}): {type(exc).__name__}: {exc}. This is a bug in "
                "interp (an input it should have checked, or an internal error): please report it with this "
                "message; the original traceback is this error's __cause__ (--debug on the command line)") from exc

    guarded.__interp_public__ = True  # type: ignore[attr-defined]
    return guarded
