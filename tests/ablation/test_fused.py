"""The fused tile sums (``interp.ablation.fused``) equal the float64 formulas recomputed by brute force, give
``patched_stack`` the torch path's numbers, and a patch that changes nothing exactly KL 0."""

import platform
import shutil

import pytest
import torch

import interp
import interp.ablation.logits as logits
from interp.ablation import fused
from interp.data import Batch
from interp.record.hooks import block_hook
from interp.ablation import metrics
from interp.models import tiny_hf_model, tiny_inputs

HERE = shutil.which("gcc") is not None and platform.system() == "Linux" and platform.machine() == "x86_64"
pytestmark = pytest.mark.skipif(not HERE, reason="the kernel needs gcc on x86-64 Linux (make setup installs gcc)")


def _brute(z, zp, lse):
    """sum_v exp(z - lse) and sum_v exp(z_p - lse) (z - lse) per row, float64 from the float32 logits."""
    s = z.double() - lse.double()[None, :, None]
    p = (zp.double() - lse.double()[:, None]).exp()
    return s.exp().sum(-1), (p[None] * s).sum(-1)


@pytest.mark.parametrize("w", [1, 7, 8, 9, 100, 512, 1024])
@pytest.mark.parametrize("n", [1, 3])
def test_tile_sums_equal_the_float64_formulas(w, n):
    """A tile at an odd offset inside wider intact logits (strided rows), several variants: 1e-13 relative."""
    assert fused.kernel() is not None
    g = torch.Generator().manual_seed(w * 10 + n)
    rows, vocab, lo = 5, w + 13, 3
    zp = torch.randn(rows, vocab, generator=g) * 4
    z = (zp[:, lo:lo + w][None] + torch.randn(n, rows, w, generator=g)).contiguous()
    lse = torch.randn(rows, generator=g, dtype=torch.float64) + 3
    sum_exp = torch.full((n, rows), 0.5, dtype=torch.float64)  # the kernel adds to what is there
    sum_ps = torch.full((n, rows), -0.25, dtype=torch.float64)
    fused.tile_sums(z.view(n * rows, w), zp, lo, lse, sum_exp, sum_ps)
    want_exp, want_ps = _brute(z, zp[:, lo:lo + w], lse)
    torch.testing.assert_close(sum_exp, want_exp + 0.5, rtol=1e-13, atol=0)
    torch.testing.assert_close(sum_ps, want_ps - 0.25, rtol=1e-13, atol=1e-13)


def test_logits_equal_to_the_intact_ones_give_s_equal_p_and_b_zero_bit_for_bit():
    """The intact sums (``_fused_intact_sums``: the kernel with z = z_p over the same tiles) and a variant whose
    tiles repeat the intact logits exactly: S == P and sum p (z - lse) == sum p (z_p - lse), so KL == 0."""
    g = torch.Generator().manual_seed(1)
    rows, vocab = 6, 1500  # three tiles of 512, the last narrower
    zp = torch.randn(rows, vocab, generator=g) * 3
    lse = zp.double().logsumexp(-1)
    total_p, p_dot_log_p = torch.empty(rows, dtype=torch.float64), torch.empty(rows, dtype=torch.float64)
    logits._fused_intact_sums(zp, lse, total_p, p_dot_log_p)
    sum_exp, sum_ps = torch.zeros(2, rows, dtype=torch.float64), torch.zeros(2, rows, dtype=torch.float64)
    for lo in range(0, vocab, logits.TILE_VOCAB):
        tile = zp[:, lo:lo + logits.TILE_VOCAB]
        stacked = torch.cat([tile, tile + 0.5]).contiguous()  # a copy in the tile buffer's layout, and a shift
        fused.tile_sums(stacked, zp, lo, lse, sum_exp, sum_ps)
    assert torch.equal(sum_exp[0], total_p) and torch.equal(sum_ps[0], p_dot_log_p)
    assert not torch.equal(sum_exp[1], total_p)  # the premise: the shifted variant's sums differ


def test_threads_split_rows_without_changing_a_bit(monkeypatch):
    g = torch.Generator().manual_seed(0)
    rows, w = 37, 64
    zp = torch.randn(rows, w, generator=g)
    z = (zp[None] + 0.1 * torch.randn(2, rows, w, generator=g)).reshape(2 * rows, w)
    lse = zp.double().logsumexp(-1)
    results = []
    threads = torch.get_num_threads()
    for per_thread, n_threads in [(10**9, 1), (1, 4)]:
        monkeypatch.setattr(fused, "ROWS_PER_THREAD", per_thread)
        torch.set_num_threads(n_threads)
        try:
            sums = (torch.zeros(2, rows, dtype=torch.float64), torch.zeros(2, rows, dtype=torch.float64))
            fused.tile_sums(z, zp, 0, lse, *sums)
        finally:
            torch.set_num_threads(threads)
        results.append(sums)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_wrong_tiles_are_refused_with_what_is_taken():
    lse = torch.zeros(2, dtype=torch.float64)
    sums = (torch.zeros(1, 2, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"<= 1024\]"):
        fused.tile_sums(torch.zeros(2, 1025), torch.zeros(2, 1025), 0, lse, *sums)
    with pytest.raises(ValueError, match="z must be float32"):
        fused.tile_sums(torch.zeros(2, 8, dtype=torch.float64), torch.zeros(2, 8), 0, lse, *sums)
    with pytest.raises(ValueError, match="intact must be"):  # the tile would run past the intact logits
        fused.tile_sums(torch.zeros(2, 8), torch.zeros(2, 8), 4, lse, *sums)
    with pytest.raises(ValueError, match="lse must be float64"):
        fused.tile_sums(torch.zeros(2, 8), torch.zeros(2, 8), 0, lse.float(), *sums)
    with pytest.raises(ValueError, match="sum_exp and sum_ps"):
        fused.tile_sums(torch.zeros(2, 8), torch.zeros(2, 8), 0, lse, sums[0], sums[1].float())


@pytest.mark.parametrize("value", ["0", "false", "Off", " no "])
def test_interp_fused_switched_off_in_words(monkeypatch, value):
    """INTERP_FUSED=false (off, no) turns the kernel off as 0 does; it used to leave it on."""
    monkeypatch.setenv("INTERP_FUSED", value)
    fused.kernel.cache_clear()
    try:
        assert fused.kernel() is None
    finally:
        monkeypatch.delenv("INTERP_FUSED")
        fused.kernel.cache_clear()


def test_available_only_for_float32_rows_on_the_cpu(monkeypatch):
    assert fused.available(torch.zeros(3, 8))
    assert not fused.available(torch.zeros(3, 8, dtype=torch.float64))
    assert not fused.available(torch.zeros(8, 3).t())  # rows not contiguous
    monkeypatch.setenv("INTERP_FUSED", "0")
    fused.kernel.cache_clear()
    try:
        assert fused.kernel() is None and not fused.available(torch.zeros(3, 8))
    finally:
        monkeypatch.delenv("INTERP_FUSED")
        fused.kernel.cache_clear()
    assert fused.kernel() is not None


def test_the_compiled_library_is_cached_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    first = fused._compile(shutil.which("gcc"))
    assert first is not None and first.parent == tmp_path / "kernels"
    stamp = first.stat().st_mtime_ns
    assert fused._compile(shutil.which("gcc")) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [first.name]  # no temporary left behind


def _float32_stack(family, tile_vocab, monkeypatch):
    """A float32 tiny model, its intact logits (fused or not, as ``fused.available`` says) and three stacked
    variants' results, the middle one the intact run itself."""
    monkeypatch.setattr(logits, "TILE_VOCAB", tile_vocab)
    model = interp.load_model(tiny_hf_model(family, n_layers=2), device="cpu")
    ids = tiny_inputs(family, batch=3, pos=10, seed=0)
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    batch = Batch(ids, mask)

    def hidden_of(b):
        kept = {}
        with torch.no_grad():
            out, _ = metrics.run_forward(model, b, [(block_hook(model.interp.n_layers - 1, "hook_out"),
                                                     lambda t, hook: kept.update(h=t))], False)
        return kept["h"], out
    hidden, out = hidden_of(batch)
    unembedding = logits.linear_unembedding(model, hidden, out)
    intact = logits.intact_logits(model, hidden, batch, unembedding)
    stacked = torch.cat([hidden_of(Batch(tiny_inputs(family, batch=3, pos=10, seed=1), mask))[0], hidden,
                         hidden + 1e-3 * torch.randn(hidden.shape, generator=torch.Generator().manual_seed(0))])
    return intact, logits.patched_stack(model, unembedding, stacked, intact, 3)


@pytest.mark.parametrize("tile_vocab", [7, logits.TILE_VOCAB])
@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_patched_stack_gives_the_torch_paths_numbers(monkeypatch, tile_vocab, family):
    """float32 models: the fused sums and the torch arithmetic agree per variant (NLL sums 1e-12, KL 1e-9
    relative), and the unchanged variant's KL is 0 to rounding (its stacked matmul need not repeat the intact
    logits bit for bit)."""
    intact, got = _float32_stack(family, tile_vocab, monkeypatch)
    assert intact.fused
    monkeypatch.setattr(fused, "available", lambda t: False)
    plain, want = _float32_stack(family, tile_vocab, monkeypatch)
    assert not plain.fused
    torch.testing.assert_close(intact.total_p, plain.total_p, rtol=1e-14, atol=0)
    torch.testing.assert_close(intact.p_dot_log_p, plain.p_dot_log_p, rtol=1e-13, atol=1e-13)
    for (sums, kl), (want_sums, want_kl) in zip(got, want):
        torch.testing.assert_close(sums, want_sums, rtol=1e-12, atol=0)
        assert abs(float(kl) - float(want_kl)) <= 1e-9 * abs(float(want_kl)) + 1e-12
    assert abs(float(got[1][1])) < 1e-12 and float(got[0][1]) > 0 and float(got[2][1]) > 0


def test_tensors_whose_pointer_is_not_their_values_are_refused():
    """A fake tensor (no storage: its data_ptr is 0, which the kernel would dereference), a negated view (its
    pointer holds the values before the negation: the sums would silently be of -z) and a sparse tensor."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    lse, zp = torch.zeros(4, dtype=torch.float64), torch.randn(4, 16)

    def sums():
        return torch.zeros(1, 4, dtype=torch.float64), torch.zeros(1, 4, dtype=torch.float64)
    with FakeTensorMode():
        fake = torch.empty(4, 16)
        with pytest.raises(ValueError, match="intact has no storage"):
            fused.tile_sums(zp, fake, 0, lse, *sums())
    with pytest.raises(ValueError, match="z must be a plain strided tensor"):
        fused.tile_sums(torch._neg_view(zp), zp, 0, lse, *sums())
    with pytest.raises(ValueError, match="z must be a plain strided tensor"):
        fused.tile_sums(zp.to_sparse(), zp, 0, lse, *sums())


def test_outputs_sharing_memory_with_another_buffer_are_refused():
    """sum_exp and sum_ps as one tensor (each row's sums would be added into the other's), or an output over lse
    (rows read after other threads wrote them); two halves of one buffer are fine and give the brute-force sums."""
    g = torch.Generator().manual_seed(3)
    zp = torch.randn(4, 16, generator=g)
    lse = zp.double().logsumexp(-1)
    one = torch.zeros(1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="share memory"):
        fused.tile_sums(zp, zp, 0, lse, one, one)
    buffer = torch.zeros(2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="share memory"):
        fused.tile_sums(zp, zp, 0, buffer[0], buffer[:1], torch.zeros(1, 4, dtype=torch.float64))
    halves = torch.zeros(2, 1, 4, dtype=torch.float64)
    fused.tile_sums(zp, zp, 0, lse, halves[0], halves[1])
    want_exp, want_ps = _brute(zp[None], zp, lse)
    torch.testing.assert_close(halves[0], want_exp, rtol=1e-13, atol=0)
    torch.testing.assert_close(halves[1], want_ps, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("keep", [3000, 0])
def test_a_damaged_cached_library_is_compiled_again(monkeypatch, tmp_path, keep):
    """A cached library cut short (a crash before the file system wrote it out, a copy interrupted) is never
    handed to dlopen, which maps the missing pages and dies of SIGBUS, nor kept as a reason to fall back: its
    bytes no longer hash to its name, and a fresh compilation takes its place."""
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    first = fused._compile(shutil.which("gcc"))
    whole = first.read_bytes()
    first.write_bytes(whole[:keep])
    again = fused._compile(shutil.which("gcc"))
    assert again is not None and again.read_bytes() == whole


def test_worker_threads_do_not_pile_up_as_the_row_count_changes(monkeypatch):
    """Batches of different real lengths ask for different thread counts: one pool per process serves them all,
    so the workers alive never exceed the most any call used (a pool per count kept 1 + 2 + ... + 7 = 28 here,
    n (n - 1) / 2 on an n-core machine), and every split gives the one-thread sums."""
    import threading
    monkeypatch.setattr(fused, "ROWS_PER_THREAD", 1)
    g = torch.Generator().manual_seed(2)
    threads = torch.get_num_threads()
    torch.set_num_threads(8)
    try:
        for rows in range(2, 9):
            zp = torch.randn(rows, 32, generator=g)
            lse = zp.double().logsumexp(-1)
            sums = torch.zeros(1, rows, dtype=torch.float64), torch.zeros(1, rows, dtype=torch.float64)
            fused.tile_sums(zp, zp, 0, lse, *sums)
            want_exp, want_ps = _brute(zp[None], zp, lse)
            torch.testing.assert_close(sums[0], want_exp, rtol=1e-13, atol=0)
            torch.testing.assert_close(sums[1], want_ps, rtol=1e-13, atol=1e-13)
    finally:
        torch.set_num_threads(threads)
    workers = [t for t in threading.enumerate() if t.name.startswith("interp-tile-sums")]
    assert len(workers) <= 7


def test_ablate_bias_gives_the_same_table_with_the_kernel_and_with_interp_fused_0(monkeypatch):
    """The sweep end to end on a float32 tiny model (vocabulary 1,100: two full tiles and a narrower one; padded
    batches; q, k and v; random-direction controls): every float column (delta, kl, the control's statistics...)
    within 1e-9 relative (1e-14 absolute: sums of rounding near 0) of the run with INTERP_FUSED=0, and the rest
    equal. The first run is checked to have used the kernel, the second not to."""
    import numpy as np
    model = interp.load_model(tiny_hf_model("qwen2", n_layers=2, config={"vocab_size": 1100}), device="cpu")
    data = []
    for seed in range(2):
        ids = torch.randint(0, 1100, (3, 12), generator=torch.Generator().manual_seed(seed))
        mask = torch.ones_like(ids)
        mask[0, 8:] = 0
        mask[2, 10:] = 0
        data.append(Batch(ids, mask))
    calls = []
    plain_tile_sums = fused.tile_sums
    monkeypatch.setattr(fused, "tile_sums", lambda *a: calls.append(1) or plain_tile_sums(*a))
    tables = []
    for switch in ("1", "0"):
        monkeypatch.setenv("INTERP_FUSED", switch)
        fused.kernel.cache_clear()
        calls.clear()
        tables.append(interp.ablate_bias(model, data, kinds=("q", "k", "v"), estimate="exact", n_boot=20,
                                         n_control=4, progress=False))
        assert bool(calls) == (switch == "1")
    monkeypatch.delenv("INTERP_FUSED")
    fused.kernel.cache_clear()
    fused_table, torch_table = tables
    assert list(fused_table.columns) == list(torch_table.columns) and len(fused_table) == len(torch_table) > 0
    floats = [c for c in fused_table.columns if fused_table[c].dtype.kind == "f"]
    assert {"delta", "kl", "control_lo", "control_hi", "control_p"} <= set(floats)
    for column in floats:
        got, want = fused_table[column].to_numpy(float), torch_table[column].to_numpy(float)
        assert np.array_equal(np.isnan(got), np.isnan(want)), column
        assert np.all((np.abs(got - want) <= 1e-9 * np.abs(want) + 1e-14) | np.isnan(want)), column
    rest = [c for c in fused_table.columns if c not in floats]
    assert fused_table[rest].astype(str).equals(torch_table[rest].astype(str))


def test_a_tile_wider_than_the_kernels_scratch_keeps_torchs_arithmetic(monkeypatch):
    """TILE_VOCAB raised past MAX_TILE (1,024 entries of scratch a row) over a vocabulary of 1,100: the tiles
    are 1,100 wide, so the sums take torch's path (they raised ValueError), with the numbers of 512-wide fused
    tiles (NLL sums 1e-12, KL 1e-9 relative)."""
    model = interp.load_model(tiny_hf_model("qwen2", n_layers=2, config={"vocab_size": 1100}), device="cpu")
    ids = torch.randint(0, 1100, (2, 9), generator=torch.Generator().manual_seed(0))
    batch = Batch(ids, torch.ones_like(ids))
    kept = {}
    with torch.no_grad():
        out, _ = metrics.run_forward(model, batch, [(block_hook(1, "hook_out"), lambda t, hook: kept.update(h=t))],
                                     False)
    hidden = kept["h"]
    unembedding = logits.linear_unembedding(model, hidden, out)
    stacked = torch.cat([hidden, hidden + 1e-2 * torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))])
    results = []
    for tile_vocab in (2048, 512):
        monkeypatch.setattr(logits, "TILE_VOCAB", tile_vocab)
        intact = logits.intact_logits(model, hidden, batch, unembedding)
        assert intact.fused == (tile_vocab == 512)
        results.append(logits.patched_stack(model, unembedding, stacked, intact, 2))
    for (sums, kl), (want_sums, want_kl) in zip(*results):
        torch.testing.assert_close(sums, want_sums, rtol=1e-12, atol=0)
        assert abs(float(kl) - float(want_kl)) <= 1e-9 * abs(float(want_kl)) + 1e-12


def test_an_interrupt_waits_for_the_workers_before_the_tensors_can_be_freed(monkeypatch):
    """The worker threads write through raw pointers into the caller's tensors: a KeyboardInterrupt (Ctrl-C in a
    notebook) on the calling thread must not leave tile_sums, and let those tensors be freed, while a worker
    still runs. A stand-in kernel: the calling thread's share is interrupted, the workers' take 0.2 s."""
    import time
    finished = []

    def stand_in(*arguments):
        row_lo, row_hi = arguments[7], arguments[8]
        if row_hi == arguments[6]:  # the last share: the calling thread's
            raise KeyboardInterrupt
        time.sleep(0.2)
        finished.append(row_lo)
    monkeypatch.setattr(fused, "kernel", lambda: stand_in)
    monkeypatch.setattr(fused, "ROWS_PER_THREAD", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        zp = torch.zeros(6, 8)
        with pytest.raises(KeyboardInterrupt):
            fused.tile_sums(zp, zp, 0, torch.zeros(6, dtype=torch.float64), torch.zeros(1, 6, dtype=torch.float64),
                            torch.zeros(1, 6, dtype=torch.float64))
        assert sorted(finished) == [0, 2]  # both workers done before the interrupt left tile_sums
    finally:
        torch.set_num_threads(threads)


def test_tile_sums_without_the_kernel_says_so(monkeypatch):
    """Called where ``kernel()`` is None (INTERP_FUSED=0, no gcc): an error that names the cause, not
    "'NoneType' object is not callable"."""
    monkeypatch.setattr(fused, "kernel", lambda: None)
    zp = torch.zeros(2, 8)
    with pytest.raises(RuntimeError, match="kernel is not available"):
        fused.tile_sums(zp, zp, 0, torch.zeros(2, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64),
                        torch.zeros(1, 2, dtype=torch.float64))
