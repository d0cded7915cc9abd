"""Analyzers: functions from (model, statistics or data) to tidy long-form DataFrames."""

from interp.analysis.high_norm import high_norm_tokens
from interp.analysis.frequency import (
    cluster_heads, family_test, frequency_profile, frequency_shift_under_ablation, spread_difference, spread_interval,
)
from interp.analysis.origin import origin_shift
from interp.analysis.scores import bias_invariances, score_decomposition
from interp.analysis.sinks import (
    implicit_value_bias, massive_activations, sink_counts, sink_pass, sink_profile, sink_shares,
)
from interp.analysis.single_input import SingleInput, single_input

__all__ = ["bias_invariances", "cluster_heads", "family_test", "frequency_profile", "frequency_shift_under_ablation",
           "implicit_value_bias", "massive_activations", "origin_shift", "score_decomposition", "sink_profile",
           "sink_shares"]
__all__ += ["SingleInput", "single_input", "high_norm_tokens", "sink_pass", "sink_counts", "spread_interval",
            "spread_difference"]
