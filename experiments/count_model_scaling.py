"""What issue 32's stopping rule asks of a larger text run: the count-model baseline per corpus size.

    python -m experiments.count_model_scaling                        # 4, 16 and 48 MiB (resumes)
    python -m experiments.count_model_scaling --budgets-mib 4 16     # a subset

For each corpus budget, the packages corpus of issue 32's fresh text recipe
(``experiments.training.sinks.fresh_text_recipe(corpus_budget=...)``: the installed packages' sources,
split by file), the Kneser-Ney count models of orders 1-7 counted on its training split and scored on
its 512 validation windows of 128 bytes, exactly as ``experiments/train_sinks.py --baseline`` does
(``experiments.training.ngram.count_baseline``); at the recipe's 4 MiB the row equals
``docs/results/sinks_text/baseline.csv``'s best (experiments/tests/test_sink_text.py). Writes one row per budget to
``docs/results/sinks_text/count_model_scaling.csv``: the corpus (sha256, training and validation
bytes), the best order and its validation nats/byte, the rule's target (that minus
``RULE_MARGIN``), and how many steps of never-reread windows the training split holds at the shipped
runs' batch (16 x 128 bytes) and at 64 x 256 bytes. A budget already in the file for the same corpus
is kept, not recomputed. The validation split grows with the budget (files are split by hash), so the
rows compare corpora, not one fixed test set. The targets hold for 128-byte windows; a run at another
context (``train_sinks.py --context``) scores other windows, and ``train_sinks.py --baseline`` computes
its own.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from interp.io import atomic_path
from experiments.training.ngram import count_baseline
from experiments.training.sink_results import RULE_MARGIN
from experiments.training.corpus import Corpus
from experiments.training.sinks import fresh_text_recipe, text_corpus, val_windows

COLUMNS = ["budget_mib", "corpus_sha256", "train_bytes", "val_bytes", "best_order", "best_discount",
           "count_model_val", "target", "steps_16x128", "steps_64x256", "count_seconds"]


def scaling_row(budget_mib: int, corpus: Corpus) -> dict:
    """One budget's corpus (of ``fresh_text_recipe(corpus_budget=...)``), its best count model and the
    rule's target (module doc)."""
    recipe = fresh_text_recipe(corpus_budget=budget_mib * 2**20)
    context = recipe.shape.context
    start = time.perf_counter()
    frame = count_baseline(corpus.train.numpy(), val_windows(corpus.val, recipe.val_windows, context).numpy(), context)
    best = frame.loc[frame.val_nats_per_byte.idxmin()]
    n = len(corpus.train)
    return dict(budget_mib=budget_mib, corpus_sha256=corpus.sha256, train_bytes=n, val_bytes=len(corpus.val),
                best_order=int(best.n), best_discount=float(best.discount),
                count_model_val=float(best.val_nats_per_byte), target=float(best.val_nats_per_byte) - RULE_MARGIN,
                steps_16x128=n // 128 // 16, steps_64x256=n // 256 // 64,
                count_seconds=round(time.perf_counter() - start, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets-mib", type=int, nargs="+", default=[4, 16, 48])
    ap.add_argument("--out", default="docs/results/sinks_text/count_model_scaling.csv")
    args = ap.parse_args()
    out = Path(args.out)
    rows = pd.read_csv(out).to_dict("records") if out.exists() else []
    for budget in args.budgets_mib:
        corpus = text_corpus(fresh_text_recipe(corpus_budget=budget * 2**20))
        if any(r["budget_mib"] == budget and r["corpus_sha256"] == corpus.sha256 for r in rows):
            print(f"{budget} MiB: kept")
            continue
        row = scaling_row(budget, corpus)
        rows = [r for r in rows if r["budget_mib"] != budget] + [row]
        frame = pd.DataFrame(rows, columns=COLUMNS).sort_values("budget_mib")
        with atomic_path(out) as tmp:  # after each budget: a killed run keeps what it measured
            frame.to_csv(tmp, index=False)
        print(f"{budget} MiB: order {row['best_order']}, {row['count_model_val']:.3f} nats/byte, target "
              f"{row['target']:.3f}; {row['steps_16x128']:,} steps of 16 x 128, {row['steps_64x256']:,} of 64 x 256 "
              f"({row['count_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
