"""Fixtures for tests and tutorials: tiny random-init models of any registered family, and inputs
shaped for them. Not the analysis API (``interp.__all__``); import them from here::

    from interp.testing import tiny_hf_model, tiny_inputs
    model = interp.load_model(tiny_hf_model("qwen2"))
"""

from interp.models.tiny import tiny_hf_model, tiny_inputs

__all__ = ["tiny_hf_model", "tiny_inputs"]
