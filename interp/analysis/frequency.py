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
(``_combine_spectra``).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from einops import rearrange
from sklearn.cluster import AgglomerativeClustering, KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score, silhouette_samples, silhouette_score
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits
from torch import Tensor
from tqdm.auto import tqdm

from interp.bootstrap import PERCENTILES, check_bootstrap, resample_indices
from interp.checks import as_index, check_count, check_fraction, check_heads, check_kinds, check_layers
from interp.record.capture import stream_batches
from interp.data import Batch, iter_batches
from interp.errors import InputError, public
from interp.record.hooks import hook_name
from interp.models.bridge import InterpBridge, require_bridge
from interp.models.info import ModelInfo
from interp.models.loading import untrained_copy
from interp.record.fingerprint import DataHasher
from interp.record.patching import bias_patch_hooks, check_method

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
    """Of a mean amplitude spectrum [head, *freq]: mean amplitude per radial bin [head, n_bins], DC amplitude,
    energy (amplitude^2) above Nyquist/2 and in total (DC included) [head].

    A bin that holds no frequency of this length or grid (a sequence of 10 tokens has frequencies 0.1, 0.2, ...
    cycles per token: bins 0, 2 and 5 of 8 hold none) takes the radially averaged amplitude interpolated
    linearly at the bin's centre frequency between the nonzero frequencies the shape has, held constant
    beyond the lowest and highest (at Nyquist this is exact for a real signal of odd length: its amplitude
    is symmetric about 0.5). So every length of at least 2 (every grid of more than one cell) gives every bin
    on the common grid of normalised frequencies; bins that hold frequencies are their cells' mean, as before.
    A spectrum with no nonzero frequency (one token) gives NaN bins (``_combine_spectra`` leaves it out of them)."""
    weights, dc, hf, inside = _bin_weights(tuple(spec.shape[1:]), n_bins)
    flat = spec.detach().cpu().double().flatten(1).numpy()  # numpy: small arrays, no thread pool per call (100x)
    energy = flat**2
    parts = dict(amp=flat @ weights, dc=flat[:, dc], e_hf=energy[:, hf].sum(1), e_total=energy[:, inside].sum(1))
    return {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in parts.items()}


@functools.lru_cache(maxsize=512)
def _bin_weights(shape: tuple, n_bins: int) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """Of a spectrum's shape: the matrix W [cells, n_bins] with amp = spectrum (flattened) @ W (``_spectrum_parts``:
    every bin is linear in the amplitudes, a mean of its cells or an interpolation between radial means; NaN
    columns when no cell has a nonzero frequency), the DC cell, the cells above Nyquist/2 and those inside Nyquist
    (read-only arrays: they are shared)."""
    idx, r = radial_bins(shape, n_bins)
    fidx, fr = idx.flatten().numpy(), r.flatten().numpy()
    weights = np.full((len(fidx), n_bins), np.nan)
    positive = (fidx >= 0) & (fidx < n_bins)
    if positive.any():
        radii, which = np.unique(fr[positive], return_inverse=True)
        radial = np.zeros((len(fidx), len(radii)))  # the radial mean at radius j is spectrum @ radial[:, j]
        radial[np.flatnonzero(positive), which] = 1.0
        radial /= radial.sum(0, keepdims=True)
        centres = (np.arange(n_bins) + 0.5) * 0.5 / n_bins
        for i in range(n_bins):
            own = fidx == i
            if own.any():
                weights[:, i] = own / own.sum()
            else:  # linear interpolation between the radial means, constant beyond the ends
                weights[:, i] = radial @ np.array([np.interp(centres[i], radii, row) for row in np.eye(len(radii))])
    out = (weights, int(np.flatnonzero(fidx == -1)[0]), (fr > 0.25) & (fidx < n_bins), fidx < n_bins)
    for array in (out[0], out[2], out[3]):
        array.flags.writeable = False
    return out


def _bins_and_ratio(parts: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """bin_i = log(mean amplitude in bin i) - log(DC amplitude); hf_ratio = high-frequency energy / total."""
    bins = torch.log(parts["amp"].clamp(min=1e-300)) - torch.log(parts["dc"].clamp(min=1e-300))[:, None]
    return bins, parts["e_hf"] / parts["e_total"].clamp(min=1e-300)


def bin_spectrum(spec: Tensor, n_bins: int = N_BINS) -> tuple[Tensor, Tensor]:
    """Binned log-amplitude relative to DC [head, n_bins] and hf_ratio [head] of a spectrum."""
    return _bins_and_ratio(_spectrum_parts(spec, n_bins))


def _combine_spectra(spectra: dict[tuple, tuple[Tensor, int]], n_bins: int = N_BINS) -> tuple[Tensor, Tensor]:
    """Bins and hf_ratio of spectra of several shapes (sequence lengths, patch grids).

    ``spectra``: shape -> (sum over items of their amplitude spectra, number of items). Each item
    counts once: per-bin amplitudes, DC amplitudes and energies of each shape's mean spectrum are
    averaged with the shapes' item counts as weights. With one shape this is ``bin_spectrum`` of
    the mean spectrum; it does not depend on how the items were batched. Every shape with a nonzero
    frequency gives every bin (``_spectrum_parts`` interpolates the bins a short length lacks), so no bin is
    NaN; one-token sequences (DC only) enter hf_ratio but not the bins (nor their DC), and data made of
    them alone is refused with the lengths named.
    """
    parts = {shape: _spectrum_parts(total / n, n_bins) for shape, (total, n) in spectra.items()}
    counts = {shape: n for shape, (_, n) in spectra.items()}
    n_all = sum(counts.values())
    mean = {key: sum(counts[s] * p[key] for s, p in parts.items()) / n_all for key in ("e_hf", "e_total")}
    binned = [s for s, p in parts.items() if not torch.isnan(p["amp"]).any()]
    if not binned:
        raise InputError(f"no item has a frequency above 0 (lengths or grids {sorted(parts)}): the spectral bins "
                         f"bin_0..bin_{n_bins - 1} need sequences of at least 2 tokens (grids of at least 2 "
                         "patches); pass longer inputs")
    n_binned = sum(counts[s] for s in binned)
    for key in ("amp", "dc"):
        mean[key] = sum(counts[s] * parts[s][key] for s in binned) / n_binned
    return _bins_and_ratio(mean)


def _pixel_distances(grid: tuple[int, int], patch: int) -> Tensor:
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    centres = torch.stack([(rows.flatten() + 0.5) * patch, (cols.flatten() + 0.5) * patch], -1).double()
    return torch.cdist(centres, centres)


def _vision_terms(info: ModelInfo, z: Tensor, pat: Tensor, image_hw: tuple[int, int]) -> dict[str, Any]:
    """Per-head sums over the batch's query rows: spectrum, pixel distance, sink mass, entropy (ViT). The pattern
    is taken to float64 one item at a time and each sum is added up item by item (the order ``sum(0)`` adds them
    in: the same sums): a whole batch's float64 pattern and its products came and went at every layer, and at
    glibc's defaults the heap grew with them (dinov2-s14, the demo's frequency step in a fresh process: 246-294 MB
    above the start, 67-84 MB one item at a time)."""
    n_pre, ps, b = info.n_prefix_tokens, info.patch_size, z.shape[0]
    grid = (image_hw[0] // ps, image_hw[1] // ps)
    distances = _pixel_distances(grid, ps).to(pat.device)
    dist = sink = ent = torch.zeros(pat.shape[1], dtype=torch.float64, device=pat.device)
    for i in range(b):
        p = pat[i].double()  # [head, query, key]
        dist = dist + (p[:, n_pre:, n_pre:] * distances).sum((-1, -2))
        sink = sink + p[:, n_pre:, :n_pre].sum((-1, -2))
        ent = ent + torch.special.entr(p).sum((-1, -2))  # -p log p, 0 where p = 0
    return dict(spectra={grid: (head_spectrum(z[:, n_pre:], grid) * b, b)},
                n_query=float(b * (pat.shape[2] - n_pre)), n_rows=float(b * pat.shape[2]), dist=dist, sink=sink,
                ent=ent)


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
    first-token mass, entropy. As for a ViT (``_vision_terms``), the pattern goes to float64 one sequence at a time:
    a whole batch's [batch, head, T, T] in float64 and its products came and went at every layer."""
    mask = attention_mask.to(z.device).bool() if attention_mask is not None else \
        torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)
    if not bool(mask.any()):
        raise InputError("no real tokens in a batch: its attention mask is all 0")
    pos = torch.arange(z.shape[1], device=z.device)
    d = (pos[:, None] - pos[None, :]).abs().double()
    first = mask.double().argmax(-1)  # each sequence's first real token (left padding)
    dist = sink = ent = torch.zeros(pat.shape[1], dtype=torch.float64, device=pat.device)
    for i in range(pat.shape[0]):
        p, real = pat[i].double(), mask[i].double()  # [head, query, key], [query]
        dist = dist + ((p * d).sum(-1) * real).sum(-1)
        sink = sink + (p[:, :, first[i]] * real).sum(-1)
        ent = ent + (torch.special.entr(p).sum(-1) * real).sum(-1)  # -p log p, 0 where p = 0
    n_tok = float(mask.sum())
    return dict(spectra=_sequence_spectra(z, mask), n_query=n_tok, n_rows=n_tok, dist=dist, sink=sink, ent=ent)


def _add_terms(acc: dict[str, Any], terms: dict[str, Any]) -> None:
    for key, val in terms.items():
        if key == "spectra":
            spectra = acc.setdefault("spectra", {})
            for shape, (total, n) in val.items():
                old_total, old_n = spectra.get(shape, (0, 0))
                spectra[shape] = (old_total + total.cpu(), old_n + n)
        else:
            acc[key] = acc.get(key, 0) + (val.cpu() if isinstance(val, Tensor) else val)


def _batch_terms(info: ModelInfo, batch: Batch, store: dict[str, Tensor], l: int,
                 item: Optional[int] = None) -> Optional[dict[str, Any]]:
    """Layer ``l``'s per-head terms of the batch, or of its item ``item`` alone (None if it has no real token)."""
    z, pat, mask = store[hook_name(l, "z")], store[hook_name(l, "pattern")], batch.attention_mask
    if item is not None:
        z, pat = z[item:item + 1], pat[item:item + 1]
        mask = None if mask is None else mask[item:item + 1]
        if mask is not None and not bool(mask.bool().any()):
            return None
    if info.modality == "vision":
        return _vision_terms(info, z, pat, (batch.inputs.shape[2], batch.inputs.shape[3]))
    return _text_terms(z, pat, mask)


def _reducer(info: ModelInfo, layers: Sequence[int], acc: dict[int, dict[str, Any]],
             items: Optional[list[dict[int, dict[str, Any]]]] = None) -> tuple[Any, Any]:
    """(hooks of a batch, consumer): each layer's per-head terms are taken as soon as the forward has passed both
    its z and its pattern (the bridge fires either first) and added into ``acc``; with ``items`` (a list), each
    item's own terms are kept apart and appended there by the consumer (one accumulator per item). One layer's
    pattern is alive at a time, not every layer's until the forward ends: the same sums, in the same order."""
    pending: dict[str, Any] = {}

    def hooks(batch: Batch) -> list:
        held: dict[int, dict[str, Tensor]] = {l: {} for l in layers}
        own = None if items is None else [{l: {} for l in layers} for _ in range(batch.inputs.shape[0])]
        pending["own"] = own

        def reduce(l: int, name: str):
            def fn(t: Tensor, hook: Any) -> None:
                store = held[l]
                store[name] = t.detach()
                if len(store) < 2:
                    return
                del held[l]
                if own is None:
                    _add_terms(acc[l], _batch_terms(info, batch, store, l))
                    return
                for i, item in enumerate(own):
                    terms = _batch_terms(info, batch, store, l, item=i)
                    if terms is not None:
                        _add_terms(item[l], terms)
            return fn
        return [(hook_name(l, n), reduce(l, hook_name(l, n))) for l in layers for n in ("z", "pattern")]

    def consume(batch: Batch, store: dict[str, Tensor]) -> None:
        own = pending.pop("own", None)
        if items is not None:
            items.extend(item for item in own if all(item.values()))
    return hooks, consume


def _profile_rows(info: ModelInfo, acc: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """The profile table of accumulated terms ``acc`` (layer -> sums, as ``_add_terms`` builds them)."""
    rows = []
    for l, a in acc.items():
        bins, hf = _combine_spectra(a["spectra"])
        for h in range(info.n_heads):
            row = dict(layer=l, head=h, hf_ratio=float(hf[h]),
                       mean_attention_distance=float(a["dist"][h] / a["n_query"]),
                       entropy=float(a["ent"][h] / a["n_rows"]), sink_mass=float(a["sink"][h] / a["n_query"]),
                       distance_unit="pixels" if info.modality == "vision" else "tokens")
            row.update({f"bin_{i}": float(bins[h, i]) for i in range(bins.shape[1])})
            rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["model"] = info.name  # which model's heads: halves of another model's profile are refused
    return table


def _profile_batches(model: InterpBridge, batches: Any, layers: Sequence[int], hooks_for_layer=None,
                     progress: bool = True, desc: str = "frequency profile",
                     max_batches: Optional[int] = None) -> pd.DataFrame:
    """The profile of ``layers`` over ``batches`` (data, streamed through the one capture loop,
    ``stream_batches``; with ``hooks_for_layer``, one pass per layer with that layer's hooks: a list)."""
    info = model.interp
    acc: dict[int, dict[str, Any]] = {l: {} for l in layers}
    runs = [([l], hooks_for_layer(l)) for l in layers] if hooks_for_layer else [(list(layers), [])]
    for want, hooks in tqdm(runs, desc=desc, disable=not progress or len(runs) == 1):
        reducing, consume = _reducer(info, want, acc)
        stream_batches(model, batches, max_batches, [hook_name(max(want), n) for n in ("z", "pattern")], consume,
                       hooks=lambda batch, hooks=hooks, reducing=reducing: list(hooks) + reducing(batch), desc=desc,
                       progress=progress and len(runs) == 1)
    return _profile_rows(info, acc)


def _item_terms(model: InterpBridge, data: Any, layers: Sequence[int], max_batches: Optional[int] = None,
               progress: bool = True, hasher: Optional[DataHasher] = None) -> list[dict[int, dict[str, Any]]]:
    """Each item's own accumulated profile terms (one forward pass over ``data``): any subset of the items
    gives its profile exactly by summing its items' terms (``_profile_of_items``); ``hasher`` sees each batch."""
    items: list[dict[int, dict[str, Any]]] = []
    reducing, consume = _reducer(model.interp, layers, {}, items)

    def hashed(batch: Batch, store: dict[str, Tensor]) -> None:
        hasher.update(batch)
        consume(batch, store)
    stream_batches(model, data, max_batches, [hook_name(max(layers), n) for n in ("z", "pattern")],
                   consume if hasher is None else hashed,
                   hooks=reducing, desc="frequency profile (per item)", progress=progress)
    return items


def _profile_of_items(info: ModelInfo, items: Sequence[dict[int, dict[str, Any]]]) -> pd.DataFrame:
    """The profile of the items whose terms are ``items`` (each counted once, as in ``frequency_profile``)."""
    acc: dict[int, dict[str, Any]] = {l: {} for l in items[0]}
    for own in items:
        for l, terms in own.items():
            _add_terms(acc[l], terms)
    return _profile_rows(info, acc)


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


def _family_separation(profile: pd.DataFrame, labels: np.ndarray) -> float:
    """min over pairs of families of max over headline features of |mean difference| / resolution."""
    res = {**RESOLUTION, "mean_attention_distance": DISTANCE_RESOLUTION * abs(profile.mean_attention_distance.mean())}
    cols = [c for c in res if c in profile]
    means = profile[cols].assign(_c=labels).groupby("_c").mean()
    scale = np.array([max(res[c], 1e-12) for c in cols])
    values = means.to_numpy() / scale
    gaps = [np.abs(values[i] - values[j]).max() for i in range(len(values)) for j in range(i + 1, len(values))]
    return float(min(gaps)) if gaps else 0.0


N_NULL = 199  # the smallest p is 1 / 200 = 0.005, well below alpha = 0.05
N_SPLITS = 20
REPLICATION_BAR = 0.5  # the lower end of the split-repeat interval of the halves' adjusted Rand index
NULLS = ("within_layer", "gaussian_layer_means", "gaussian_covariance")  # the first is the default
N_BOOT = 100  # bootstrap resamples of the items for the layer effect's interval (family_test; 200 cost the report 30%)
FAMILY_COLUMNS = ("cluster", "silhouette", "silhouette_mean", "k", "separation", "cluster_index",
                  "null_cluster_index", "family_effect", "family_p", "p_value", "null", "n_null", "covariance",
                  "replication_ari", "replication_lo", "replication_hi", "n_splits", "structure", "layer_effect",
                  "layer_effect_lo", "layer_effect_hi", "layer_p", "n_boot", "layers_differ", "n_features")


def cluster_index(X: np.ndarray, labels: np.ndarray) -> float:
    """SigClust's cluster index: sum_c sum_{i in c} ||x_i - mean_c||^2 / sum_i ||x_i - mean||^2 (small: tight)."""
    total = float(((X - X.mean(0)) ** 2).sum())
    within = sum(float(((X[labels == c] - X[labels == c].mean(0)) ** 2).sum()) for c in np.unique(labels))
    return within / total if total > 0 else 1.0


def two_means_index(X: np.ndarray, seed: int, n_init: int = 5) -> float:
    """The cluster index of the 2-means split of X (k-means, ``n_init`` restarts)."""
    return cluster_index(X, _fit_clusters(X, 2, "kmeans", seed, n_init))


def null_covariance(R: np.ndarray, dof: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(eigenvalues, eigenvectors, rule) of the covariance Sigma = R^T R / dof of the centred features R
    that the Gaussian null draws from: the sample covariance, always.

    ``sample``: few features against heads (dof > p, 12 features here): it estimates Sigma well.
    ``sample_singular`` (dof <= p): its zero eigenvalues are kept. SigClust's thresholds (Liu, Hayes, Nobel
    and Marron 2008; Huang et al. 2015) raise small eigenvalues to a background noise (MAD of all entries /
    0.6745)^2, which assumes isotropic noise in most directions; these features are smooth and low-rank, the
    raised floor spreads the null and rejects for random-init models (digits-vit's 16 heads: p 0.005 with
    either threshold, 0.245 without), so the sample eigenvalues, the conservative choice, are used."""
    lam, vec = np.linalg.eigh(R.T @ R / max(dof, 1))
    return np.clip(lam, 0.0, None), vec, "sample" if dof > R.shape[1] else "sample_singular"


def _null_centres(X: np.ndarray, layers: np.ndarray, null: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(the null's mean per head, its spread per head, residual degrees of freedom). ``gaussian_covariance``:
    the grand mean, spread 1 (n - 1). ``gaussian_layer_means`` (where some layer has two heads): head i's layer
    mean and its layer's own scale s_g = sqrt(v_g / v) (n - L), v_g = sum_{i in g} ||x_i - m_g||^2 / (n_g - 1)
    and v the same pooled over layers (a layer of one head: s = 1), so a quiet layer stays quiet."""
    if null == "gaussian_layer_means":
        frame = pd.DataFrame(X).groupby(layers)
        if frame.ngroups < len(X):
            centres = frame.transform("mean").to_numpy()
            power = pd.Series(((X - centres) ** 2).sum(1)).groupby(layers)
            v_g = power.sum() / (power.count() - 1).clip(lower=1)
            v = power.sum().sum() / (len(X) - frame.ngroups)
            scale = np.where(power.count() > 1, np.sqrt(v_g / v) if v > 0 else 1.0, 1.0)
            return centres, pd.Series(scale, index=v_g.index).loc[layers].to_numpy(), len(X) - frame.ngroups
    return np.broadcast_to(X.mean(0), X.shape), np.ones(len(X)), len(X) - 1


def gaussian_null(X: np.ndarray, seed: int, n_null: int, layers: Optional[np.ndarray] = None,
                  null: str = "gaussian_covariance") -> tuple[np.ndarray, str]:
    """The 2-means cluster index of ``n_null`` sets of heads drawn from N(c_i, s_i^2 Sigma) (``_null_centres``;
    Sigma: ``null_covariance`` of (X - c) / s), each standardised as X was: one family that keeps the features'
    correlations (spectral bins move together) and, with layer means, each layer's offset and spread.
    ``within_layer``: the draws are N(0, Sigma) with Sigma the covariance of the profile's within-layer residuals
    (``_within_layer_features``: layer means removed, each layer's features scaled to its own spread), and each
    draw is treated exactly as the profile was (``_within_layer_features`` of the draw).
    Returns (indices, covariance rule)."""
    layers = np.zeros(len(X)) if layers is None else np.asarray(layers)
    rng = np.random.default_rng(seed)
    if null == "within_layer":
        R = _within_layer_features(X, layers)
        lam, vec, rule = null_covariance(R, len(X) - len(np.unique(layers)))
        root = vec * np.sqrt(lam)
        return np.asarray([two_means_index(_within_layer_features(rng.standard_normal(R.shape) @ root.T, layers),
                                           seed) for _ in range(n_null)]), rule
    centres, scale, dof = _null_centres(X, layers, null)
    safe = np.where(scale > 0, scale, 1.0)[:, None]
    lam, vec, rule = null_covariance((X - centres) / safe, dof)
    root = vec * np.sqrt(lam)  # Sigma = root @ root.T
    out = [two_means_index(StandardScaler().fit_transform(
        centres + scale[:, None] * (rng.standard_normal(X.shape) @ root.T)), seed) for _ in range(n_null)]
    return np.asarray(out), rule


def _within_layer_features(X: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """What is left of X once layers are taken out, standardised: each layer's mean removed and each feature
    divided by its standard deviation within that layer (a layer whose heads vary in other features than another
    layer's is no family), then each column scaled to variance 1 over all heads (columns with no within-layer
    variation dropped). What the within-layer family test clusters, and what it does to each null draw."""
    _, group = np.unique(np.asarray(layers), return_inverse=True)
    counts = np.bincount(group)[:, None].astype(float)
    means = np.zeros((len(counts), X.shape[1]))
    np.add.at(means, group, X)
    R = X - (means / counts)[group]
    power = np.zeros_like(means)
    np.add.at(power, group, R**2)
    sd = np.sqrt(power / np.clip(counts - 1, 1, None))[group] * (counts[group] > 1)
    R = np.divide(R, sd, out=np.zeros_like(R), where=sd > 1e-12 * max(1.0, float(np.abs(X).max())))
    keep = R.std(0) > 1e-9
    return StandardScaler().fit_transform(R[:, keep]) if keep.any() else R


def layer_effect(X: np.ndarray, layers: np.ndarray) -> float:
    """The share of the (standardised) features' variance that lies between layers: eta^2 =
    sum_i ||m_layer(i) - m||^2 / sum_i ||x_i - m||^2 (0: layers alike, 1: heads differ only by layer)."""
    centres = pd.DataFrame(X).groupby(np.asarray(layers)).transform("mean").to_numpy()
    total = float(((X - X.mean(0)) ** 2).sum())
    return float(((centres - X.mean(0)) ** 2).sum()) / total if total > 0 else 0.0


def layer_test(X: np.ndarray, layers: np.ndarray, seed: int, n_perm: int) -> tuple[float, float]:
    """(eta^2, its permutation p): do heads differ by layer beyond what heads that are exchangeable across layers
    give? p = (1 + #{eta^2 of the heads with their layers permuted >= observed}) / (1 + n_perm)."""
    layers = np.asarray(layers)
    observed = layer_effect(X, layers)
    if len(np.unique(layers)) < 2 or len(np.unique(layers)) == len(X):
        return observed, float("nan")  # one layer, or one head per layer: nothing to compare
    rng = np.random.default_rng(seed)
    null = np.array([layer_effect(X, rng.permutation(layers)) for _ in range(n_perm)])
    return observed, (1 + int((null >= observed - 1e-12).sum())) / (1 + n_perm)


def _test_features(X: np.ndarray, layers: Optional[np.ndarray], null: str) -> tuple[np.ndarray, str]:
    """(the features the family test clusters, the null in effect): within-layer residuals for ``within_layer``
    where some layer has two heads (else plain SigClust on X, said in the null column), X otherwise."""
    if null != "within_layer":
        return X, null
    if layers is None or len(np.unique(layers)) == len(X):
        return X, "gaussian_covariance"
    return _within_layer_features(X, layers), null


def _replication(halves: Sequence[tuple[pd.DataFrame, pd.DataFrame]], k: int, method: str, seed: int,
                null: str = "gaussian_covariance", heads: Optional[np.ndarray] = None,
                model: Optional[str] = None) -> np.ndarray:
    """Per split, the adjusted Rand index between the k families fitted on each half's profile on its own (on
    its within-layer residuals under the ``within_layer`` null); the halves must hold the profile's ``heads``
    ([layer, head] rows) of its ``model`` (``.attrs``), when given."""
    out = []
    for a, b in halves:
        if not isinstance(a, pd.DataFrame) or not isinstance(b, pd.DataFrame) or \
                not np.array_equal(a[["layer", "head"]].to_numpy(), b[["layer", "head"]].to_numpy()):
            raise InputError("halves must be pairs of profiles of the same heads in the same order (family_test "
                             "builds them from disjoint halves of the data)")
        if heads is not None and not np.array_equal(a[["layer", "head"]].to_numpy(), heads):
            raise InputError("halves must be profiles of the profile's own heads (the same layers and heads in the "
                             "same order): family_test builds them from disjoint halves of the same data")
        names = {t.attrs.get("model") for t in (a, b)} | {model}
        if len(names - {None}) > 1:
            raise InputError(f"halves come from another model than the profile ({', '.join(sorted(names - {None}))})"
                             ": pair a profile with halves of its own model (family_test does)")
        labels = [_fit_clusters(_test_features(_cluster_features(h, method), h["layer"].to_numpy(), null)[0], k,
                                method, seed) for h in (a, b)]
        out.append(adjusted_rand_score(*labels))
    return np.asarray(out)


def _layer_columns(X: np.ndarray, layers: Optional[np.ndarray], seed: int, n_perm: int, alpha: float,
                   resamples: Optional[Sequence[pd.DataFrame]], method: str) -> dict[str, Any]:
    """The layer test's columns: eta^2, its bootstrap interval over items (NaN without resamples), its p."""
    if layers is None:
        return dict(layer_effect=np.nan, layer_effect_lo=np.nan, layer_effect_hi=np.nan, layer_p=np.nan,
                    n_boot=0, layers_differ=False)
    effect, p = layer_test(X, layers, seed, n_perm)
    boots = [layer_effect(_cluster_features(r, method), r["layer"].to_numpy()) for r in resamples or ()]
    lo, hi = np.percentile(boots, PERCENTILES) if boots else (np.nan, np.nan)
    return dict(layer_effect=effect, layer_effect_lo=float(lo), layer_effect_hi=float(hi), layer_p=p,
                n_boot=len(boots), layers_differ=bool(p <= alpha))


def _family_test(X: np.ndarray, Xc: np.ndarray, profile: pd.DataFrame, best: tuple, k: int, method: str, seed: int,
                 n_null: int, alpha: float, halves: Optional[Sequence], kind: str) -> dict[str, Any]:
    """The family test's columns of ``cluster_heads`` (one value each): Gaussian null, separation, halves.
    X: the standardised features; Xc: what is clustered (X, or its within-layer residuals)."""
    layers = profile["layer"].to_numpy() if "layer" in profile else None
    null, rule = gaussian_null(X, seed, n_null, layers, kind)
    observed = two_means_index(Xc, seed)
    p = (1 + int((null <= observed + 1e-12).sum())) / (1 + n_null)
    spread = float(null.std())
    separation = _family_separation(profile, best[2])
    own = profile[["layer", "head"]].to_numpy() if {"layer", "head"} <= set(profile.columns) else None
    ari = _replication(halves, k, method, seed, kind, own, profile.attrs.get("model")) if halves else np.array([np.nan])
    lo, mid, hi = np.percentile(ari, [2.5, 50, 97.5]) if halves else (np.nan,) * 3
    replicated = (not halves) or lo >= REPLICATION_BAR
    return dict(separation=separation, cluster_index=observed, null_cluster_index=float(null.mean()),
                family_effect=(float(null.mean()) - observed) / spread if spread > 0 else np.nan, family_p=p,
                p_value=p, null=kind, n_null=n_null, covariance=rule, replication_ari=mid, replication_lo=lo,
                replication_hi=hi, n_splits=len(halves) if halves else 0,
                structure=bool(p <= alpha and separation >= 1.0 and replicated))


def _check_k(k: Any, n: int) -> Optional[int]:
    if k is None:
        return None
    number = as_index(k)
    if number is None or not 2 <= number < n:
        raise InputError(f"k must lie in 2..{n - 1} (an integer, fewer than the {n} heads) or be None (chosen "
                         f"by silhouette); got {k!r} ({type(k).__name__})")
    return number


@public
def cluster_heads(profile: pd.DataFrame, k: Optional[int] = None, method: str = "kmeans", seed: int = 0,
                  n_null: int = N_NULL, alpha: float = 0.05,
                  halves: Optional[Sequence[tuple[pd.DataFrame, pd.DataFrame]]] = None,
                  null: str = NULLS[0], resamples: Optional[Sequence[pd.DataFrame]] = None) -> pd.DataFrame:
    """Two questions about heads, each with its own p and effect size, on the standardised profile features
    (every feature used; a NaN or infinite one is refused, never dropped; ``n_features`` says how many).

    **(a) Do heads differ by layer?** ``layer_effect`` = eta^2, the share of the features' variance between
    layers (``layer_effect``); ``layer_p`` its permutation p (the layers of the heads permuted ``n_null`` times,
    ``layer_test``); ``layer_effect_lo`` / ``_hi`` its 95% percentile interval over bootstrap resamples of the
    items (``resamples``: profiles of resampled items, which ``family_test`` builds; NaN without them);
    ``layers_differ`` = layer_p <= ``alpha``. A layer difference is no family: a randomly initialised model has
    one too (its layer 0 reads token embeddings, the later layers a smoothed residual); whether *training* made
    it is ``specialisation_test``'s question.

    **(b) Within layers, do heads form families?** ``null="within_layer"`` (default): each layer's mean is
    removed (``_within_layer_features``) and the residuals' 2-means cluster index CI = sum_c sum_{i in c}
    ||x_i - m_c||^2 / sum_i ||x_i - m||^2 (``two_means_index``) is tested against one Gaussian with the
    within-layer covariance (SigClust: Liu, Hayes, Nobel and Marron 2008): ``n_null`` sets of heads drawn from
    N(0, s_g^2 Sigma_within) (each layer's own spread s_g, ``_null_centres``), each treated exactly as the profile
    (layer means removed, standardised, split by the same 2-means; ``gaussian_null``). family_p = (1 + #{null CI
    <= observed CI}) / (1 + n_null) (199 draws: smallest p 0.005); ``family_effect`` = (mean null CI - observed)
    / SD of the null CIs. Older nulls: ``"gaussian_layer_means"`` clusters the features with the layer means kept
    against N(layer mean, s_g^2 Sigma) (it called a random-init GPT-2 structured in most seeds: a layer-0 split
    passes it by chance), ``"gaussian_covariance"`` plain SigClust around the grand mean (a split along layers
    passes it: it answers (a) and (b) at once). With one head per layer ``within_layer`` has no residual and
    falls back to plain SigClust (said in ``null``). Sigma is the sample covariance (``null_covariance``).

    ``k`` (clustered on what the null tests: the residuals under ``within_layer``) is chosen by the best mean
    silhouette over 2..8 when not given. Families must differ by a visible amount: ``separation`` = min over
    pairs of families of max over hf_ratio, mean_attention_distance, entropy, sink_mass of |mean difference| in
    units of ``RESOLUTION`` (0.01, 2% of the mean distance, 0.05 nats, 0.02). ``halves`` (``family_test`` builds
    them): pairs of profiles of disjoint halves of the items, each clustered on its own into the k families;
    ``replication_ari`` is the median adjusted Rand index of the pairs, ``replication_lo`` / ``_hi`` its 2.5 /
    97.5 percentiles (NaN without halves). A stable split is not a family: a layer difference replicates too
    (ARI 1 in random models); replication is required, not sufficient. ``structure`` = family_p <= ``alpha`` and
    separation >= 1 and, with halves, replication_lo >= ``REPLICATION_BAR`` (0.5). Without structure the heads
    form one family (k = 1, cluster 0); a given ``k`` is used as asked, with the test reported. Clusters are
    relabelled so that cluster 0 has the lowest mean hf_ratio. Adds ``FAMILY_COLUMNS`` (``p_value`` = family_p).
    """
    with threadpool_limits(1):  # small matrices: k-means' OpenMP threads only oversubscribe a busy machine (60x)
        return _cluster_heads(profile, k, method, seed, n_null, alpha, halves, null, resamples)


def _cluster_heads(profile: pd.DataFrame, k: Any, method: str, seed: Any, n_null: Any, alpha: Any,
                   halves: Optional[Sequence], null: str, resamples: Optional[Sequence] = None) -> pd.DataFrame:
    X = _cluster_features(profile, method)
    n_null, seed = check_count("n_null", n_null), check_count("seed", seed, minimum=0)
    alpha, k = check_fraction("alpha", alpha), _check_k(k, len(X))
    if null not in NULLS:
        raise InputError(f"null must be one of {NULLS}; got {null!r}")
    if resamples is not None and not all(isinstance(r, pd.DataFrame) and np.array_equal(
            r[["layer", "head"]].to_numpy(), profile[["layer", "head"]].to_numpy()) for r in resamples):
        raise InputError("resamples must be profiles of the same heads in the same order (family_test builds them "
                         "from bootstrap resamples of the items)")
    layers = profile["layer"].to_numpy() if "layer" in profile else None
    Xc, null = _test_features(X, layers, null)
    best = _best_k(Xc, method, seed)
    if best is None:
        raise InputError("heads are indistinguishable: no clustering with >= 2 clusters")
    test = _family_test(X, Xc, profile, best, k or best[1], method, seed, n_null, alpha, halves, null)
    test.update(_layer_columns(X, layers, seed, n_null, alpha, resamples, method), n_features=X.shape[1])
    if k is not None:
        labels = _fit_clusters(Xc, k, method, seed)
    elif test["structure"]:
        k, labels = best[1], best[2]
    else:
        k, labels = 1, np.zeros(len(X), dtype=int)
    out = profile.copy()
    order = out.assign(_c=labels).groupby("_c").hf_ratio.mean().sort_values().index.tolist()
    remap = {old: new for new, old in enumerate(order)}
    out["cluster"] = [remap[c] for c in labels]
    out["silhouette"] = silhouette_samples(Xc, labels) if len(set(labels)) > 1 else float("nan")
    out["silhouette_mean"] = float(np.mean(out["silhouette"])) if len(set(labels)) > 1 else float("nan")
    out["k"] = k
    for name, value in test.items():
        out[name] = value
    return out[list(profile.columns) + [c for c in FAMILY_COLUMNS if c not in profile.columns]]


def one_family(profile: pd.DataFrame) -> pd.DataFrame:
    """``profile`` with ``FAMILY_COLUMNS`` saying one family, untested (fewer than 3 heads: nothing to cluster)."""
    values = dict(cluster=0, k=1, null="none", n_null=0, covariance="", n_splits=0, structure=False, n_boot=0,
                  layers_differ=False, n_features=0)
    return profile.assign(**{c: values.get(c, np.nan) for c in FAMILY_COLUMNS})


def item_profiles(model: InterpBridge, data: Any, layers: Sequence[int], heads: Sequence[int], n_splits: int,
                  seed: int, n_boot: int = 0, max_batches: Optional[int] = None,
                  progress: bool = True) -> tuple[pd.DataFrame, list, list]:
    """(the profile of all items, ``n_splits`` pairs of profiles of random disjoint halves of the items,
    ``n_boot`` profiles of bootstrap resamples of the items) from one forward pass: each item's terms are kept
    (``_item_terms``) and summed per subset (``_profile_of_items``). Resamples draw items with replacement
    (``interp.bootstrap.resample_indices(n_items, n_boot, seed)``)."""
    info = model.interp
    items = _item_terms(model, data, layers, max_batches, progress)
    if len(items) < 2:
        raise InputError(f"family_test splits the data's items into two halves: it needs at least 2 items (images "
                         f"or sequences with a real token), got {len(items)}; pass more data")
    rng, n = np.random.default_rng(seed), len(items)
    halves = []
    for _ in range(n_splits):
        order = rng.permutation(n)
        halves.append(tuple(_select_heads(_profile_of_items(info, [items[i] for i in part]), heads)
                            for part in (order[: n // 2], order[n // 2:])))
    resamples = [_select_heads(_profile_of_items(info, [items[i] for i in idx]), heads)
                 for idx in (resample_indices(n, n_boot, seed) if n_boot else ())]
    return _select_heads(_profile_of_items(info, items), heads), halves, resamples


def split_profiles(model: InterpBridge, data: Any, layers: Sequence[int], heads: Sequence[int], n_splits: int,
                   seed: int, max_batches: Optional[int] = None, progress: bool = True) -> tuple[pd.DataFrame, list]:
    """(the profile of all items, ``n_splits`` pairs of profiles of random disjoint halves of the items) from one
    forward pass (``item_profiles`` without resamples)."""
    full, halves, _ = item_profiles(model, data, layers, heads, n_splits, seed, 0, max_batches, progress)
    return full, halves


@public
def family_test(model: InterpBridge, data: Any, *, layers: Optional[Sequence[int]] = None,
                heads: Optional[Sequence[int]] = None, k: Optional[int] = None, method: str = "kmeans",
                seed: int = 0, n_null: int = N_NULL, alpha: float = 0.05, n_splits: int = N_SPLITS,
                null: str = NULLS[0], n_boot: int = N_BOOT, max_batches: Optional[int] = None,
                progress: bool = True) -> pd.DataFrame:
    """``cluster_heads`` of the data's profile with both of its tests fed by the data's items: families must come
    back on disjoint halves of the data, and the layer effect gets its bootstrap interval over the items.

    One forward pass keeps each item's (image's, sequence's) profile terms; the full profile (equal to
    ``frequency_profile``'s), the profiles of ``n_splits`` random splits of the items into two halves
    (sizes floor(n/2) and ceil(n/2), seeded) and of ``n_boot`` bootstrap resamples are sums of them
    (``item_profiles``). Returns ``cluster_heads(profile, k, ..., halves=..., resamples=...)``: see there for
    the layer test (layer_effect with its interval, layer_p), the within-layer family test (family_p,
    family_effect, replication_ari with its split-repeat interval) and structure. Whether training made what
    these find: ``specialisation_test``."""
    info = require_bridge(model, "family_test").interp
    layers, heads = check_layers(layers, info), check_heads(heads, info)
    n_splits, seed = check_count("n_splits", n_splits), check_count("seed", seed, minimum=0)
    n_boot = check_count("n_boot", n_boot, minimum=0)
    full, halves, resamples = item_profiles(model, data, layers, heads, n_splits, seed, n_boot, max_batches, progress)
    return cluster_heads(full, k, method, seed, n_null, alpha, halves=halves, null=null, resamples=resamples)


def _cluster_features(profile: pd.DataFrame, method: str) -> np.ndarray:
    """The standardised feature matrix [head, feature] of a profile (constant features dropped), checked."""
    if not isinstance(profile, pd.DataFrame):
        raise InputError(f"cluster_heads takes the DataFrame from frequency_profile, got {type(profile).__name__}")
    if method not in ("kmeans", "agglomerative"):
        raise InputError(f"method must be 'kmeans' or 'agglomerative'; got {method!r}")
    cols = [c for c in profile.columns if c.startswith("bin_")] + [c for c in FEATURES if c in profile]
    if not cols:
        raise InputError("profile has no feature columns: pass the output of frequency_profile")
    if len(profile) < 3:
        raise InputError(f"need at least 3 heads to cluster, got {len(profile)}")
    values = profile[cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    bad = [c for c, ok in zip(cols, np.isfinite(values).all(0)) if not ok]
    if bad:
        raise InputError(f"profile has NaN or infinite values in {bad} (a value that is not a number counts as NaN): "
                         "cluster_heads uses every feature and drops none; pass a complete frequency_profile (its "
                         "spectral bins are defined for every input of at least 2 tokens or patches), or drop those "
                         "heads or columns yourself first")
    if {"layer", "head"} <= set(profile.columns) and profile.duplicated(["layer", "head"]).any():
        twice = profile.loc[profile.duplicated(["layer", "head"]), ["layer", "head"]].iloc[0].tolist()
        raise InputError(f"profile has more than one row for layer {twice[0]}, head {twice[1]}: one row per head "
                         "(a concatenation of two profiles? cluster each on its own)")
    X = StandardScaler().fit_transform(values)
    varies = X.std(0) > 1e-9  # constant columns (every head equal) carry nothing; a null draw would give them
    return X[:, varies] if varies.any() else X  # rounding noise, standardised to variance 1 (n_features counts)


@public
def spread_interval(model: InterpBridge, data: Any, *, column: str = "hf_ratio", n_boot: int = 200, seed: int = 0,
                    layers: Optional[Sequence[int]] = None, max_batches: Optional[int] = None,
                    progress: bool = True) -> pd.DataFrame:
    """How differently the heads filter, with its interval: the spread (standard deviation over heads, ddof 1) of a
    ``frequency_profile`` column, and its 95% percentile bootstrap over *items*: each resample draws the items
    with replacement (``interp.bootstrap.resample_indices(n_items, n_boot, seed)``, items in data order) and
    recomputes the whole profile from their summed terms (one forward pass: ``_item_terms``). One row: model,
    column, spread, spread_lo, spread_hi, n_items, n_heads, n_boot, seed; ``.attrs["boots"]`` holds the resampled
    spreads, so two models on the same items and seed give a paired difference (``spread_difference``)."""
    model = require_bridge(model, "spread_interval")
    n_boot, seed = check_bootstrap(n_boot, seed)
    if column not in ("hf_ratio", "mean_attention_distance", "entropy", "sink_mass"):
        raise InputError(f"column must be a frequency_profile feature (hf_ratio, mean_attention_distance, entropy, "
                         f"sink_mass); got {column!r}")
    info = model.interp
    layers = check_layers(layers, info)  # sorted, each once, as every analyzer reads a selection
    if len(layers) * info.n_heads < 2:
        raise InputError(f"spread_interval is a spread over heads: it needs at least 2, and {info.name} has "
                         f"{len(layers) * info.n_heads} in the layers asked for; pass more layers")
    hasher = DataHasher()
    items = _item_terms(model, data, layers, max_batches, progress, hasher=hasher)
    if len(items) < 2:
        raise InputError(f"spread_interval resamples items: it needs at least 2, got {len(items)}; pass more data")
    spread = float(_profile_of_items(info, items)[column].std())
    boots = np.array([_profile_of_items(info, [items[i] for i in idx])[column].std()
                      for idx in resample_indices(len(items), n_boot, seed)])
    lo, hi = np.percentile(boots, PERCENTILES) if n_boot else (np.nan, np.nan)
    row = pd.DataFrame([dict(model=info.name, column=column, spread=spread, spread_lo=float(lo), spread_hi=float(hi),
                             n_items=len(items), n_heads=len(layers) * info.n_heads, n_boot=n_boot, seed=seed,
                             data_fingerprint=hasher.hexdigest())])
    row.attrs["boots"] = tuple(float(b) for b in boots)  # a tuple: tables with it still concatenate
    return row


@public
def spread_difference(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """first - second of two ``spread_interval`` rows on the same items and seed: the difference of the spreads and
    its paired 95% bootstrap interval (each resample draws the same items for both models); "no difference" is
    only where the interval holds 0."""
    for name, table in (("first", first), ("second", second)):
        if not isinstance(table, pd.DataFrame) or len(table) != 1 or not table.attrs.get("boots"):
            raise InputError(f"spread_difference takes two one-row tables of interp.spread_interval with n_boot >= 1 "
                             f"(their resamples travel in .attrs['boots']); {name} is not one: pass the table "
                             "spread_interval returned, not a concatenation or a table read back from a file")
    a, b = first.iloc[0], second.iloc[0]
    data = [t.get("data_fingerprint") for t in (a, b)]
    if None not in data and data[0] != data[1]:
        raise InputError(f"spread_difference pairs two spread_interval rows over the same items, and these were "
                         f"computed on different data (data_fingerprint {data[0]} vs {data[1]}): run both on the same "
                         "data (the same items in the same order) with one seed")
    if (a.n_items, a.n_boot, a.seed, a.column) != (b.n_items, b.n_boot, b.seed, b.column):
        raise InputError("spread_difference pairs two spread_interval rows over the same items: they differ in "
                         f"(n_items, n_boot, seed, column): {(a.n_items, a.n_boot, a.seed, a.column)} vs "
                         f"{(b.n_items, b.n_boot, b.seed, b.column)}; run both on the same data with one seed")
    diff = np.asarray(first.attrs["boots"]) - np.asarray(second.attrs["boots"])
    lo, hi = np.percentile(diff, PERCENTILES)
    return pd.DataFrame([dict(first=a.model, second=b.model, column=a.column, difference=a.spread - b.spread,
                              difference_lo=float(lo), difference_hi=float(hi), n_items=a.n_items,
                              n_boot=a.n_boot)])


# ----- what training made: the trained model against untrained copies of its architecture ----------------------

SPECIALISATION_STATISTICS = {
    "layer_effect": "share of the standardised features' variance between layers (eta^2)",
    "within_layer_split": "share of the within-layer residual variance the best 2-means split explains (1 - CI)",
    "hf_ratio_spread": "standard deviation of hf_ratio over heads",
}
N_RANDOM = 8


def _head_statistics(profile: pd.DataFrame, seed: int = 0) -> dict[str, float]:
    """The statistics ``specialisation_test`` compares (``SPECIALISATION_STATISTICS``), of one profile; larger
    means more specialised in each. Every feature is used (``_cluster_features``: NaN refused)."""
    X = _cluster_features(profile, "kmeans")
    layers = profile["layer"].to_numpy()
    Xc, _ = _test_features(X, layers, "within_layer")
    with threadpool_limits(1):
        split = 1.0 - two_means_index(Xc, seed)
    return dict(layer_effect=layer_effect(X, layers), within_layer_split=split,
                hf_ratio_spread=float(profile.hf_ratio.std()))


def specialisation_table(trained: pd.DataFrame, untrained: Sequence[pd.DataFrame], seeds: Sequence[int],
                         alpha: float = 0.05, model: str = "", seed: int = 0) -> pd.DataFrame:
    """``specialisation_test``'s table from the trained model's profile and its untrained copies' profiles (same
    heads, same data, same features); see there."""
    from scipy import stats as st

    if len(untrained) < 2 or len(untrained) != len(seeds):
        raise InputError(f"specialisation needs at least 2 untrained profiles (one seed each); got {len(untrained)}")
    for u in untrained:
        if not np.array_equal(u[["layer", "head"]].to_numpy(), trained[["layer", "head"]].to_numpy()):
            raise InputError("the untrained profiles must hold the trained profile's heads in the same order")
    n_features = _cluster_features(trained, "kmeans").shape[1]
    t_stats = _head_statistics(trained, seed)
    u_stats = [_head_statistics(u, seed) for u in untrained]
    n, summary = len(untrained), {}
    for name in SPECIALISATION_STATISTICS:
        ref, value = np.array([s[name] for s in u_stats]), t_stats[name]
        mean, sd = float(ref.mean()), float(ref.std(ddof=1))
        if sd > 0:
            z = (value - mean) / sd
            p = float(st.t.sf(z / np.sqrt(1 + 1 / n), df=n - 1))
        else:
            z = np.inf if value > mean else (0.0 if value == mean else -np.inf)
            p = 0.0 if value > mean else 1.0
        summary[name] = dict(trained_value=value, untrained_mean=mean, untrained_sd=sd, z=z, p_value=p,
                             p_empirical=(1 + int((ref >= value - 1e-12).sum())) / (1 + n))
    order = sorted(summary, key=lambda k: summary[k]["p_value"])
    running = 0.0
    for rank, name in enumerate(order):  # Holm: family-wise error over the statistics
        running = max(running, min(1.0, (len(order) - rank) * summary[name]["p_value"]))
        summary[name]["p_holm"] = running
    rows = []
    for name, s in summary.items():
        common = dict(model=model, statistic=name, meaning=SPECIALISATION_STATISTICS[name], **s,
                      specialised=bool(s["p_holm"] <= alpha), alpha=alpha, n_random=n, n_heads=len(trained),
                      n_features=n_features)
        rows.append(dict(common, weights="trained", seed=pd.NA, value=s["trained_value"]))
        rows += [dict(common, weights="untrained", seed=int(sd_), value=u[name]) for sd_, u in zip(seeds, u_stats)]
    out = pd.DataFrame(rows)
    out["seed"] = out["seed"].astype("Int64")
    return out


@public
def specialisation_test(model: InterpBridge, data: Any, *, n_random: int = N_RANDOM, seed: int = 0,
                        alpha: float = 0.05, layers: Optional[Sequence[int]] = None,
                        heads: Optional[Sequence[int]] = None, max_batches: Optional[int] = None,
                        progress: bool = True) -> pd.DataFrame:
    """Did training make the heads' specialisation? The trained model's statistics against ``n_random``
    randomly initialised copies of its own architecture (``interp.untrained_copy``, seeds ``seed`` ..
    ``seed + n_random - 1``), each profiled on the same batches with the same features (``frequency_profile``).

    Statistics (``SPECIALISATION_STATISTICS``, larger = more specialised): ``layer_effect`` (eta^2 of the
    standardised features by layer: a layer-0-versus-rest split is in untrained models too),
    ``within_layer_split`` (1 - the 2-means cluster index of the within-layer residuals) and ``hf_ratio_spread``
    (SD of hf_ratio over heads). For each: the untrained mean and SD, ``z`` = (trained - mean) / SD (how far
    outside, in their SD), ``p_value`` = the one-sided prediction p that a new draw of the untrained
    distribution reaches the trained value (Student t with n_random - 1 degrees of freedom on z / sqrt(1 + 1 /
    n_random): exact for a normal untrained distribution), ``p_empirical`` = (1 + #{untrained >= trained}) / (1 +
    n_random) (its floor, 1 / 9 at 8 seeds, is why the t p is the decision), ``p_holm`` (Holm over the three
    statistics: family-wise) and ``specialised`` = p_holm <= ``alpha``. Tidy: one row per statistic x copy
    (``weights`` trained | untrained, ``seed``, ``value``), the summary repeated on each; ``n_features`` says how
    many features every profile used. Calibration on untrained models and the size of this test:
    ``docs/results/families/calibration.csv``. ``interp.plots.specialisation_figure`` draws it."""
    model = require_bridge(model, "specialisation_test")
    info = model.interp
    n_random = check_count("n_random", n_random, minimum=2)
    seed, alpha = check_count("seed", seed, minimum=0), check_fraction("alpha", alpha)
    layers, heads = check_layers(layers, info), check_heads(heads, info)
    batches = list(iter_batches(model, data, max_batches))
    trained = _select_heads(_profile_batches(model, batches, layers, progress=False), heads)
    if len(trained) < 3:
        raise InputError(f"specialisation_test compares statistics over heads: it needs at least 3 heads, got "
                         f"{len(trained)}; select more layers or heads")
    seeds = list(range(seed, seed + n_random))
    untrained = []
    for s in tqdm(seeds, desc="untrained copies", disable=not progress):
        copy_ = untrained_copy(model, s)
        untrained.append(_select_heads(_profile_batches(copy_, batches, layers, progress=False), heads))
        del copy_
    return specialisation_table(trained, untrained, seeds, alpha, info.name, seed)
