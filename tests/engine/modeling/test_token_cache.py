"""The token cache: a run reads the token ids a run before it tokenised, the same ids to the last one; another
tokenizer, max_length or text misses; a damaged entry is never used."""

import copy
import json
import logging

import numpy as np
import pytest
import torch

from biencoder.engine.modeling.encoding import TextEncoder, TokenizedTexts
from biencoder.engine.modeling.token_cache import TokenCache, _checksum
from biencoder.engine.training.inputs import EncoderInputs, RunData
from conftest import FAST, compose_cfg

#: one text longer than any max_length below (truncated), an empty one, accents, a CJK character, a literal special
#: token, and a word of several pieces
TEXTS = [
    "a counterargumentation about schools",
    "a counter about schools, " + "with many more words in it " * 20,
    "",
    "Café naïve — 学校 [SEP] end",
    "a point about schools",
]


def same_tokens(a: TokenizedTexts, b: TokenizedTexts) -> None:
    """Every row's ids equal (values and dtype), the lengths equal, and a padded batch of all rows equal."""
    assert len(a) == len(b)
    for x, y in zip(a.ids, b.ids, strict=True):
        assert x.dtype == y.dtype == np.int64
        np.testing.assert_array_equal(x, y)
    assert a.lengths.dtype == b.lengths.dtype and a.pad_id == b.pad_id
    np.testing.assert_array_equal(a.lengths, b.lengths)
    if len(a):
        rows = np.arange(len(a))[::-1]
        x, y = a.batch(rows), b.batch(rows)
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["attention_mask"], y["attention_mask"])
        assert x["padded"] == y["padded"]


@pytest.fixture
def no_tokenizing(monkeypatch):
    """From here on, any call of TokenizedTexts' tokenizing constructor fails the test."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("tokenised although the cache holds these texts")

    return lambda: monkeypatch.setattr(TokenizedTexts, "__init__", refuse)


def test_a_second_run_reads_the_ids_the_first_tokenised(tmp_path, tiny_model_and_tokenizer, no_tokenizing, caplog):
    _, tokenizer = tiny_model_and_tokenizer
    fresh = TokenizedTexts(TEXTS, tokenizer, 12)
    assert fresh.lengths.max() == 12  # the long text is truncated: the entry holds the truncated ids
    first, cached = TokenCache(tmp_path, tokenizer, 12).tokenized(TEXTS, "tokens val")
    assert not cached
    same_tokens(first, fresh)
    [entry] = (tmp_path / "tokens").glob("*.npz")
    no_tokenizing()
    with caplog.at_level(logging.INFO, logger="biencoder"):
        second, cached = TokenCache(tmp_path, tokenizer, 12).tokenized(TEXTS, "tokens val")  # a new run's cache
    assert cached and f"tokens val: token ids of 5 texts read from the token cache {entry}" in caplog.text
    same_tokens(second, fresh)


def test_the_entry_is_int32_ids_and_offsets(tmp_path, tiny_model_and_tokenizer):
    """Stored compactly: one int32 array of every row's ids and the N + 1 offsets where rows start."""
    _, tokenizer = tiny_model_and_tokenizer
    TokenCache(tmp_path, tokenizer, 12).tokenized(TEXTS)
    [entry] = (tmp_path / "tokens").glob("*.npz")
    fresh = TokenizedTexts(TEXTS, tokenizer, 12)
    with np.load(entry) as data:
        assert data["ids"].dtype == np.int32 and data["offsets"].dtype == np.int64
        np.testing.assert_array_equal(data["ids"], np.concatenate(fresh.ids))
        np.testing.assert_array_equal(data["offsets"], np.concatenate([[0], np.cumsum(fresh.lengths)]))


@pytest.mark.slow
def test_no_texts_round_trip(tmp_path, tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    TokenCache(tmp_path, tokenizer, 12).tokenized([])
    tokens, cached = TokenCache(tmp_path, tokenizer, 12).tokenized([])
    assert cached and len(tokens) == 0 and tokens.ids == [] and tokens.lengths.dtype == np.int64


def another_tokenizer(tokenizer, change: str):
    other = copy.deepcopy(tokenizer)
    if change == "vocabulary":
        other.add_tokens(["counterargumentation"])  # a whole word where the vocabulary had pieces: other ids
    else:
        other.truncation_side = "left"  # the same pipeline, the other end of a long text kept
    return other


@pytest.mark.slow
@pytest.mark.parametrize("change", ["max_length", "text", "order", "one text fewer", "vocabulary", "truncation side"])
def test_another_max_length_text_or_tokenizer_misses(tmp_path, tiny_model_and_tokenizer, change):
    """Each change gives other ids (checked), so reading the first entry would be wrong: it must miss, and the ids
    returned are the fresh tokenisation's."""
    _, tokenizer = tiny_model_and_tokenizer
    TokenCache(tmp_path, tokenizer, 12).tokenized(TEXTS)
    texts, max_length = list(TEXTS), 12
    if change == "max_length":
        max_length = 13
    elif change == "text":
        texts[0] = "a counterargumentation about school"
    elif change == "order":
        texts = texts[::-1]
    elif change == "one text fewer":
        texts = texts[:-1]
    else:
        tokenizer = another_tokenizer(tokenizer, change.split()[0])
    fresh = TokenizedTexts(texts, tokenizer, max_length)
    before = TokenizedTexts(TEXTS, tiny_model_and_tokenizer[1], 12)
    assert [a.tolist() for a in fresh.ids] != [b.tolist() for b in before.ids]
    tokens, cached = TokenCache(tmp_path, tokenizer, max_length).tokenized(texts)
    assert not cached
    same_tokens(tokens, fresh)
    assert len(list((tmp_path / "tokens").glob("*.npz"))) == 2  # the first entry stays for the runs that want it


def damage(entry, how: str) -> None:
    """Damage a cache entry as a crash, a disk or another program could."""
    if how == "truncated":
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    elif how == "garbage":
        entry.write_bytes(b"not an npz at all")
    else:
        with np.load(entry) as data:
            arrays = {k: data[k] for k in data.files}
        if how == "tampered ids":
            arrays["ids"] = arrays["ids"].copy()
            arrays["ids"][3] += 1  # the checksum no longer matches
        elif how == "other texts' entry":
            # sound in itself (its checksum matches), but the key of other texts: a copied file, a name collision
            meta = json.loads(str(arrays["meta"]))
            meta["texts"] = "0" * 64
            arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
        elif how == "offsets past max_length":
            # sound in itself, but a row of 13 tokens cannot be a tokenisation to 12
            arrays["offsets"] = arrays["offsets"].copy()
            arrays["offsets"][1:-1] = [13, 14, 15, 16]
        if how != "tampered ids":
            arrays["checksum"] = np.array(_checksum(arrays["ids"], arrays["offsets"], str(arrays["meta"])))
        with open(entry, "wb") as file:
            np.savez(file, **arrays)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("truncated", "cannot be read"),
        ("garbage", "cannot be read"),
        ("tampered ids", "fails its checksum"),
        ("other texts' entry", "carries another key"),
        ("offsets past max_length", "has rows of a negative length or longer than 12 tokens"),
    ],
)
def test_a_damaged_entry_is_tokenised_again_and_replaced(tmp_path, tiny_model_and_tokenizer, caplog, how, said):
    """A damaged entry is never trusted: one warning names it and why, the texts are tokenised again (the ids are
    the fresh ones) and a sound entry replaces it, which the next run reads."""
    _, tokenizer = tiny_model_and_tokenizer
    TokenCache(tmp_path, tokenizer, 12).tokenized(TEXTS)
    [entry] = (tmp_path / "tokens").glob("*.npz")
    damage(entry, how)
    with caplog.at_level(logging.WARNING, logger="biencoder"):
        tokens, cached = TokenCache(tmp_path, tokenizer, 12).tokenized(TEXTS)
    assert not cached and f"token cache: {entry} {said}" in caplog.text
    same_tokens(tokens, TokenizedTexts(TEXTS, tokenizer, 12))
    again, cached = TokenCache(tmp_path, tokenizer, 12).tokenized(TEXTS)
    assert cached
    same_tokens(again, tokens)


def test_runs_writing_the_same_entry_at_once_leave_a_sound_one(tmp_path, tiny_model_and_tokenizer):
    """Two runs that both missed write the same entry: each writes a temporary file of its own and renames it, so
    the entry is whole whichever rename comes last, and no temporary file stays."""
    _, tokenizer = tiny_model_and_tokenizer
    one, two = TokenCache(tmp_path, tokenizer, 12), TokenCache(tmp_path, tokenizer, 12)
    meta = one.meta(TEXTS)
    assert one._read(one.path(meta), meta, len(TEXTS)) is None and two._read(two.path(meta), meta, len(TEXTS)) is None
    tokens = TokenizedTexts(TEXTS, tokenizer, 12)
    assert one._write(one.path(meta), meta, tokens) and two._write(two.path(meta), meta, tokens)
    assert [p.name for p in (tmp_path / "tokens").iterdir()] == [one.path(meta).name]
    read, cached = TokenCache(tmp_path, tokenizer, 12).tokenized(TEXTS)
    assert cached
    same_tokens(read, tokens)


def test_a_cache_folder_that_cannot_be_written_costs_only_the_cache(tmp_path, tiny_model_and_tokenizer, caplog):
    """A fine-tuning run never needed trainer.cache_dir before the token cache: a folder it cannot write is a
    warning, and the run gets its ids."""
    _, tokenizer = tiny_model_and_tokenizer
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="biencoder"):
        tokens, cached = TokenCache(blocker, tokenizer, 12).tokenized(TEXTS)
    assert not cached and "token cache: cannot write" in caplog.text and "trainer.cache_dir" in caplog.text
    same_tokens(tokens, TokenizedTexts(TEXTS, tokenizer, 12))


# -- a run's splits ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_runs_splits_come_from_the_cache_the_run_before_filled(tmp_path, tiny_model_and_tokenizer, no_tokenizing):
    """EncoderInputs.make (a trained encoder): the first run tokenises every split and fills the cache under
    trainer.cache_dir, the second reads every split from it and gets the same ids."""
    model, tokenizer = tiny_model_and_tokenizer
    splits = RunData.read(compose_cfg(FAST).data).splits
    encoder = TextEncoder(model, tokenizer, 32, cache_dir=tmp_path)
    first = EncoderInputs.make(encoder, splits, frozen=False)
    assert first.tokens_cached == {"train": False, "val": False, "test": False}
    no_tokenizing()
    second = EncoderInputs.make(encoder, splits, frozen=False)
    assert second.tokens_cached == {"train": True, "val": True, "test": True}
    for name, split in splits.items():
        assert len(second.tokens[name]) == len(split.texts)
        same_tokens(second.tokens[name], first.tokens[name])


def test_without_a_cache_folder_nothing_is_cached(tmp_path, tiny_model_and_tokenizer, demo_corpus):
    model, tokenizer = tiny_model_and_tokenizer
    splits = {"val": demo_corpus.paired("val")}
    inputs = EncoderInputs.make(TextEncoder(model, tokenizer, 32), splits, frozen=False)
    assert inputs.tokens_cached == {"val": False}
    same_tokens(inputs.tokens["val"], TokenizedTexts(splits["val"].texts, tokenizer, 32))


@pytest.mark.slow
def test_a_second_runner_reads_its_tokens_from_the_cache(tmp_path, caplog):
    """Two runs of a sweep with the same trainer.cache_dir: the second one's train.log says where its ids came
    from, and its encoder inputs equal the first one's."""
    from biencoder.engine.training.runner import Runner

    cfg = compose_cfg(FAST + [f"trainer.cache_dir={tmp_path / 'cache'}"])
    first = Runner(cfg, tmp_path / "first")
    assert first.inputs.tokens_cached == {"train": False, "val": False, "test": False}
    with caplog.at_level(logging.INFO, logger="biencoder"):
        second = Runner(cfg, tmp_path / "second")
    assert second.inputs.tokens_cached == {"train": True, "val": True, "test": True}
    for name in ("train", "val", "test"):
        assert f"tokens {name}: token ids of {len(second.data.splits[name].texts)} texts read" in caplog.text
        same_tokens(second.inputs.tokens[name], first.inputs.tokens[name])


@pytest.mark.slow
def test_the_training_split_with_its_given_negatives_is_cached_too(tmp_path, tiny_model_and_tokenizer, no_tokenizing):
    """Pair files' given negatives: the trainer's ids (the split's rows, then the negatives') go through the cache
    as well, and equal a fresh tokenisation."""
    import dataclasses

    import pandas as pd

    model, tokenizer = tiny_model_and_tokenizer
    splits = RunData.read(compose_cfg(FAST).data).splits
    negatives = pd.DataFrame({"pair": [0, 2], "text": ["a given negative", "another given negative"]})
    train = dataclasses.replace(splits["train"], negatives=negatives)
    assert train.extra_texts == ["a given negative", "another given negative"]
    encoder = TextEncoder(model, tokenizer, 32, cache_dir=tmp_path)
    fresh = TokenizedTexts(train.texts + train.extra_texts, tokenizer, 32)
    first = EncoderInputs.make(encoder, {"train": train}, frozen=False).training_inputs(train, encoder)
    same_tokens(first.tokens, fresh)
    no_tokenizing()
    again = EncoderInputs.make(encoder, {"train": train}, frozen=False).training_inputs(train, encoder)
    same_tokens(again.tokens, fresh)


@pytest.mark.slow
def test_the_epoch_bench_says_where_the_runners_ids_came_from(tmp_path):
    """bench.epoch_phases reports the runner's own answer: tokenised by the first run, from the cache by the next."""
    from biencoder.bench.epoch_phases import token_report
    from biencoder.engine.training.runner import Runner

    cfg = compose_cfg(FAST + [f"trainer.cache_dir={tmp_path / 'cache'}"])
    first = token_report(Runner(cfg, tmp_path / "first"))
    assert first.startswith("token ids in the runner's set-up: train tokenised, val tokenised, test tokenised; ")
    assert "reading all three from it: " in first
    second = token_report(Runner(cfg, tmp_path / "second"))
    assert second.startswith(
        "token ids in the runner's set-up: train from the token cache, val from the token cache, test from the token "
        "cache; reading all three from it: "
    )
    frozen = compose_cfg(FAST + [f"trainer.cache_dir={tmp_path / 'cache'}", "model.encoder.freeze=true"])
    assert token_report(Runner(frozen, tmp_path / "frozen")) is None
