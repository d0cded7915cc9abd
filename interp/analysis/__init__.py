"""Analyzers: functions from (model, statistics or data) to tidy long-form DataFrames."""

from interp.analysis.origin import origin_shift
from interp.analysis.scores import bias_invariances, score_decomposition

__all__ = ["origin_shift", "score_decomposition", "bias_invariances"]
