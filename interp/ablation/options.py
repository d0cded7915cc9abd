"""``SweepOptions``: every option of one ``ablate_bias`` call, each declared once (default, how it binds the
results, its check, its help and whether ``interp ablate`` has a flag for it).

This module imports neither torch nor the sweep, so the command line builds its flags from the same declaration
(``add_flags``) while ``interp --help`` stays fast; its count and positive-number checks restate
``interp.checks.check_count`` and ``check_positive`` without their torch import (the same rules and messages).

How each option reaches the results (``bind``; ``SweepOptions.BINDS``):

* ``"fingerprint"``: the rows' values depend on it, so it is in the log's fingerprint and in each row's
  ``options`` column: a resume or a ``merge_shards`` under another value is refused (``n_projections`` only
  with a distance metric, whose atp_distance rows it changes; ``shard`` only in the log: ranks differ by it);
* ``"key"``: in each row's key and columns (method, estimate; positions and thresholds for the implicit
  kinds, in ``options`` too): a resume under another value runs its own rows, never reuses these;
* ``"none"``: how the same rows are computed or which of them run (stacking, prefix reuse, the progress
  bar, which variants "auto" runs exactly): no row's value depends on it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import numpy as np

from interp.bootstrap import check_bootstrap
from interp.errors import InputError, _unknown_keywords, check_option_types, option_checkers
from interp.types import ESTIMATES, METHODS, Estimate, Method


CONTROL_P = ("normal", "sequential")  # how an exact head's control_p is read (interp.ablation.sweep.control_columns)
SEQUENTIAL_MIN = 39  # control_p sequential: the fewest n_control allowed (p can reach 1 / 40 = 0.025 at most)


def _member(choices: tuple) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if value not in choices:
            raise InputError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
        return value
    return check


def _count(minimum: int) -> Callable[[str, Any], int]:
    """``interp.checks.check_count``'s rule, without its torch import (the CLI reads these declarations)."""
    def check(name: str, value: Any) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise InputError(f"{name} must be an integer >= {minimum}; got {value!r} ({type(value).__name__})")
        return int(value)
    return check


def _stack(name: str, value: Any) -> Any:
    """"auto" (``interp.ablation.memory.auto_stack``) or a count >= 1; the command line's text "8" is a count."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value == "auto":
        return value
    if isinstance(value, str):
        raise InputError(f"{name} must be 'auto' or an integer >= 1; got {value!r}")
    return _count(1)(name, value)


def _positive(name: str, value: Any) -> float:
    """``check_positive``'s rule (a positive finite real number, numpy scalars too), without torch."""
    real = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
    if not real or not value > 0 or math.isinf(float(value)):
        raise InputError(f"{name} must be a positive finite number; got {value!r}")
    return float(value)


def _projections(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"n_projections must be >= 1 (random projections of the features); got {value!r}")
    return int(value)


def _shard(name: str, value: Any) -> tuple[int, int]:
    """(rank, world), two ints (the door has checked their type), 0 <= rank < world."""
    rank, world = (int(x) for x in value)
    if world < 1 or not 0 <= rank < world:
        raise InputError(f"shard must be (rank, world) with 0 <= rank < world; got {value!r}")
    return rank, world


# where each option applies (``option``'s estimates, kinds, needs_out): a value other than the default where an
# option does not apply is refused (``SweepOptions.check_applies``) with the reason; the command line reads the same
_EXACT = ("exact", "auto")  # the estimates that run exact rows (auto: its top_k and sample_k heads)


def option(default: Any, bind: str, help: str, check: Optional[Callable[[str, Any], Any]] = None,
           flag: bool = False, only: Optional[str] = None, estimates: Optional[tuple] = None,
           kinds: Optional[tuple] = None, needs_out: bool = False) -> Any:
    """One option's declaration: its default, how it binds the results (module doc), its help (the command line's
    and the docs'), its check (``check(name, value)`` returns the value to keep or raises ``InputError``; its type
    is checked first, against the field's annotation, by the library's one door, ``interp.errors.public``'s),
    whether ``interp ablate`` has a flag for it, ``only``: "distance" / "sharded" where the fingerprint holds it only
    under a distance metric / more than one rank; and where it applies (``check_applies``): ``estimates`` (None:
    all), ``kinds`` (one of them requested; None: all), ``needs_out`` (only with an output folder)."""
    return field(default=default, metadata=dict(bind=bind, help=help, check=check, flag=flag, only=only,
                                                estimates=estimates, kinds=kinds, needs_out=needs_out))


@dataclass(frozen=True)
class SweepOptions:
    """Every option of one ``ablate_bias`` call besides the model, data, metric, statistics, output folder and
    the selection of variants (kinds, scope, layers, heads): typed, checked once here, read by every step
    (each field's declaration: ``option``; the module doc says what ``bind`` means)."""

    method: Method = option("zero", "key", "zero | mean | layer_mean | fold | random (interp.record.patching)",
                            _member(METHODS))
    estimate: Estimate = option("auto", "key", "exact | attribution | atp | atp_distance | auto",
                                _member(ESTIMATES))
    max_batches: Optional[int] = option(None, "fingerprint", "batches of the data read (None: all)")
    stack: Any = option("auto", "none", "variants stacked on the batch axis of one patched forward: a count, or "
                        "auto, the most (up to 8) whose estimated peak stays within 2 plain forwards' or, when a "
                        "one-pass estimate runs first, within its backward's peak (interp.ablation.memory)", _stack,
                        flag=True, estimates=_EXACT)
    force_exact: bool = option(False, "none", "run forwards even for variants an identity answers (b_k under "
                               "non-rotary positions, absent biases, b_v folded); by default their rows say why and "
                               "skip the forward (under an estimate too: the variants are estimated)", flag=True)
    reuse_prefix: bool = option(True, "none", "replay the intact layers below a patch instead of recomputing them",
                                estimates=_EXACT)
    top_k: int = option(5, "none", "heads per kind run exactly under estimate auto", _count(0), flag=True,
                        estimates=("auto",))
    sample_k: int = option(5, "none", "heads per kind drawn at random (seed) and run exactly too under estimate "
                           "auto, so estimate and exact are compared off the estimate's own top", _count(0), flag=True,
                           estimates=("auto",))
    n_projections: int = option(8, "fingerprint", "random projections of atp_distance's second-order estimate",
                                _projections, only="distance", estimates=("atp_distance", "auto"))
    n_boot: int = option(1000, "fingerprint", "bootstrap resamples over items for delta_lo/delta_hi of exact rows "
                         "(0: none)", flag=True, estimates=_EXACT)
    n_control: int = option(19, "fingerprint", "matched-control draws per exact head (random directions of the "
                            "method's own displacement norm; fewer where control_stop ends a head inside its band); "
                            "under control_p sequential the most draws (pass 199 or so: its smallest p is "
                            "1 / (n_control + 1)); each draw costs a patched forward (0: none)", _count(0), flag=True,
                            estimates=_EXACT)
    control_stop: int = option(5, "fingerprint", "a head's draws stop once this many move the metric as much as the "
                               "head does (it is inside its band: p = control_stop / draws, Besag-Clifford); "
                               "0: always n_control draws", _count(0), flag=True, estimates=_EXACT)
    control_p: str = option("normal", "fingerprint", "the p of a head that draws all n_control: normal (the tail of "
                            "a normal fitted to its control draws, as a Student-t prediction; the Monte Carlo p "
                            "beside it) | sequential (the Monte Carlo p alone, Besag-Clifford; with n_control=199)",
                            _member(CONTROL_P), flag=True, estimates=_EXACT)
    seed: int = option(0, "fingerprint", "fixes the bootstrap, the random sample, the control's directions and "
                       "method random", flag=True)
    shard: tuple[int, int] = option((0, 1), "fingerprint", "(rank, world): this process runs every world-th variant",
                                    _shard, only="sharded")
    progress: bool = option(True, "none", "a progress bar")
    overwrite: bool = option(False, "none", "start a new sweep log in out even if it holds results of another run",
                             flag=True, needs_out=True)
    positions: Any = option(None, "key", "sink_v's position classes (resolved against the model by "
                            "interp.ablation.implicit.check_implicit)", kinds=("sink_v",))
    abs_threshold: float = option(100.0, "key", "massive: residual entries past this absolute value", _positive,
                                  kinds=("massive",))
    ratio_threshold: float = option(1000.0, "key", "massive: and past this multiple of the median", _positive,
                                    kinds=("massive",))

    BINDS: ClassVar[dict[str, str]]  # field -> "fingerprint" | "key" | "none", from the declarations
    ESTIMATE_BOUND: ClassVar[frozenset]  # fingerprint fields that apply to some estimates only

    def __post_init__(self) -> None:
        check_option_types("SweepOptions", _door(), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        for f in dataclasses.fields(self):
            if f.metadata["check"] is not None:
                object.__setattr__(self, f.name, f.metadata["check"](f.name, getattr(self, f.name)))
        if self.control_p == "sequential" and 0 < self.n_control < SEQUENTIAL_MIN:
            raise InputError(f"control_p='sequential' with n_control={self.n_control}: its smallest p is "
                             f"1 / {self.n_control + 1}, which no correction across heads can pass; pass "
                             "n_control=199 (heads inside their band still stop after a few draws) or "
                             "control_p='normal'")
        n_boot, seed = check_bootstrap(self.n_boot, self.seed)
        object.__setattr__(self, "n_boot", n_boot)
        object.__setattr__(self, "seed", seed)

    def fingerprint(self, distance: bool) -> dict:
        """The options bound into the log's fingerprint ("fingerprint" in ``BINDS``; ``only`` says when)."""
        bound = {}
        for f in dataclasses.fields(self):
            only = f.metadata["only"]
            if f.metadata["bind"] != "fingerprint" or (only == "distance" and not distance) or (
                    only == "sharded" and self.shard[1] == 1):
                continue
            if f.metadata["estimates"] is not None and self.estimate not in f.metadata["estimates"]:
                continue  # it does not apply to this estimate: its rows do not depend on it (the log keeps it)
            bound[f.name] = f"{self.shard[0]}/{self.shard[1]}" if only == "sharded" else getattr(self, f.name)
        return bound


    def check_applies(self, kinds: Any, out: bool, estimates: Optional[tuple] = None) -> None:
        """One ``InputError`` for an option given a value other than its default where it does not apply (its
        declaration: ``option``): e.g. ``top_k`` with an exact estimate, ``n_control`` with attribution,
        ``positions`` without sink_v, ``overwrite`` without ``out``. ``estimates`` (default: this call's) lets the
        command line check the union of the estimates it runs (``--estimate both``)."""
        estimates = estimates or (self.estimate,)
        requested = {kinds} if isinstance(kinds, str) else set(kinds) if isinstance(kinds, (list, tuple, set)) else (
            set())
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if _same(value, f.default):
                continue
            if meta["estimates"] is not None and not set(estimates) & set(meta["estimates"]):
                raise InputError(f"{f.name}={value!r} does not apply with estimate={'/'.join(estimates)}: it applies "
                                 f"only under estimate {' or '.join(meta['estimates'])} ({meta['help']}); leave it out "
                                 "or choose such an estimate")
            if meta["kinds"] is not None and not requested & set(meta["kinds"]):
                raise InputError(f"{f.name}={value!r} does not apply to kinds {sorted(requested)}: it applies only "
                                 f"when kinds include {' or '.join(meta['kinds'])} ({meta['help']}); leave it out")
            if meta["needs_out"] and not out:
                raise InputError(f"{f.name}={value!r} does not apply without out= (an output folder holding a sweep "
                                 "log): leave it out or give out")

    def keywords(self, estimate: Optional[str] = None) -> dict:
        """These options as ``ablate_bias`` keywords; with ``estimate``, for that one of several (the command
        line's ``--estimate both``): the options that do not apply to it at their defaults."""
        estimate = estimate or self.estimate
        return {f.name: f.default if f.metadata["estimates"] is not None and estimate not in f.metadata["estimates"]
                else getattr(self, f.name) for f in dataclasses.fields(self)} | {"estimate": estimate}


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:  # an array compared elementwise: not the default
        return False


@functools.lru_cache(maxsize=1)
def _door() -> dict:
    """The type checkers of SweepOptions' fields (from their annotations), built once on first use."""
    return option_checkers(SweepOptions, SweepOptions.__annotations__)


def _refuse_unknown(init: Callable) -> Callable:
    """``SweepOptions(topk=1)``: one ``InputError`` naming the nearest option, never a bare TypeError."""
    sig = inspect.signature(init)

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            sig.bind(self, *args, **kwargs)
        except TypeError as exc:
            unknown = _unknown_keywords(SweepOptions, sig, kwargs)
            raise InputError(unknown or f"SweepOptions: {exc}; its options are {', '.join(OPTION_NAMES)}") from None
        init(self, *args, **kwargs)
    return checked


SweepOptions.__init__ = _refuse_unknown(SweepOptions.__init__)  # type: ignore[method-assign]
SweepOptions.BINDS = {f.name: f.metadata["bind"] for f in dataclasses.fields(SweepOptions)}
SweepOptions.ESTIMATE_BOUND = frozenset(f.name for f in dataclasses.fields(SweepOptions)
                                        if f.metadata["bind"] == "fingerprint" and f.metadata["estimates"] is not None)
OPTION_NAMES = tuple(SweepOptions.BINDS)


def sweep_options(function: str = "ablate_bias", **given: Any) -> SweepOptions:
    """The keywords ``given`` (option names only) as checked ``SweepOptions``, or one ``InputError`` (an unknown
    name, with the nearest option; a value of the wrong type; a value out of range)."""
    return SweepOptions(**given)


def add_flags(parser: Any) -> None:
    """``interp ablate``'s flags for the options declared with ``flag=True``: ``--top-k`` for ``top_k``, a switch
    for a boolean option, the declared default and help."""
    for f in dataclasses.fields(SweepOptions):
        if not f.metadata["flag"]:
            continue
        name = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            parser.add_argument(name, action="store_true", help=f.metadata["help"])
        else:
            parser.add_argument(name, type=type(f.default), default=f.default,
                                help=f.metadata["help"] + " (default: %(default)s)")


def flag_values(args: Any) -> dict:
    """The flagged options' values from parsed ``interp ablate`` arguments."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(SweepOptions) if f.metadata["flag"]}
