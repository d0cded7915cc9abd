"""Implicit biases on the real zoo (issue 26, docs/findings.md "claim 4 revisited").

For each model: ``sink_profile`` (threshold ``SINK_THRESHOLD``, 0.3), ``sink_shares``, ``implicit_value_bias`` and
``massive_activations`` over the first ``--batches`` batches of its modality's built-in data, written
to ``docs/results/<model>/sinks_{profile,shares,implicit,massive}.csv``; with ``--remove`` on the
models named there, the profile also carries the masses with the key prior removed and with b_q
zeroed (``sink_profile(remove="key_prior")``). Run: ``nice python -m experiments.sinks_real``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import interp
from interp.analysis.sinks import SINK_THRESHOLD

DATA = {"minilm-l6": "python-docs", "smollm2-135m": "python-docs", "dinov2-s14": "photos",
        "mnist-vit": "mnist", "mnist-vit-nobias": "mnist", "mnist-vit-qv": "mnist"}
OUT = Path(__file__).resolve().parent.parent / "docs" / "results"


def run_model(name: str, batches: int, remove: bool, out: Path, batch_size: int) -> None:
    """Write the four tables of ``name`` into ``out/<name>/``."""
    t0 = time.time()
    model = interp.load_model(name, device="cpu")
    data = interp.builtin_batches(model, DATA[name], batch_size=batch_size, n=batches * batch_size)[:batches]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    profile = interp.sink_profile(model, data, threshold=SINK_THRESHOLD, remove="key_prior" if remove else None,
                                  progress=False)
    tables = dict(profile=profile, shares=interp.sink_shares(profile),
                  implicit=interp.implicit_value_bias(model, data, progress=False),
                  massive=interp.massive_activations(model, data, progress=False))
    for key, frame in tables.items():
        frame.assign(data=DATA[name], batch_size=batch_size).to_csv(folder / f"sinks_{key}.csv", index=False)
    print(f"{name}: {len(data)} batches of {batch_size}, remove={'key_prior' if remove else None}, "
          f"{time.time() - t0:.0f} s", flush=True)


BIAS = {"minilm-l6": "q, k, v", "smollm2-135m": "none", "dinov2-s14": "q, k, v", "mnist-vit": "q, k, v",
        "mnist-vit-nobias": "none", "mnist-vit-qv": "q, v"}


def table_row(name: str, out: Path) -> str:
    """The findings table's markdown row for ``name`` (docs/findings.md, claim 4 revisited)."""
    r = summary(out / name)
    sink = f"{r['sink_class']} {r['sink_share']:.0f}%"
    if "sink_share_without_key_prior" in r:
        sink += f" ({r['sink_share_without_key_prior']:.0f}% without key prior)"
    explicit = "none" if r["explicit"] is None else f"{r['explicit']:.3g}"
    cells = [f"`{name}`", BIAS[name], str(r["heads"]), sink, f"{r['content_share']:.0f}%", f"{r['implicit']:.3g}",
             explicit, f"{r['output_rms']:.3g}", f"{r['top_value']:.3g} (layer {r['top_layer']})",
             f"{r['top_ratio']:.0f}", str(r["massive"])]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DATA), help="comma-separated zoo names (default: all six)")
    p.add_argument("--remove", default="minilm-l6", help="models whose profile also runs remove='key_prior'")
    p.add_argument("--batches", type=int, default=2, help="batches per model (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=4, help="items per batch (default: %(default)s)")
    p.add_argument("--out", type=Path, default=OUT, help="results folder (default: docs/results)")
    p.add_argument("--table", action="store_true", help="print the findings table from the CSVs, run nothing")
    args = p.parse_args()
    if args.table:
        print("\n".join(table_row(n, args.out) for n in args.models.split(",") if (args.out / n / "sinks_shares.csv").exists()))
        return
    for name in args.models.split(","):
        run_model(name, args.batches, name in args.remove.split(","), args.out, args.batch_size)



def summary(folder: Path) -> dict:
    """One findings-table row from ``folder``'s four CSVs (tests/test_docs.py recomputes it)."""
    shares = pd.read_csv(folder / "sinks_shares.csv").set_index("position")
    implicit = pd.read_csv(folder / "sinks_implicit.csv")
    massive = pd.read_csv(folder / "sinks_massive.csv")
    sink = "first" if "first" in shares.index else "cls"
    top = massive.loc[massive.abs_value.idxmax()]
    row = dict(heads=int(shares.n_heads.iloc[0]), sink_class=sink, sink_share=100 * shares.share[sink],
               content_share=100 * shares.share["top_content"], implicit=implicit.implicit_norm.median(),
               explicit=implicit.explicit_norm.median() if implicit.has_b_v.any() else None,
               output_rms=implicit.output_rms.median(), top_value=top.abs_value, top_layer=int(top.layer),
               top_ratio=top.ratio_to_median, massive=int(massive.massive.sum()))
    if "share_without_key_prior" in shares.columns:
        row["sink_share_without_key_prior"] = 100 * shares.share_without_key_prior[sink]
    return row


if __name__ == "__main__":
    main()
