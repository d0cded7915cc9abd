"""Plots draw the analyzers' frames: one titled panel per kind, axes labelled."""

import pandas as pd

from interp.plots import layer_head_heatmaps, origin_shift_figures, save_figure


def test_heatmaps_have_titles_labels_and_one_panel_per_kind(tmp_path):
    df = pd.DataFrame(
        [dict(layer=l, head=h, kind=k, shift_ratio=l + h / 10, bias_share=0.5)
         for l in range(3) for h in range(4) for k in "qkv"]
    )
    figs = origin_shift_figures(df, "toy")
    fig = figs["shift_ratio"]
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["kind = q", "kind = k", "kind = v"]
    assert all(ax.get_xlabel() == "head" and ax.get_ylabel() == "layer" for ax in axes)
    assert "toy" in fig._suptitle.get_text()
    path = save_figure(fig, tmp_path / "f.png")
    assert path.stat().st_size > 1000
    # the grid really is layer x head of the value
    single = layer_head_heatmaps(df[df.kind == "q"], "shift_ratio")
    mesh = single.axes[0].collections[0]
    assert mesh.get_array().reshape(3, 4)[2, 3] == 2.3
