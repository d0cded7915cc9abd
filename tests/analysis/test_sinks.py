"""Sinks, implicit value bias, massive activations (``interp.analysis.sinks``).

Every number is checked against an independent brute-force computation on the plain HF model
(an unwrapped copy, eager attention, ``output_attentions=True`` and forward hooks on its own
modules, one sequence at a time); padded, split and one-at-a-time batches must agree; planted
sinks and planted massive activations must be found; the b_v identity and the key-prior removal
must hold to float64 rounding; bad inputs must raise ``InterpError`` subclasses.
"""

import copy
import math

import pandas as pd
import pytest
import torch
import transformers

import interp
from interp.analysis.sinks import scores_without_key_prior
from interp.errors import InputError, InterpError, UnsupportedModelError
from interp.models import tiny_hf_model
from interp.models.zoo import ZOO

# (value projection, output projection, query projection, key projection) inside one HF layer
PATHS = {
    "bert": ("attention.self.value", "attention.output.dense", "attention.self.query", "attention.self.key"),
    "vit": ("attention.v_proj", "attention.o_proj", "attention.q_proj", "attention.k_proj"),
    "llama": ("self_attn.v_proj", "self_attn.o_proj", "self_attn.q_proj", "self_attn.k_proj"),
}
PATHS["qwen2"] = PATHS["llama"]
TOL = 1e-5  # float32 models against float32 references


# ----- the plain HF reference -------------------------------------------------------------------------


def hf_layers(ref, n_layers):
    return next(m for m in ref.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers)


def reference_run(ref, family, n_layers, inputs, mask=None):
    """HF's own patterns, and from hooks on its modules: block outputs, values, head outputs z, attention inputs."""
    got = {"out": [], "v": [], "z": [], "x": []}
    v_path, o_path, q_path, _ = PATHS[family]
    handles = []
    for layer in hf_layers(ref, n_layers):
        handles += [
            layer.register_forward_hook(lambda m, a, o: got["out"].append(o[0] if isinstance(o, tuple) else o)),
            layer.get_submodule(v_path).register_forward_hook(lambda m, a, o: got["v"].append(o)),
            layer.get_submodule(o_path).register_forward_pre_hook(lambda m, a: got["z"].append(a[0])),
            layer.get_submodule(q_path).register_forward_pre_hook(lambda m, a: got["x"].append(a[0])),
        ]
    kw = {"pixel_values": inputs} if inputs.is_floating_point() else {"input_ids": inputs, "attention_mask": mask}
    try:
        with torch.no_grad():
            got["attn"] = list(ref(**kw, output_attentions=True).attentions)
    finally:
        for h in handles:
            h.remove()
    assert len(got["attn"]) == n_layers and len(got["out"]) == n_layers
    return got


def head_weights(ref, family, n_layers, n_heads, d_head):
    """Per layer: W_O per head [h, d_head, d_model] and b_v per kv head [kv, d_head], from the HF modules."""
    v_path, o_path, _, _ = PATHS[family]
    out = []
    for layer in hf_layers(ref, n_layers):
        W = layer.get_submodule(o_path).weight.detach().double()  # [d_model, h * d_head]
        W_o = torch.stack([W[:, h * d_head:(h + 1) * d_head].T for h in range(n_heads)])
        b = layer.get_submodule(v_path).bias
        b_v = None if b is None else b.detach().double().view(-1, d_head)
        out.append((W_o, b_v))
    return out


def brute_force(ref, family, info, batches, class_ids, sink="first"):
    """Masses per class, implicit value bias of the class ``sink`` and the residual top values, by hand."""
    n_layers, n_heads, d = info.n_layers, info.n_heads, info.d_head
    group = [h // (n_heads // info.n_kv_heads) for h in range(n_heads)]
    weights = head_weights(ref, family, n_layers, n_heads, d)
    mass, impl, resid = {}, {}, {l: [] for l in range(n_layers)}
    rows, seq_index = 0, 0
    for batch in batches:
        inputs, mask = (batch["input_ids"], batch.get("attention_mask")) if isinstance(batch, dict) else (batch, None)
        got = reference_run(ref, family, n_layers, inputs, mask)
        for s in range(inputs.shape[0]):
            real = mask[s].bool() if mask is not None else torch.ones(got["out"][0].shape[1], dtype=torch.bool)
            idx = real.nonzero()[:, 0]
            rows += len(idx)
            keys = class_ids(inputs[s][idx] if not inputs.is_floating_point() else None, len(idx))
            for l in range(n_layers):
                A = got["attn"][l][s][:, idx][:, :, idx].double()  # [head, query, key], real rows and keys
                for name, sums in masses_of_rows(A, keys, info.causal).items():
                    mass[(l, name)] = [a + b for a, b in zip(mass.get((l, name), (0, 0, 0)), sums)]
                _brute_implicit(impl, l, A, got, s, idx, keys[sink], weights[l][0], group, d)
                resid[l].append((seq_index, got["out"][l][s][idx].double()))
            seq_index += 1
    mass = {k: (m / r, u / r) for k, (m, r, u) in mass.items()}  # (mass, uniform mass) per head
    return mass, {k: v / rows for k, v in impl.items()}, resid, weights, group


def masses_of_rows(A, keys, causal):
    """Per class, over the rows of A [head, query, key] (one sequence) other than the class's own: (the
    attention its keys receive, how many rows, the attention they would give it if uniform), per head."""
    n_heads, n = A.shape[0], A.shape[-1]
    visible = torch.ones(n, n, dtype=torch.float64)
    visible = visible.tril() if causal else visible
    uniform = visible / visible.sum(-1, keepdim=True)
    out = {}
    for name, k in keys.items():
        r = ~k
        out[name] = (A[:, r][:, :, k].sum((1, 2)), torch.full((n_heads,), float(r.sum())),
                     torch.full((n_heads,), float(uniform[r][:, k].sum())))
    content = ~torch.stack(list(keys.values())).any(0)
    col = A.sum(1)  # [head, key]: over every row
    top = col.masked_fill(~content, -1.0).argmax(1)  # each head's most-attended content key
    sums = [torch.zeros(n_heads, dtype=torch.float64) for _ in range(3)]
    for h, j in enumerate(top.tolist()):
        if content.any():
            r = torch.arange(n) != j
            sums[0][h], sums[1][h], sums[2][h] = A[h, r, j].sum(), float(r.sum()), uniform[r, j].sum()
    out["top_content"] = tuple(sums)
    return out


def _brute_implicit(impl, l, A, got, s, idx, S, W_o, group, d):
    n = len(idx)
    V = got["v"][l][s][idx].double().view(n, -1, d)
    Z = got["z"][l][s][idx].double().view(n, -1, d)
    for h in range(A.shape[0]):
        c = (A[h][:, S] @ V[S, group[h]]) @ W_o[h]  # [query, d_model]: sum over the sink set
        o = Z[:, h] @ W_o[h]
        for key, val in (("c", c.sum(0)), ("c_sq", (c * c).sum()), ("o_sq", (o * o).sum()),
                         ("mass", A[h][:, S].sum())):
            impl[(l, h, key)] = impl.get((l, h, key), 0) + val


def assert_matches_brute_force(model, ref, family, batches, class_ids, sink="first", tol=TOL):
    """The three analyzers against ``brute_force``; returns the largest differences seen."""
    info = model.interp
    mass, impl, resid, weights, group = brute_force(ref, family, info, batches, class_ids, sink)
    profile = interp.sink_profile(model, batches, progress=False).set_index(["layer", "head", "position"])
    got, floor = profile.mass, profile.uniform_mass
    diffs = {"mass": max(max(abs(got[(l, h, name)] - float(v[h])), abs(floor[(l, h, name)] - float(u[h])))
                         for (l, name), (v, u) in mass.items() for h in range(info.n_heads))}
    assert set(profile.index.get_level_values("position")) == {name for _, name in mass}, "position classes"
    assert diffs["mass"] <= tol, diffs
    implicit = interp.implicit_value_bias(model, batches, positions=sink, progress=False).set_index(["layer", "head"])
    d_impl = 0.0
    for l in range(info.n_layers):
        for h in range(info.n_heads):
            m = impl[(l, h, "c")]
            row = implicit.loc[(l, h)]
            b_v = weights[l][1]
            explicit = 0.0 if b_v is None else float((b_v[group[h]] @ weights[l][0][h]).norm())
            d_impl = max(d_impl, abs(row.implicit_norm - float(m.norm())), abs(row.explicit_norm - explicit),
                         abs(row.output_rms - math.sqrt(float(impl[(l, h, "o_sq")]))),
                         abs(row.sink_mass - float(impl[(l, h, "mass")])),
                         abs(row.constancy - float(m @ m) / float(impl[(l, h, "c_sq")])))
    diffs["implicit"] = d_impl
    diffs.update(_massive_diffs(model, batches, resid))
    assert diffs["mass"] <= tol and diffs["implicit"] <= tol and diffs["massive"] <= tol, diffs
    return diffs


def _massive_diffs(model, batches, resid):
    frame = interp.massive_activations(model, batches, progress=False)
    d_val, d_med = 0.0, 0.0
    for l, parts in resid.items():
        vals = torch.cat([h for _, h in parts])  # [real tokens, d_model], in data order
        where = [(s, p) for s, h in parts for p in range(h.shape[0])]
        absval = vals.abs().flatten()
        top = torch.sort(absval, descending=True, stable=True).indices[:3]  # ties: the earliest wins
        rows = frame[frame.layer == l].sort_values("rank")
        for (_, row), i in zip(rows.iterrows(), top.tolist()):
            tok, channel = divmod(i, vals.shape[1])
            assert (row.sequence, row.position, row.channel) == (*where[tok], channel)
            d_val = max(d_val, abs(row.value - float(vals.flatten()[i])))
        exact = float(absval.median())  # torch: the lower median
        d_med = max(d_med, abs(rows.median_abs.iloc[0] - exact) / exact)
        norms = vals.norm(dim=-1)
        assert (rows.norm_max_sequence.iloc[0], rows.norm_max_position.iloc[0]) == where[int(norms.argmax())]
        d_val = max(d_val, abs(rows.norm_mean.iloc[0] - float(norms.mean())), abs(rows.norm_max.iloc[0] - float(norms.max())))
        assert abs(rows.norm_median.iloc[0] - float(norms.median())) <= 2**-11 * float(norms.median())
    assert d_med <= 2**-11, d_med  # the histogram's documented precision
    return {"massive": d_val, "median_rel": d_med}


def text_classes(specials=()):
    def classes(ids, n):
        first = torch.zeros(n, dtype=torch.bool)
        first[0] = True
        return {"first": first, **{name: ids == token_id for name, token_id in specials}}
    return classes


def vit_classes(ids, n):
    cls = torch.zeros(n, dtype=torch.bool)
    cls[0] = True
    return {"cls": cls}


def padded_text_batches(vocab=97, lengths=((9, 6, 4), (9, 3)), seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for lens in lengths:
        ids = torch.randint(3, vocab, (len(lens), max(lens)), generator=gen)
        mask = torch.tensor([[1] * n + [0] * (max(lens) - n) for n in lens])
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def images(n=3, seed=0):
    return [torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed + i)) for i in range(2)]


def tiny_pair(family, dtype=torch.float32, **kw):
    hf = tiny_hf_model(family, **kw).to(dtype)
    return interp.load_model(copy.deepcopy(hf), device="cpu"), hf


# ----- (a) equality with brute force ---------------------------------------------------------------


def test_tiny_vit_matches_brute_force():
    model, ref = tiny_pair("vit")
    diffs = assert_matches_brute_force(model, ref, "vit", images(), vit_classes, sink="cls")
    print(f"tiny ViT: {diffs}")


def test_tiny_llama_matches_brute_force_with_padding():
    model, ref = tiny_pair("llama")
    diffs = assert_matches_brute_force(model, ref, "llama", padded_text_batches(), text_classes())
    print(f"tiny LLaMA: {diffs}")


def test_brute_force_check_can_fail():
    """The comparison is not vacuous: a model whose weights differ from the reference's is caught."""
    model, ref = tiny_pair("llama")
    with torch.no_grad():
        ref.model.layers[1].self_attn.k_proj.weight.mul_(3.0)
    with pytest.raises(AssertionError, match="'mass'"):
        assert_matches_brute_force(model, ref, "llama", padded_text_batches(), text_classes())


def real_reference(name):
    if not ZOO[name].available():
        pytest.fail(f"{name} is not cached: the test setup (`make models`) should have fetched it")
    folder = ZOO[name].folder()
    arch = transformers.AutoConfig.from_pretrained(folder).architectures[0]
    return getattr(transformers, arch).from_pretrained(folder, attn_implementation="eager",
                                                       use_safetensors=True).eval()


def docs_batches(model, n_batches=2, size=4):
    """The first sequences of the built-in python-docs batches (right-padded: masks are real)."""
    return [{"input_ids": b.inputs[:size], "attention_mask": b.attention_mask[:size]}
            for b in interp.builtin_batches(model, "python-docs")[:n_batches]]


@pytest.fixture(scope="module")
def minilm():
    return interp.load_model("minilm-l6", device="cpu")


@pytest.fixture(scope="module")
def smollm2():
    return interp.load_model("smollm2-135m", device="cpu")


@pytest.mark.slow
def test_minilm_matches_brute_force(minilm):
    batches = docs_batches(minilm)
    tok = minilm.tokenizer
    classes = text_classes([("cls", tok.cls_token_id), ("sep", tok.sep_token_id)])
    diffs = assert_matches_brute_force(minilm, real_reference("minilm-l6"), "bert", batches, classes)
    print(f"MiniLM-L6: {diffs}")


@pytest.mark.slow
def test_smollm2_matches_brute_force(smollm2):
    batches = docs_batches(smollm2, size=2)  # 2 batches x 2 right-padded sequences: SmolLM2 is slow on CPU
    classes = text_classes([("bos", smollm2.tokenizer.bos_token_id)])
    diffs = assert_matches_brute_force(smollm2, real_reference("smollm2-135m"), "llama", batches, classes)
    print(f"SmolLM2-135M: {diffs}")


# ----- (b) the same sequences, batched three ways ------------------------------------------------------


def batchings(family, seed=0):
    """The same four sequences (or images): one padded batch, two batches, one at a time unpadded."""
    gen = torch.Generator().manual_seed(seed)
    if family == "vit":
        x = torch.randn(4, 3, 32, 32, generator=gen, dtype=torch.float64)
        return {"one batch": [x], "split": [x[:1], x[1:]], "one at a time": list(x[:, None])}
    seqs = [torch.randint(3, 97, (n,), generator=gen) for n in (9, 5, 3, 7)]

    def pad(group):
        n = max(len(s) for s in group)
        ids = torch.stack([torch.cat([s, torch.zeros(n - len(s), dtype=torch.long)]) for s in group])
        return {"input_ids": ids, "attention_mask": (torch.arange(n)[None] < torch.tensor([len(s) for s in group])[:, None]).long()}

    return {"one batch": [pad(seqs)], "split": [pad(seqs[:3]), pad(seqs[3:])], "one at a time": [s[None] for s in seqs]}


NUMBERS = {
    "profile": ["mass", "mass_without_key_prior", "mass_without_b_q", "n_rows"],
    "implicit": ["sink_mass", "implicit_norm", "constancy", "explicit_norm", "cos_to_explicit", "output_rms", "n_rows"],
    "massive": ["value", "sequence", "position", "channel", "median_abs", "norm_mean", "norm_median", "norm_max",
                "norm_max_sequence", "norm_max_position", "n_tokens"],
}


@pytest.mark.parametrize("family", ["qwen2", "bert", "vit"])
def test_batching_does_not_change_any_number(family):
    model = interp.load_model(tiny_hf_model(family).double(), device="cpu")
    remove = None if family == "vit" else "key_prior"
    frames = {}
    for way, data in batchings(family).items():
        frames[way] = {
            "profile": interp.sink_profile(model, data, remove=remove, progress=False),
            "implicit": interp.implicit_value_bias(model, data, progress=False),
            "massive": interp.massive_activations(model, data, progress=False),
        }
    worst = 0.0
    # float64: rounding only, except that HF's Qwen2 takes its rotary cos/sin in float32, whose vectorised tail
    # differs with the sequence length (its own float64 forward moves by 2.4e-7 between batchings: see
    # tests/test_batching_invariance.py); there the bound is that error's scale
    bound = 1e-7 if family == "qwen2" else 1e-10
    for way in ("split", "one at a time"):
        for kind, cols in NUMBERS.items():
            a, b = frames["one batch"][kind], frames[way][kind]
            cols = [c for c in cols if c in a]
            assert len(a) == len(b)
            diff = (a[cols].astype(float) - b[cols].astype(float)).abs().fillna(0).to_numpy().max()
            worst = max(worst, diff)
            assert diff <= bound, (family, way, kind, diff)
            assert a.data_fingerprint.iloc[0] != b.data_fingerprint.iloc[0]  # the batches differ; the numbers do not
    print(f"{family}: largest difference across batchings {worst:.1e}")


# ----- (c) planted structure is found -------------------------------------------------------------------


def plant_key_prior_sink(hf, family, layer, head, channel, strength, d_head=8):
    """Head ``head`` of ``layer`` scores key j by strength * x_j[channel] / sqrt(d) only (W_q = 0, b_q = strength e_0,
    k_j = x_j[channel] e_0 + b_k): its pattern is all key prior, and it sinks on the token large in ``channel``."""
    n_layers = hf.config.num_hidden_layers
    block = hf_layers(hf, n_layers)[layer]
    q, k = block.get_submodule(PATHS[family][2]), block.get_submodule(PATHS[family][3])
    rows = slice(head * d_head, (head + 1) * d_head)
    with torch.no_grad():
        q.weight[rows] = 0.0
        q.bias[rows] = 0.0
        q.bias[head * d_head] = strength
        k.weight[rows] = 0.0
        k.weight[head * d_head, channel] = 1.0


def test_planted_first_token_sink_is_found_and_written_by_the_key_prior():
    hf = tiny_hf_model("bert")
    plant_key_prior_sink(hf, "bert", layer=0, head=2, channel=3, strength=40.0)
    with torch.no_grad():
        hf.bert.embeddings.position_embeddings.weight[0, 3] += 30.0  # the first token is large in channel 3
    model = interp.load_model(hf, device="cpu")
    ids = torch.randint(3, 97, (4, 16), generator=torch.Generator().manual_seed(1))
    profile = interp.sink_profile(model, [ids], remove="key_prior", progress=False)
    sinks = profile[profile.sink]
    assert list(zip(sinks.layer, sinks["head"], sinks.position)) == [(0, 2, "first")], sinks
    assert sinks.mass.iloc[0] >= 0.9
    # without its key prior (and with b_q zeroed) the planted head's scores are constant across keys: uniform
    assert abs(sinks.mass_without_key_prior.iloc[0] - 1 / 16) <= 1e-6
    assert abs(sinks.mass_without_b_q.iloc[0] - 1 / 16) <= 1e-6
    shares = interp.sink_shares(profile).set_index("position")
    assert shares.loc["first", "n_sink_heads"] == 1 and shares.loc["first", "share"] == 1 / 8
    assert shares.loc["first", "share_without_key_prior"] == 0.0
    assert (interp.sink_shares(profile).n_heads == 8).all()  # 2 layers x 4 heads
    # the same rows twice counted each head twice (n_heads 16 on an 8-head model): refused
    with pytest.raises(InputError, match=r"more than once \(e\.g\. layer 0, head 0, 'first': 2 rows\)"):
        interp.sink_shares(pd.concat([profile, profile], ignore_index=True))
    with pytest.raises(InputError, match="more than once"):  # one head's row repeated
        interp.sink_shares(pd.concat([profile, profile[profile.sink]], ignore_index=True))


def test_planted_massive_activation_is_flagged_and_nothing_else():
    hf = tiny_hf_model("llama")
    ids = torch.randint(3, 97, (3, 10), generator=torch.Generator().manual_seed(2))
    ids[1, 4] = 1  # token 1 appears once: sequence 1, position 4
    clean = interp.load_model(copy.deepcopy(hf), device="cpu")
    median = interp.massive_activations(clean, [ids], layers=[0], progress=False).median_abs.iloc[0]
    with torch.no_grad():
        hf.model.embed_tokens.weight[1, 7] = 500 * median  # one token, one channel, 500x the median
    planted = interp.load_model(hf, device="cpu")
    kw = dict(abs_threshold=100 * median, ratio_threshold=100.0, progress=False)
    frame = interp.massive_activations(planted, [ids], **kw)
    flagged = frame[frame.massive]
    assert set(flagged.layer) == {0, 1} and (flagged["rank"] == 1).all(), frame
    assert (flagged.sequence == 1).all() and (flagged.position == 4).all() and (flagged.channel == 7).all()
    assert (flagged.token_id == 1).all()
    assert 400 <= flagged.ratio_to_median.iloc[0] <= 600
    assert not interp.massive_activations(clean, [ids], **kw).massive.any()


# ----- (d) the b_v identity through a sink --------------------------------------------------------------


def test_implicit_value_bias_of_a_constant_sink_is_the_constant_it_adds():
    """All of head 1's attention on CLS (mass exactly 1) and v = b_v for every key: the sink adds b_v W_O."""
    hf = tiny_hf_model("vit").double()
    head, d = 1, 8
    plant_key_prior_sink(hf, "vit", layer=0, head=head, channel=5, strength=2000.0)
    with torch.no_grad():
        hf.embeddings.cls_token[0, 0, 5] += 30.0
        hf.layers[0].attention.v_proj.weight[head * d:(head + 1) * d] = 0.0  # v_j = b_v: a constant value
    model = interp.load_model(hf, device="cpu")
    frame = interp.implicit_value_bias(model, images(), positions="cls", layers=[0], progress=False)
    row = frame.set_index("head").loc[head]
    assert abs(row.sink_mass - 1) <= 1e-12
    assert abs(row.implicit_norm - row.explicit_norm) <= 1e-6 and row.explicit_norm > 0.1
    assert abs(row.cos_to_explicit - 1) <= 1e-6 and abs(row.constancy - 1) <= 1e-6
    others = frame[frame["head"] != head]
    assert ((others.implicit_norm - others.explicit_norm).abs() > 1e-3).all()  # a partial sink adds less


# ----- (e) key-prior removal is exact -------------------------------------------------------------------


def independent_terms(ref, family, layer, x, info):
    """The four score terms from the HF modules' own weights (and HF's own rotary), [batch, head, query, key]."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    block = hf_layers(ref, info.n_layers)[layer]
    q_lin, k_lin = block.get_submodule(PATHS[family][2]), block.get_submodule(PATHS[family][3])
    b, p, _ = x.shape
    d, n_kv = info.d_head, info.n_kv_heads
    cq = (x @ q_lin.weight.T).view(b, p, info.n_heads, d).transpose(1, 2)
    ck = (x @ k_lin.weight.T).view(b, p, n_kv, d).transpose(1, 2)
    bq = q_lin.bias.view(1, -1, 1, d).expand_as(cq)
    bk = k_lin.bias.view(1, -1, 1, d).expand_as(ck)
    if family == "qwen2":
        cos, sin = ref.model.rotary_emb(x, torch.arange(p)[None].expand(b, p))
        cq, ck = apply_rotary_pos_emb(cq, ck, cos, sin)
        bq, bk = apply_rotary_pos_emb(bq, bk, cos, sin)
    rep = info.n_heads // n_kv
    ck, bk = ck.repeat_interleave(rep, 1), bk.repeat_interleave(rep, 1)
    dot = lambda a, c: a @ c.transpose(-1, -2) / math.sqrt(d)  # noqa: E731
    return dict(content=dot(cq, ck), query_const=dot(cq, bk), key_prior=dot(bq, ck), const=dot(bq, bk))


@pytest.mark.parametrize("family", ["bert", "qwen2"])
@torch.no_grad()
def test_key_prior_removal_is_exact(family):
    model, ref = tiny_pair(family, torch.float64)
    info = model.interp
    batch = padded_text_batches(lengths=((9, 6, 4),))[0]
    ids, mask = batch["input_ids"], batch["attention_mask"]
    got = reference_run(ref, family, info.n_layers, ids, mask)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, attention_mask=mask)
    real = mask.bool()
    allowed = real[:, None, :, None] & real[:, None, None, :]
    if info.causal:
        allowed = allowed & torch.ones(9, 9, dtype=torch.bool).tril()
    without_kp, without_bq = [], []
    for l in range(info.n_layers):
        full, without = scores_without_key_prior(model, cache, l)
        t = independent_terms(ref, family, l, got["x"][l].double(), info)
        expected = t["content"] + t["query_const"] + t["const"]
        assert (without - expected).abs().masked_fill(~allowed, 0).max() <= 1e-6
        assert (full - expected - t["key_prior"]).abs().masked_fill(~allowed, 0).max() <= 1e-6
        pattern = full.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num()
        assert (pattern - got["attn"][l]).abs().masked_fill(~allowed, 0).max() <= 1e-6  # `full` is HF's score
        without_kp.append(expected.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num())
        without_bq.append((t["content"] + t["query_const"]).masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num())
    profile = interp.sink_profile(model, [batch], remove="key_prior", progress=False).set_index(["layer", "head", "position"])
    for column, patterns in (("mass_without_key_prior", without_kp), ("mass_without_b_q", without_bq)):
        for l, P in enumerate(patterns):
            totals = {}
            for s in range(3):
                idx = real[s].nonzero()[:, 0]
                classes = text_classes()(None, len(idx))
                for name, (v, r, _) in masses_of_rows(P[s][:, idx][:, :, idx], classes, info.causal).items():
                    totals[name] = [a + b for a, b in zip(totals.get(name, (0, 0)), (v, r))]
            for name, (v, r) in totals.items():
                for h in range(info.n_heads):
                    assert abs(profile.loc[(l, h, name), column] - float(v[h]) / float(r[h])) <= 1e-6


# ----- (f) bad inputs -----------------------------------------------------------------------------------


def sdpa(model):
    for sub in model.hf_model.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = "sdpa"
    return model


def tiny(family):
    return interp.load_model(tiny_hf_model(family), device="cpu")


def two_profiles():
    a = interp.sink_profile(tiny("llama"), [tiny_ids()], progress=False)
    b = interp.sink_profile(tiny("gpt2"), [tiny_ids()], progress=False)
    return pd.concat([a, b])


def tiny_ids():
    return torch.randint(3, 97, (2, 6), generator=torch.Generator().manual_seed(0))


BAD = [
    ("non-eager attention", lambda: interp.sink_profile(sdpa(tiny("bert")), [tiny_ids()], progress=False),
     UnsupportedModelError, "eager"),
    ("non-eager, implicit", lambda: interp.implicit_value_bias(sdpa(tiny("vit")), images(), progress=False),
     UnsupportedModelError, "eager"),
    ("empty data", lambda: interp.sink_profile(tiny("llama"), [], progress=False), InputError, "empty"),
    ("empty data, massive", lambda: interp.massive_activations(tiny("llama"), [], progress=False), InputError, "empty"),
    ("all padding", lambda: interp.implicit_value_bias(
        tiny("bert"), [{"input_ids": tiny_ids(), "attention_mask": torch.zeros(2, 6, dtype=torch.long)}],
        progress=False), InputError, "no real tokens"),
    ("threshold 0", lambda: interp.sink_profile(tiny("llama"), [tiny_ids()], threshold=0), InputError, "(0, 1]"),
    ("threshold 1.5", lambda: interp.sink_profile(tiny("llama"), [tiny_ids()], threshold=1.5), InputError, "(0, 1]"),
    ("threshold nan", lambda: interp.sink_profile(tiny("llama"), [tiny_ids()], threshold=float("nan")), InputError,
     "(0, 1]"),
    ("threshold bool", lambda: interp.sink_profile(tiny("llama"), [tiny_ids()], threshold=True), InputError,
     "threshold must be a number; got True (bool)"),
    ("class the model lacks", lambda: interp.sink_profile(tiny("llama"), [tiny_ids()], positions="cls"), InputError,
     "its classes are first, top_content"),
    ("register on a plain ViT", lambda: interp.implicit_value_bias(tiny("vit"), images(), positions=["register_0"]),
     InputError, "its classes are cls, top_content"),
    ("no prefix, no default sink", lambda: interp.implicit_value_bias(tiny("siglip-vision"), images()), InputError,
     "pass positions="),
    ("unknown removal", lambda: interp.sink_profile(tiny("bert"), [tiny_ids()], remove="everything"), InputError,
     "'key_prior' or 'b_q'"),
    ("key prior under qk-norm", lambda: interp.sink_profile(tiny("qwen3"), [tiny_ids()], remove="key_prior"),
     UnsupportedModelError, "qk-norm"),
    ("key prior beside ALiBi", lambda: interp.sink_profile(tiny("bloom"), [tiny_ids()], remove="key_prior"),
     UnsupportedModelError, "remove='b_q'"),
    ("layer out of range", lambda: interp.sink_profile(tiny("llama"), [tiny_ids()], layers=[5]), InputError,
     "layers must lie in 0..1"),
    ("abs threshold 0", lambda: interp.massive_activations(tiny("llama"), [tiny_ids()], abs_threshold=0), InputError,
     "positive finite"),
    ("ratio threshold inf", lambda: interp.massive_activations(tiny("llama"), [tiny_ids()], ratio_threshold=math.inf),
     InputError, "positive finite"),
    ("top_k 0", lambda: interp.massive_activations(tiny("llama"), [tiny_ids()], top_k=0), InputError,
     "positive integer"),
    ("shares of a list", lambda: interp.sink_shares([1, 2]), InputError, "sink_profile"),
    ("shares of two models", lambda: interp.sink_shares(two_profiles()), InputError, "mixes 2 runs"),
    ("not a bridge", lambda: interp.sink_profile(tiny_hf_model("llama"), [tiny_ids()]), InputError, "load_model"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_one_clear_error(case):
    _, call, error, message = case
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, InterpError)
    assert message in str(raised.value), str(raised.value)


def test_training_mode_with_dropout_is_refused_without_it_left_as_found():
    model = interp.load_model(tiny_hf_model("bert"), device="cpu")
    ids = tiny_ids()
    ref = interp.sink_profile(model, [ids], progress=False)
    model.train()
    with pytest.raises(InputError, match=r"dropout active.*model\.eval\(\)"):  # random numbers: refused, as
        interp.sink_profile(model, [ids], progress=False)                    # every streaming pass refuses them
    for module in model.hf_model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.hf_model.config.attention_probs_dropout_prob = 0.0
    again = interp.sink_profile(model, [ids], progress=False)
    assert model.training  # restored
    assert (ref.mass - again.mass).abs().max() == 0.0  # ran in eval mode


# ----- figures ------------------------------------------------------------------------------------------


def test_figures_draw_the_frames_with_titles_labels_and_one_scale(tmp_path):
    from interp import plots

    model = interp.load_model(tiny_hf_model("bert"), device="cpu")
    ids = tiny_ids()
    profile = interp.sink_profile(model, [ids], progress=False)
    grid = plots.sink_mass_grid(profile, data="two random sequences")
    ax = grid.axes[0]
    assert ax.get_title().startswith(model.interp.name) and (ax.get_xlabel(), ax.get_ylabel()) == ("head", "layer")
    top = profile.groupby(["layer", "head"]).mass.max().unstack().to_numpy()
    assert abs(ax.collections[0].get_array().reshape(top.shape) - top).max() < 1e-12  # colour = the top mass
    implicit = plots.implicit_vs_explicit(interp.implicit_value_bias(model, [ids], progress=False)).axes[0]
    assert implicit.get_xlim() == implicit.get_ylim() and "b_v" in implicit.get_xlabel()
    massive = plots.massive_activations_plot(interp.massive_activations(model, [ids], progress=False)).axes[0]
    assert massive.get_yscale() == "log" and massive.get_title() and "layer" in massive.get_xlabel()
    for i, fig in enumerate((grid, implicit.figure, massive.figure)):
        assert plots.save_figure(fig, tmp_path / f"{i}.png").stat().st_size > 1000


@pytest.mark.parametrize("family", ["dinov2", "bert", "llama"])
def test_a_subset_of_layers_gives_the_same_numbers(family):
    """Each forward stops after the last layer asked for; what it reads must not change."""
    model = interp.load_model(tiny_hf_model(family, n_layers=3), device="cpu")
    data = images() if family == "dinov2" else [tiny_ids()]
    remove = "key_prior" if family == "bert" else None
    for fn, kw in ((interp.sink_profile, {"remove": remove}), (interp.implicit_value_bias, {}),
                   (interp.massive_activations, {})):
        full = fn(model, data, progress=False, **kw)
        part = fn(model, data, layers=[1], progress=False, **kw)
        cols = [c for c in ("mass", "mass_without_key_prior", "mass_without_b_q", "implicit_norm", "output_rms",
                            "value", "median_abs") if c in full]
        a = full[full.layer == 1].reset_index(drop=True)[cols]
        assert (a - part[cols]).abs().to_numpy().max() <= 1e-6, fn.__name__


def test_two_stage_top_entries_equal_a_search_of_every_entry():
    """massive_activations searches only the rows of the k tokens with the largest |value|: on integer data
    full of ties, the entries it picks (and their order) equal a stable search over every entry."""
    from interp.analysis.sink_parts import stable_topk
    from interp.analysis.sinks import _top_entries

    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        h = torch.randint(0, 4, (3, 5, 6), generator=g).float()
        real = torch.rand(3, 5, generator=g) > 0.3
        score = h.masked_fill(~real[..., None], float("-inf")).flatten()
        for k in (1, 3, 7, 40):
            tok, channel = _top_entries(h, real, k)
            got, want = tok * 6 + channel, stable_topk(score, k)
            assert got[score[got] > float("-inf")].tolist() == want[score[want] > float("-inf")].tolist()


@pytest.mark.parametrize("family", ["llama", "vit"])
def test_one_pass_gives_the_tables_of_the_two_calls(family):
    """sink_pass runs sink_profile and massive_activations from one forward per batch: the same tables."""
    model = interp.load_model(tiny_hf_model(family), device="cpu")
    data = images() if family == "vit" else padded_text_batches()
    both = interp.sink_pass(model, data, progress=False)
    pd.testing.assert_frame_equal(both["profile"], interp.sink_profile(model, data, progress=False))
    pd.testing.assert_frame_equal(both["massive"], interp.massive_activations(model, data, progress=False))
