"""Frequency specialisation of heads (``frequency_profile``) and head families (``cluster_heads``).

ViTs (Park & Kim 2022, "How Do Vision Transformers Work?", applied per head): the head
output z = hook_z [batch, pos, head, d_head] on the patch grid (CLS/distillation tokens
left out) is Fourier transformed over the 2D grid per channel; amplitudes are averaged
over channels and images and binned by radial frequency r = sqrt(fx^2 + fy^2) (cycles per
patch, Nyquist 0.5) into ``n_bins`` bins; ``bin_i`` = log(mean amplitude in bin i) -
log(DC amplitude). ``hf_ratio`` = energy (amplitude^2) at r > Nyquist/2 over the total
energy including DC. LMs: the same along the token axis (1D FFT over positions).

Mean attention distance (ViT paper): sum_j A_ij ||p_i - p_j|| over patch keys j, with
patch-centre coordinates in pixels, averaged over query patches and images (CLS row and
column dropped, weights not renormalised). LMs: sum_j A_ij |i - j| in tokens over
non-padding queries. Entropy: -sum_j A_ij log A_ij, averaged over queries. Sink mass:
attention on the prefix tokens (CLS) for ViTs, on the first real token for LMs.

Weighting (the same for every batching of the same items): distances, entropies and sink
masses are means over query rows, each real token or patch counting once; a text spectrum
is taken per sequence over its real tokens only (padding never enters an FFT) and spectra
of different lengths or grids are combined with each sequence or image counting once
(``combine_spectra``).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from einops import rearrange
from sklearn.cluster import AgglomerativeClustering, KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import silhouette_samples, silhouette_score
from sklearn.preprocessing import StandardScaler
from torch import Tensor
from tqdm.auto import tqdm

from interp.checks import as_index, check_count, check_fraction, check_heads, check_kinds, check_layers
from interp.capture import stream_batches
from interp.data import Batch, iter_batches
from interp.errors import InputError, public
from interp.hooks import hook_name
from interp.models.bridge import InterpBridge, require_bridge
from interp.models.info import ModelInfo
from interp.patching import bias_patch_hooks, check_method

N_BINS = 8


def radial_bins(shape: Sequence[int], n_bins: int = N_BINS) -> tuple[Tensor, Tensor]:
    """(bin index per frequency cell [-1 = DC, n_bins = beyond Nyquist], radius per cell)."""
    freqs = [torch.fft.fftfreq(n, dtype=torch.float64) for n in shape]
    grids = torch.meshgrid(*freqs, indexing="ij")
    r = torch.sqrt(sum(g**2 for g in grids))
    idx = torch.ceil(r / 0.5 * n_bins).long() - 1  # (0, 0.5/n] -> 0, ..., (.., 0.5] -> n-1
    idx[r == 0] = -1
    idx[r > 0.5 + 1e-12] = n_bins
    return idx, r


def head_spectrum(z: Tensor, grid: Optional[tuple[int, int]]) -> Tensor:
    """Mean amplitude spectrum [head, *freq_shape] of z [b, p, h, d] (grid: 2D patch layout)."""
    z = z.double()
    if grid is not None:
        z = rearrange(z, "b (gh gw) h d -> b h d gh gw", gh=grid[0], gw=grid[1])
        amp = torch.fft.fft2(z).abs()
    else:
        z = rearrange(z, "b p h d -> b h d p")
        amp = torch.fft.fft(z).abs()
    return amp.mean(dim=(0, 2))


def _spectrum_parts(spec: Tensor, n_bins: int = N_BINS) -> dict[str, Tensor]:
    """Of a mean amplitude spectrum [head, *freq]: mean amplitude per radial bin [head, n_bins] (NaN where a
    bin has no cell), DC amplitude, energy (amplitude^2) above Nyquist/2 and in total (DC included) [head]."""
    idx, r = radial_bins(spec.shape[1:], n_bins)
    flat, fidx, fr = spec.flatten(1), idx.flatten(), r.flatten()
    amp = torch.full((spec.shape[0], n_bins), float("nan"), dtype=torch.float64)
    for i in range(n_bins):
        cells = fidx == i
        if cells.any():
            amp[:, i] = flat[:, cells].mean(1)
    energy, inside = flat**2, fidx < n_bins
    return dict(amp=amp, dc=flat[:, fidx == -1][:, 0], e_hf=energy[:, (fr > 0.25) & inside].sum(1),
                e_total=energy[:, inside].sum(1))


def _bins_and_ratio(parts: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """bin_i = log(mean amplitude in bin i) - log(DC amplitude); hf_ratio = high-frequency energy / total."""
    bins = torch.log(parts["amp"].clamp(min=1e-300)) - torch.log(parts["dc"].clamp(min=1e-300))[:, None]
    return bins, parts["e_hf"] / parts["e_total"].clamp(min=1e-300)


def bin_spectrum(spec: Tensor, n_bins: int = N_BINS) -> tuple[Tensor, Tensor]:
    """Binned log-amplitude relative to DC [head, n_bins] and hf_ratio [head] of a spectrum."""
    return _bins_and_ratio(_spectrum_parts(spec, n_bins))


def combine_spectra(spectra: dict[tuple, tuple[Tensor, int]], n_bins: int = N_BINS) -> tuple[Tensor, Tensor]:
    """Bins and hf_ratio of spectra of several shapes (sequence lengths, patch grids).

    ``spectra``: shape -> (sum over items of their amplitude spectra, number of items). Each item
    counts once: per-bin amplitudes, DC amplitudes and energies of each shape's mean spectrum are
    averaged with the shapes' item counts as weights. With one shape this is ``bin_spectrum`` of
    the mean spectrum; it does not depend on how the items were batched.
    """
    parts = {shape: _spectrum_parts(total / n, n_bins) for shape, (total, n) in spectra.items()}
    counts = {shape: n for shape, (_, n) in spectra.items()}
    n_all = sum(counts.values())
    mean = {key: sum(counts[s] * p[key] for s, p in parts.items()) / n_all for key in ("amp", "dc", "e_hf", "e_total")}
    return _bins_and_ratio(mean)


def _pixel_distances(grid: tuple[int, int], patch: int) -> Tensor:
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    centres = torch.stack([(rows.flatten() + 0.5) * patch, (cols.flatten() + 0.5) * patch], -1).double()
    return torch.cdist(centres, centres)


def _vision_terms(info: ModelInfo, z: Tensor, pat: Tensor, image_hw: tuple[int, int]) -> dict[str, Any]:
    """Per-head sums over the batch's query rows: spectrum, pixel distance, sink mass, entropy (ViT)."""
    n_pre, ps, b = info.n_prefix_tokens, info.patch_size, z.shape[0]
    grid = (image_hw[0] // ps, image_hw[1] // ps)
    pp = pat[:, :, n_pre:, n_pre:]
    return dict(
        spectra={grid: (head_spectrum(z[:, n_pre:], grid) * b, b)},
        n_query=float(b * pp.shape[2]), n_rows=float(b * pat.shape[2]),
        dist=(pp * _pixel_distances(grid, ps).to(pp.device)).sum((-1, -2)).sum(0),
        sink=pat[:, :, n_pre:, :n_pre].sum((-1, -2)).sum(0),
        ent=-(pat * pat.clamp(min=1e-300).log()).sum((-1, -2)).sum(0),
    )


def _sequence_spectra(z: Tensor, mask: Tensor) -> dict[tuple, tuple[Tensor, int]]:
    """length -> (sum of amplitude spectra, count) of each sequence over its real tokens only (no padding)."""
    out: dict[tuple, tuple[Tensor, int]] = {}
    for row, keep in zip(z, mask):
        real = row[keep]  # [real_pos, head, d_head]
        if real.shape[0] == 0:
            continue
        key = (real.shape[0],)
        total, n = out.get(key, (0, 0))
        out[key] = (total + head_spectrum(real[None], None), n + 1)
    return out


def _text_terms(z: Tensor, pat: Tensor, attention_mask: Optional[Tensor]) -> dict[str, Any]:
    """Per-head sums over real query tokens: spectrum (per sequence, padding cut), token distance,
    first-token mass, entropy."""
    mask = attention_mask.to(z.device).bool() if attention_mask is not None else \
        torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)
    if not bool(mask.any()):
        raise InputError("no real tokens in a batch: its attention mask is all 0")
    pos = torch.arange(z.shape[1], device=z.device)
    d = (pos[:, None] - pos[None, :]).abs().double()
    qmask = mask[:, None, :].double()  # [batch, 1, query_pos]
    first = mask.double().argmax(-1)  # each sequence's first real token (left padding)
    first_mass = pat.gather(-1, first[:, None, None, None].expand(*pat.shape[:3], 1))[..., 0]
    n_tok = float(mask.sum())
    return dict(
        spectra=_sequence_spectra(z, mask), n_query=n_tok, n_rows=n_tok,
        dist=((pat * d).sum(-1) * qmask).sum((0, 2)),
        sink=(first_mass * qmask).sum((0, 2)),
        ent=(-(pat * pat.clamp(min=1e-300).log()).sum(-1) * qmask).sum((0, 2)),
    )


def _add_terms(acc: dict[str, Any], terms: dict[str, Any]) -> None:
    for key, val in terms.items():
        if key == "spectra":
            spectra = acc.setdefault("spectra", {})
            for shape, (total, n) in val.items():
                old_total, old_n = spectra.get(shape, (0, 0))
                spectra[shape] = (old_total + total.cpu(), old_n + n)
        else:
            acc[key] = acc.get(key, 0) + (val.cpu() if isinstance(val, Tensor) else val)


def _consumer(info: ModelInfo, layers: Sequence[int], acc: dict[int, dict[str, Any]]):
    """Adds one batch's per-head terms of ``layers`` (from the kept z and pattern) into ``acc``."""
    def consume(batch: Batch, store: dict[str, Tensor], x: Tensor, kw: dict) -> None:
        for l in layers:
            z, pat = store[hook_name(l, "z")], store[hook_name(l, "pattern")].double()
            if info.modality == "vision":
                terms = _vision_terms(info, z, pat, (x.shape[2], x.shape[3]))
            else:
                terms = _text_terms(z, pat, batch.attention_mask)
            _add_terms(acc[l], terms)
    return consume


def _profile_batches(model: InterpBridge, batches: Any, layers: Sequence[int], hooks_for_layer=None,
                     progress: bool = True, desc: str = "frequency profile",
                     max_batches: Optional[int] = None) -> pd.DataFrame:
    """The profile of ``layers`` over ``batches`` (data, streamed through the one capture loop,
    ``stream_batches``; with ``hooks_for_layer``, one pass per layer with that layer's hooks: a list)."""
    info = model.interp
    acc: dict[int, dict[str, Any]] = {l: {} for l in layers}
    runs = [([l], hooks_for_layer(l)) for l in layers] if hooks_for_layer else [(list(layers), [])]
    for want, hooks in tqdm(runs, desc=desc, disable=not progress or len(runs) == 1):
        names = [hook_name(l, n) for l in want for n in ("z", "pattern")]
        stream_batches(model, batches, max_batches, names, _consumer(info, want, acc), hooks=hooks, desc=desc,
                       progress=progress and len(runs) == 1)
    rows = []
    for l in layers:
        a = acc[l]
        bins, hf = combine_spectra(a["spectra"])
        for h in range(info.n_heads):
            row = dict(layer=l, head=h, hf_ratio=float(hf[h]),
                       mean_attention_distance=float(a["dist"][h] / a["n_query"]),
                       entropy=float(a["ent"][h] / a["n_rows"]), sink_mass=float(a["sink"][h] / a["n_query"]),
                       distance_unit="pixels" if info.modality == "vision" else "tokens")
            row.update({f"bin_{i}": float(bins[h, i]) for i in range(bins.shape[1])})
            rows.append(row)
    return pd.DataFrame(rows)


@public
def frequency_profile(model: InterpBridge, data: Any, *, layers: Optional[Sequence[int]] = None,
                      heads: Optional[Sequence[int]] = None, max_batches: Optional[int] = None,
                      progress: bool = True) -> pd.DataFrame:
    """One row per layer x head: hf_ratio, mean_attention_distance, entropy, sink_mass, bin_0..7.

    ``layers`` / ``heads`` (None: all): only those rows, equal to the same rows of the full table."""
    info = require_bridge(model, "frequency_profile").interp
    layers, heads = check_layers(layers, info), check_heads(heads, info)
    return _select_heads(_profile_batches(model, data, layers, progress=progress, max_batches=max_batches), heads)


def _select_heads(table: pd.DataFrame, heads: list[int]) -> pd.DataFrame:
    return table[table["head"].isin(heads)].reset_index(drop=True)


@public
def frequency_shift_under_ablation(model: InterpBridge, data: Any, kinds: Sequence[str] = ("q",), method: str = "zero",
                                   *, layers: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None,
                                   max_batches: Optional[int] = None, progress: bool = True) -> pd.DataFrame:
    """Each head's profile with its own bias (of ``kinds``) patched out, and the change.

    Heads of one layer do not interact within that layer, so patching every head of
    layer l at once and reading layer l gives each head's own-patch profile exactly:
    one forward per layer. Columns: the profile's, plus ``*_intact`` and ``delta_*`` for
    hf_ratio and mean_attention_distance. ``layers`` / ``heads`` (None: all): only those rows (each
    head's own patch, so equal to the same rows of the full table).
    """
    info = require_bridge(model, "frequency_shift_under_ablation").interp
    kinds, layers, heads = check_kinds(kinds), check_layers(layers, info), check_heads(heads, info)
    check_method(method, [(0, 0, k) for k in kinds], None, need_stats=False)
    if method == "mean":
        raise InputError("frequency_shift_under_ablation supports method 'zero' or 'fold' (v); 'mean' needs stats")
    batches = list(iter_batches(model, data, max_batches))
    intact = _profile_batches(model, batches, layers, progress=progress, desc="profile (intact)")

    def hooks(l: int):
        targets = [(l, h, k) for k in kinds for h in range(info.n_heads if k == "q" else info.n_kv_heads)]
        return bias_patch_hooks(model, targets, method)

    patched = _profile_batches(model, batches, layers, hooks_for_layer=hooks, progress=progress,
                               desc=f"profile ({'+'.join(kinds)} bias {method})")
    out = patched.merge(intact[["layer", "head", "hf_ratio", "mean_attention_distance"]],
                        on=["layer", "head"], suffixes=("", "_intact"))
    out["delta_hf_ratio"] = out.hf_ratio - out.hf_ratio_intact
    out["delta_mean_attention_distance"] = out.mean_attention_distance - out.mean_attention_distance_intact
    out["ablated"] = "+".join(kinds) + f" bias ({method})"
    return _select_heads(out, heads)


FEATURES = ("hf_ratio", "mean_attention_distance", "entropy", "sink_mass")


def _fit_clusters(X: np.ndarray, k: int, method: str, seed: int, n_init: int = 10) -> np.ndarray:
    with warnings.catch_warnings():
        # duplicate heads (e.g. planted copies) yield fewer distinct clusters than k
        warnings.simplefilter("ignore", ConvergenceWarning)
        if method == "kmeans":
            return KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(X)
        return AgglomerativeClustering(n_clusters=k).fit_predict(X)


def _best_k(X: np.ndarray, method: str, seed: int, n_init: int = 10) -> Optional[tuple[float, int, np.ndarray]]:
    """(mean silhouette, k, labels) of the k in 2..8 with the best mean silhouette; None if no k splits."""
    best = None
    for k in range(2, min(8, len(X) - 1) + 1):
        labels = _fit_clusters(X, k, method, seed, n_init)
        if len(set(labels)) < 2:
            continue
        score = silhouette_score(X, labels)
        if best is None or score > best[0] + 1e-12:
            best = (score, k, labels)
    return best


# The smallest difference between two families' mean that counts, per headline feature: a split whose
# every pair of families differs by less in all four is no family structure, however high its silhouette
# (standardised features make 115.89 vs 115.85 px look like two families).
RESOLUTION = dict(hf_ratio=0.01, entropy=0.05, sink_mass=0.02)
DISTANCE_RESOLUTION = 0.02  # of the mean attention distance


def family_separation(profile: pd.DataFrame, labels: np.ndarray) -> float:
    """min over pairs of families of max over headline features of |mean difference| / resolution."""
    res = {**RESOLUTION, "mean_attention_distance": DISTANCE_RESOLUTION * abs(profile.mean_attention_distance.mean())}
    cols = [c for c in res if c in profile]
    means = profile[cols].assign(_c=labels).groupby("_c").mean()
    scale = np.array([max(res[c], 1e-12) for c in cols])
    values = means.to_numpy() / scale
    gaps = [np.abs(values[i] - values[j]).max() for i in range(len(values)) for j in range(i + 1, len(values))]
    return float(min(gaps)) if gaps else 0.0


def permutation_null(X: np.ndarray, method: str, seed: int, n_null: int) -> np.ndarray:
    """The best mean silhouette (over k in 2..8) of ``n_null`` copies of X with each feature column
    permuted across heads on its own: each feature keeps its distribution (outliers included), any
    structure shared by the features is destroyed."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_null):
        Xp = np.column_stack([rng.permutation(col) for col in X.T])
        best = _best_k(Xp, method, seed, n_init=3)  # 3 restarts: the null needs many fits, not the best one
        out.append(best[0] if best is not None else 0.0)
    return np.asarray(out)


@public
def cluster_heads(profile: pd.DataFrame, k: Optional[int] = None, method: str = "kmeans",
                  seed: int = 0, n_null: int = 19, alpha: float = 0.05) -> pd.DataFrame:
    """Group heads into families on standardised profile features (scikit-learn), or say there are none.

    ``k`` is chosen by the best mean silhouette over 2..8 when not given, and that silhouette is
    compared with a permutation null: the same best silhouette on ``n_null`` copies of the features
    with each column permuted across heads on its own (``permutation_null``). p = (1 + #null >=
    observed) / (1 + n_null). Families must also differ by a visible amount: ``separation`` = min over
    pairs of families of max over hf_ratio, mean_attention_distance, entropy and sink_mass of the
    difference of their means in units of ``RESOLUTION`` (0.01, 2% of the mean distance, 0.05 nats,
    0.02). With p > ``alpha`` or separation < 1 the heads form one family: ``k`` = 1, ``cluster`` = 0,
    ``structure`` = False (standardised features give noise, or a random-init model's layer 0, a high
    silhouette too). A given ``k`` is used as asked, with p and separation reported. Clusters are
    relabelled so that cluster 0 has the lowest mean hf_ratio (most low-pass). Adds columns
    ``cluster``, ``silhouette`` (per head), ``silhouette_mean``, ``k``, ``null_silhouette`` (mean of
    the null's), ``p_value``, ``separation`` (of the best k's families), ``structure``.
    """
    X = _cluster_features(profile, method)
    n_null, seed = check_count("n_null", n_null), check_count("seed", seed, minimum=0)
    alpha = check_fraction("alpha", alpha)
    n = len(X)
    if k is not None:
        number = as_index(k)
        if number is None or not 2 <= number < n:
            raise InputError(f"k must lie in 2..{n - 1} (an integer, fewer than the {n} heads) or be None (chosen "
                             f"by silhouette); got {k!r} ({type(k).__name__})")
        k = number
    best = _best_k(X, method, seed)
    if best is None:
        raise InputError("heads are indistinguishable: no clustering with >= 2 clusters")
    null = permutation_null(X, method, seed, n_null)
    p_value = (1 + int((null >= best[0] - 1e-12).sum())) / (1 + n_null)
    separation = family_separation(profile, best[2])
    structure = p_value <= alpha and separation >= 1.0
    if k is not None:
        labels = _fit_clusters(X, k, method, seed)
    elif structure:
        k, labels = best[1], best[2]
    else:
        k, labels = 1, np.zeros(n, dtype=int)
    out = profile.copy()
    order = out.assign(_c=labels).groupby("_c").hf_ratio.mean().sort_values().index.tolist()
    remap = {old: new for new, old in enumerate(order)}
    out["cluster"] = [remap[c] for c in labels]
    out["silhouette"] = silhouette_samples(X, labels) if len(set(labels)) > 1 else float("nan")
    out["silhouette_mean"] = float(np.mean(out["silhouette"])) if len(set(labels)) > 1 else float("nan")
    out["k"] = k
    out["null_silhouette"], out["p_value"], out["structure"] = float(null.mean()), p_value, bool(structure)
    out["separation"] = separation
    return out


def _cluster_features(profile: pd.DataFrame, method: str) -> np.ndarray:
    """The standardised feature matrix [head, feature] of a profile, checked."""
    if not isinstance(profile, pd.DataFrame):
        raise InputError(f"cluster_heads takes the DataFrame from frequency_profile, got {type(profile).__name__}")
    if method not in ("kmeans", "agglomerative"):
        raise InputError(f"method must be 'kmeans' or 'agglomerative'; got {method!r}")
    cols = [c for c in profile.columns if c.startswith("bin_")] + [c for c in FEATURES if c in profile]
    if not cols:
        raise InputError("profile has no feature columns: pass the output of frequency_profile")
    if len(profile) < 3:
        raise InputError(f"need at least 3 heads to cluster, got {len(profile)}")
    headline = [c for c in FEATURES if c in profile]
    missing = profile[headline].isna().any()
    if missing.any():
        raise InputError(f"profile has NaN in {list(missing[missing].index)}: cluster_heads would read them as 0; "
                         "pass a complete frequency_profile (drop or fill those heads first)")
    return np.nan_to_num(StandardScaler().fit_transform(np.nan_to_num(profile[cols].to_numpy(dtype=float))))
