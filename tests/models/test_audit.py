"""The config audit (``interp/models/audit.py``): every attention-relevant attribute of every family's
config class is handled (compared with HF here, at a non-default value), refused (one clear error,
checked here) or irrelevant (with a reason); an attribute with none of the three fails."""

import copy
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers as tf

import interp
from interp.analysis.scores import _key_mask, score_terms
from interp.data.batch import Batch
from interp.errors import UnsupportedModelError
from interp.models.audit import FAMILY, attention_attributes, audit_of, config_attributes
from interp.models.families import get_family, list_families
from interp.models.tiny import tiny_hf_model, tiny_inputs

TESTS = Path(__file__).resolve().parents[1]
ALL = [f.name for f in list_families()]
BASES = [f for f in list_families() if not f.variant_of]
TEST_NAMES = set(re.findall(r"^def (test_\w+)", "\n".join(p.read_text() for p in TESTS.rglob("test_*.py")), re.M))


def _probed(status: tuple[str, ...]) -> list[tuple[str, str]]:
    """(family, attribute) for each entry with a probe among the family's audited attributes (an entry
    several attributes share, such as Qwen2's window, runs once, under its first attribute)."""
    cases, seen = [], set()
    for family in BASES:
        names = set(attention_attributes(family)) | set(FAMILY.get(family.name, {}))
        for n, a in sorted(audit_of(family).items()):
            if n in names and a.status in status and a.probe and (family.name, id(a)) not in seen:
                seen.add((family.name, id(a)))
                cases.append((family.name, n))
    return cases


@pytest.mark.parametrize("name", ALL)
def test_every_attention_attribute_is_handled_refused_or_irrelevant(name):
    family = get_family(name)
    audit = family.config_audit
    missing = [n for n in attention_attributes(family) if n not in audit]
    assert not missing, f"{name}: attention-relevant config attributes with no audit entry: {missing}"
    stale = sorted(set(FAMILY.get(name, {})) - set(config_attributes(family)))
    assert not stale, f"{name}: audit entries for attributes its config class does not have: {stale}"
    test_names = TEST_NAMES
    for attr, entry in audit.items():
        assert entry.status in ("handled", "refused", "irrelevant") and entry.why, (name, attr)
        if entry.status == "handled":
            assert entry.probe or entry.test in test_names, f"{name}.{attr}: handled, but neither probed nor tested"
        if entry.status == "refused":
            assert entry.probe and entry.fix and entry.refuse and entry.scope in ("load", "terms"), (name, attr)


def _outputs(out):
    for key in ("logits", "last_hidden_state", "pooler_output"):
        if hasattr(out, key) and getattr(out, key) is not None:
            return getattr(out, key)
    return out if isinstance(out, torch.Tensor) else out[0]


@pytest.mark.parametrize("name,attr", _probed(("handled", "irrelevant")))
def test_handled_attribute_matches_hf(name, attr):
    """The hooked model at the probed value equals HF's (or timm's / open_clip's) model: outputs, patterns
    and, where the decomposition applies, softmax of the four terms over the layer's key mask."""
    entry = get_family(name).config_audit[attr]
    hf = tiny_hf_model(name, config=entry.probe)
    ids = tiny_inputs(name, pos=12)
    with torch.no_grad():
        if get_family(name).source == "transformers":
            out = hf(ids, output_attentions=True)
            reference, patterns = _outputs(out), out.attentions
        else:
            reference, patterns = hf(ids), None
        model = interp.load_model(copy.deepcopy(hf), device="cpu")
        mine, cache = model.run_with_cache(ids)
    assert (_outputs(mine) - reference).abs().max() <= 1e-5
    info = model.interp
    for layer in range(info.n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        if patterns is not None:
            assert (pattern - patterns[layer]).abs().max() <= 1e-6, f"layer {layer}: pattern differs from HF's"
        if info.spec.score_refusal or info.spec.extra_score_term:
            continue
        total = sum(t.double() for t in score_terms(model, cache, layer).values())
        allowed = _key_mask(model, Batch(ids), total.shape[-1], "cpu", layer)
        from_terms = total.masked_fill(~allowed, float("-inf")).softmax(-1)
        assert (from_terms - pattern.double()).abs().max() <= 1e-5, f"layer {layer}: the four terms miss the pattern"


@pytest.mark.parametrize("name,attr", _probed(("refused",)))
def test_refused_attribute_is_one_clear_error(name, attr):
    """At load (or, for scope 'terms', at the score decomposition): UnsupportedModelError naming the
    attribute, its value and the fix."""
    entry = get_family(name).config_audit[attr]
    hf = tiny_hf_model(name, config=entry.probe)
    if entry.scope == "load":
        with pytest.raises(UnsupportedModelError) as caught:
            interp.load_model(hf, device="cpu")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = interp.load_model(hf, device="cpu")
        with pytest.raises(UnsupportedModelError) as caught:
            interp.score_decomposition(model, [tiny_inputs(name)], progress=False)
    message = str(caught.value)
    named = f"`{attr}={entry.probe[attr]!r}`" if entry.read is None else f"`{attr}"
    assert named in message and entry.fix in message, message


# ----- the cases the issue found, each failing before its fix ---------------------------------------


def _brute_total_variance(patterns, allowed):
    """Per layer and head: Var over attended keys of log p (= the score up to a row constant), averaged
    over query rows: what score_decomposition's total_variance must be."""
    out = []
    for pattern, mask in zip(patterns, allowed):
        logp = pattern.double().clamp_min(1e-300).log()
        m = mask.expand_as(logp).double()
        n = m.sum(-1)
        mean = (logp * m).sum(-1) / n
        var = (((logp - mean[..., None]) ** 2) * m).sum(-1) / n
        out.append(var.mean((0, 2)))
    return torch.stack(out)


def _decomposition_against_hf(name, config, pos=12):
    hf = tiny_hf_model(name, config=config, bias_scale=2.0)
    ids = tiny_inputs(name, pos=pos)
    with torch.no_grad():
        patterns = hf(ids, output_attentions=True).attentions
    model = interp.load_model(hf, device="cpu")
    masks = [_key_mask(model, Batch(ids), pos, "cpu", layer) for layer in range(model.interp.n_layers)]
    table = interp.score_decomposition(model, [ids], progress=False)
    mine = table[table.term == "content"].pivot(index="layer", columns="head", values="total_variance")
    return torch.tensor(mine.values), _brute_total_variance(patterns, masks), patterns, masks


def test_inverse_layer_scaling_enters_the_decomposition():
    """GPT-2 `scale_attn_by_inverse_layer_idx=True`: before, layer 1's total_variance was 4x HF's (the
    1/(layer + 1) factor was ignored); now it equals the variance of HF's own scores."""
    mine, hf, _, _ = _decomposition_against_hf("gpt2", {"scale_attn_by_inverse_layer_idx": True})
    assert torch.allclose(mine, hf, rtol=1e-5, atol=1e-9), (mine, hf)


@pytest.mark.parametrize("name,config", [
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
    ("qwen2-moe", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2}),
    ("mistral", {"sliding_window": 4}), ("mixtral", {"sliding_window": 4}), ("phi3", {"sliding_window": 4}),
])
def test_sliding_window_key_mask_is_hfs(name, config):
    """Before, the key mask had no window: the shares were taken over keys HF never attends. Now the mask
    is exactly where HF's pattern is nonzero, layer by layer, and total_variance is HF's."""
    mine, hf, patterns, masks = _decomposition_against_hf(name, config)
    for layer, (pattern, mask) in enumerate(zip(patterns, masks)):
        assert torch.equal(pattern > 0, mask.expand_as(pattern)), f"layer {layer}: key mask is not HF's"
    q, k = torch.arange(12)[:, None], torch.arange(12)[None, :]
    causal, band = k <= q, (k <= q) & (q - k < config["sliding_window"])  # the window, independently of HF
    kinds = ["window" if torch.equal(m[0, 0], band) else "causal" if torch.equal(m[0, 0], causal) else "?"
             for m in masks]
    assert "window" in kinds and "?" not in kinds, kinds  # the probe exercises the window (it bites at pos 12)
    assert torch.allclose(mine, hf, rtol=1e-5, atol=1e-9), (mine, hf)


def test_windows_follow_hfs_layer_types():
    qwen = interp.load_model(tiny_hf_model("qwen2", n_layers=3, config=dict(
        use_sliding_window=True, sliding_window=4, max_window_layers=1)), device="cpu")
    assert qwen.interp.windows == (None, 4, 4)
    moe = interp.load_model(tiny_hf_model("qwen2-moe", n_layers=3, config=dict(
        use_sliding_window=True, sliding_window=4, max_window_layers=3)), device="cpu")
    assert moe.interp.windows == (4, None, 4)
    assert interp.load_model(tiny_hf_model("qwen2"), device="cpu").interp.windows == ()


def test_stablelm_qk_layernorm_is_its_own_variant():
    """Before: the registry said no qk-norm, so the decomposition claimed terms_complete=True while its
    terms missed the pattern by 0.33. Now the stablelm-qknorm variant refuses it, naming qk-norm."""
    model = interp.load_model(tiny_hf_model("stablelm", config={"qk_layernorm": True}), device="cpu")
    assert model.interp.family == "stablelm-qknorm" and model.interp.spec.qk_norm
    with pytest.raises(UnsupportedModelError, match="qk-norm"):
        interp.score_decomposition(model, [tiny_inputs("stablelm")], progress=False)


def test_timm_deit_qk_norm_is_its_own_variant():
    """Found in the audit: a timm DeiT with qk_norm=True was read as plain DeiT (terms off by 0.033, b_k
    claimed inert)."""
    model = interp.load_model(tiny_hf_model("timm-deit", config={"qk_norm": True}), device="cpu")
    assert model.interp.family == "timm-deit-qknorm" and not model.interp.spec.k_bias_inert


def test_decomposition_refuses_when_its_terms_do_not_give_the_pattern():
    """The class, not the case: a window the config audit does not know about (simulated by hiding the
    model's windows), or a score change it cannot see (a hook doubling layer 1's scores), is refused
    instead of decomposed."""
    windowed = interp.load_model(tiny_hf_model("mistral", config={"sliding_window": 4}), device="cpu")
    windowed.interp.windows = ()
    with pytest.raises(UnsupportedModelError, match="do not reproduce the model's attention pattern"):
        interp.score_decomposition(windowed, [tiny_inputs("mistral", pos=12)], progress=False)
    scaled = interp.load_model(tiny_hf_model("gpt2", bias_scale=2.0), device="cpu")
    scaled.blocks[1].attn.hook_attn_scores.add_hook(lambda t, hook: 2 * t, is_permanent=True)
    with pytest.raises(UnsupportedModelError, match="layer 1: the four score terms"):
        interp.score_decomposition(scaled, [tiny_inputs("gpt2", pos=12)], progress=False)


def test_an_inferred_family_names_its_unaudited_attention_settings():
    hf = tf.GPTNeoForCausalLM(tf.GPTNeoConfig(
        hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], vocab_size=97,
        max_position_embeddings=64, window_size=4, attn_implementation="eager")).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load_model(hf, device="cpu")
    said = " ".join(str(w.message) for w in caught)
    assert "attention settings not in the config audit" in said and "window_size=4" in said
    assert "window_size=4" in model.interp.spec.inferred


def test_a_refused_config_in_a_folder_fails_before_its_weights_are_read(tmp_path, monkeypatch):
    tiny_hf_model("gpt2", config={"scale_attn_weights": False}).save_pretrained(tmp_path)
    monkeypatch.setattr(tf.GPT2LMHeadModel, "from_pretrained", classmethod(lambda *a, **k: pytest.fail("built")))
    with pytest.raises(UnsupportedModelError, match="`scale_attn_weights=False`.*fold the scale into the weights"):
        interp.load_model(tmp_path, device="cpu")


def test_a_key_mask_without_its_layer_is_refused_where_a_window_acts():
    """A caller that omits the layer would get a mask without the window: refused once the sequence is
    longer than the window, harmless (no window acts) below it."""
    model = interp.load_model(tiny_hf_model("mistral", config={"sliding_window": 4}), device="cpu")
    assert _key_mask(model, Batch(tiny_inputs("mistral", pos=4)), 4, "cpu").all(-1).any()
    with pytest.raises(UnsupportedModelError, match="sliding window"):
        _key_mask(model, Batch(tiny_inputs("mistral", pos=12)), 12, "cpu")
