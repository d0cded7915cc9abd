"""Exceptions with messages that name the problem and what was expected."""

from __future__ import annotations


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
