"""Numbers the docs quote cannot drift: README's and the docs pages' figures are checked against the
CSVs in docs/results/ they were read from, and lists (notebooks, built-in data sets, families)
against the folder or registry they name. A quoted number agrees with its source when the source,
rounded to the digits the text shows, is that number."""

import re
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
GETTING_STARTED = (DOCS / "getting-started.md").read_text()
DATA = (DOCS / "data.md").read_text()
PERFORMANCE = (DOCS / "performance.md").read_text()
DEVELOPMENT = (DOCS / "development.md").read_text()
FINDINGS = (ROOT / "docs" / "findings.md").read_text()
GUARANTEES = (ROOT / "docs" / "guarantees.md").read_text()
RESULTS = ROOT / "docs" / "results"


def agrees(quoted: str, value: float) -> bool:
    """'6.7e-3' agrees with 0.00668; '0.155' with 0.1546; '0' only with 0; '+0.12' with 0.118."""
    q = Decimal(quoted.replace("+", "").rstrip("%"))
    if q == 0:
        return value == 0
    half_ulp = Decimal(1).scaleb(q.as_tuple().exponent) / 2
    return abs(Decimal(repr(float(value))) - q) <= half_ulp * Decimal("1.000001")


def assert_quoted(text: str, pattern: str, values: tuple, what: str) -> None:
    """``pattern``'s groups in ``text`` agree one by one with ``values``: the figures a document quotes."""
    said = re.search(pattern, text)
    assert said, f"the text quotes {what}"
    assert len(said.groups()) == len(values), what
    for quoted, value in zip(said.groups(), values):
        assert agrees(quoted, value), (what, quoted, value)


def row(text: str, label: str) -> list[str]:
    """The cells of the markdown table row whose first cell is `label`."""
    lines = [line for line in text.splitlines() if line.startswith(f"| {label} |")]
    assert len(lines) == 1, f"no single table row {label!r}"
    return [c.strip() for c in lines[0].strip("|").split("|")]


def numbers(cell: str) -> list[str]:
    return re.findall(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?", cell)


def test_agrees_is_strict():
    assert agrees("6.7e-3", 0.0066787) and agrees("0.155", 0.1546) and agrees("0", 0.0)
    assert not agrees("6e-8", 0.0) and not agrees("154", 142.65) and not agrees("0.155", 0.1556)


def test_readme_notebook_list_is_the_notebooks_folder():
    paragraph = GETTING_STARTED[GETTING_STARTED.index("\nNotebooks ("):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    listed = set(re.findall(r"\d\d_\w+\.ipynb", paragraph))
    assert listed == {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}


def test_readme_and_cli_help_name_every_builtin_data_set():
    from interp.cli import DATA_HELP
    from interp.data import BUILTIN

    builtin_line = re.search(r"besides the built-in names \(([^)]*)\)", DATA).group(1)
    assert set(re.findall(r"`([\w-]+)`", builtin_line)) == set(BUILTIN)
    help_names = re.search(r"a built-in data set \(([^)]*)\)", DATA_HELP).group(1)
    assert {n.strip() for n in help_names.split(",")} == set(BUILTIN)


def test_readme_quickstart_counts_the_builtin_photos():
    import re

    from interp.data import photos

    said = re.search(r'"photos" alone means all (\d+)', README)
    assert said and int(said.group(1)) == photos(32).shape[0]


def test_guarantees_count_every_registered_family_as_forward_tested():
    from interp.models import TINY_FAMILIES, list_families

    assert TINY_FAMILIES == tuple(f.name for f in list_families())  # test_loading's fixture covers them all
    claim = row(GUARANTEES, "hooked forward = HF forward")[1]
    assert f"every registered family ({len(TINY_FAMILIES)})" in claim


def _dinov2_bk_norms() -> tuple[float, float]:
    o = pd.read_csv(RESULTS / "dinov2-s14" / "origin_shift.csv")
    k = o[o.kind == "k"]
    per_layer = (k.bias_norm ** 2).groupby(k.layer).sum() ** 0.5
    return float(per_layer.max()), float(k.bias_norm.max())


def test_dinov2_bk_norm_says_per_layer_or_per_head():
    per_layer, per_head = _dinov2_bk_norms()
    for text in (README, GUARANTEES, FINDINGS):
        layer, head = re.search(r"up to (\d+) per layer,? \(?(\d+) per head", text).groups()
        assert agrees(layer, per_layer) and agrees(head, per_head)
    assert agrees(re.search(r"its norm reaches (\d+) \(layer 3, head 4\)", FINDINGS).group(1), per_head)
    assert agrees(re.search(r"a large norm \((\d+) on one head", FINDINGS).group(1), per_head)


SWEEP_ROWS = {
    "MiniLM-L6 (sentence-embedding cosine)": "minilm-l6",
    "DINOv2-S/14 (CLS feature cosine)": "dinov2-s14",
    "digits-vit (cross-entropy, baseline 0.008)": "digits-vit",
    "digits-vit-nobias (cross-entropy)": "digits-vit-nobias",
}


@pytest.mark.parametrize("label", SWEEP_ROWS)
def test_readme_real_sweep_table_equals_ablation_csv(label):
    a = pd.read_csv(RESULTS / SWEEP_ROWS[label] / "ablation.csv")
    largest = a.groupby(["method", "kind"]).delta.apply(lambda s: s.abs().max())
    cells = row(FINDINGS, label)
    for cell, method in zip(cells[1:3], ("zero", "mean")):
        quoted = numbers(cell.split("(")[0])
        assert len(quoted) == 3, cell
        for q, kind in zip(quoted, "qkv"):
            assert agrees(q, largest[method, kind]), (label, method, kind, q, largest[method, kind])
    assert set(a.columns) >= {"delta_lo", "delta_hi", "identity", "exact_because", "options"}  # today's columns
    head = re.fullmatch(r"L(\d+) H(\d+) ([qkv])(?: \((zero|mean)\))?", cells[3])
    if not head:  # no head named: only for a model without the biases (every zero row an identity)
        assert cells[3] == "" and a[a.method == "zero"].identity.str.startswith("absent bias").all(), cells[3]
        return
    top = a.loc[a.delta.abs().idxmax()]
    assert (int(head[1]), int(head[2]), head[3]) == (top.layer, top["head"], top.kind), (cells[3], top)
    assert head[4] in (None, top.method), (cells[3], top.method)


def test_readme_dinov2_ablation_finding_equals_ablation_csv():
    a = pd.read_csv(RESULTS / "dinov2-s14" / "ablation.csv")
    zero = a[a.method == "zero"]
    largest = zero.groupby("kind").delta.apply(lambda s: s.abs().max())
    text = re.search(r"b_q matters most \(max drop ([\d.]+), layer (\d+) head (\d+); then L(\d+) H(\d+), L(\d+) H(\d+)\), "
                     r"b_v up to ([\d.]+), b_k ([\de.-]+) ", FINDINGS)
    drop, *heads, v, k = text.groups()
    for q, kind in zip((drop, v, k), "qvk"):
        assert agrees(q, largest[kind]), (kind, q, largest[kind])
    top_q = zero[zero.kind == "q"].assign(a=lambda f: f.delta.abs()).nlargest(3, "a")
    assert [int(h) for h in heads] == [int(x) for lh in zip(top_q.layer, top_q["head"]) for x in lh]


BK_ROWS = {
    "AdamW, eps 1e-8, float64 (softmax too)": "adamw_fp64", "SGD, momentum 0.9": "sgd",
    "AdamW, eps 1e-6": "adamw_eps1e-6", "AdamW, eps 1e-8": "adamw",
    "AdamW, eps 1e-8, no weight decay on biases": "adamw_nodecay", "AdamW, eps 1e-8, bfloat16 autocast": "adamw_bf16",
}


@pytest.mark.parametrize("label", BK_ROWS)
def test_findings_bk_dynamics_table_equals_its_csv(label):
    s = pd.read_csv(RESULTS / "bk_dynamics" / "summary.csv").set_index("setting").loc[BK_ROWS[label]]
    cells = row(FINDINGS, label)
    columns = ("median_grad_ratio_k_over_q", "final_k_bias_norm", "final_q_bias_norm")
    for cell, column in zip(cells[2:], columns):
        assert agrees(numbers(cell)[0], s[column]), (label, column, cell, s[column])


MNIST_ROWS = {"q, k, v bias (`mnist-vit`)": "qkv", "no QKV bias (`mnist-vit-nobias`)": "none",
              "q and v bias, b_k held at 0 (`mnist-vit-qv`)": "qv"}


@pytest.mark.parametrize("label", MNIST_ROWS)
def test_findings_mnist_table_equals_its_csv(label):
    s = pd.read_csv(RESULTS / "mnist_vit" / "summary.csv").set_index("variant").loc[MNIST_ROWS[label]]
    cells = row(FINDINGS, label)
    columns = ["accuracy_pct", "ci95_low", "ci95_high"]
    if MNIST_ROWS[label] != "qkv":
        columns += ["paired_diff_pp", "paired_ci95_low", "paired_ci95_high"]
    quoted = numbers(cells[1]) + numbers(cells[2])
    assert len(quoted) == len(columns)
    for q, column in zip(quoted, columns):
        assert agrees(q, s[column]), (label, column, q, s[column])


@pytest.mark.parametrize("label,model", [("MiniLM-L6 (BERT)", "minilm-l6"), ("SmolLM2-135M (LLaMA)", "smollm2-135m")])
def test_findings_frequency_table_equals_the_profile_csv(label, model):
    p = pd.read_csv(RESULTS / model / "frequency_profile.csv")
    cells = row(FINDINGS, label)
    assert agrees(cells[2], len(p))
    tests = pd.read_csv(RESULTS / "families" / "family_tests.csv")
    t = tests[(tests.model == model) & (tests.weights == "trained") & (tests.null == "gaussian_layer_means")].iloc[0]
    quoted = numbers(cells[3])
    assert len(quoted) == 5, quoted
    for q, v in zip(quoted, (t.k, t.family_p, t.replication_ari, t.replication_lo, t.replication_hi)):
        assert agrees(q, v), (label, q, v)
    assert agrees(cells[4], p.hf_ratio.std())
    assert agrees(cells[5], p.sink_mass.mean())
    assert agrees(numbers(cells[6])[0], int((p.sink_mass > 0.9).sum()))


def _families(model: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = pd.read_csv(RESULTS / model / "frequency_profile.csv")
    by = p.groupby("cluster").agg(n=("head", "size"), hf=("hf_ratio", "mean"), dist=("mean_attention_distance", "mean"))
    return p, by.sort_values("hf")


def _shift(model: str) -> tuple[pd.Series, pd.Series]:
    s = pd.read_csv(RESULTS / model / "frequency_shift_q_bias.csv")
    d = s.delta_mean_attention_distance
    return d, s.loc[d.abs().idxmax()]


def test_dinov2_frequency_families_and_q_shift_equal_their_csvs():
    """Findings' DINOv2 frequency claims (families, their hf_ratio and distance, the b_q shift) are
    read from frequency_profile.csv / frequency_shift_q_bias.csv (they said 3 families after the CSV had 2)."""
    p, by = _families("dinov2-s14")
    d, top = _shift("dinov2-s14")
    tests = pd.read_csv(RESULTS / "families" / "family_tests.csv")
    t = tests[(tests.model == "dinov2-s14") & (tests.weights == "trained")
              & (tests.null == "gaussian_layer_means")].iloc[0]
    families = [r for r in FINDINGS.splitlines() if r.startswith("| DINOv2-S/14 |") and "families by frequency" in r]
    nums = numbers(families[0].split("|")[2])
    assert len(nums) == 9, nums  # 199 draws, p, photographs, ARI [lo, hi], "2 families", 52-92 px
    quoted = dict(zip(("draws", "p", "items", "ari", "lo", "hi"), nums[:6]))
    assert int(quoted["draws"]) == t.n_null and int(quoted["items"]) == t.n_items and int(t.k) == 1
    for name, value in (("p", t.family_p), ("ari", t.replication_ari), ("lo", t.replication_lo),
                        ("hi", t.replication_hi)):
        assert agrees(quoted[name], value), (name, quoted[name], value)
    layer_means = p.groupby("layer").mean_attention_distance.mean()
    assert agrees(nums[-2], layer_means.min()) and agrees(nums[-1].lstrip("-"), layer_means.max())
    shift = [r for r in FINDINGS.splitlines() if r.startswith("| DINOv2-S/14 |") and "b_q out makes it" in r][0]
    nums = numbers(shift.split("|")[2])
    assert len(nums) == 7, nums
    assert all(agrees(q, v) for q, v in zip(nums, [d.mean(), d.median(), d.abs().max(), top.layer, top["head"],
                                                    top.mean_attention_distance_intact, top.mean_attention_distance]))
    sentence = FINDINGS[FINDINGS.index("Patching each DINOv2-S/14 head's b_q"):FINDINGS.index("But ViTs trained")]
    nums = numbers(sentence.replace("DINOv2-S/14", ""))  # the families: tests/test_docs_families.py
    assert len(nums) == 4 and all(agrees(q, v) for q, v in zip(nums, [d.mean(), d.abs().max(), top.layer,
                                                                      top["head"]])), nums


def test_minilm_q_shift_sentence_equals_its_csv():
    d, _ = _shift("minilm-l6")
    sentence = FINDINGS[FINDINGS.index("In MiniLM, patching each"):]
    mean, largest = numbers(sentence)[:2]
    assert agrees(mean, d.mean()) and agrees(largest, d.abs().max())


def test_findings_mnist_trio_spreads_equal_notebook_05s_table():
    """The MNIST trio's families and hf_ratio spreads are printed by notebook 05 (its rendered copy in
    docs/notebooks/ is regenerated by `make notebooks-docs`); findings quote that table."""
    rendered = (ROOT / "docs" / "notebooks" / "05_claims.md").read_text()
    table = rendered[rendered.index("<th>hf_ratio_spread</th>"):]
    cells = {m: re.findall(r"<td>([^<]*)</td>", table[table.index(f"<th>{m}</th>"):])[:3]
             for m in ("mnist-vit", "mnist-vit-nobias", "mnist-vit-qv")}
    sentence = FINDINGS[FINDINGS.index("in the MNIST trio"):FINDINGS.index("no k-means count is a number")]
    nums = numbers(sentence)
    batch = int(re.search(r"builtin_batches\(m, 'mnist', batch_size=(\d+)", rendered).group(1))
    n_batches = int(re.search(r"frequency_profile\(m, mnist\[name\]\[:(\d+)\]", rendered).group(1))
    assert nums[:2] == [str(batch * n_batches), "05"], (nums, batch, n_batches)  # the images the profiles read
    cells = {m: re.findall(r"<td>([^<]*)</td>", table[table.index(f"<th>{m}</th>"):])[:4] for m in cells}
    spreads, family_ps = nums[2:5], nums[-3:]  # columns: families, family_p, layer_p, hf_ratio_spread
    assert spreads == [cells[m][3] for m in cells] and family_ps == [cells[m][1] for m in cells], (nums, cells)
    assert all(cells[m][0] == "False" for m in cells)  # no families: what the sentence says


SINK_MODELS = ("minilm-l6", "smollm2-135m", "dinov2-s14", "mnist-vit", "mnist-vit-nobias", "mnist-vit-qv")


@pytest.mark.parametrize("model", [m for m in SINK_MODELS if f"| `{m}` |" in FINDINGS])
def test_findings_sinks_table_equals_its_csvs(model):
    """Claim 4 revisited: every number in a row of the implicit-biases table is read from the model's CSVs
    (experiments/sinks_real.py)."""
    folder = RESULTS / model
    shares = pd.read_csv(folder / "sinks_shares.csv").set_index("position")
    implicit = pd.read_csv(folder / "sinks_implicit.csv")
    massive = pd.read_csv(folder / "sinks_massive.csv")
    sink = "first" if "first" in shares.index else "cls"
    top = massive.loc[massive.abs_value.idxmax()]
    cells = row(FINDINGS, f"`{model}`")
    assert agrees(cells[2], shares.n_heads.iloc[0]) and cells[3].startswith(sink)
    assert agrees(numbers(cells[3])[0], 100 * shares.share[sink])
    if "share_without_key_prior" in shares.columns:
        assert agrees(numbers(cells[3])[1], 100 * shares.share_without_key_prior[sink])
    assert agrees(numbers(cells[4])[0], 100 * shares.share["top_content"])
    assert agrees(cells[5], implicit.implicit_norm.median())
    assert cells[6] == "none" if not implicit.has_b_v.any() else agrees(cells[6], implicit.explicit_norm.median())
    assert agrees(cells[7], implicit.output_rms.median())
    value, layer = numbers(cells[8])[:2]
    assert agrees(value, top.abs_value) and agrees(layer, top.layer)
    assert agrees(cells[9], top.ratio_to_median) and agrees(cells[10], massive.massive.sum())
    header = [line for line in FINDINGS.splitlines() if line.startswith("| model | QKV bias | heads | sink heads")]
    assert "| largest residual value (layer l: `blocks.l.hook_resid_post`) |" in header[0]  # issue 37: one residual point
    assert top.hook == f"blocks.{int(layer)}.hook_resid_post"


IMPLICIT_MODELS = ("minilm-l6", "dinov2-s14", "smollm2-135m")


def _largest(part: pd.DataFrame) -> pd.Series:
    return part.loc[part.delta.abs().idxmax()]


@pytest.mark.parametrize("model", [m for m in IMPLICIT_MODELS if f"| `{m}`, implicit |" in FINDINGS])
def test_findings_implicit_table_equals_its_csvs(model):
    """Claim 4 revisited, high-norm tokens and the implicit biases ablated: every number of the row is read
    from sinks_high_norm.csv (tools/sink_figures.py) and ablation_implicit.csv
    (experiments/ablate_implicit_real.py)."""
    hn = pd.read_csv(RESULTS / model / "sinks_high_norm.csv")
    per = hn.drop_duplicates("layer").assign(r=lambda f: f.norm_max / f.norm_median)
    cells = row(FINDINGS, f"`{model}`, implicit")
    n, total = numbers(cells[1])
    assert agrees(n, int((per.n_outliers > 0).sum())) and agrees(total, len(per))
    top = per.loc[per.r.idxmax()]
    assert [agrees(q, v) for q, v in zip(numbers(cells[2]), (top.r, top.layer))] == [True, True]
    header = row(FINDINGS, "model, implicit")
    assert "(layer l: `blocks.l.hook_resid_post`)" in header[2] and set(per.hook) == {
        f"blocks.{layer}.hook_resid_post" for layer in per.layer}  # issue 37: the massive table's convention
    kept = hn.dropna(subset=["norm"])
    if kept.empty:
        assert cells[3] == "none"
    else:
        assert [agrees(q, v) for q, v in zip(numbers(cells[3]), (kept.mass.mean(), per.mass_mean.iloc[0]))] == [True] * 2
    path = RESULTS / model / "ablation_implicit.csv"
    if not path.exists():
        assert cells[4:] == ["not run"] * 3
        return
    zero = pd.read_csv(path).query("method == 'zero'")
    for cell, kind in zip(cells[4:6], ("v", "sink_v")):
        part = zero[zero.kind == kind]
        if part.empty:
            assert cell == "no b_v"
            continue
        top = _largest(part)
        assert [agrees(q, v) for q, v in zip(numbers(cell), (abs(top.delta), top.layer, top["head"]))] == [True] * 3
    massive = zero[zero.kind == "massive"]
    if (massive.identity.fillna("") != "").all():
        assert cells[6] == "none flagged"
    else:
        top = _largest(massive[massive.identity.fillna("") == ""])
        assert [agrees(q, v) for q, v in zip(numbers(cells[6]), (abs(top.delta), top.layer))] == [True] * 2


def test_findings_smollm2_high_norm_sentence_equals_its_csv():
    """Findings 4b's prose on SmolLM2's high-norm tokens (issue 31: it said "40 to 177 times from layer 12 on",
    but layer 29's is 15x, and "0.54 of a head's attention", which is over every high-norm token, not the first
    token's from layer 12): every number is read from sinks_high_norm.csv."""
    hn = pd.read_csv(RESULTS / "smollm2-135m" / "sinks_high_norm.csv")
    rows = hn.dropna(subset=["norm"])
    text = " ".join(FINDINGS[FINDINGS.index("SmolLM2's high-norm tokens are its sink"):].split()[:150])
    said = re.search(r"from layer (\d+) on, the first token of every window .* has a norm (\d+) to (\d+) times the "
                     r"layer's median \(the layer's largest: (\d+) at layer (\d+), falling layer by layer to (\d+) at "
                     r"layer (\d+) and (\d+) at layer (\d+)\) and receives on average ([\d.]+) of a head's attention, "
                     r"(\d+) times an average token's share \(([\d.]+) over all high-norm tokens, the table's cell\); "
                     r"layers (\d+) to (\d+) also carry (\d+) to (\d+) milder ones \((\d+)-(\d+)x\)", text)
    assert said, text
    (start, lo, hi, top, top_layer, late, late_layer, last, last_layer, mass, times, mass_all, mild_a, mild_b,
     n_lo, n_hi, r_lo, r_hi) = said.groups()
    first = rows[rows.layer >= int(start)]
    n_windows = rows.sequence.nunique()  # 2 batches of 4 windows; every window has high-norm tokens somewhere
    per_layer = first.groupby("layer")
    assert (first.position == 0).all() and (per_layer.sequence.nunique() == n_windows).all()  # every window's first
    assert agrees(lo, first.ratio_to_median.min()) and agrees(hi, first.ratio_to_median.max())
    largest = per_layer.ratio_to_median.max()
    assert largest.is_monotonic_decreasing and largest.index[0] == int(start)
    for q, layer in ((top, top_layer), (late, late_layer), (last, last_layer)):
        assert agrees(q, largest[int(layer)]), (q, layer, largest[int(layer)])
    assert int(last_layer) == largest.index[-1] == hn.layer.max()
    assert agrees(mass, first.mass.mean()) and agrees(times, first.mass.mean() / hn.mass_mean.iloc[0])
    assert agrees(mass_all, rows.mass.mean())
    mild = rows[rows.layer.between(int(mild_a), int(mild_b))]
    counts = mild.groupby("layer").size()
    assert list(counts.index) == list(range(int(mild_a), int(mild_b) + 1)) and counts.index.max() < int(start)
    assert agrees(n_lo, counts.min()) and agrees(n_hi, counts.max())
    assert agrees(r_lo, mild.ratio_to_median.min()) and agrees(r_hi, mild.ratio_to_median.max())
    same = re.search(r"the first massive value and the first sink-token outlier are both after block (\d+) "
                     r"\(`blocks\.(\d+)\.hook_resid_post`.* after block (\d+) no block reads the token, so layer (\d+) "
                     r"has no attention mass", text)
    assert same, text
    massive = pd.read_csv(RESULTS / "smollm2-135m" / "sinks_massive.csv")
    flagged = massive[massive.massive]
    assert int(same[1]) == int(same[2]) == flagged.layer.min() == int(start)  # one layer for the one jump
    assert set(flagged.hook) == {f"blocks.{layer}.hook_resid_post" for layer in flagged.layer}
    assert int(same[3]) == int(same[4]) == hn.layer.max() and rows[rows.layer == hn.layer.max()].mass.isna().all()


def test_readme_key_prior_cls_sentence_equals_origin_shift_csv():
    """Findings' DINOv2 key-prior row (issue 31: it said "median 0.16" where the CSV's median is 0.150): the
    largest cos(u, CLS) and its head, the count above 0.5, the median, and MiniLM's largest |cos(u, position)|."""
    said = re.search(r"cos\(u, CLS\) ([\d.]+) at layer (\d+) head (\d+), above 0\.5 in (\d+) of (\d+) heads \(median "
                     r"([\d.]+)\); MiniLM's u reaches cos ([\d.]+) with a position embedding \(layer (\d+) head (\d+)\)",
                     FINDINGS)
    assert said
    top, layer, head, above, total, median, mini, mini_layer, mini_head = said.groups()
    cos = pd.read_csv(RESULTS / "dinov2-s14" / "origin_shift.csv").dropna(subset=["cos_key_prior_cls"])
    best = cos.loc[cos.cos_key_prior_cls.idxmax()]
    assert agrees(top, best.cos_key_prior_cls) and (int(layer), int(head)) == (best.layer, best["head"])
    assert int(above) == (cos.cos_key_prior_cls > 0.5).sum() and int(total) == len(cos)
    assert agrees(median, cos.cos_key_prior_cls.median())
    pos = pd.read_csv(RESULTS / "minilm-l6" / "origin_shift.csv").dropna(subset=["max_abs_cos_key_prior_pos"])
    best = pos.loc[pos.max_abs_cos_key_prior_pos.idxmax()]
    assert agrees(mini, best.max_abs_cos_key_prior_pos) and (int(mini_layer), int(mini_head)) == (best.layer, best["head"])


def test_readme_quotes_the_suite_timings_from_their_csv():
    """docs/development.md: the suite timed in one session (docs/results/suite_time/timings.csv)."""
    t = pd.read_csv(RESULTS / "suite_time" / "timings.csv").set_index("suite")
    text = " ".join(DEVELOPMENT.split())

    def minutes(seconds: float) -> str:
        return f"{int(seconds // 60)} min {round(seconds % 60)} s"

    before, tiers, unit = t.loc["previous release"], t.loc["tiers"], t.loc["unit tier"]
    assert f"previous release's suite ({before['items']:,} items" in text
    assert f"took {minutes(before.pytest_seconds)} of pytest" in text
    assert f"with test tiers ({tiers['items']:,} items" in text and f"{minutes(tiers.pytest_seconds)} of pytest" in text
    assert f"{minutes(tiers.make_test_seconds)} for `make test`" in text
    assert f"{tiers.user_cpu_seconds:,.0f} s user + {tiers.sys_cpu_seconds:.0f} s system" in text
    assert f"(`pytest -n 2`, {unit['items']:,} tests) {minutes(unit.pytest_seconds)}" in text
    # the one-thread change, before and after in one session; then `make test` whole
    slow, fast, make = t.loc["before one-thread children"], t.loc["one-thread children"], t.loc["make test"]
    assert slow["items"] == fast["items"] and slow.workers == fast.workers == 2
    assert (f"{slow['items']:,} items took {minutes(slow.pytest_seconds)} of pytest "
            f"({slow.user_cpu_seconds:,.0f} s user + {slow.sys_cpu_seconds:.0f} s system)") in text
    assert (f"and {minutes(fast.pytest_seconds)} after ({fast.user_cpu_seconds:.0f} s user + "
            f"{fast.sys_cpu_seconds:.0f} s system)") in text
    assert f"took {minutes(make.make_test_seconds)}, {minutes(make.pytest_seconds)} of it pytest" in text
    latest = t.loc["pytest issues 38-40"]
    assert (f"idle, {latest['items']:,} items: {minutes(latest.pytest_seconds)} of pytest "
            f"({latest.user_cpu_seconds:,.0f} s user") in text
    again = t.loc["make test again"]
    assert (f"with {again['items']:,} items, {minutes(again.make_test_seconds)} ({minutes(again.pytest_seconds)} of "
            f"pytest, {again.user_cpu_seconds:.0f} s user CPU against {make.user_cpu_seconds:.0f} s)") in text
    assert max(make.make_test_seconds, again.make_test_seconds) < 600, "the goal: `make test` under 10 minutes here"
    latest = t.loc["make test issue 37"]
    assert (f"idle, {latest['items']:,} items: `make test` {minutes(latest.make_test_seconds)} "
            f"({minutes(latest.pytest_seconds)} of pytest, {latest.user_cpu_seconds:.0f} s user CPU)") in text
    assert latest.make_test_seconds < 600
    trimmed = t.loc["make test trimmed"]
    assert (f"{trimmed['items']:,} items: `make test` {minutes(trimmed.make_test_seconds)} "
            f"({minutes(trimmed.pytest_seconds)} of pytest, {trimmed.user_cpu_seconds:.0f} s user CPU)") in text
    assert trimmed.make_test_seconds < 600


def test_findings_value_bias_comparison_is_in_normalised_units():
    """Issue 37: findings 4b compared SmolLM2's implicit value bias with MiniLM's explicit b_v W_O in raw norms
    ("more than ten times"), across two residual streams of different scale. The verdict now quotes both as a
    share of the median token norm after the head's block (sinks_massive.csv), the raw ratio beside them."""
    said = re.search(r"as MiniLM's explicit \|\|b_v W_O\|\|: ([\d.]+)% and ([\d.]+)% of the median token norm after the "
                     r"head's block \(`norm_median` of `sinks_massive.csv`; the raw norms, ([\d.]+) and ([\d.]+), differ "
                     r"(\d+)-fold", " ".join(FINDINGS.split()))
    assert said, "findings 4b's verdict lost its normalised value-bias comparison"
    medians = {}
    for model in ("smollm2-135m", "minilm-l6"):
        implicit = pd.read_csv(RESULTS / model / "sinks_implicit.csv")
        massive = pd.read_csv(RESULTS / model / "sinks_massive.csv")
        assert set(massive.hook) == {f"blocks.{layer}.hook_resid_post" for layer in massive.layer}
        scale = implicit.layer.map(massive.drop_duplicates("layer").set_index("layer").norm_median)
        column = "implicit_norm" if model == "smollm2-135m" else "explicit_norm"
        medians[model] = (100 * (implicit[column] / scale).median(), implicit[column].median())
    (smol_rel, smol_raw), (mini_rel, mini_raw) = medians["smollm2-135m"], medians["minilm-l6"]
    assert [agrees(q, v) for q, v in zip(said.groups(), (smol_rel, mini_rel, smol_raw, mini_raw, smol_raw / mini_raw))] \
        == [True] * 5, (said.groups(), medians)


def test_readme_matched_control_figures_equal_ablation_control_csv():
    """Findings' matched-control counts and example come from docs/results/minilm-l6/ablation_control.csv."""
    t = pd.read_csv(RESULTS / "minilm-l6" / "ablation_control.csv")
    top = t.assign(a=t.delta.abs()).nlargest(10, "a")
    text = re.search(r"\*\*(\d+) of the (\d+)\s+largest exact effects are bias-dependent\*\* .*? p = ([\d.]+), the "
                     r"smallest (\d+) draws allow\), (\d+) of the (\d+) heads run exactly; e\.g\. L(\d+) H(\d+) ([qkv]) "
                     r"([-\d.e]+)\s+against a control band of \[([-\d.e]+), ([-\d.e]+)\]\. .*?moved \*\*(\d+) of "
                     r"those (\d+)\*\* as much or more", FINDINGS, re.S)
    assert text, "findings' matched-control paragraph not found"
    dep, n_top, p, draws, dep_all, n_all, layer, head, kind, delta, lo, hi, as_large, n_top2 = text.groups()
    assert int(n_top) == int(n_top2) == len(top) == 10 and int(dep) == int(top.bias_dependent.sum())
    assert int(draws) == int(t.n_control.max()) == 19 and agrees(p, top.control_p.max())
    assert (int(dep_all), int(n_all)) == (int(t.bias_dependent.sum()), len(t))
    first = top.iloc[0]
    assert (int(layer), int(head), kind) == (first.layer, first["head"], first.kind)
    for quoted, value in zip((delta, lo, hi), (first.delta, first.control_lo, first.control_hi)):
        assert agrees(quoted, value), (quoted, value)
    assert int(as_large) == int((top.random_delta.abs() >= top.delta.abs()).sum())


def test_findings_spread_differences_equal_hf_spread_csv():
    """Findings 3's paired spread differences (with intervals) are read from hf_spread_differences.csv."""
    d = pd.read_csv(RESULTS / "families" / "hf_spread_differences.csv").set_index(["first", "second"])
    sentence = FINDINGS[FINDINGS.index("With intervals (`experiments/hf_spread.py`"):FINDINGS.index("These intervals cover")]
    quoted = [q for q in numbers(sentence.split("paired between models):")[1])]
    pairs = [("mnist-vit", "mnist-vit-nobias"), ("mnist-vit", "mnist-vit-qv"), ("digits-vit", "digits-vit-nobias")]
    assert len(quoted) == 9, quoted
    for i, pair in enumerate(pairs):
        row = d.loc[pair]
        for q, v in zip(quoted[3 * i:3 * i + 3], (row.difference, row.difference_lo, row.difference_hi)):
            assert agrees(q, v), (pair, q, v)
    assert d.loc[pairs[0]].difference_lo < 0 < d.loc[pairs[0]].difference_hi  # "no difference" only where it holds 0
    assert "256 images" in sentence and (d.loc[pairs].n_items == 256).all()


def test_readme_lm_families_and_spread_equal_their_csvs():
    t = pd.read_csv(RESULTS / "families" / "family_tests.csv")
    t = t[(t.weights == "trained") & (t.null == "gaussian_layer_means")].set_index("model")
    spread = pd.read_csv(RESULTS / "families" / "hf_spread.csv").set_index("model")
    d = pd.read_csv(RESULTS / "families" / "hf_spread_differences.csv").set_index(["first", "second"])
    line = [r for r in FINDINGS.splitlines() if r.startswith("| MiniLM-L6, SmolLM2-135M |")][0].split("|")[2]
    quoted = [q for q in numbers(line.replace("SmolLM2", "").replace("95% bootstrap over 24", "")) if q != "95"]
    expected = [t.family_p["minilm-l6"], t.family_p["smollm2-135m"]]
    for m in ("smollm2-135m", "minilm-l6"):
        expected += [spread.spread[m], spread.spread_lo[m], spread.spread_hi[m]]
    row = d.loc[("minilm-l6", "smollm2-135m")]
    expected += [-row.difference, -row.difference_hi, -row.difference_lo]
    assert len(quoted) >= len(expected), quoted
    for q, v in zip(quoted, expected):
        assert agrees(q, v), (q, v)


def test_readme_demo_time_is_the_measured_one():
    t = pd.read_csv(RESULTS / "demo" / "timing.csv").iloc[-1]
    text = " ".join(PERFORMANCE.split())
    minutes, seconds = divmod(round(t.wall_seconds), 60)
    quoted = f"({minutes} min {seconds} s on 2 cores, idle, `docs/results/demo/timing.csv`"
    assert quoted in text, quoted


def test_readme_quickstart_time_equals_its_csv():
    """The time of README's ten lines (docs/performance.md) is `benchmarks/quickstart_time.py`'s last run
    (docs/results/quickstart/timing.csv): total wall and CPU seconds, the load it ran under, the slowest line."""
    timing = pd.read_csv(RESULTS / "quickstart" / "timing.csv")
    total = timing[timing.line == "total"].iloc[0]
    said = re.search(r"The ten lines of the \[quickstart\]\([^)]*\) took ([\d.]+) s wall on (\d+) cores at a load average of ([\d.]+) "
                     r"\(([\d.]+) s of CPU time", PERFORMANCE)
    assert said, "docs/performance.md states the quickstart's time (benchmarks/quickstart_time.py --out ...)"
    wall, cores, load, cpu = said.groups()
    assert agrees(wall, total.wall_s) and int(cores) == total.cores and agrees(cpu, total.cpu_s)
    assert agrees(load, max(total.load_1min_before, total.load_1min_after))
    lines = [line for line in timing.line if line != "total"]
    block = re.search(r"## Ten lines\s+```python\n(.*?)```", README, re.S).group(1)
    code = [line.split("  #")[0].rstrip() for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert lines == code, "timing.csv was measured on another quickstart: rerun benchmarks/quickstart_time.py"


def test_readme_ablation_scale_equals_its_csv():
    """docs/performance.md's ablate_bias figures at 25m@128 are docs/results/scale/ablation_cpu.csv's rows: the code before the
    rework and the 25m row of the C kernel's last commit (the page's "then"), floor ratio and peaks."""
    table = pd.read_csv(RESULTS / "scale" / "ablation_cpu.csv")
    text = " ".join(PERFORMANCE.split())
    before = table[table.label == "before (36909f6), idle"].iloc[-1]
    said = re.search(r"Before the rework \(every stacked variant's full logits\): ([\d.]+)x its floor, peak "
                     r"([\d.]+) MB \(([\d.]+)x a forward's ([\d.]+) MB\)", text)
    assert said, "the performance page quotes the ablation before the rework"
    for quoted, value in zip(said.groups(), (before.ratio_floor, before.ablate_peak_mb, before.memory_ratio,
                                             before.forward_peak_mb)):
        assert agrees(quoted, value), (quoted, value)
    now = table.set_index("label").loc["fused tile sums (1924ba2), idle"]
    said = re.search(r'`stack="auto"` = (\d+)\): ([\d.]+)x its floor, peak ([\d.]+) MB \(([\d.]+)x a forward\); the '
                     r"one-pass estimate alone peaks at ([\d.]+) MB; the first call in a process peaks at ([\d.]+) MB",
                     text)
    assert said, "the performance page quotes the last ablation row"
    assert int(said.group(1)) == int(now.stack_used)
    for quoted, value in zip(said.groups()[1:], (now.ratio_floor, now.ablate_peak_mb, now.memory_ratio,
                                                 now.estimate_peak_mb, now.ablate_cold_peak_mb)):
        assert agrees(quoted, value), (quoted, value)
    before = table.set_index("label").loc["times at allocator defaults, warm peaks (0a11b77), idle"]
    assert_quoted(text, r"the row before that \(the metric with expm1\): ([\d.]+)x its floor, ([\d.]+) MB",
                  (before.ratio_floor, before.ablate_peak_mb), "the row before the metric without expm1")
    before = table.set_index("label").loc["exp(z - lse) in float64, tile buffers (b042a19), idle"]
    assert_quoted(text, r"Torch's eight passes over each tile, in float64: ([\d.]+)x its floor, ([\d.]+) MB",
                  (before.ratio_floor, before.ablate_peak_mb), "the row before the fused tile sums")
    # the timing harness: the allocator's fixed mmap threshold against its defaults
    said = re.search(r"the reworked sweep read ([\d.]+)x its floor so, and the same exact stage ([\d.]+)x", text)
    assert said, "the performance page quotes the two timing regimes"
    by_label = table.set_index("label")
    for quoted, label in zip(said.groups(), ("after (aa9bc7d), idle", "times at allocator defaults (ea092fc), idle")):
        assert agrees(quoted, by_label.loc[label, "ratio_floor"]), (quoted, label)


def test_readme_ablation_at_112m_equals_its_csv_and_profile():
    """docs/performance.md's ablate_bias figures at 112m@512 are ablation_cpu.csv's 112m row of the C kernel's last commit
    (floor ratio, peaks, patched forwards, stack) and the tiled head's seconds are ablation_profile_fused_112m.txt's
    patched_stack line, against the row's floor for the head (n_patched x head_s)."""
    table = pd.read_csv(RESULTS / "scale" / "ablation_cpu.csv")
    now = table.set_index("label").loc["112m, 1+1 exact heads, fused tile sums (1924ba2), idle"]
    text = " ".join(PERFORMANCE.split())
    assert_quoted(text, r"(\d+) patched forwards; `stack=\"auto\"` = (\d+)\): ([\d.]+)x its floor, peak ([\d.]+) MB "
                  r"\(([\d.]+)x a ([\d.]+) MB forward\), the one-pass estimate's ([\d.]+) MB",
                  (now.n_patched, now.stack_used, now.ratio_floor, now.ablate_peak_mb, now.memory_ratio,
                   now.forward_peak_mb, now.estimate_peak_mb), "the 112m@512 ablation row")
    profile = (RESULTS / "scale" / "ablation_profile_fused_112m.txt").read_text().splitlines()
    line = next(line for line in profile if line.rstrip().endswith("(patched_stack)"))
    said = re.search(r"the tiled head ([\d.]+) s against the floor's ([\d.]+) s", text)
    assert said, "the performance page quotes the tiled head against its floor"
    assert agrees(said.group(1), float(line.split()[3]))  # cumtime
    assert agrees(said.group(2), now.n_patched * now.head_s)
    before = table.set_index("label").loc["112m, 1+1 exact heads (b042a19), idle"]
    assert_quoted(text, r"\(before the fused tile sums: ([\d.]+)x\)", (before.ratio_floor,),
                  "the 112m row before the fused sums")


def test_readme_checkpointed_estimate_equals_its_csvs():
    """docs/performance.md's figures for the checkpointed one-pass estimate at 112m@512 are
    ablation_phases_checkpoint_cpu.csv's (peaks) and estimate_time_cpu.csv's (time / HF forward and backward)."""
    text = " ".join(PERFORMANCE.split())
    phases = pd.read_csv(RESULTS / "scale" / "ablation_phases_checkpoint_cpu.csv")
    phases = phases[phases["size"] == "112m"].set_index(["code", "phase"])
    said = re.search(r"the one-pass estimate ([\d.]+) -> ([\d.]+) MB against a ([\d.]+) MB forward \(([\d.]+)x\), "
                     r"the intact run ([\d.]+)x, the exact stage ([\d.]+)x", text)
    assert said, "the performance page quotes the checkpointed estimate's peaks"
    want = [phases.loc[("before", "_run_estimate"), "peak_mb"], phases.loc[("after", "_run_estimate"), "peak_mb"],
            phases.loc[("after", "_run_estimate"), "forward_mb"], phases.loc[("after", "_run_estimate"), "ratio"],
            phases.loc[("after", "_run_intact"), "ratio"], phases.loc[("after", "_exact"), "ratio"]]
    for quoted, value in zip(said.groups(), want):
        assert agrees(quoted, value), (quoted, value)
    assert agrees(re.search(r"one item's backward through 12 blocks would hold ([\d.]+)x", text).group(1),
                  phases.loc[("before", "_run_estimate"), "ratio"])
    times = pd.read_csv(RESULTS / "scale" / "estimate_time_cpu.csv")
    times = times[times["size"] == "112m"].set_index("code")
    said = re.search(r"estimate_time_cpu.csv`: ([\d.]+)x -> ([\d.]+)x an HF forward and backward", text)
    assert said, "the performance page quotes the checkpointed estimate's time"
    for quoted, code in zip(said.groups(), ("before", "after")):
        assert agrees(quoted, times.loc[code, "ratio_fwd_bwd"]), (quoted, code)


def test_readme_ablation_phases_equal_their_csv():
    """docs/performance.md's per-phase peaks of ablate_bias, before and after, are docs/results/scale/ablation_phases_cpu.csv's."""
    table = pd.read_csv(RESULTS / "scale" / "ablation_phases_cpu.csv").set_index(["code", "phase"])
    text = " ".join(PERFORMANCE.split())
    said = re.search(r"a forward ([\d.]+) MB\): the intact run ([\d.]+) -> ([\d.]+) MB, the one-pass estimate ([\d.]+) "
                     r"-> ([\d.]+) MB, the exact stage \(one head and 7 control draws\) ([\d.]+) -> ([\d.]+) MB", text)
    assert said, "the performance page quotes the per-phase peaks"
    want = [table.loc[("before", "_run_intact"), "forward_mb"]] + [
        table.loc[(code, phase), "peak_mb"] for phase in ("_run_intact", "_run_estimate", "_exact")
        for code in ("before", "after")]
    for quoted, value in zip(said.groups(), want):
        assert agrees(quoted, value), (quoted, value)


def test_readme_score_decomposition_before_after_equals_its_csv():
    """docs/performance.md's paragraph on issue 40 item 2 quotes docs/results/scale/score_before_after.csv
    (benchmarks/score_before_after.py): per run, the wall, CPU and peak-memory ratios to a plain forward before
    (aa859e5) and after; the batches, threads and the load average the run saw; the largest table difference."""
    table = pd.read_csv(RESULTS / "scale" / "score_before_after.csv")
    for r in table.itertuples():
        quoted = [n for c in row(PERFORMANCE, f"{r.size}@{r.tokens}")[1:] for n in numbers(c)]
        expected = [r.before_wall_ratio, r.after_wall_ratio, r.before_cpu_ratio, r.after_cpu_ratio,
                    r.before_memory_ratio, r.after_memory_ratio]
        assert len(quoted) == 6 and all(agrees(q, e) for q, e in zip(quoted, expected)), (r.size, quoted, expected)
    text = " ".join(PERFORMANCE.split())
    said = re.search(r"batch (\d+) x (\d+) batches, (\d+) CPU thread, at a 1-minute load average of ([\d.]+) to "
                     r"([\d.]+) on (\d+) cores", text)
    assert said, "the performance page states how score_before_after.csv was measured"
    loads = table[["load_1min_before", "load_1min_after"]].to_numpy()
    assert [int(x) for x in said.group(1, 2, 3)] == [table.batch_size[0], table.n_batches[0], table.threads[0]]
    assert agrees(said[4], loads.min()) and agrees(said[5], loads.max()) and int(said[6]) == table.cores[0]
    said = re.search(r"tables equal the first round's to ([\d.e-]+) on these float32 models", text)
    assert said and agrees(said[1], table.max_abs_diff.max()), "the performance page quotes the largest table difference"
