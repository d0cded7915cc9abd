"""Issue 27 in full: does an explicit bias or a key/value slot replace the attention sink?

    python -m experiments.train_sinks                      # every arm x 3 seeds, text and vision (resumes)
    python -m experiments.train_sinks --summarise-only     # tables, figures and card from the CSVs
    python -m experiments.train_sinks --redraw --out docs/results/sinks_text --figures docs/figures/sinks_text
                                                          # table.png alone, from the committed summary.csv
    python -m experiments.train_sinks --domains text --seeds 0 --text-steps 20 --no-ship   # a quick look
    python -m experiments.train_sinks --recipe fresh --domains text --arms none k_slot_v0 sink_token \
        --seeds 0 --out docs/results/sinks_text --figures docs/figures/sinks_text --no-ship   # issue 32

``--recipe fresh`` (issue 32): constant rate after warm-up, the installed packages' sources read
without repeating a window (``experiments.training.sinks.fresh_text_recipe``), and the count-model
baseline (``experiments.training.ngram``: Kneser-Ney byte models, the discount tuned on the last tenth of
the training split) on the same split and validation windows, written once to ``baseline.csv``;
``rule.csv`` then says, per run, whether the stopping rule (validation loss at least ``RULE_MARGIN``
nats/byte below the best count model) was met and from which step.

Trains the text arms (none, qkv, kv_slot, k_slot_v0, sink_token: a 4-layer LLaMA on the standard
library's bytes) and the vision arms (none, qkv, kv_slot, registers: the MNIST ViT recipe, cut
short), measuring each every ``every`` steps on held-out data (``experiments.training.sinks``).
Checkpoints go to ``--work/<the domain's recipe fingerprint>/`` (git-ignored cache): a killed run resumes where
it stopped, a finished one is read back, another recipe never mixes in. Writes into ``--out``
(``docs/results/sinks``): runs.csv, heads.csv, layers.csv, summary.csv, corpus.json, tables.md;
figures into ``docs/figures/sinks/``; the seed-0 text weights and their card into ``--ship``
(``data/sinks``). One thread: on this project's shared 2-core machine one thread trained faster
than two. ``--device cuda`` trains the text arms on a GPU (measurements still on a CPU copy);
``--d-model``, ``--n-layers``, ``--n-heads``, ``--d-ff``, ``--context`` and ``--text-batch`` change the
text recipe (and so its fingerprint: results of another shape are refused, never mixed), e.g. a wider
model on a larger corpus for issue 32's stopping rule, on a GPU machine, reading the corpus gathered
here (``--corpus-from``: that machine's packages would give other bytes):

    python -m experiments.train_sinks --recipe fresh --domains text --collect text --arms none \
        --seeds 0 --d-model 256 --n-layers 6 --n-heads 8 --d-ff 1024 --context 256 --text-batch 64 \
        --corpus-from .cache/interp/sinks-corpus/packages-<key> --text-steps 2000 --text-every 250 \
        --device cuda --baseline --out docs/results/sinks_text_wide --figures docs/figures/sinks_text_wide --no-ship

(``experiments/count_model_scaling.py`` gives each corpus size's count model, target and how many
steps of never-reread windows it holds.)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from interp.errors import InputError  # noqa: E402
from interp.io import atomic_path  # noqa: E402
from experiments.training.sink_arms import TEXT_ARMS, VISION_ARMS, LMShape  # noqa: E402
from interp.figures.plots import save_figure  # noqa: E402
from experiments.training.sink_report import findings_tables, loss_figure, massive_figure, model_card, rerun_tables, \
    seed_table, sink_share_figure, table_figure  # noqa: E402
from experiments.training.sink_results import check_results_folder, run_all, summarise  # noqa: E402
from experiments.training.corpus import Corpus, load_corpus  # noqa: E402
from experiments.training.ngram import count_baseline  # noqa: E402
from experiments.training.sink_results import stopping_rule  # noqa: E402
from experiments.training.sinks import TextRecipe, VisionRecipe, fresh_text_recipe, recipe_fingerprint, text_corpus, \
    training_device, val_windows  # noqa: E402

SHIPPED = "data/sinks"  # the first release's seed-0 text weights (experiments.training.sink_arms.load_sink_lm)


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--domains", nargs="+", default=["text", "vision"], choices=["text", "vision"])
    ap.add_argument("--arms", nargs="+", default=None, help="a subset of the arms (default: all)")
    ap.add_argument("--recipe", default="first", choices=["first", "fresh"],
                    help="text recipe: the first release's (cosine, stdlib, uniform windows) or issue 32's")
    ap.add_argument("--text-steps", type=int, default=TextRecipe().steps)
    ap.add_argument("--text-every", type=int, default=None, help="measure every this many steps")
    ap.add_argument("--corpus-budget", type=int, default=None, help="corpus bytes (default: the recipe's)")
    ap.add_argument("--corpus-from", default=None,
                    help="a corpus folder gathered elsewhere (<cache>/sinks-corpus/<key>/: train.bin, val.bin, "
                         "corpus.json), to train on exactly those bytes on a machine with other packages")
    shape = LMShape()
    ap.add_argument("--d-model", type=int, default=shape.d_model, help="text model width")
    ap.add_argument("--n-layers", type=int, default=shape.n_layers)
    ap.add_argument("--n-heads", type=int, default=shape.n_heads)
    ap.add_argument("--d-ff", type=int, default=shape.d_ff)
    ap.add_argument("--context", type=int, default=shape.context, help="text window, bytes")
    ap.add_argument("--text-batch", type=int, default=TextRecipe().batch, help="windows per text step")
    ap.add_argument("--device", default="cpu", help="where the text arms train: cpu, cuda, cuda:1, ...")
    ap.add_argument("--vision-steps", type=int, default=VisionRecipe().steps)
    ap.add_argument("--work", default=".cache/interp/sinks-runs", help="checkpoints (one folder per recipe)")
    ap.add_argument("--out", default="docs/results/sinks")
    ap.add_argument("--figures", default="docs/figures/sinks")
    ap.add_argument("--ship", default=SHIPPED, help="where the seed-0 text weights go")
    ap.add_argument("--no-ship", action="store_true")
    ap.add_argument("--overwrite", action="store_true", help="replace results of another recipe in --out")
    ap.add_argument("--summarise-only", action="store_true", help="no training: tables and figures from the CSVs")
    ap.add_argument("--redraw", action="store_true", help="only table.png, from --out's summary.csv (writes nothing "
                    "else: the other figures' titles need the recipe's arguments, --summarise-only redraws them)")
    ap.add_argument("--collect", nargs="+", default=["text", "vision"], choices=["text", "vision"],
                    help="the domains whose finished runs (of this recipe, by any process) go into the tables")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--baseline", action="store_true",
                    help="(re)compute the count-model baseline of the text recipe's split into --out/baseline.csv")
    return ap.parse_args()


def outputs(out: Path, figures: Path, scale: str, context: int) -> pd.DataFrame:
    """summary.csv, tables.md and the three figures from runs.csv and layers.csv."""
    runs, layers, heads = (pd.read_csv(out / f"{name}.csv") for name in ("runs", "layers", "heads"))
    summary = summarise(runs, heads)
    with atomic_path(out / "summary.csv") as tmp:
        summary.to_csv(tmp, index=False)
    with atomic_path(out / "tables.md") as tmp:
        tmp.write_text(findings_tables(summary) + "\n")
    if (runs.domain == "text").any():
        with atomic_path(out / "seeds.md") as tmp:
            tmp.write_text(seed_table(runs, heads) + "\n")
    save_figure(sink_share_figure(runs, heads, scale, context), figures / "sink_share.png")
    save_figure(massive_figure(layers, scale), figures / "massive_activations.png")
    save_figure(table_figure(summary), figures / "table.png")
    return summary


def baseline_csv(out: Path, text: TextRecipe, corpus) -> pd.DataFrame:
    """``baseline.csv``: the count models on the recipe's split and validation windows (computed once
    per corpus and validation set; a file of another corpus is recomputed)."""
    path = out / "baseline.csv"
    ident = f"{corpus.sha256[:16]}-{text.val_windows}x{text.shape.context}-orders1to7"
    if path.exists():
        found = pd.read_csv(path)
        if "data" in found and set(found.data) == {ident}:
            return found
    val = val_windows(corpus.val, text.val_windows, text.shape.context).numpy()
    frame = count_baseline(corpus.train.numpy(), val, text.shape.context)
    frame.insert(0, "data", ident)
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return frame


def text_recipe(args: argparse.Namespace) -> TextRecipe:
    """The text recipe the arguments name: the shape and batch are part of it (and of its fingerprint);
    with ``--corpus-from``, the budget is the one that corpus was gathered with."""
    shape = LMShape(n_layers=args.n_layers, d_model=args.d_model, n_heads=args.n_heads, d_ff=args.d_ff,
                    context=args.context)
    if shape.d_model % shape.n_heads:
        raise SystemExit(f"--d-model {shape.d_model} is not a multiple of --n-heads {shape.n_heads}: each head "
                         "needs an equal share of the width")
    budget = args.corpus_budget
    if args.corpus_from:
        record = _gathered(args.corpus_from).record
        gathered = record.get("budget")
        if gathered is None:
            raise SystemExit(f"{args.corpus_from}/corpus.json records no budget: not a corpus this library gathered")
        if budget is not None and budget != gathered:
            raise SystemExit(f"--corpus-budget {budget} but the corpus in {args.corpus_from} was gathered with a "
                             f"budget of {gathered}: drop --corpus-budget")
        kind, wanted = ("packages" if "packages" in record else "stdlib"), ("packages" if args.recipe == "fresh"
                                                                             else "stdlib")
        if kind != wanted:
            raise SystemExit(f"{args.corpus_from} holds a {kind} corpus, but --recipe {args.recipe} trains on the "
                             f"{wanted} corpus: pass a {wanted} corpus folder")
        budget = gathered
    changes = dict(steps=args.text_steps, batch=args.text_batch, **({"shape": shape} if shape != LMShape() else {}),
                   **({"every": args.text_every} if args.text_every else {}),
                   **({"corpus_budget": budget} if budget else {}))
    return fresh_text_recipe(**changes) if args.recipe == "fresh" else TextRecipe(**changes)


@functools.lru_cache(maxsize=2)
def _gathered(folder: str) -> Corpus:
    return load_corpus(Path(folder))  # read and checked once per process


def corpus_of(args: argparse.Namespace, text: TextRecipe) -> Corpus:
    """``--corpus-from``'s corpus (checked against its record), else the one the recipe gathers."""
    return _gathered(args.corpus_from) if args.corpus_from else text_corpus(text)


def ship_folder(args: argparse.Namespace, text: TextRecipe) -> Optional[Path]:
    """Where the seed-0 text weights go: ``--ship``, except that a recipe other than the first release's
    never replaces the shipped weights (``data/sinks``) unless ``--ship`` names the folder."""
    if args.no_ship:
        return None
    if text != TextRecipe() and args.ship == SHIPPED:
        raise SystemExit(f"this text recipe is not the first release's, whose weights {SHIPPED}/ holds: pass "
                         "--no-ship, or --ship FOLDER for another folder")
    return Path(args.ship)


def check_device(name: str) -> str:
    """``name`` if the text arms can train there (``experiments.training.sinks.training_device``), else exit
    with its message."""
    try:
        training_device(name)
    except InputError as err:
        raise SystemExit(f"--{err}") from err
    return name


def main() -> None:
    args = arguments()
    if args.redraw:
        print("wrote", save_figure(table_figure(pd.read_csv(Path(args.out) / "summary.csv")),
                                   Path(args.figures) / "table.png"))
        return
    torch.set_num_threads(args.threads)
    device = check_device(args.device)
    out, figures, start = Path(args.out), Path(args.figures), time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    text = text_recipe(args)
    vision = VisionRecipe(steps=args.vision_steps)
    s = text.shape
    scale = "; ".join(
        ([f"text: {s.n_layers} layers x {s.n_heads} heads, width {s.d_model}, context {s.context}, "
          f"{text.steps} steps of {text.batch}"] if "text" in args.domains else [])
        + ([f"vision: {vision.steps} steps of {vision.batch}"] if "vision" in args.domains else []))
    if not args.summarise_only:
        ship = ship_folder(args, text) if "text" in args.domains and 0 in args.seeds else None  # before any work
        corpus = corpus_of(args, text)
        fingerprints = dict(text=recipe_fingerprint(text, corpus.sha256), vision=recipe_fingerprint(vision))
        check_results_folder(out, fingerprints, args.overwrite)
        with atomic_path(out / "corpus.json") as tmp:
            tmp.write_text(json.dumps(dict(corpus.record, sha256=corpus.sha256), indent=1))
        arms = {"text": TEXT_ARMS, "vision": VISION_ARMS}
        plan = [(d, arm, seed) for d in args.domains for seed in args.seeds for arm in arms[d]
                if args.arms is None or arm in args.arms]
        frames = run_all(plan, text, vision, corpus, Path(args.work), out, ship=ship,
                         collect=args.collect, device=device)
        if ship is not None:
            with atomic_path(ship / "MODEL_CARD.md") as tmp:
                tmp.write_text(model_card(frames["runs"], text, fingerprints["text"], corpus.sha256))
    if args.baseline:
        baseline_csv(out, text, corpus_of(args, text))
    summary = outputs(out, figures, scale, s.context)
    if (out / "baseline.csv").exists():
        runs, baseline = pd.read_csv(out / "runs.csv"), pd.read_csv(out / "baseline.csv")
        rule = stopping_rule(runs, baseline)
        with atomic_path(out / "rule.csv") as tmp:
            rule.to_csv(tmp, index=False)
        with atomic_path(out / "rerun.md") as tmp:
            tmp.write_text(rerun_tables(runs, pd.read_csv(out / "heads.csv"), baseline, rule) + "\n")
        save_figure(loss_figure(runs, baseline, rule, scale), figures / "loss.png")
        print(rule.to_string(index=False))
    wall = time.perf_counter() - start
    runs = pd.read_csv(out / "runs.csv")
    train = runs.groupby(["domain", "arm", "seed"]).train_seconds.max().groupby("domain").sum()
    print(findings_tables(summary))
    print(f"\nwall time of this invocation {wall:.0f} s; training time in the checkpoints (all runs, all "
          f"invocations): {', '.join(f'{d} {t:.0f} s' for d, t in train.items())}; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
