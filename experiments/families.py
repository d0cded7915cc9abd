"""Head families tested (issue 37): each real model and a randomly initialised copy of its architecture (the
negative control), under both Gaussian nulls of ``cluster_heads`` and replicated on disjoint halves of the
items (``family_test``'s split profiles from one forward pass). Also the issue's own case: a random-init
GPT-2 of the real shape (4 layers, 768 wide) on random tokens, and a random-init ViT-B/16 shape (4 layers).

    python -m experiments.families --out docs/results/families [--models dinov2-s14 minilm-l6]

Writes ``family_tests.csv``: one row per model x weights x null with k, family_p, n_null, covariance,
cluster_index, null_cluster_index, separation, replication_ari / _lo / _hi (median and 2.5 / 97.5 percentiles
over ``n_splits`` random halvings), structure, the old column-permutation p (``permutation_p``, 19 draws as
shipped before) and the families' sizes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import transformers as tf

import interp
from threadpoolctl import threadpool_limits

from interp.analysis.frequency import NULLS, N_SPLITS, _best_k, _cluster_features, cluster_heads, split_profiles
from interp.models import InterpBridge

RUNS = {"dinov2-s14": "photos", "digits-vit": "digits", "digits-vit-nobias": "digits",
        "minilm-l6": "python-docs", "smollm2-135m": "python-docs"}


def random_init(model: InterpBridge, seed: int = 0) -> InterpBridge:
    """A fresh copy of ``model``'s architecture with its own random initialisation (no weights loaded)."""
    hf = model.hf_model
    source = getattr(hf, hf.base_model_prefix) if model.interp.random_head else hf
    torch.manual_seed(seed)
    kwargs = {"add_pooling_layer": False} if hasattr(source, "pooler") else {}
    fresh = type(source)(source.config, **kwargs).eval()
    return InterpBridge(fresh, name=f"{model.interp.name} (random init)", tokenizer=model.tokenizer,
                        processor=model.processor, warn_zero_biases=False)


def shaped_controls() -> dict[str, tuple[InterpBridge, list]]:
    """The issue's random-init GPT-2 (real width, 4 layers, 16 sequences of 48 random tokens) and a ViT-B/16
    shape (4 layers, 8 random 224 x 224 images): attention nearly uniform in every head."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=4, attn_implementation="eager")).eval()
    vit = tf.ViTModel(tf.ViTConfig(num_hidden_layers=4, attn_implementation="eager"), add_pooling_layer=False).eval()
    return {"gpt2-shape": (interp.load_model(gpt2, device="cpu"),
                           [torch.randint(0, 50257, (4, 48), generator=g) for _ in range(4)]),
            "vit-b16-shape": (interp.load_model(vit, device="cpu"),
                              [torch.randn(2, 3, 224, 224, generator=g) for _ in range(4)])}


def _permutation_p(profile: pd.DataFrame, n_null: int = 19, seed: int = 0) -> float:
    """The previous release's p: the best mean silhouette (k in 2..8) against ``n_null`` copies of the
    standardised features with each column permuted across heads on its own (19 draws: smallest p 0.05)."""
    X = _cluster_features(profile, "kmeans")
    observed, rng, null = _best_k(X, "kmeans", seed)[0], np.random.default_rng(seed), []
    with threadpool_limits(1):
        for _ in range(n_null):
            best = _best_k(np.column_stack([rng.permutation(col) for col in X.T]), "kmeans", seed, n_init=3)
            null.append(best[0] if best is not None else 0.0)
    return (1 + int((np.asarray(null) >= observed - 1e-12).sum())) / (1 + n_null)


def rows_for(name: str, weights: str, model: InterpBridge, data, max_batches: int, n_splits: int) -> list[dict]:
    info = model.interp
    layers, heads = list(range(info.n_layers)), list(range(info.n_heads))
    full, halves = split_profiles(model, data, layers, heads, n_splits, seed=0, max_batches=max_batches)
    n_items = sum(len(b.inputs) for b in interp.iter_batches(model, data, max_batches))
    out, permutation_p = [], _permutation_p(full)
    for null in NULLS:
        c = cluster_heads(full, halves=halves, null=null)
        first = c.iloc[0]
        sizes = c.cluster.value_counts().sort_index().tolist()
        out.append(dict(model=name, weights=weights, data=data if isinstance(data, str) else "random", n_items=n_items,
                        n_heads=len(c), null=null, k=int(first.k), family_sizes=" ".join(map(str, sizes)),
                        silhouette_mean=first.silhouette_mean, family_p=first.family_p, n_null=int(first.n_null),
                        covariance=first.covariance, cluster_index=first.cluster_index,
                        null_cluster_index=first.null_cluster_index, separation=first.separation,
                        replication_ari=first.replication_ari, replication_lo=first.replication_lo,
                        replication_hi=first.replication_hi, n_splits=int(first.n_splits),
                        structure=bool(first.structure), permutation_p=permutation_p))
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in out[-1].items()}, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/families")
    ap.add_argument("--models", nargs="*", default=list(RUNS) + ["gpt2-shape", "vit-b16-shape"])
    ap.add_argument("--max-batches", type=int, default=3)
    ap.add_argument("--n-splits", type=int, default=N_SPLITS)
    ap.add_argument("--no-random-init", action="store_true")
    args = ap.parse_args()
    rows, controls = [], None
    for name in args.models:
        if name in RUNS:
            model = interp.load_model(name, device="cpu")
            rows += rows_for(name, "trained", model, RUNS[name], args.max_batches, args.n_splits)
            if not args.no_random_init:
                rows += rows_for(name, "random init", random_init(model), RUNS[name], args.max_batches, args.n_splits)
        else:
            controls = controls or shaped_controls()
            model, data = controls[name]
            rows += rows_for(name, "random init", model, data, None, args.n_splits)
    out = pd.DataFrame(rows)
    path = Path(args.out) / "family_tests.csv"
    if path.exists():  # other models' rows are kept; these models' rows replaced
        old = pd.read_csv(path)
        out = pd.concat([old[~old.model.isin(args.models)], out], ignore_index=True)
    out = out.sort_values(["model", "weights", "null"], kind="stable").reset_index(drop=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(path, index=False)
    print(out.drop(columns=["data"]).round(3).to_string())


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
