"""Size and power of the two head tests and of the specialisation test (``interp.cluster_heads``,
``interp.specialisation_test``).

Size: four untrained architectures (GPT-2, LLaMA-style, BERT, ViT; the registry's tiny builders at 4 layers x 8
heads of 16, HF's own initialisation through ``interp.untrained_copy``), 8 seeds each, on one fixed data set
(16 random sequences of 48 tokens; 8 random 64 x 64 images, an 8 x 8 patch grid). Per seed: the within-layer
family test (default null; 99 draws, smallest p 0.01), the earlier default null (layer means kept), the layer
test with its bootstrap interval over items (50 resamples), and the specialisation test of that untrained
copy against 8 others (reference seeds 1000-1007, never a subject's own; profiled once per architecture, then
``specialisation_table``, which is what ``interp.specialisation_test`` returns). Rows: ``calibration.csv``.

Power: 72 heads (6 layers x 12) drawn from MiniLM's within-layer covariance of its 12 standardised profile
features on python-docs (no layer effect), a family shifted by delta along MiniLM's local-minus-global
direction (mean of the heads below the median attention distance minus those above, a unit vector in the space of
the standardised features: delta is in units of a feature's SD over MiniLM's heads): ``across`` = a share of heads drawn from all layers, ``along`` = whole layers (1 or 2 of 6). 10
repetitions per cell, 49 null draws or permutations per test (smallest p 0.02; enough to read alpha 0.05,
fewer than the library's default 199 to keep the grid affordable on two cores). Rows: ``power.csv``.

    python -m experiments.families_calibration --out docs/results/families   # about 30 min on 2 busy cores
    python -m experiments.families_calibration --out docs/results/families --part power --deltas 12 16 \
        --placements across   # the larger shifts where the within-layer test finds a spread family
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits

import interp
from interp.analysis.frequency import (
    _cluster_features, _test_features, cluster_heads, gaussian_null, item_profiles, layer_test,
    specialisation_table, two_means_index,
)

ARCHITECTURES = {"gpt2": "GPT-2", "llama": "LLaMA-style", "bert": "BERT", "vit": "ViT"}
SUBJECT_SEEDS = range(100, 108)
QUICK = False
REFERENCE_SEED = 1000
N_NULL, N_BOOT, N_SPLITS = 99, 50, 10
DELTAS = (0, 2, 3, 4, 5, 8)
SHARES = {"across": (1 / 6, 1 / 3), "along": (1 / 6, 1 / 3)}
N_POWER_NULL, N_REPS = 49, 10


def architecture(name: str) -> tuple[interp.InterpBridge, list]:
    """The tiny model of ``name`` (its weights are never used: only its architecture) and the fixed data."""
    config = {"image_size": 64} if name == "vit" else None
    base = interp.load_model(interp.tiny_hf_model(name, n_layers=4, n_heads=8, d_head=16, config=config),
                             device="cpu")
    g = torch.Generator().manual_seed(0)
    if name == "vit":
        return base, [torch.randn(4, 3, 64, 64, generator=g) for _ in range(2)]
    return base, [torch.randint(0, 97, (4, 48), generator=g) for _ in range(4)]


def calibration_rows(name: str) -> list[dict]:
    base, data = architecture(name)
    info, rows = base.interp, []
    everything = list(range(info.n_layers)), list(range(info.n_heads))
    ref_seeds = list(range(REFERENCE_SEED, REFERENCE_SEED + 8))  # the references, profiled once per architecture
    references = [interp.frequency_profile(interp.untrained_copy(base, s), data, progress=False) for s in ref_seeds]
    for seed in SUBJECT_SEEDS:
        t0 = time.time()
        model = interp.untrained_copy(base, seed)
        full, halves, resamples = item_profiles(model, data, *everything, N_SPLITS, 0, N_BOOT, progress=False)
        new = cluster_heads(full, n_null=N_NULL, halves=halves, resamples=resamples).iloc[0]
        old = cluster_heads(full, n_null=N_NULL, halves=halves, null="gaussian_layer_means").iloc[0]
        # = interp.specialisation_test(model, data, n_random=8, seed=REFERENCE_SEED) (tests/analysis check it)
        spec = specialisation_table(full, references, ref_seeds, seed=REFERENCE_SEED)
        summary = spec[spec.weights == "trained"].set_index("statistic")
        rows.append(dict(
            architecture=ARCHITECTURES[name], family=name, seed=seed, n_heads=len(full), n_features=int(new.n_features),
            family_p=new.family_p, family_effect=new.family_effect, structure=bool(new.structure),
            old_null_p=old.family_p, old_null_structure=bool(old.structure), replication_ari=new.replication_ari,
            layer_effect=new.layer_effect, layer_effect_lo=new.layer_effect_lo, layer_effect_hi=new.layer_effect_hi,
            layer_p=new.layer_p, layers_differ=bool(new.layers_differ),
            specialised=bool(summary.specialised.any()), specialisation_min_p_holm=float(summary.p_holm.min()),
            **{f"z_{s}": float(summary.loc[s, "z"]) for s in summary.index},
            n_null=N_NULL, n_boot=N_BOOT, n_random=8))
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()},
              f"{time.time() - t0:.0f} s", flush=True)
    return rows


def minilm_shape() -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(MiniLM's within-layer covariance of its standardised features, the local-minus-global direction as a unit
    vector in that standardised space, the layers, the number of features) on python-docs."""
    model = interp.load_model("minilm-l6", device="cpu")
    profile = interp.frequency_profile(model, "python-docs", progress=False, max_batches=3)
    X = _cluster_features(profile, "kmeans")
    layers = profile.layer.to_numpy()
    R = X - pd.DataFrame(X).groupby(layers).transform("mean").to_numpy()
    cov = R.T @ R / (len(X) - len(np.unique(layers)))
    local = profile.mean_attention_distance.to_numpy() < profile.mean_attention_distance.median()
    u = X[local].mean(0) - X[~local].mean(0)
    return cov, u / np.linalg.norm(u), layers, X.shape[1]


def planted(cov: np.ndarray, u: np.ndarray, layers: np.ndarray, kind: str, share: float, delta: float,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """72 heads from N(0, cov) with a family shifted by delta * u; (features, family membership)."""
    lam, vec = np.linalg.eigh(cov)
    X = rng.standard_normal((len(layers), len(u))) @ (vec * np.sqrt(np.clip(lam, 0, None))).T
    if kind == "across":
        member = np.zeros(len(layers), dtype=bool)
        member[rng.choice(len(layers), int(round(share * len(layers))), replace=False)] = True
    else:
        chosen = rng.choice(np.unique(layers), int(round(share * len(np.unique(layers)))), replace=False)
        member = np.isin(layers, chosen)
    return X + delta * member[:, None] * u, member


def tests_of(X: np.ndarray, layers: np.ndarray, seed: int, n_null: int) -> dict[str, float]:
    """The p of each test on features X (standardised first, as ``cluster_heads`` does): within-layer family
    test (default), the earlier layer-means null, and the layer test."""
    X = (X - X.mean(0)) / X.std(0)
    out = {}
    for null in ("within_layer", "gaussian_layer_means"):
        Xc, kind = _test_features(X, layers, null)
        draws, _ = gaussian_null(X, seed, n_null, layers, kind)
        out[null] = (1 + int((draws <= two_means_index(Xc, seed) + 1e-12).sum())) / (1 + n_null)
    out["layer"] = layer_test(X, layers, seed, n_null)[1]
    return out


def power_rows(deltas: tuple = DELTAS, placements: tuple = tuple(SHARES)) -> list[dict]:
    cov, u, layers, n_features = minilm_shape()
    rows = []
    for kind in placements:
        for share in SHARES[kind]:
            for delta in deltas:
                t0, ps = time.time(), []
                for rep in range(N_REPS):
                    rng = np.random.default_rng([rep, int(delta * 10), int(share * 100), kind == "along"])
                    X, _ = planted(cov, u, layers, kind, share, delta, rng)
                    ps.append(tests_of(X, layers, rep, N_POWER_NULL))
                for test, label in (("within_layer", "within-layer families"), ("layer", "layer effect"),
                                    ("gaussian_layer_means", "earlier null (layer means kept)")):
                    hits = sum(p[test] <= 0.05 for p in ps)
                    rows.append(dict(placement=kind, share=round(share, 3), delta=delta, test=label, rejected=hits,
                                     runs=N_REPS, rate=hits / N_REPS, n_heads=len(layers), n_features=n_features,
                                     n_null=N_POWER_NULL))
                print(kind, round(share, 2), delta, {r["test"]: r["rejected"] for r in rows[-3:]},
                      f"{time.time() - t0:.0f} s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/families")
    ap.add_argument("--part", choices=("calibration", "power", "both"), default="both")
    ap.add_argument("--deltas", type=float, nargs="*", default=list(DELTAS), help="power: the shifts (added to the "
                    "rows of power.csv already there, replacing equal cells)")
    ap.add_argument("--placements", nargs="*", default=list(SHARES), choices=list(SHARES))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    with threadpool_limits(1):
        if args.part in ("calibration", "both"):
            frame = pd.DataFrame([r for name in ARCHITECTURES for r in calibration_rows(name)])
            frame.to_csv(out / "calibration.csv", index=False)
            print(frame.groupby("architecture")[["structure", "old_null_structure", "layers_differ",
                                                 "specialised"]].sum())
        if args.part in ("power", "both"):
            frame = pd.DataFrame(power_rows(tuple(args.deltas), tuple(args.placements)))
            if (out / "power.csv").exists():  # other cells kept, these replaced
                old = pd.read_csv(out / "power.csv")
                key = ["placement", "share", "delta", "test"]
                old = old[~old.set_index(key).index.isin(frame.set_index(key).index)]
                frame = pd.concat([old, frame], ignore_index=True).sort_values(key, kind="stable")
            frame.to_csv(out / "power.csv", index=False)
            print(frame.pivot_table(index=["placement", "share", "test"], columns="delta", values="rejected"))


if __name__ == "__main__":
    main()
