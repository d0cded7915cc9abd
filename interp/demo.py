"""``interp demo``: every pipeline step on one model, written as tables, figures, report.html
and summary.json.

Steps (``interp.pipeline.STEPS``): bias inventory -> recording -> origin shift -> score
decomposition -> invariances -> frequency profiles and head families -> q/k/v ablations.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from interp._version import __version__
from interp.checks import check_count
from interp.errors import InputError, MissingWeightsError
from interp.models.loading import load_model
from interp.models.zoo import ZOO
from interp.pipeline import make_context, run_steps
from interp.report import begin_outputs, write_report

DEFAULT_MODEL = "dinov2-s14"


def run_demo(model: Optional[str], data: Optional[str], out: Path, quick: bool = False,
             ablation_estimate: str = "auto", top_k: int = 5, data_options: Optional[dict] = None) -> Path:
    """Run the main job on ``model`` (default dinov2-s14) and write everything into ``out``.

    The ablation step estimates every head in one pass and runs the ``top_k`` per kind exactly
    (``ablation_estimate="auto"``); ``"exact"`` runs every head exactly. Every option is checked
    before the first step runs. ``data_options``: ``resolve_data``'s options for your own data."""
    name = model or DEFAULT_MODEL
    if ablation_estimate not in ("auto", "exact"):
        raise InputError(f"ablation_estimate must be 'auto' or 'exact'; got {ablation_estimate!r}")
    check_count("top_k", top_k, minimum=0)
    if model is None and not ZOO[name].available():
        raise MissingWeightsError(f"{name} weights are not cached: run `make models` (interp fetch) first")
    t0 = time.time()
    print(f"loading {name}")
    ctx = make_context(load_model(name), data, quick, out, ablation_estimate, top_k, data_options)
    begin_outputs(out)
    sections = run_steps(ctx)
    info = ctx.model.interp
    meta = dict(model=name, family=info.family, dataset=ctx.dataset, batches=len(ctx.batches),
                positions_counted=ctx.stats.count(ctx.stats.layers[0]), quick=quick,
                ablation_estimate=ablation_estimate, top_k=top_k,
                model_fingerprint=ctx.stats.model_fingerprint, data_fingerprint=ctx.stats.data_fingerprint,
                interp_version=__version__, seconds=round(time.time() - t0, 1))
    report = write_report(sections, meta, out)
    print(f"wrote {report}, summary.json and tables/figures in {out} ({meta['seconds']:.0f}s)")
    return report

