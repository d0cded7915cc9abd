"""High-norm tokens (``interp.high_norm_tokens``) against brute force on the plain HF model.

Norms, the outlier set, their attention mass and the counts equal a computation from HF's own hidden
states and attention patterns (eager, one padded batch at a time); the median is the histogram's, within
a relative 2^-11 of the exact lower median; batching does not change the table; a planted high-norm
token is found.
"""

import copy
import math

import pytest
import torch

import interp
from interp.errors import InputError
from interp.models import tiny_hf_model


def text_batches(lengths=((9, 6, 4), (9, 3)), seed=0, left=False):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for lens in lengths:
        width = max(lens)
        ids = torch.randint(3, 97, (len(lens), width), generator=gen)
        rows = [[0] * (width - n) + [1] * n if left else [1] * n + [0] * (width - n) for n in lens]
        mask = torch.tensor(rows)
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def residual_points(hf, run, point, n_layers):
    """HF's own residual stream per layer: pre = hidden_states[l], post = hidden_states[l + 1], except that
    LLaMA's last hidden state is after its final norm: its last block's output is read by a forward hook."""
    blocks = getattr(getattr(hf, "model", None), "layers", None)
    grabbed = []
    handle = blocks[-1].register_forward_hook(
        lambda mod, args, out: grabbed.append(out[0] if isinstance(out, tuple) else out)) if blocks else None
    try:
        out = run()
    finally:
        if handle:
            handle.remove()
    hidden = list(out.hidden_states)
    if grabbed:
        hidden[n_layers] = grabbed[0]
    return out, [hidden[layer + (point == "post")] for layer in range(n_layers)]


def brute_force(hf, batches, n_layers, k, point="pre"):
    """Per layer: every real token's (sequence, real position, norm, mass), and the exact lower median; mass is
    the attention the block reading the point pays (block l for pre, l + 1 for post, NaN after the last)."""
    per_layer = {layer: [] for layer in range(n_layers)}
    seq0 = 0
    for batch in batches:
        kw = batch if isinstance(batch, dict) else {"pixel_values": batch}
        with torch.no_grad():
            out, resid = residual_points(hf, lambda: hf(**kw, output_hidden_states=True, output_attentions=True),
                                         point, n_layers)
        n = next(iter(kw.values())).shape[0]
        mask = batch["attention_mask"].bool() if isinstance(batch, dict) else torch.ones(
            n, out.hidden_states[0].shape[1], dtype=torch.bool)
        for layer in range(n_layers):
            norms = resid[layer].double().norm(dim=-1)
            reader = layer + (point == "post")
            if reader < n_layers:
                A = out.attentions[reader].double()
                mass = (A * mask[:, None, :, None]).sum(2).mean(1) / mask.sum(1, keepdim=True)
            else:
                mass = torch.full_like(norms, float("nan"))
            for b in range(n):
                real = mask[b].nonzero()[:, 0]
                for r, j in enumerate(real.tolist()):
                    per_layer[layer].append((seq0 + b, r, float(norms[b, j]), float(mass[b, j])))
        seq0 += n
    result = {}
    for layer, tokens in per_layer.items():
        norms = torch.tensor([t[2] for t in tokens])
        median = float(norms.sort().values[(len(norms) + 1) // 2 - 1])
        result[layer] = (median, tokens)
    return result


def assert_matches(frame, expected, k, top):
    worst = 0.0
    for layer, (median, tokens) in expected.items():
        rows = frame[frame.layer == layer]
        assert abs(rows.norm_median.iloc[0] / median - 1) <= 2**-11
        cutoff = k * rows.norm_median.iloc[0]
        assert min(abs(t[2] - cutoff) for t in tokens) > 1e-6  # no token sits on the edge of the cutoff
        outliers = sorted([t for t in tokens if t[2] > cutoff], key=lambda t: -t[2])
        assert rows.n_outliers.iloc[0] == len(outliers) and rows.n_tokens.iloc[0] == len(tokens)
        kept = rows.dropna(subset=["norm"])
        assert len(kept) == min(top, len(outliers))
        for (_, row), want in zip(kept.iterrows(), outliers):
            assert (row.sequence, row.position) == want[:2]
            assert math.isnan(row.mass) == math.isnan(want[3])  # NaN only where no block reads the point
            worst = max(worst, abs(row.norm - want[2]), 0 if math.isnan(want[3]) else abs(row.mass - want[3]))
        assert abs(rows.norm_max.iloc[0] - max(t[2] for t in tokens)) <= 1e-5
    assert worst <= 1e-5, worst
    return worst


@pytest.mark.parametrize("point", ["post", "pre"])
@pytest.mark.parametrize("family,left,k", [("llama", False, 1.1), ("llama", True, 1.1), ("bert", False, 1.01)])
def test_text_matches_brute_force(family, left, k, point):
    """(BERT's block inputs come out of a layer norm: their norms differ by ~1%, hence its k.)"""
    hf = tiny_hf_model(family).eval()
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    batches = text_batches(left=left)
    frame = interp.high_norm_tokens(model, batches, k=k, top=5, point=point, progress=False)
    worst = assert_matches(frame, brute_force(hf, batches, 2, k, point), k, 5)
    assert (frame.n_outliers > 0).any()  # the check compares tokens, not only empty tables
    assert list(frame.drop_duplicates("layer").hook) == [f"blocks.{layer}.hook_resid_{point}" for layer in (0, 1)]
    print(f"{family} (left padding {left}, {point}): max abs diff {worst:.1e}")


def test_a_planted_high_norm_token_is_found_in_a_vit_and_batching_changes_nothing():
    hf = tiny_hf_model("vit").eval()
    with torch.no_grad():
        hf.embeddings.cls_token[0, 0, 5] += 50.0  # the class token: norm far above the patches'
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    images = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    frame = interp.high_norm_tokens(model, [images[:2], images[2:]], k=5.0, point="pre", progress=False)
    assert_matches(frame, brute_force(hf, [images[:2], images[2:]], 2, 5.0), 5.0, 20)
    layer0 = frame[frame.layer == 0]
    assert layer0.n_outliers.iloc[0] == 5 and set(layer0.position) == {0} and set(layer0.token) == {"cls"}
    one = interp.high_norm_tokens(model, [images], k=5.0, point="pre", progress=False)
    split = [images[i:i + 1] for i in range(5)]
    for other in (one, interp.high_norm_tokens(model, split, k=5.0, point="pre", progress=False)):
        cols = ["layer", "rank", "sequence", "position", "n_outliers", "norm_median"]
        assert other[cols].equals(frame[cols])
        assert (other.norm - frame.norm).abs().max() <= 1e-5 and (other.mass - frame.mass).abs().max() <= 1e-6


@pytest.mark.parametrize("kw,words", [(dict(k=0), "k must be a positive"), (dict(top=0), "top_k must be"),
                                      (dict(layers=[9]), "layers"), (dict(point="mid"), "point must be 'post'")])
def test_bad_input_raises_one_clear_error(kw, words):
    model = interp.load_model(tiny_hf_model("llama"), device="cpu")
    with pytest.raises(InputError, match=words):
        interp.high_norm_tokens(model, text_batches(), progress=False, **kw)


def test_figures_draw_the_tables_with_titles_and_labelled_axes():
    """token_norm_plot draws each kept outlier at its norm; key_prior_sink_plot one bar per sink and score set,
    of the profile's masses; a model without b_q gets a panel that says so."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    from interp.figures.plots import key_prior_sink_plot, token_norm_plot

    hf = tiny_hf_model("vit").eval()
    with torch.no_grad():
        hf.embeddings.cls_token[0, 0, 5] += 50.0
    model = interp.load_model(hf, device="cpu")
    images = [torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    for point in ("post", "pre"):  # post: the last layer's outliers have no reading block (hollow points)
        frame = interp.high_norm_tokens(model, images, k=5.0, point=point, progress=False)
        fig = token_norm_plot(frame)
        ax = fig.axes[0]
        points = [xy for c in ax.collections if isinstance(c, PathCollection) for xy in c.get_offsets().tolist()]
        kept = frame.dropna(subset=["norm"])
        assert sorted(map(tuple, points)) == sorted(zip(kept.layer.astype(float), kept.norm))
        assert ax.get_title() and "token norm" in ax.get_ylabel() and f"hook_resid_{point}" in ax.get_xlabel()
        plt.close(fig)
    assert frame[frame.layer == 0].mass.notna().all() and (frame.n_outliers > 0).all()

    bert = tiny_hf_model("bert")
    profile = interp.sink_profile(interp.load_model(bert, device="cpu"), text_batches(), remove="key_prior",
                                  threshold=0.1, progress=False)
    fig = key_prior_sink_plot(profile, top=4)
    ax = fig.axes[0]
    sinks = profile[profile.sink].nlargest(4, "mass").sort_values(["layer", "head"])
    widths = sorted(round(p.get_width(), 9) for p in ax.patches if p.get_width() > 0)
    want = sorted(round(v, 9) for c in ("mass", "mass_without_key_prior", "mass_without_b_q") for v in sinks[c])
    assert len(sinks) > 0 and widths == want
    assert ax.get_title() and "attention mass" in ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)
    llama = interp.load_model(tiny_hf_model("llama"), device="cpu")
    fig = key_prior_sink_plot(interp.sink_profile(llama, text_batches(), progress=False))
    assert "no b_q in this model" in fig.axes[0].texts[0].get_text()
    plt.close(fig)


@pytest.mark.parametrize("point", [None, "post", "pre"])
def test_a_planted_residual_jump_is_at_the_same_layer_and_hook_in_both_analyzers(point):
    """Issue 37: massive_activations numbered the residual after block l and high_norm_tokens the one entering
    it, so one jump was "layer 11" in one and "layer 12" in the other. A jump planted in block 1's output (one
    token, one channel) is first reported by both, by default and with either point, at the layer and hook where
    HF's own hidden states put it (post: after block 1; pre: entering block 2); every layer's largest |value|
    and largest token norm equal HF's."""
    hf = tiny_hf_model("llama", n_layers=4).eval()

    def plant(module, args, out):
        h = (out[0] if isinstance(out, tuple) else out).clone()
        h[1, 3, 5] += 1e4
        return (h, *out[1:]) if isinstance(out, tuple) else h

    hf.model.layers[1].register_forward_hook(plant)
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    ids = torch.randint(3, 97, (3, 8), generator=torch.Generator().manual_seed(0))
    kw = {} if point is None else {"point": point}
    massive = interp.massive_activations(model, [ids], abs_threshold=1e3, ratio_threshold=100.0, progress=False, **kw)
    high = interp.high_norm_tokens(model, [ids], k=5.0, progress=False, **kw)
    want = point or "post"
    with torch.no_grad():
        _, resid = residual_points(hf, lambda: hf(input_ids=ids, output_hidden_states=True), want, 4)
    jump = [layer for layer in range(4) if float(resid[layer][1, 3, 5]) > 5e3]  # brute force: HF's own stream
    assert jump == ([1, 2, 3] if want == "post" else [2, 3])
    flagged, outliers = massive[massive.massive], high.dropna(subset=["norm"])
    assert sorted(set(flagged.layer)) == jump == sorted(set(outliers.layer))
    hooks = {layer: f"blocks.{layer}.hook_resid_{want}" for layer in range(4)}
    for frame in (flagged, outliers):
        assert (frame.hook == frame.layer.map(hooks)).all() and set(zip(frame.sequence, frame.position)) == {(1, 3)}
    assert set(flagged.channel) == {5}
    for layer in range(4):
        h = resid[layer].double()
        top, norms = massive[(massive.layer == layer) & (massive["rank"] == 1)], high[high.layer == layer]
        assert top.hook.iloc[0] == norms.hook.iloc[0] == hooks[layer]
        assert abs(top.abs_value.iloc[0] - float(h.abs().max())) <= 1e-4 * float(h.abs().max())
        assert abs(norms.norm_max.iloc[0] - float(h.norm(dim=-1).max())) <= 1e-4 * float(h.norm(dim=-1).max())
