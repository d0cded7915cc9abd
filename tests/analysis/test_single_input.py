"""One input, looked at closely (``interp.single_input``).

Every pattern is checked against an independent computation on the plain HF model (a deep copy,
eager attention, ``output_attentions=True``): the pattern without b_q against HF's own pattern with
that head's b_q zeroed in its weights; the pattern without the key prior against the softmax of the
other three score terms computed from HF's weights (and HF's own rotary); the b_k and b_v identities;
bad inputs raise ``InterpError`` subclasses that name the fix.
"""

import copy
import importlib
import math

import numpy as np
import pytest
import torch

import interp
from interp.errors import InputError, InternalError, InterpError
from interp.record.fingerprint import model_fingerprint
from interp.models import tiny_hf_model

TOL = 1e-6  # float64 models
MEASURED = {}  # printed at the end of the module (-s): the max abs diffs the report quotes


def pair(family):
    """(bridge over a float64 tiny model, an untouched float64 copy of the HF model)."""
    hf = tiny_hf_model(family).double()
    return interp.load_model(copy.deepcopy(hf), device="cpu"), hf


def ids(n=7, seed=0):
    return torch.randint(3, 97, (n,), generator=torch.Generator().manual_seed(seed))


def q_linear(ref, family, layer):
    """(weight [out, in], bias [out]) of the query projection inside HF layer ``layer`` (views, writable)."""
    if family == "gpt2":
        attn = ref.transformer.h[layer].attn.c_attn  # Conv1D, fused: x @ W + b, q first
        d = ref.config.n_embd
        return attn.weight[:, :d].T, attn.bias[:d]
    lin = ref.model.layers[layer].self_attn.q_proj
    return lin.weight, lin.bias


def k_linear(ref, family, layer):
    if family == "gpt2":
        attn = ref.transformer.h[layer].attn.c_attn
        d = ref.config.n_embd
        return attn.weight[:, d:2 * d].T, attn.bias[d:2 * d]
    lin = ref.model.layers[layer].self_attn.k_proj
    return lin.weight, lin.bias


def hf_patterns(ref, x):
    with torch.no_grad():
        return [a[0] for a in ref(input_ids=x[None], output_attentions=True).attentions]


def table_pattern(result, condition, layer, head, n):
    """The [query, key] pattern of one head and condition from the long table (unattended pairs: NaN)."""
    rows = result.patterns.query("condition == @condition and layer == @layer and head == @head")
    out = torch.full((n, n), float("nan"), dtype=torch.float64)
    out[rows.query_pos.to_numpy().copy(), rows.key_pos.to_numpy().copy()] = torch.tensor(rows.weight.to_numpy().copy())
    return out


def max_diff(got, expected):
    seen = ~got.isnan()
    assert torch.equal(seen, expected > 0) or torch.equal(seen, torch.ones_like(seen).tril().bool()), \
        "the table holds exactly the attended pairs"
    return float((got[seen] - expected.detach()[seen]).abs().max())


# ----- the pattern without b_q is HF's pattern with that head's b_q zeroed ------------------------------


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_pattern_without_b_q_equals_hf_with_that_heads_b_q_zeroed_in_the_weights(family):
    model, ref = pair(family)
    info, x = model.interp, ids()
    result = interp.single_input(model, x)
    worst = 0.0
    for layer in range(info.n_layers):
        for head in range(info.n_heads):
            zeroed = copy.deepcopy(ref)
            _, b = q_linear(zeroed, family, layer)
            with torch.no_grad():
                b[head * info.d_head:(head + 1) * info.d_head] = 0
            expected = hf_patterns(zeroed, x)[layer][head]
            worst = max(worst, max_diff(table_pattern(result, "no_b_q", layer, head, len(x)), expected))
            intact = hf_patterns(ref, x)[layer][head]
            assert max_diff(table_pattern(result, "intact", layer, head, len(x)), intact) <= TOL
    MEASURED[f"no_b_q vs HF b_q zeroed ({family})"] = worst
    assert worst <= TOL
    assert result.heads.query("condition == 'no_b_q'").max_abs_diff.max() > 1e-3  # the bias does matter here


# ----- the pattern without the key prior is softmax(content + query_const + const) -------------------


@torch.no_grad()
def hf_terms(ref, family, layer, x, info):
    """The four score terms of ``layer`` from HF's own weights (HF's rotary for qwen2) [head, query, key]."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    got = {}
    block = ref.transformer.h[layer].attn.c_attn if family == "gpt2" else ref.model.layers[layer].self_attn.q_proj
    handle = block.register_forward_pre_hook(lambda m, a: got.setdefault("x", a[0]))
    hf_patterns(ref, x)
    handle.remove()
    h_in, d, n_kv, p = got["x"][0], info.d_head, info.n_kv_heads, len(x)
    (Wq, bq), (Wk, bk) = q_linear(ref, family, layer), k_linear(ref, family, layer)
    cq = (h_in @ Wq.T).view(p, info.n_heads, d).transpose(0, 1)[None]
    ck = (h_in @ Wk.T).view(p, n_kv, d).transpose(0, 1)[None]
    bq, bk = bq.view(1, -1, 1, d).expand_as(cq), bk.view(1, -1, 1, d).expand_as(ck)
    if family == "qwen2":
        cos, sin = ref.model.rotary_emb(h_in[None], torch.arange(p)[None])
        cq, ck = apply_rotary_pos_emb(cq, ck, cos, sin)
        bq, bk = apply_rotary_pos_emb(bq, bk, cos, sin)
    rep = info.n_heads // n_kv
    ck, bk = ck.repeat_interleave(rep, 1), bk.repeat_interleave(rep, 1)
    dot = lambda a, c: (a @ c.transpose(-1, -2) / math.sqrt(d))[0]  # noqa: E731
    return dict(content=dot(cq, ck), query_const=dot(cq, bk), key_prior=dot(bq, ck), const=dot(bq, bk))


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_key_prior_removed_pattern_is_softmax_of_the_other_three_terms(family):
    model, ref = pair(family)
    info, x = model.interp, ids()
    result = interp.single_input(model, x, top_k=None)
    causal = torch.ones(len(x), len(x), dtype=torch.bool).tril()
    worst = worst_kp = 0.0
    for layer in range(info.n_layers):
        t = hf_terms(ref, family, layer, x, info)
        kept = (t["content"] + t["query_const"] + t["const"]).masked_fill(~causal, float("-inf")).softmax(-1)
        full = (kept.log() + t["key_prior"]).masked_fill(~causal, float("-inf")).softmax(-1)
        for head in range(info.n_heads):
            worst = max(worst, max_diff(table_pattern(result, "no_key_prior", layer, head, len(x)), kept[head]))
            assert max_diff(table_pattern(result, "intact", layer, head, len(x)), full[head]) <= TOL  # the terms are HF's
            # the ranking's key prior: the mean over the queries that attend each key, by hand
            kp = t["key_prior"][head].masked_fill(~causal, 0).sum(0) / causal.sum(0)
            rows = result.key_prior.query("layer == @layer and head == @head")
            worst_kp = max(worst_kp, float((torch.tensor(rows.key_prior.to_numpy()) - kp[rows.key_pos.to_numpy().copy()]).abs().max()))
            assert list(rows.key_pos) == sorted(range(len(x)), key=lambda j: -float(kp[j]))[:len(rows)]
    MEASURED[f"no_key_prior vs softmax(content + query_const + const) ({family})"] = worst
    MEASURED[f"key_prior ranking vs hand ({family})"] = worst_kp
    assert worst <= TOL and worst_kp <= TOL


def test_key_prior_without_rotary_is_one_number_per_key_the_same_from_every_query():
    model, _ = pair("gpt2")
    x = ids()
    last = interp.single_input(model, x, query="last", top_k=None).key_prior
    mean = interp.single_input(model, x, query="mean", top_k=None).key_prior
    merged = last.merge(mean, on=["layer", "head", "key_pos"])
    assert (merged.key_prior_x - merged.key_prior_y).abs().max() <= 1e-12
    assert (last.groupby(["layer", "head"]).key_prior_centered.sum().abs() <= 1e-12).all()


# ----- the b_k and b_v identities ----------------------------------------------------------------------


def test_b_k_removal_is_an_identity_under_learned_positions_and_not_under_rotary():
    learned = interp.single_input(pair("gpt2")[0], ids()).heads.query("condition == 'no_b_k'")
    rotary = interp.single_input(pair("qwen2")[0], ids()).heads.query("condition == 'no_b_k'")
    MEASURED["no_b_k, learned positions (gpt2)"] = learned.max_abs_diff.max()
    MEASURED["no_b_k, rotary (qwen2)"] = rotary.max_abs_diff.max()
    assert learned.max_abs_diff.max() <= 1e-12 and (learned.removed_norm > 0.1).all()
    assert learned.note.str.startswith("identity").all()
    assert rotary.max_abs_diff.max() > 1e-3 and rotary.note.str.contains("rotary").all()


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_b_v_leaves_the_pattern_and_moves_the_output_by_b_v_W_O(family):
    model, _ = pair(family)
    result = interp.single_input(model, ids())
    rows = result.patterns.query("condition == 'no_b_v'")
    assert rows.delta.abs().max() <= 1e-15  # the same pattern (rounding of the three-variant batch only)
    info = model.interp
    for layer in range(info.n_layers):
        w = interp.attention_weights(model, layer)
        for head in range(info.n_heads):
            g = interp.kv_group(info.n_heads, info.n_kv_heads)[head]
            expected = float((w.b_V[g] @ w.W_O[head]).norm())
            got = result.heads.query("condition == 'no_b_v' and layer == @layer and head == @head")
            # rows of A sum to 1 up to the softmax's rounding (float32 in HF's Qwen2 even in float64)
            assert abs(float(got.output_change_rms.iloc[0]) - expected) <= 1e-6 * max(1.0, expected)
            assert "output moves by -b_v W_O[h]" in got.note.iloc[0]



def test_a_sliding_window_keeps_each_layers_keys_and_the_identities():
    """Qwen2 with a 3-key window: the tables hold exactly the pairs HF attends; the pattern without b_q is
    HF's with b_q zeroed; the pattern without the key prior is a distribution over the window."""
    hf = tiny_hf_model("qwen2", config={"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 0})
    ref = hf.double()
    model, x = interp.load_model(copy.deepcopy(ref), device="cpu"), ids()
    assert model.interp.windows == (3, 3)
    result = interp.single_input(model, x)
    zeroed = copy.deepcopy(ref)
    with torch.no_grad():
        q_linear(zeroed, "qwen2", 1)[1][8:16] = 0  # head 1 of layer 1
    for layer in range(2):
        intact = hf_patterns(ref, x)[layer]
        for head in range(4):
            got = table_pattern(result, "intact", layer, head, len(x))
            assert torch.equal(~got.isnan(), intact[head] > 0)  # exactly the window's keys
            assert float((got.nan_to_num() - intact[head]).abs().max()) <= TOL
    got = table_pattern(result, "no_b_q", 1, 1, len(x))
    assert float((got.nan_to_num() - hf_patterns(zeroed, x)[1][1]).abs().max()) <= TOL
    sums = result.patterns.query("condition == 'no_key_prior'").groupby(["layer", "head", "query_pos"]).weight.sum()
    assert (sums - 1).abs().max() <= 1e-12

# ----- queries, positions, images, fingerprints -------------------------------------------------------


def test_mean_query_is_the_mean_of_the_rows_and_selections_agree():
    model, _ = pair("gpt2")
    x = ids()
    every = interp.single_input(model, x, query="all").patterns
    as_array = interp.single_input(model, x.numpy(), query="all").patterns  # token ids as a numpy array
    assert as_array.weight.equals(every.weight)
    mean = interp.single_input(model, x, query="mean").patterns
    by_hand = every.groupby(["layer", "head", "condition", "key_pos"], observed=True).weight.sum() / len(x)
    got = mean.set_index(["layer", "head", "condition", "key_pos"]).weight
    assert (got - by_hand.loc[got.index]).abs().max() <= 1e-12 and (mean.query_pos == -1).all()
    row = interp.single_input(model, x, query=3).patterns
    assert set(row.query_pos) == {3} and set(row.key_pos) == set(range(4))  # causal: keys 0..3
    last = interp.single_input(model, x, query=-1, layers=1, heads=[0, 2]).patterns
    assert set(last.query_pos) == {len(x) - 1} and set(last.layer) == {1} and set(last["head"]) == {0, 2}


def test_vit_queries_from_cls_with_patch_coordinates_and_the_image_it_saw(tmp_path):
    model = interp.load_model(tiny_hf_model("vit").double(), device="cpu")
    pixels = (np.arange(40 * 48 * 3) % 251).astype(np.uint8).reshape(40, 48, 3)
    result = interp.single_input(model, pixels)
    assert result.meta["query"] == "cls" and result.meta["grid"] == (4, 4)
    pos = result.positions
    assert list(pos.label[:2]) == ["cls", "patch (0, 0)"] and pos.iloc[-1].label == "patch (3, 3)"
    assert (pos.iloc[1:].row * 4 + pos.iloc[1:].col + 1 == pos.iloc[1:].pos).all()
    from interp.data.batch import square_resize

    assert np.abs(result.image - square_resize(pixels, 32).permute(1, 2, 0).numpy()).max() <= 1e-6
    intact = result.patterns.query("condition == 'intact'")
    # one full row, the CLS query's (HF's ViT softmaxes in float32 even in float64)
    assert (intact.groupby(["layer", "head"]).weight.sum() - 1).abs().max() <= 1e-6
    assert set(result.key_prior.kind) <= {"prefix", "patch"} and result.key_prior["rank"].max() == 10
    from PIL import Image

    pil = interp.single_input(model, Image.fromarray(pixels))
    assert pil.patterns.weight.equals(result.patterns.weight)
    Image.fromarray(pixels).save(tmp_path / "photo.png")
    from_file = interp.single_input(model, str(tmp_path / "photo.png"))
    assert from_file.patterns.weight.equals(result.patterns.weight)
    (tmp_path / "broken.png").write_bytes(b"not an image")
    with pytest.raises(InputError, match="could be read.*broken.png"):
        interp.single_input(model, str(tmp_path / "broken.png"))


def test_every_table_carries_the_model_fingerprint_and_the_model_mode_is_restored():
    model, _ = pair("qwen2")
    model.train()
    result = interp.single_input(model, "a prompt of words" if model.tokenizer else ids())
    assert model.training
    fp = model_fingerprint(model)
    for frame in (result.patterns, result.heads, result.key_prior, result.positions):
        assert set(frame.model_fingerprint) == {fp}
    assert result.meta["model_fingerprint"] == fp and len(result.meta["data_fingerprint"]) == 16


def test_float64_copy_matches_a_float64_model():
    hf = tiny_hf_model("gpt2")
    x = ids()
    in32 = interp.single_input(interp.load_model(copy.deepcopy(hf), device="cpu"), x, float64=True)
    in64 = interp.single_input(interp.load_model(hf.double(), device="cpu"), x)
    assert in32.meta["dtype"] == "float64"
    assert (in32.patterns.weight - in64.patterns.weight).abs().max() <= 1e-12


# ----- bad inputs --------------------------------------------------------------------------------------


def tiny(family):
    return interp.load_model(tiny_hf_model(family), device="cpu")


BAD = [
    ("a batch of two images", "vit", lambda: torch.randn(2, 3, 32, 32), {}, "one input.*inputs\\[0\\]"),
    ("a built-in data set", "vit", lambda: "photos", {}, "one input.*built-in data set 'photos'"),
    ("two prompts", "gpt2", lambda: ["one prompt here", "and another one"], {}, "one input.*list of 2"),
    ("two token rows", "gpt2", lambda: torch.randint(0, 90, (2, 5)), {}, "one input.*2 sequences"),
    ("text to a ViT", "vit", lambda: "a photo of a cat", {}, "vision model.*image"),
    ("pixels to a language model", "gpt2", lambda: torch.randn(1, 3, 32, 32), {}, "token ids|integer"),
    ("token ids to a ViT", "vit", lambda: torch.randint(0, 90, (1, 7)), {}, "pixel|float|image"),
    ("layer out of range", "gpt2", lambda: ids(), dict(layers=5), "layers must lie in 0..1"),
    ("head out of range", "gpt2", lambda: ids(), dict(heads=[9]), "heads must .* in 0..3"),
    ("unknown query", "gpt2", lambda: ids(), dict(query="middle"), "query must be a position .* cls, first"),
    ("query past the end", "gpt2", lambda: ids(), dict(query=40), "outside this input's 7 positions"),
    ("cls on a model without one", "gpt2", lambda: ids(), dict(query="cls"), "no class token.*query='mean'"),
    ("top_k of zero", "gpt2", lambda: ids(), dict(top_k=0), "top_k must be an integer >= 1"),
    ("float64 not a bool", "gpt2", lambda: ids(), dict(float64="yes"), "float64 must be True or False; got 'yes' \\(str\\)"),
    ("an unreadable object", "gpt2", lambda: object(), {}, "data must be .*got object"),
    # open_data decides what a string is (issue 31): a path that does not exist is never a prompt
    ("a missing path to a language model", "gpt2", lambda: "prompts/today.txt", {}, "no such file or folder"),
    ("a missing folder to a language model", "gpt2", lambda: "my data/prompts", {}, "no such file or folder"),
    ("one word is a name, not a prompt", "gpt2", lambda: "Hello", {}, "pass it in a list"),
    ("a 0 x 0 image", "vit", lambda: np.zeros((0, 0, 3), np.uint8), {}, "image must be .*H, W >= 1.*\\(0, 0, 3\\)"),
    ("a 5 x 0 image", "vit", lambda: np.zeros((5, 0), np.float32), {}, "image must be .*H, W >= 1"),
    ("a PIL image to a language model", "gpt2", lambda: __import__("PIL.Image").Image.new("RGB", (8, 8)), {},
     "language model, so an image cannot be its input"),
    ("two batches of one", "gpt2", lambda: [ids(), ids()], {}, "one input.*more than one batch"),
    ("an empty list", "gpt2", lambda: [], {}, "data is empty"),
    ("pixels beyond float32", "vit", lambda: torch.full((3, 32, 32), 1e300, dtype=torch.float64), {},
     "beyond what the model's torch.float32 holds"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_one_clear_error(case):
    _, family, make, kw, words = case
    with pytest.raises(InterpError, match=words) as info:
        interp.single_input(tiny(family), make(), **kw)
    assert not isinstance(info.value, InternalError) and isinstance(info.value, InputError), info.value


def test_a_string_means_the_same_to_single_input_and_to_the_streaming_analyzers():
    """One decision (open_data): a missing path is refused by both with the same words."""
    model = tiny("gpt2")
    for text in ("prompts/today.txt", "Hello"):
        with pytest.raises(InputError) as streamed:
            interp.sink_profile(model, text, progress=False)
        with pytest.raises(InputError) as single:
            interp.single_input(model, text)
        assert str(streamed.value) in str(single.value)


def test_a_table_too_large_is_refused_naming_the_way_out(monkeypatch):
    si = importlib.import_module("interp.analysis.single_input")  # the module (interp.analysis.single_input is the function)

    monkeypatch.setattr(si, "MAX_PATTERN_ROWS", 100)
    with pytest.raises(InputError, match="choose layers= and heads=, or one query row"):
        interp.single_input(tiny("vit"), torch.randn(3, 32, 32), query="all")
    with pytest.warns(UserWarning, match="showing the last token's row"):
        result = interp.single_input(tiny("gpt2"), ids())  # the default for text falls back
    assert result.meta["query"] == "last"


@pytest.fixture(scope="module", autouse=True)
def report_measured_diffs():
    """The max abs diffs the tests above measure, printed after the module (-s). A fixture, not a test: a
    test that only prints cannot fail (issue 31); each diff is asserted where it is measured."""
    yield
    if MEASURED:
        print("\n" + "\n".join(f"{k}: {v:.3g}" for k, v in MEASURED.items()))


# ----- figures -----------------------------------------------------------------------------------------


def test_each_layers_float64_conditions_are_let_go_before_the_next_layers_are_made(monkeypatch):
    import gc
    import weakref

    module = importlib.import_module("interp.analysis.single_input")
    made, alive_at_each_call = [], []
    original = module._layer_conditions

    def conditions(*args, **kwargs):
        gc.collect()
        alive_at_each_call.append(sum(ref() is not None for ref in made))
        got = original(*args, **kwargs)
        made.append(weakref.ref(got))
        return got

    monkeypatch.setattr(module, "_layer_conditions", conditions)
    model, _ = pair("gpt2")
    result = interp.single_input(model, ids(), layers=[0, 1])
    assert alive_at_each_call == [0, 0] and set(result.heads.layer) == {0, 1}


@pytest.fixture(scope="module")
def vit_view():
    model = interp.load_model(tiny_hf_model("vit").double(), device="cpu")
    return interp.single_input(model, torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(1)))


def test_static_figures_draw_the_tables(vit_view):
    import matplotlib.pyplot as plt

    from interp import plots

    pairs = plots.pick_heads(vit_view)
    fig = plots.single_input_patterns(vit_view)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == len(pairs) * 6 and "without b_q" in panels[2].get_title()  # the image, then 5 conditions
    assert "input" in panels[0].get_title() and len(panels[0].get_images()) == 2  # the image, the map over it
    assert "output" in panels[4].get_title() and "cls" in panels[1].get_title()  # b_v said; CLS weight given
    layer, head = pairs[0]
    rows = vit_view.patterns.query("layer == @layer and head == @head and condition == 'no_b_q' and key_kind == 'patch'")
    drawn = panels[2].get_images()[0].get_array()
    assert np.allclose(drawn[rows.key_row, rows.key_col], rows.weight)
    for r, (layer, head) in enumerate(pairs):  # every panel: its condition's patch weights, on its row's scale
        row_max = vit_view.patterns.query("layer == @layer and head == @head and key_kind == 'patch'").weight.max()
        for c, cond in enumerate(["intact", "no_b_q", "no_b_k", "no_b_v", "no_key_prior"]):
            want = vit_view.patterns.query("layer == @layer and head == @head and condition == @cond and "
                                           "key_kind == 'patch'")
            image = panels[r * 6 + c + 1].get_images()[0]
            grid = np.full((4, 4), np.nan)
            grid[want.key_row, want.key_col] = want.weight
            np.testing.assert_array_equal(image.get_array(), grid)
            assert image.norm.vmin == 0 and image.norm.vmax == row_max
    overlay = plots.single_input_overlay(vit_view, condition="no_key_prior")
    assert len(overlay.axes) == 2 * 4 and "without the key prior" in overlay._suptitle.get_text()
    # each panel holds the image as drawn, 8-bit (a float64 copy per panel was 8x the memory)
    pixels = overlay.axes[0].get_images()[0].get_array()
    assert pixels.dtype == np.uint8 and np.array_equal(pixels, np.rint(vit_view.image * 255))
    bars = plots.key_prior_top_tokens(vit_view, heads=[(1, 2)], top=5)
    top = vit_view.key_prior.query("layer == 1 and head == 2").nsmallest(5, "rank")
    assert np.allclose([p.get_width() for p in bars.axes[0].patches], top.key_prior_centered)
    assert bars.axes[0].get_yticklabels()[0].get_text().startswith(f"{top.label.iloc[0]} [{top.key_pos.iloc[0]}]")
    plt.close("all")


def test_plotly_figures_carry_the_numbers(vit_view):
    from interp import plots

    fig = plots.single_input_patterns_plotly(vit_view, heads=[(0, 1)])
    rows = vit_view.patterns.query("layer == 0 and head == 1 and condition == 'intact' and key_kind == 'patch'")
    z = np.array(fig.data[0].z, dtype=float)
    assert len(fig.data) == 5 and np.allclose(z[rows.key_row, rows.key_col], rows.weight)
    assert "cls" in fig.layout.annotations[0].text
    overlay = plots.single_input_overlay_plotly(vit_view)
    assert len(overlay.layout.sliders[0].steps) == 2 and len(overlay.data) == 4 + 2 * 4  # images + maps
    bars = plots.key_prior_top_tokens_plotly(vit_view, heads=[(1, 0)], top=3)
    top = vit_view.key_prior.query("layer == 1 and head == 0").nsmallest(3, "rank")
    assert np.allclose(bars.data[0].x, top.key_prior_centered)


def test_the_real_views_figures_follow_the_colour_rule_and_its_b_k_kl_is_no_effect(vit_view):
    """The float64 tiny ViT's KL without b_k is rounding (min -2.2e-8 nats here): the report's KL heatmap draws
    it as 0, grey, with the floor in the hover; every single-input figure passes interp.figures.colours' check."""
    import matplotlib.pyplot as plt

    from interp import interactive, plots
    from interp.figures.colours import NO_EFFECT, _colour_at, check_colours

    kl = interactive.layer_head_heatmap(vit_view.heads, "kl", facet="condition",
                                        query="condition in ('no_b_q', 'no_b_k', 'no_key_prior')")
    noise = {t.name: t for t in kl.data}["no_b_k"]
    table = vit_view.heads[vit_view.heads.condition == "no_b_k"].kl
    assert table.abs().max() < 1e-6 and (np.array(noise.z, dtype=float) == np.clip(
        vit_view.heads[vit_view.heads.condition == "no_b_k"].pivot(index="layer", columns="head", values="kl"), 0,
        None).to_numpy()).all()
    from matplotlib.colors import to_rgb
    for row in noise.z:
        for v in row:
            assert np.allclose(_colour_at([list(s) for s in noise.colorscale], (v - noise.zmin) / (noise.zmax - noise.zmin)),
                               to_rgb(NO_EFFECT), atol=0.01)
    for fig in (kl, plots.single_input_patterns(vit_view), plots.single_input_overlay(vit_view),
                plots.single_input_patterns_plotly(vit_view), plots.single_input_overlay_plotly(vit_view)):
        assert check_colours(fig) == []
    plt.close("all")


def test_text_views_draw_matrices_or_bars_and_refuse_an_overlay():
    import matplotlib.pyplot as plt

    from interp import plots

    model, _ = pair("gpt2")
    full = interp.single_input(model, ids())
    fig = plots.single_input_patterns(full, heads=[(0, 0), (1, 3)])
    matrix = fig.axes[0].get_images()[0].get_array()
    assert matrix.shape == (7, 7) and np.ma.is_masked(matrix[0, 6])  # causal: the upper triangle is not attended
    last = interp.single_input(model, ids(), query="last")
    bars = plots.single_input_patterns(last, heads=[(0, 0)])
    assert len(bars.axes[0].patches) == 7
    for draw in (plots.single_input_overlay, plots.single_input_overlay_plotly):
        with pytest.raises(InputError, match="single_input_patterns"):
            draw(full)
    with pytest.raises(InputError, match="pairs this view holds"):
        plots.single_input_patterns(full, heads=[(5, 0)])
    with pytest.raises(InputError, match="result of interp.single_input"):
        plots.key_prior_top_tokens(full.patterns)
    plt.close("all")


def test_the_pipeline_step_makes_a_report_section(tmp_path):
    from interp.report.pipeline import make_context, single_input_step
    from interp.report.html import write_report

    ctx = make_context(interp.load_model(tiny_hf_model("vit"), device="cpu"), "digits", quick=True)
    section, = single_input_step(ctx)
    assert set(section.figures) == {"single_input_patterns", "single_input_key_prior", "single_input_overlay"}
    assert section.numbers["no_b_k_max_abs_diff"] <= 1e-5 and section.numbers["no_b_v_output_change_rms_max"] > 0
    report = write_report([section], dict(model="tiny vit", dataset="digits"), tmp_path).read_text()
    assert "One input, closely" in report and (tmp_path / "single_input_patterns.csv").exists()
