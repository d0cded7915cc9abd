"""Bring your own data: one test per format (files generated in a temp folder), the bad ones
included, streaming and per-rank reads."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import interp
from interp.errors import InputError
from interp.models import tiny_hf_model
from interp.data.sources import resolve_data


@pytest.fixture(scope="module")
def vit():
    return interp.load_model(tiny_hf_model("vit"), device="cpu")


@pytest.fixture(scope="module")
def lm():
    from transformers import AutoTokenizer

    from interp.models.zoo import ZOO

    tokenizer = AutoTokenizer.from_pretrained(ZOO["smollm2-135m"].folder())
    hf = tiny_hf_model("gpt2")
    hf.resize_token_embeddings(len(tokenizer))
    hf.config.n_positions = 64
    return interp.load_model(hf, device="cpu", tokenizer=tokenizer)


def write_images(folder, n, size=(40, 30), mode="RGB", fmt="PNG", classes=None, seed=0):
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        sub = folder / (classes[i % len(classes)] if classes else "")
        sub.mkdir(parents=True, exist_ok=True)
        channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
        pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
        img = Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)
        path = sub / f"img{i:03d}.{fmt.lower()}"
        img.save(path, fmt)
        paths.append(path)
    return paths


def batches_of(source):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(source)


def test_image_folder_sorted_recursive_with_class_labels(vit, tmp_path):
    write_images(tmp_path, 6, classes=["cat", "dog"])
    source = resolve_data(vit, tmp_path, batch_size=4)
    assert source.description.startswith(f"6 images from {tmp_path}/ (2 classes from subfolders)")
    batches = batches_of(source)
    assert [b.inputs.shape for b in batches] == [(4, 3, 32, 32), (2, 3, 32, 32)]
    # sorted: cat/img000, cat/img002, cat/img004, dog/img001, ... -> labels 0, 0, 0, 1, 1, 1
    assert torch.cat([b.labels for b in batches]).tolist() == [0, 0, 0, 1, 1, 1]
    stats = interp.record_qkv(vit, resolve_data(vit, tmp_path, batch_size=4), progress=False)
    assert stats.count(0) == 6 * 17


def test_images_match_the_preprocessing_by_hand(vit, tmp_path):
    [path] = write_images(tmp_path, 1, size=(50, 40))
    x = batches_of(resolve_data(vit, path))[0].inputs[0]
    img = np.asarray(Image.open(path).convert("RGB"))[:, 5:45]  # centre square crop of 40 x 50
    ref = torch.nn.functional.interpolate(torch.tensor(img / 255.0, dtype=torch.float32).permute(2, 0, 1)[None],
                                          size=(32, 32), mode="bilinear", antialias=True, align_corners=False)[0]
    mean, std = torch.tensor(interp.data.batch.IMAGENET_MEAN), torch.tensor(interp.data.batch.IMAGENET_STD)
    torch.testing.assert_close(x, (ref - mean[:, None, None]) / std[:, None, None], rtol=0, atol=1e-6)


def test_jpeg_webp_grayscale_rgba_and_mixed_sizes(vit, tmp_path):
    write_images(tmp_path / "a", 2, size=(64, 64), mode="L", fmt="JPEG")
    write_images(tmp_path / "b", 2, size=(20, 90), mode="RGBA", fmt="PNG")
    write_images(tmp_path / "c", 2, size=(33, 33), fmt="WEBP")
    batches = batches_of(resolve_data(vit, tmp_path, batch_size=8))
    assert batches[0].inputs.shape == (6, 3, 32, 32) and torch.isfinite(batches[0].inputs).all()


def test_corrupt_and_truncated_images_are_skipped_counted_and_named(vit, tmp_path):
    paths = write_images(tmp_path, 4)
    paths[1].write_bytes(b"not an image")
    paths[2].write_bytes(paths[2].read_bytes()[:60])  # truncated PNG
    source = resolve_data(vit, tmp_path)
    with pytest.warns(UserWarning, match=r"2 item\(s\) could not be read.*img001.*img002"):
        batches = list(source)
    assert source.skipped == 2 and batches[0].inputs.shape[0] == 2
    with pytest.raises(InputError, match=r"could not read .*img001\.png"):
        list(resolve_data(vit, tmp_path, strict=True))


def test_a_source_with_no_readable_item_says_which_it_skipped(vit, tmp_path):
    """Found in issue 23's second pass: a folder (or one image path) of unreadable images ended in
    "data is empty: no batches to process", the skipped files named only in a warning."""
    (tmp_path / "broken.png").write_bytes(b"not an image")
    for data in (tmp_path, tmp_path / "broken.png"):
        with pytest.raises(InputError, match=r"no item of the data could be read.*broken\.png \(Unidentified"):
            interp.record_qkv(vit, data, progress=False)


@pytest.mark.parametrize("name,text", [
    ("notes.txt", "hello there\n"), ("table.csv", "text,label\nhello there,1\n"),
    ("rows.jsonl", '{"text": "hello there"}\n')])
def test_a_utf8_byte_order_mark_is_not_text(lm, tmp_path, name, text):
    """Found in issue 23's second pass: a UTF-8 file starting with a byte order mark (Notepad, Excel's
    "CSV UTF-8") put U+FEFF into the first text (a .txt), the first column's name (a .csv: "no column
    'text'" when it was there) or failed the first JSON line."""
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    [batch] = batches_of(resolve_data(lm, tmp_path / name))
    expected = lm.tokenizer("hello there" + ("\n" if name.endswith(".txt") else ""))["input_ids"]
    assert batch.inputs[0].tolist() == expected


def test_empty_folder_and_empty_file(vit, lm, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("no images here")
    with pytest.raises(InputError, match="no images .* in .*empty"):
        resolve_data(vit, tmp_path / "empty")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(InputError, match="empty.txt is empty"):
        resolve_data(lm, tmp_path / "empty.txt")


def test_text_file_windows_padding_and_chunking(lm, tmp_path):
    long_paragraph = " ".join(f"word{i}" for i in range(200))
    (tmp_path / "corpus.txt").write_text(f"A short first paragraph.\n\n{long_paragraph}\n\nThe end.\n")
    source = resolve_data(lm, tmp_path / "corpus.txt", seq_len=32, batch_size=64)
    [batch] = batches_of(source)
    tok = lm.tokenizer
    expected = [tok(p, add_special_tokens=True)["input_ids"] for p in
                ("A short first paragraph.\n", long_paragraph + "\n", "The end.\n")]
    windows = [ids[i : i + 32] for ids in expected for i in range(0, len(ids), 32)]
    assert batch.inputs.shape == (len(windows), 32) and len(windows) > 3  # the long paragraph was chunked
    for row, window in enumerate(windows):
        assert batch.attention_mask[row].sum() == len(window)
        assert batch.inputs[row, : len(window)].tolist() == window
    stats = interp.record_qkv(lm, resolve_data(lm, tmp_path / "corpus.txt", seq_len=32), progress=False)
    assert stats.count(0) == sum(len(w) for w in windows)  # padding excluded


def test_non_utf8_text_and_too_long_seq_len(lm, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(InputError, match="latin1.txt is not UTF-8"):
        batches_of(resolve_data(lm, tmp_path / "latin1.txt"))
    (tmp_path / "ok.txt").write_text("hello")
    with pytest.raises(InputError, match="seq_len 100 is longer than .* 64 positions"):
        resolve_data(lm, tmp_path / "ok.txt", seq_len=100)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_tables_with_a_named_text_column(lm, tmp_path, fmt):
    rows = pd.DataFrame({"id": [1, 2, 3], "body": ["first text", "second, longer text", "third"]})
    path = tmp_path / f"corpus.{fmt}"
    {"jsonl": lambda: path.write_text("\n".join(json.dumps(r) for r in rows.to_dict("records"))),
     "csv": lambda: rows.to_csv(path, index=False), "parquet": lambda: rows.to_parquet(path)}[fmt]()
    [batch] = batches_of(resolve_data(lm, path, text_column="body", batch_size=8))
    assert batch.inputs.shape[0] == 3
    assert int(batch.attention_mask.sum()) == sum(len(lm.tokenizer(t)["input_ids"]) for t in rows.body)
    with pytest.raises(InputError, match="has no column 'text'; its columns: id, body"):
        resolve_data(lm, path)


def test_table_with_an_image_path_column(vit, tmp_path):
    paths = write_images(tmp_path / "imgs", 3)
    pd.DataFrame({"file": [str(p.relative_to(tmp_path)) for p in paths]}).to_csv(tmp_path / "t.csv", index=False)
    [batch] = batches_of(resolve_data(vit, tmp_path / "t.csv", image_column="file"))
    assert batch.inputs.shape == (3, 3, 32, 32)


def test_hf_dataset_numpy_and_dataloader(vit, lm):
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["one text", "another text here"]})
    [batch] = batches_of(resolve_data(lm, ds))
    assert batch.inputs.shape[0] == 2
    images = np.random.default_rng(0).integers(0, 256, (5, 40, 40, 3), dtype=np.uint8)
    assert interp.record_qkv(vit, images, progress=False).count(0) == 5 * 17
    loader = torch.utils.data.DataLoader(torch.randn(6, 3, 32, 32), batch_size=4)
    assert interp.record_qkv(vit, loader, progress=False).count(0) == 6 * 17


def test_modality_mismatch_and_unknown_paths(vit, lm, tmp_path):
    write_images(tmp_path, 1)
    with pytest.raises(InputError, match="holds images, but .* is a language model"):
        resolve_data(lm, tmp_path)
    with pytest.raises(InputError, match="unknown dataset or path 'nope'"):
        interp.record_qkv(vit, "nope", progress=False)


def test_each_rank_reads_only_its_items_and_the_shards_add_up(vit, tmp_path, monkeypatch):
    write_images(tmp_path, 7)
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda p, *a, **k: (opened.append(p.name), real_open(p, *a, **k))[1])
    whole = interp.record_qkv(vit, resolve_data(vit, tmp_path, batch_size=3), progress=False)
    opened.clear()
    shards = [interp.record_qkv(vit, resolve_data(vit, tmp_path, batch_size=3, rank=r, world=2), progress=False)
              for r in range(2)]
    # a batch (3 images) at a time: rank 0 reads batches 0 and 2, rank 1 batch 1; nothing twice
    assert opened == [f"img{i:03d}.png" for i in (0, 1, 2, 6, 3, 4, 5)]
    merged = shards[0].merge(shards[1])
    for kind in "qkv":
        torch.testing.assert_close(merged.mean(1, kind), whole.mean(1, kind), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(merged.cov(1, kind), whole.cov(1, kind), rtol=1e-10, atol=1e-12)


def test_the_pipeline_and_the_cli_take_a_folder(vit, tmp_path):
    from interp.cli import main as cli_main
    from interp.report.pipeline import make_context

    write_images(tmp_path / "imgs", 10)
    ctx = make_context(vit, str(tmp_path / "imgs"))
    assert [b.inputs.shape[0] for b in ctx.batches] == [4, 4, 2]  # every image, in batches of 4
    ctx = make_context(vit, str(tmp_path / "imgs"), quick=True, data_options=dict(batch_size=8))
    assert [b.inputs.shape[0] for b in ctx.batches] == [8]  # quick mode: one batch of the first 8 items
    assert cli_main(["record", "--model", "digits-vit", "--data", str(tmp_path / "imgs"), "--max-images", "6",
                     "--out", str(tmp_path / "out")]) == 0
    meta = json.loads((tmp_path / "out" / "manifest.json").read_text())["meta"]
    assert meta["data_description"].startswith("6 images from") and meta["skipped_items"] == 0
    assert interp.QKVStats.load(tmp_path / "out" / "qkv_stats.safetensors").count(0) == 6 * 17


def test_a_sentence_is_data_for_a_language_model_with_a_tokenizer(vit, lm):
    sentence = "The quick brown fox jumps over the lazy dog."
    stats = interp.record_qkv(lm, sentence, progress=False)
    assert stats.count(0) == len(lm.tokenizer(sentence)["input_ids"])
    bare = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    with pytest.raises(InputError, match=r"no tokenizer.*interp\.load_model\(model, tokenizer="):
        interp.record_qkv(bare, sentence, progress=False)
    with pytest.raises(InputError, match="unknown dataset or path"):
        interp.record_qkv(vit, sentence, progress=False)  # a vision model never reads a string as text


@pytest.mark.parametrize("name,content", [
    ("dup.csv", 'text,id,text\n"the first column",1,"the last column"\n'),
    ("dup.jsonl", '{"text": "the first value", "text": "the last value"}\n'),
    ("dup.parquet", None),
])
def test_a_text_column_named_twice_is_refused_not_guessed(lm, tmp_path, name, content):
    # issue 38: csv.DictReader took the last column of the name, json the last value, Parquet the first
    path = tmp_path / name
    if content is None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table([pa.array(["first"]), pa.array(["last"])], names=["text", "text"]), path)
    else:
        path.write_text(content)
    with pytest.raises(InputError, match=r"2 columns named 'text' \(columns 1, [23]\).*ambiguous.*text_column="):
        interp.record_qkv(lm, path, progress=False)


def test_a_repeated_name_of_another_column_reads_as_before(lm, tmp_path):
    path = tmp_path / "other.csv"
    path.write_text('text,n,n\n"one two",1,2\n')
    assert interp.record_qkv(lm, path, progress=False).count(0) == len(lm.tokenizer("one two")["input_ids"])


def _picture(seed=0, size=(24, 40)):
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def test_one_picture_gives_the_same_pixels_in_every_depth_and_container(vit, tmp_path):
    """issue 38 (adversarial pass): a 16-bit PNG went through convert("RGB"), which clips at 255 (a white
    image); an int64 or float copy of a uint8 picture was stretched by its own min and max."""
    from interp.data.batch import square_resize

    rgb = _picture()
    want = square_resize(rgb, 32)
    gray = rgb[..., 0]
    Image.fromarray(gray.astype(np.uint16) * 257).save(tmp_path / "g16.png")  # 16-bit grey: v * 257 = v / 255
    Image.fromarray(gray).save(tmp_path / "g8.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I;16")
    g16, g8 = (batches_of(resolve_data(vit, tmp_path / f"{n}.png"))[0].inputs for n in ("g16", "g8"))
    torch.testing.assert_close(g16, g8, rtol=0, atol=1e-5)
    for copy in (rgb.astype(np.int64), rgb.astype(np.float32) / 255, rgb.astype(np.uint16) * 257):
        torch.testing.assert_close(square_resize(copy, 32), want, rtol=0, atol=1e-6)
    rgba = np.concatenate([rgb, np.full((*rgb.shape[:2], 1), 7, np.uint8)], axis=-1)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    from_file = batches_of(resolve_data(vit, tmp_path / "a.png", normalize="none"))[0].inputs[0]
    torch.testing.assert_close(from_file, want, rtol=0, atol=1e-6)  # alpha dropped, as from the array
    stack = np.stack([rgb, rgb]).astype(np.uint16) * 257  # a uint16 array of images reads like uint8 ones
    torch.testing.assert_close(batches_of(resolve_data(vit, stack, normalize="none"))[0].inputs[1], want,
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("pixels,words", [
    (_picture().astype(np.float32), r"floats in \[0, 1\]; got float32 values in 0..255: scale them"),
    (_picture().astype(np.int64) - 10, r"got int64 values in -10..245"),
    (np.full((8, 8), np.nan, np.float32), r"NaN or inf among them"),
])
def test_pixels_that_are_not_pixel_values_are_one_input_error(vit, tmp_path, pixels, words):
    from interp.data.batch import square_resize

    with pytest.raises(InputError, match=words):
        square_resize(pixels, 32)
    with pytest.raises(InputError, match=words):
        interp.single_input(vit, pixels)


def test_a_float_image_file_out_of_range_is_said_not_skipped_as_unreadable(vit, tmp_path):
    pd.DataFrame({"image": ["f.tiff"]}).to_csv(tmp_path / "t.csv", index=False)
    Image.fromarray(_picture()[..., 0].astype(np.float32)).save(tmp_path / "f.tiff")  # mode F, values 0..255
    with pytest.raises(InputError, match=r"floats in \[0, 1\]; got float32 values in 0..255"):
        list(resolve_data(vit, tmp_path / "t.csv"))
    Image.fromarray(_picture()[..., 0].astype(np.float32) / 255).save(tmp_path / "f.tiff")  # in [0, 1]: read
    assert batches_of(resolve_data(vit, tmp_path / "t.csv"))[0].inputs.shape == (1, 3, 32, 32)


def test_single_input_reads_a_16_bit_image_as_its_8_bit_twin(vit):
    gray = _picture()[..., 0]
    deep, flat = (interp.single_input(vit, Image.fromarray(g)) for g in (gray.astype(np.uint16) * 257, gray))
    assert np.abs(deep.image - flat.image).max() <= 1e-5


def test_a_list_of_pil_images_reads_like_the_folder_of_them(vit, tmp_path):
    paths = write_images(tmp_path, 3, size=(40, 30))
    opened = [Image.open(p) for p in paths]
    folder, listed = (batches_of(resolve_data(vit, x))[0].inputs for x in (tmp_path, opened))
    torch.testing.assert_close(listed, folder, rtol=0, atol=0)
    a, b = (interp.record_qkv(vit, x, progress=False) for x in (tmp_path, tuple(opened)))
    torch.testing.assert_close(a.mean(0, "q"), b.mean(0, "q"), rtol=0, atol=0)


def test_a_numpy_array_of_texts_says_to_pass_a_list(lm):
    with pytest.raises(InputError, match=r"integer token ids \[N, pos\]; got <U3 \(2,\); texts go in a list"):
        interp.record_qkv(lm, np.array(["a b", "c d"]), progress=False)


def test_a_list_of_image_paths_a_generator_and_one_image_read_like_the_folder(vit, tmp_path):
    """issue 38 (round-five pass): a list of image paths was read as texts ("text cannot be its data"), a
    generator of PIL images was "cannot make a batch from Image"; both are the folder's pixels now."""
    paths = write_images(tmp_path, 3, size=(40, 30))
    folder = torch.cat([b.inputs for b in interp.iter_batches(vit, tmp_path)])
    for data in ([str(p) for p in paths], tuple(paths)):
        torch.testing.assert_close(torch.cat([b.inputs for b in interp.iter_batches(vit, data)]), folder,
                                   rtol=0, atol=0)
    lazily = torch.cat([b.inputs for b in interp.iter_batches(vit, (Image.open(p) for p in paths))])
    torch.testing.assert_close(lazily, folder, rtol=0, atol=0)
    one = torch.cat([b.inputs for b in interp.iter_batches(vit, Image.open(paths[1]))])
    torch.testing.assert_close(one, folder[1:2], rtol=0, atol=0)


def test_one_colour_image_as_an_array_is_not_read_as_many_gray_ones(vit):
    """issue 38 (round-five pass): a (64, 64, 3) uint8 array was analysed as 64 gray images 64 x 3 px."""
    picture = _picture(size=(64, 64))
    for image in (picture, np.concatenate([picture, picture[..., :1]], axis=-1)):
        with pytest.raises(InputError, match=r"looks like one colour image \[H, W, C\]: pass array\[None\]"):
            interp.record_qkv(vit, image, progress=False)
    torch.testing.assert_close(batches_of(resolve_data(vit, picture[None]))[0].inputs,
                               batches_of(resolve_data(vit, [Image.fromarray(picture)]))[0].inputs, rtol=0, atol=0)


def test_sets_file_paths_to_a_language_model_and_lists_of_arrays_are_said(lm, vit, tmp_path):
    """issue 38 (round-five pass): a set's order (so a capped run's texts) changed with the hash seed; a
    list of file paths was tokenised as text; a list of numpy arrays was "cannot make a batch"."""
    with pytest.raises(InputError, match="which has no order"):
        interp.record_qkv(lm, {"a cat sat", "a dog ran"}, progress=False)
    (tmp_path / "a.txt").write_text("a cat sat")
    for paths in ([tmp_path / "a.txt"], [str(tmp_path / "a.txt")]):
        with pytest.raises(InputError, match="file paths, and .* is a language model: pass one file"):
            interp.record_qkv(lm, paths, progress=False)
    with pytest.raises(InputError, match=r"not a list of them \(np.stack"):
        interp.record_qkv(vit, [_picture(), _picture(1)], progress=False)


def test_a_dict_batch_of_lists_reads_like_the_same_tensors(lm):
    """issue 38 (round-five pass): {"input_ids": [[...]]} (a tokenizer without return_tensors) was an
    InternalError ('list' object has no attribute 'detach')."""
    ids, mask = [[5, 6, 7, 8], [9, 10, 0, 0]], [[1, 1, 1, 1], [1, 1, 0, 0]]
    as_lists = interp.record_qkv(lm, {"input_ids": ids, "attention_mask": mask}, progress=False)
    as_tensors = interp.record_qkv(lm, {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)},
                                   progress=False)
    assert as_lists.count(0) == as_tensors.count(0) == 6
    torch.testing.assert_close(as_lists.mean(0, "q"), as_tensors.mean(0, "q"), rtol=0, atol=0)
    with pytest.raises(InputError, match="rows of equal length"):
        interp.record_qkv(lm, {"input_ids": [[5, 6, 7], [8]]}, progress=False)
