"""High-norm tokens (``interp.high_norm_tokens``) against brute force on the plain HF model.

Norms, the outlier set, their attention mass and the counts equal a computation from HF's own hidden
states and attention patterns (eager, one padded batch at a time); the median is the histogram's, within
a relative 2^-11 of the exact lower median; batching does not change the table; a planted high-norm
token is found.
"""

import copy

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


def brute_force(hf, batches, n_layers, k):
    """Per layer: every real token's (sequence, real position, norm, mass), and the exact lower median."""
    per_layer = {layer: [] for layer in range(n_layers)}
    seq0 = 0
    for batch in batches:
        kw = batch if isinstance(batch, dict) else {"pixel_values": batch}
        with torch.no_grad():
            out = hf(**kw, output_hidden_states=True, output_attentions=True)
        n = next(iter(kw.values())).shape[0]
        mask = batch["attention_mask"].bool() if isinstance(batch, dict) else torch.ones(
            n, out.hidden_states[0].shape[1], dtype=torch.bool)
        for layer in range(n_layers):
            norms = out.hidden_states[layer].double().norm(dim=-1)
            A = out.attentions[layer].double()
            mass = (A * mask[:, None, :, None]).sum(2).mean(1) / mask.sum(1, keepdim=True)
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
            worst = max(worst, abs(row.norm - want[2]), abs(row.mass - want[3]))
        assert abs(rows.norm_max.iloc[0] - max(t[2] for t in tokens)) <= 1e-5
    assert worst <= 1e-5, worst
    return worst


@pytest.mark.parametrize("family,left,k", [("llama", False, 1.1), ("llama", True, 1.1), ("bert", False, 1.01)])
def test_text_matches_brute_force(family, left, k):
    """(BERT's block inputs come out of a layer norm: their norms differ by ~1%, hence its k.)"""
    hf = tiny_hf_model(family).eval()
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    batches = text_batches(left=left)
    frame = interp.high_norm_tokens(model, batches, k=k, top=5, progress=False)
    worst = assert_matches(frame, brute_force(hf, batches, 2, k), k, 5)
    assert (frame.n_outliers > 0).any()  # the check compares tokens, not only empty tables
    print(f"{family} (left padding {left}): max abs diff {worst:.1e}")


def test_a_planted_high_norm_token_is_found_in_a_vit_and_batching_changes_nothing():
    hf = tiny_hf_model("vit").eval()
    with torch.no_grad():
        hf.embeddings.cls_token[0, 0, 5] += 50.0  # the class token: norm far above the patches'
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    images = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    frame = interp.high_norm_tokens(model, [images[:2], images[2:]], k=5.0, progress=False)
    assert_matches(frame, brute_force(hf, [images[:2], images[2:]], 2, 5.0), 5.0, 20)
    layer0 = frame[frame.layer == 0]
    assert layer0.n_outliers.iloc[0] == 5 and set(layer0.position) == {0} and set(layer0.token) == {"cls"}
    one = interp.high_norm_tokens(model, [images], k=5.0, progress=False)
    split = [images[i:i + 1] for i in range(5)]
    for other in (one, interp.high_norm_tokens(model, split, k=5.0, progress=False)):
        cols = ["layer", "rank", "sequence", "position", "n_outliers", "norm_median"]
        assert other[cols].equals(frame[cols])
        assert (other.norm - frame.norm).abs().max() <= 1e-5 and (other.mass - frame.mass).abs().max() <= 1e-6


@pytest.mark.parametrize("kw,words", [(dict(k=0), "k must be a positive"), (dict(top=0), "top_k must be"),
                                      (dict(layers=[9]), "layers")])
def test_bad_input_raises_one_clear_error(kw, words):
    model = interp.load_model(tiny_hf_model("llama"), device="cpu")
    with pytest.raises(InputError, match=words):
        interp.high_norm_tokens(model, text_batches(), progress=False, **kw)


def test_figures_draw_the_tables_with_titles_and_labelled_axes():
    """token_norm_plot draws each kept outlier at its norm; key_prior_sink_plot one bar per sink and score set,
    of the profile's masses; a model without b_q gets a panel that says so."""
    import matplotlib.pyplot as plt
    from interp.plots import key_prior_sink_plot, token_norm_plot

    hf = tiny_hf_model("vit").eval()
    with torch.no_grad():
        hf.embeddings.cls_token[0, 0, 5] += 50.0
    model = interp.load_model(hf, device="cpu")
    images = [torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    frame = interp.high_norm_tokens(model, images, k=5.0, progress=False)
    fig = token_norm_plot(frame)
    ax = fig.axes[0]
    points = ax.collections[-1].get_offsets()
    kept = frame.dropna(subset=["norm"])
    assert sorted(map(tuple, points.tolist())) == sorted(zip(kept.layer.astype(float), kept.norm))
    assert ax.get_title() and "token norm" in ax.get_ylabel() and "layer" in ax.get_xlabel()
    plt.close(fig)

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
