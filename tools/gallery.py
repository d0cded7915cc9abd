"""The figure gallery: every figure the pipeline draws, for every zoo model, into
``docs/figures/<model>/`` (one command regenerates it; look at each image after a change).

    python tools/gallery.py [--models dinov2-s14 minilm-l6 ...] [--quick] [--out docs/figures]
    python tools/gallery.py --steps frequency sinks --out /tmp/gallery   # those steps' figures only

``--steps`` redraws the figures of the pipeline steps named (``interp.report.pipeline.STEPS``) without the others (the
ablation step alone is most of the time) and leaves ``index.md`` alone: copy the PNGs you mean to change.

Each model runs on its own kind of data (photos for DINOv2, MNIST for the MNIST ViTs, digits
for the digits pair, Python's documentation for the language models). Writes the PNGs and
an index (``index.md``) naming each figure and what produced it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import interp  # noqa: E402
from interp.io import atomic_path  # noqa: E402
from interp.report.pipeline import DEMO_BATCHES, STEPS, make_context, run_steps  # noqa: E402
from interp.figures.plots import save_figure  # noqa: E402

RUNS = {"dinov2-s14": "photos", "minilm-l6": "python-docs", "smollm2-135m": "python-docs",
        "digits-vit": "digits", "digits-vit-nobias": "digits", "mnist-vit": "mnist", "mnist-vit-nobias": "mnist",
        "mnist-vit-qv": "mnist"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--quick", action="store_true", help="one batch (a smoke run)")
    ap.add_argument("--out", default="docs/figures")
    ap.add_argument("--steps", nargs="+", choices=list(STEPS), help="only these pipeline steps (no index.md)")
    args = ap.parse_args()
    out = Path(args.out)
    sample = "one batch (--quick)" if args.quick else f"the demo's sample, its first {DEMO_BATCHES} batches"
    lines = ["# Figure gallery", "", "Regenerate with `python tools/gallery.py`. Each model runs the whole pipeline "
             f"on {sample} (the Data line says how many items), as `interp demo` does.", ""]
    for name in args.models:
        t = time.time()
        ctx = make_context(interp.load_model(name), RUNS[name], quick=args.quick, max_batches=DEMO_BATCHES)  # as the demo
        sections = run_steps(ctx, args.steps, log=lambda _: None)
        lines += [f"## {name}", "", f"Data: {ctx.data_label()}.", ""]
        for section in sections:
            for fig_name, fig in section.figures.items():
                path = save_figure(fig, out / name / f"{fig_name}.png")
                lines.append(f"- [{section.title}: {fig_name}]({name}/{path.name})")
        lines.append("")
        print(f"{name}: {sum(len(s.figures) for s in sections)} figures in {time.time() - t:.0f}s", flush=True)
    if args.steps:
        return
    with atomic_path(out / "index.md") as tmp:
        tmp.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
