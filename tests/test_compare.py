"""Models side by side (interp.compare): a planted difference is recovered where it was planted and nowhere else,
the rows equal the analyzers' own tables and a brute-force recomputation, the command's table equals the
function's, the figure draws the table on one colour scale per quantity, and mixed data or modalities are refused."""

import copy
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

import interp
from interp.figures.colours import check_colours
from interp.compare import combine_comparisons, compare_models, comparison_figure, pooled_sink_masses
from interp.data import Batch
from interp.errors import InputError
from interp.models import tiny_hf_model

KEYS = ["analysis", "quantity", "part", "layer", "head"]


def token_batches(n=5, seed=0):
    """n right-padded token sequences of different lengths, in two batches (no tokenizer: ids only)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [5 + (5 * i) % 7 for i in range(n)]
    ids = torch.randint(3, 97, (n, max(lengths)), generator=gen)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    return [Batch(ids[:2] * mask[:2], mask[:2]), Batch(ids[2:] * mask[2:], mask[2:])]


@pytest.fixture(scope="module")
def planted():
    """A tiny BERT and the same weights with every b_k zeroed: under learned positions b_k cancels in the
    softmax, so only the k rows of the origin shift may differ."""
    hf = tiny_hf_model("bert", n_layers=2, n_heads=4)
    zeroed = copy.deepcopy(hf)
    with torch.no_grad():
        for layer in zeroed.bert.encoder.layer if hasattr(zeroed, "bert") else zeroed.encoder.layer:
            layer.attention.self.key.bias.zero_()
    intact, no_bk = (interp.load_model(m, device="cpu", dtype=torch.float64) for m in (hf, zeroed))
    data = token_batches()
    table = compare_models({"intact": intact, "no_b_k": no_bk}, data, n_boot=10, seed=1)
    return intact, data, table, no_bk


def test_planted_b_k_difference_is_recovered_in_the_k_rows_only(planted):
    _, _, table, _ = planted
    a, b = (table[table.model == m].set_index(KEYS).sort_index() for m in ("intact", "no_b_k"))
    assert a.index.equals(b.index) and len(a) > 100
    k_rows = (a.index.get_level_values("analysis") == "origin") & (a.index.get_level_values("part") == "k")
    assert (a.value[k_rows] > 1e-3).all() and (b.value[k_rows] == 0).all()  # planted: every k row differs
    assert (b.present[k_rows]).all()  # a zeroed bias is still a bias (present), not an absent one
    for column in ("value", "lo", "hi", "floor"):  # everything else equal, intervals too (the same items)
        np.testing.assert_allclose(a[column][~k_rows].to_numpy(float), b[column][~k_rows].to_numpy(float),
                                   atol=1e-9, rtol=1e-7, err_msg=column)
    assert set(a.index.get_level_values("analysis")) == {"origin", "scores", "sinks", "residual"}
    assert a.model_fingerprint.iloc[0] != b.model_fingerprint.iloc[0]
    assert (a.data_fingerprint == b.data_fingerprint.iloc[0]).all()
    assert table.source_fingerprint.nunique() == 1


def test_rows_equal_the_analyzers_and_a_brute_force_residual(planted):
    model, data, table, _ = planted
    mine = table[table.model == "intact"]
    origin = interp.origin_shift(model, interp.record_qkv(model, data, progress=False), data=data, n_boot=10, seed=1)
    got = mine[mine.quantity == "shift_ratio"].set_index(["layer", "head", "part"]).sort_index()
    want = origin.set_index(["layer", "head", "kind"]).sort_index()
    np.testing.assert_allclose(got[["value", "lo", "hi"]].to_numpy(float),
                               want[["shift_ratio", "shift_ratio_lo", "shift_ratio_hi"]].to_numpy(float))
    profile = interp.sink_profile(model, data, progress=False).set_index(["layer", "head", "position"]).sort_index()
    for quantity, column in (("sink_mass", "mass"), ("sink_mass_over_uniform", "mass_over_uniform")):
        got = mine[mine.quantity == quantity].set_index(["layer", "head", "part"]).sort_index()
        np.testing.assert_allclose(got.value.to_numpy(float), profile[column].to_numpy(float), atol=1e-12)
    assert np.allclose(mine[mine.quantity == "sink_mass"].sort_values(["layer", "head", "part"]).floor,
                       profile.uniform_mass)
    caches = [model.run_with_cache(b.inputs, attention_mask=b.attention_mask)[1] for b in data]
    for layer in range(model.interp.n_layers):
        name = f"blocks.{layer}.hook_resid_post"  # every batch's real tokens, padding masked out by hand
        h = torch.cat([c[name][b.attention_mask.bool()] for c, b in zip(caches, data)]).double().numpy()
        norms = np.linalg.norm(h, axis=-1)
        row = mine[(mine.analysis == "residual") & (mine.layer == layer)].set_index("quantity").value
        assert row["resid_max_to_rms"] == pytest.approx(np.abs(h).max() / np.sqrt((h ** 2).mean()), rel=1e-9)
        assert row["resid_norm_max_to_median"] == pytest.approx(norms.max() / np.median(norms), rel=1e-9)
    assert np.allclose(mine.depth.dropna(), mine.layer.dropna() / (model.interp.n_layers - 1))


def test_frequency_spread_rows_and_their_paired_difference(planted):
    """The spread rows are spread_interval's; the planted b_k change leaves every pattern as it was, so the paired
    difference is 0 with the interval [0, 0]; another model's difference is spread_difference's."""
    model, data, _, no_bk = planted
    big_bq = interp.load_model(tiny_hf_model("bert", n_layers=2, n_heads=4, seed=3, bias_scale=4.0), device="cpu",
                               dtype=torch.float64)  # other weights, larger biases
    table = compare_models({"intact": model, "no_b_k": no_bk, "big_b_q": big_bq}, data, analyses=["frequency"],
                           n_boot=10, seed=1).set_index(["model", "quantity"])
    for label, m in (("intact", model), ("big_b_q", big_bq)):
        want = interp.spread_interval(m, data, n_boot=10, seed=1, progress=False).iloc[0]
        got = table.loc[(label, "hf_ratio_spread")]
        assert (got.value, got.lo, got.hi) == pytest.approx((want.spread, want.spread_lo, want.spread_hi), rel=1e-12)
    same = table.loc[("no_b_k", "hf_ratio_spread_difference")]
    assert same.part == "no_b_k - intact" and abs(same.value) < 1e-12 and abs(same.lo) < 1e-12 and abs(same.hi) < 1e-12
    a = interp.spread_interval(model, data, n_boot=10, seed=1, progress=False)
    b = interp.spread_interval(big_bq, data, n_boot=10, seed=1, progress=False)
    want = interp.spread_difference(b, a).iloc[0]
    got = table.loc[("big_b_q", "hf_ratio_spread_difference")]
    assert (got.value, got.lo, got.hi) == pytest.approx((want.difference, want.difference_lo, want.difference_hi))
    assert got.value != 0 and abs(same.value) < abs(got.value) * 1e-3  # another model: not the b_k clone's zero


def test_pooled_sink_mass_intervals_are_percentiles_of_resampled_profiles(planted):
    """Each resample's pooled mass equals sink_profile on the resampled items themselves (brute force)."""
    from interp.bootstrap import PERCENTILES, item_keys, resample_indices

    model, data, _, _ = planted
    per_item = interp.sink_profiles_by_item(model, data)
    pooled = pooled_sink_masses(per_item, 3, 2).set_index(["layer", "head", "position"]).sort_index()
    items = [Batch(b.inputs[i:i + 1], b.attention_mask[i:i + 1]) for b in data for i in range(len(b.inputs))]
    keys = [k for b in data for k in item_keys(b)]
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    masses = [interp.sink_profile(model, [items[i] for i in order[draw]], progress=False)
              .set_index(["layer", "head", "position"]).sort_index().mass for draw in resample_indices(len(keys), 3, 2)]
    lo, hi = np.percentile(np.stack(masses), PERCENTILES, axis=0)
    np.testing.assert_allclose(pooled.mass_lo.to_numpy(float), lo, atol=1e-12)
    np.testing.assert_allclose(pooled.mass_hi.to_numpy(float), hi, atol=1e-12)


def test_figure_draws_the_table_on_one_scale_per_quantity(planted):
    _, _, table, _ = planted
    fig = comparison_figure(table)
    grid = np.array(fig.axes[:8]).reshape(4, 2)  # 4 headline rows x 2 models (colour bars come after)
    for axes, quantity, part in ((grid[0], "shift_ratio", "q"), (grid[1], "score_share", "key_prior"),
                                 (grid[2], "sink_mass_over_uniform", "first")):
        assert axes[0].images[0].get_clim() == axes[1].images[0].get_clim()  # one colour scale per quantity
        for ax, model in zip(axes, ("intact", "no_b_k")):
            rows = table[(table.model == model) & (table.quantity == quantity) & (table.part == part)]
            want = rows.pivot_table(index="layer", columns="head", values="value").to_numpy(float)
            np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), want)
    for ax, model in zip(grid[3], ("intact", "no_b_k")):
        rows = table[(table.model == model) & (table.quantity == "resid_max_to_rms")].sort_values("depth")
        np.testing.assert_array_equal(ax.lines[0].get_ydata(), rows.value.to_numpy())
    assert grid[3][0].get_ylim() == grid[3][1].get_ylim()
    assert check_colours(fig) == []  # the library's colour language (interp.figures.colours)
    assert grid[0][0].images[0].cmap.name == "viridis" and grid[2][0].images[0].get_clim()[0] < 0  # mass - floor
    plt.close(fig)


def test_mixed_modalities_and_mixed_data_are_refused():
    vit = interp.load_model(tiny_hf_model("vit", n_layers=2), device="cpu")
    lm = interp.load_model(tiny_hf_model("gpt2", n_layers=2), device="cpu")
    with pytest.raises(InputError, match="text models and image models cannot share data"):
        compare_models({"vit": vit, "lm": lm}, token_batches())
    lm2 = interp.load_model(copy.deepcopy(tiny_hf_model("gpt2", n_layers=2, seed=1)), device="cpu")
    with pytest.raises(InputError, match="at least two models"):
        compare_models([lm], token_batches())
    with pytest.raises(InputError, match="share the label"):
        compare_models([lm, lm2], token_batches())
    first = compare_models({"a": lm, "b": lm2}, token_batches(seed=0), analyses=["residual"], n_boot=0)
    other = compare_models({"c": lm, "d": lm2}, token_batches(seed=5), analyses=["residual"], n_boot=0)
    same = compare_models({"c": lm, "d": lm2}, token_batches(seed=0), analyses=["residual"], n_boot=0)
    assert set(combine_comparisons(first, same).model) == {"a", "b", "c", "d"}
    with pytest.raises(InputError, match="different data"):
        combine_comparisons(first, other)
    with pytest.raises(InputError, match="more than one table"):
        combine_comparisons(first, first)
    with pytest.raises(InputError, match="analyses must be"):
        compare_models({"a": lm, "b": lm2}, token_batches(), analyses=["frequencies"])


def test_cli_equals_api_on_the_shipped_digits_vits(tmp_path, run_cli, capsys):
    argv = ["compare", "--model", "digits-vit", "--model", "digits-vit-nobias", "--data", "digits", "--max-items", "4",
            "--n-boot", "10", "--analyses", "origin,residual", "--device", "cpu", "--out", tmp_path / "cmp"]
    assert run_cli(argv) == 0
    table = compare_models(["digits-vit", "digits-vit-nobias"], "digits", n_items=4, n_boot=10, device="cpu",
                           analyses=["origin", "residual"])
    written = pd.read_csv(tmp_path / "cmp" / "compare.csv", keep_default_na=False, na_values=[""])
    written["note"] = written["note"].fillna("")
    pd.testing.assert_frame_equal(written, table, check_dtype=False, check_exact=False, rtol=1e-12)
    manifest = json.loads((tmp_path / "cmp" / "manifest.json").read_text())
    assert {"compare.csv", "compare.parquet", "compare.png", "report.md"} <= set(manifest["files"])
    assert manifest["meta"]["source_fingerprint"] == table.source_fingerprint.iloc[0]
    nobias = table[(table.model == "digits-vit-nobias") & (table.analysis == "origin") & (table.part != "o")]
    assert not nobias.present.any() and (nobias.value == 0).all()  # no q, k, v bias: absent, not measured as 0
    assert "absent" in (tmp_path / "cmp" / "report.md").read_text()


def test_cli_refuses_a_text_model_beside_a_vision_model(tmp_path, run_cli, capsys):
    tiny_hf_model("gpt2", n_layers=1).save_pretrained(tmp_path / "lm")
    assert run_cli(["compare", "--model", "digits-vit", "--model", tmp_path / "lm", "--data", "digits",
                    "--out", tmp_path / "x"]) == 1
    assert "cannot share data" in capsys.readouterr().err
    assert not (tmp_path / "x" / "compare.csv").exists()


README_QUOTES = [("minilm-vs-smollm2", "minilm-l6", "shift_ratio", "q"),
                 ("minilm-vs-smollm2", "minilm-l6", "score_share", "key_prior"),
                 ("minilm-vs-smollm2", "smollm2-135m", "sink_head_share", "first"),
                 ("minilm-vs-smollm2", "minilm-l6", "sink_head_share", "first"),
                 ("minilm-vs-smollm2", "smollm2-135m", "resid_max_to_rms", "hook_resid_post"),
                 ("minilm-vs-smollm2", "minilm-l6", "resid_max_to_rms", "hook_resid_post"),
                 ("digits-vit-bias", "digits-vit", "sink_head_share", "top_content"),
                 ("digits-vit-bias", "digits-vit-nobias", "sink_head_share", "top_content")]


def test_readme_quotes_the_kept_comparisons():
    """The getting-started page's side-by-side numbers are docs/results/compare/*/compare_summary.csv's, and each
    summary is its kept table's (the largest row of the quantity, with that row's interval)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "getting-started.md").read_text()
    start = text.index("## Models side by side")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    for run, model, quantity, part in README_QUOTES:
        folder = root / "docs" / "results" / "compare" / run
        summary = pd.read_csv(folder / "compare_summary.csv")
        row = summary[(summary.model == model) & (summary.quantity == quantity) & (summary.part == part)].iloc[0]
        quoted = f"{row.largest:.3g} [{row.largest_lo:.3g}, {row.largest_hi:.3g}]"
        assert quoted in section, (run, model, quantity, quoted)
        table = pd.read_parquet(folder / "compare.parquet")
        rows = table[(table.model == model) & (table.quantity == quantity) & (table.part == part)]
        top = rows.loc[rows.value.idxmax()]
        assert (top.value, top.lo, top.hi) == pytest.approx((row.largest, row.largest_lo, row.largest_hi), rel=1e-12)
