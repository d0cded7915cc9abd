"""Recording: hooks named as TransformerLens names them, bias patching, the prefix cache, per-head
weights, and the streaming Q/K/V statistics (``QKVStats``) with their fingerprint.

Importing the package imports nothing else; each module loads on first use."""

from interp._lazy import lazy_modules as _lazy_modules

__getattr__ = _lazy_modules(__name__, globals())
