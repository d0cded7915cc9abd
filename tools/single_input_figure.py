"""The single-input view in the docs: DINOv2 on one ``skimage.data`` photograph (``chelsea``, the cat,
third of the built-in photos), each picked head's CLS attention intact and without b_q, b_k, b_v and the
key prior, written to ``docs/figures/single_input_dinov2.png`` (and, with ``--all``, the overlay grid and
the key-prior bars beside it).

    python tools/single_input_figure.py [--all] [--out docs/figures]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import interp  # noqa: E402
from interp.figures.plots import key_prior_top_tokens, save_figure, single_input_overlay, single_input_patterns  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/figures")
    ap.add_argument("--all", action="store_true", help="also the overlay grid and the key-prior bars")
    args = ap.parse_args()
    out, t = Path(args.out), time.time()
    model = interp.load_model("dinov2-s14")
    photo = interp.builtin_batches(model, "photos", n=3)[0].inputs[2]  # chelsea
    view = interp.single_input(model, photo)
    print(f"{view} in {time.time() - t:.0f}s")
    print(view.heads.groupby("condition", observed=True)[["max_abs_diff", "kl", "output_change_rms"]].max())
    save_figure(single_input_patterns(view), out / "single_input_dinov2.png", dpi=90)
    if args.all:
        save_figure(single_input_overlay(view), out / "single_input_dinov2_overlay.png", dpi=70)
        save_figure(key_prior_top_tokens(view), out / "single_input_dinov2_key_prior.png", dpi=90)


if __name__ == "__main__":
    main()
