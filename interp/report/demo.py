"""``interp demo``: every pipeline step on one model, written as tables, figures, report.html
and summary.json.

Steps (``interp.report.pipeline.STEPS``): bias inventory -> recording -> origin shift -> score
decomposition -> invariances -> frequency profiles and head families -> implicit biases (sinks,
implicit value bias, massive activations) -> q/k/v ablations -> one input, closely.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from interp._version import __version__
from interp.checks import check_count
from interp.errors import InputError, MissingWeightsError, StepFailedError
from interp.record.fingerprint import model_fingerprint
from interp.models.loading import load_model
from interp.models.zoo import ZOO
from interp.report.pipeline import DEMO_BATCHES, make_context, run_steps
from interp.report.html import begin_outputs, write_and_release, write_report

DEFAULT_MODEL = "dinov2-s14"


def run_demo(model: Optional[str], data: Optional[str], out: Path, quick: bool = False,
             ablation_estimate: str = "auto", top_k: int = 5, data_options: Optional[dict] = None,
             max_batches: Optional[int] = None, weights: Optional[str] = None,
             model_args: Optional[dict] = None) -> Path:
    """Run the main job on ``model`` (default dinov2-s14) and write everything into ``out``.

    ``model`` is anything ``load_model`` takes by name (a zoo name, a folder, ``timm:NAME`` / ``open_clip:NAME``
    with ``weights``, a state dict file, and ``model_args``). The ablation step estimates every head in one pass
    and runs the ``top_k`` per kind exactly (``ablation_estimate="auto"``); ``"exact"`` runs every head exactly.
    Every option is checked before the first step runs. ``data_options``: ``resolve_data``'s options for your own
    data. One sample for every step: the first ``max_batches`` batches (None: ``DEMO_BATCHES``, 8 items at the
    demo's batch size of 4; quick: 1 batch), the invariances at most ``INVARIANCE_BATCHES`` of them; the
    manifest's ``analysed`` says, per step, how many items and batches it read."""
    name = model or DEFAULT_MODEL
    if ablation_estimate not in ("auto", "exact"):
        raise InputError(f"ablation_estimate must be 'auto' or 'exact'; got {ablation_estimate!r}")
    check_count("top_k", top_k, minimum=0)
    if model is None and not ZOO[name].available():
        raise MissingWeightsError(f"{name} weights are not cached: run `make models` (interp fetch) first")
    t0 = time.time()
    print(f"loading {name}")
    max_batches = DEMO_BATCHES if max_batches is None else max_batches
    ctx = make_context(load_model(name, weights=weights, model_args=model_args), data, quick, out, ablation_estimate,
                       top_k, data_options, max_batches=max_batches, command="demo")
    begin_outputs(out, "demo")
    # each step's files written as it ends, its figures let go: the report reads their PNGs
    sections = run_steps(ctx, keep_partial=True, after_step=lambda made: write_and_release(made, out))
    info, stats = ctx.model.interp, ctx.stats
    failed = sections[-1].numbers if sections and sections[-1].key == "failed" else None
    meta = dict(command="demo", model=name, weights=None if weights is None else str(weights), model_args=model_args,
                family=info.family, dataset=ctx.dataset, batches=len(ctx.batches),
                items=sum(int(b.inputs.shape[0]) for b in ctx.batches), max_batches=max_batches,
                analysed=ctx.analysed,
                positions_counted=stats.count(stats.layers[0]) if stats is not None else 0, quick=quick,
                ablation_estimate=ablation_estimate, top_k=top_k,
                model_fingerprint=model_fingerprint(ctx.model),
                data_fingerprint=stats.data_fingerprint if stats is not None else None,
                interp_version=__version__, seconds=round(time.time() - t0, 1),
                failed_step=None if failed is None else failed["failed_step"])
    report = write_report(sections, meta, out)
    if failed is not None:
        raise StepFailedError(f"step '{failed['failed_step']}' failed ({failed['error']}); the earlier steps' tables, "
                              f"figures and a report saying so are in {out}")
    print(f"wrote {report}, summary.json and tables/figures in {out} ({meta['seconds']:.0f}s)")
    return report

