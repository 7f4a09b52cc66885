"""biencoder.retrieve: the Retriever agrees with the per-epoch rerank, caches candidates, reads the input formats,
refuses bad inputs in one line; best.pt is self-sufficient."""

import json
import shutil

import numpy as np
import pytest
import torch

from biencoder.engine.inference.retriever import EncodingSettings, InputError, Retriever
from biencoder.engine.modeling.encoding import TokenizedTexts, encode, pair_margins
from biencoder.engine.retrieval.order import retrieve
from biencoder.engine.runs.checkpoint import load_checkpoint
from biencoder.engine.training.run import run
from biencoder.retrieve import main, read_texts
from conftest import FAST, compose_cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("retrieve") / "run"
    run(compose_cfg(FAST + ["+variant=ln_relu", "eval.tasks=false", "trainer.max_epochs=1"]), out)
    return out


@pytest.mark.slow
def test_top1_is_the_per_epoch_rerank_choice(trained, demo_corpus, tmp_path):
    """For every demo test point: the Retriever's first hit is the text the per-epoch retrieve-then-rerank ranks
    first among the k nearest (the query itself excluded)."""
    model, tokenizer, model_cfg, settings = load_checkpoint(trained)
    split = demo_corpus.used(True).paired("test")
    emb = encode(model, TokenizedTexts(split.texts, tokenizer, model_cfg["max_length"]))
    rows, _ = retrieve(emb.sim.numpy(), split, settings["k"], "exact")  # the Retriever searches exactly
    # the per-epoch pool also drops twins of the true counter; without twins in the shortlist both pools agree
    margins = pair_margins(model, emb, np.repeat(split.query, rows.shape[1]), rows.ravel()).reshape(rows.shape)
    expected = [split.texts[r[np.argmax(m)]] for r, m in zip(rows, margins, strict=True)]
    retriever = Retriever(trained, split.texts, EncodingSettings(cache_dir=tmp_path))
    hits = retriever.search([split.texts[q] for q in split.query], k=3)
    assert [h[0].text for h in hits] == expected
    for query, h in zip(split.query, hits, strict=True):
        assert [x.rank for x in h] == [1, 2, 3] and all(x.text != split.texts[query] for x in h)
        assert h[0].rerank_score >= h[1].rerank_score >= h[2].rerank_score


def test_the_rerank_sees_the_runs_k_nearest(trained):
    """A query that is not a candidate: the classifier reranks exactly the run's eval.k nearest candidates (the
    shortlist of the per-epoch top-1), so with k = eval.k the hits are those k, in another order."""
    texts = [f"candidate number {i} says something about schools" for i in range(40)]
    retriever = Retriever(trained, texts, EncodingSettings(cache_dir=None))
    k = int(retriever.settings["k"])
    every = retriever.search(["homework should be banned"], k=len(texts))[0]
    hits = retriever.search(["homework should be banned"], k=k)[0]
    assert sorted(h.retrieval_distance for h in hits) == sorted(h.retrieval_distance for h in every)[:k]
    assert [h.rerank_score for h in hits] == sorted((h.rerank_score for h in hits), reverse=True)


@pytest.mark.parametrize("copies", [0, 1, 3])
@pytest.mark.parametrize("k", [10, 12])
def test_k_hits_however_many_copies_of_the_query_the_collection_holds(trained, copies, k):
    """12 candidates with other texts than the query's, and ``copies`` more with the query's own text (the nearest of
    all: equal texts, equal vectors): k hits, all with other texts, each candidate once. The run's eval.k is 10."""
    query = "homework should be banned"
    others = [f"candidate number {i} says something about schools" for i in range(12)]
    texts = others[:5] + [query] * copies + others[5:]
    retriever = Retriever(trained, texts, EncodingSettings(cache_dir=None))
    assert int(retriever.settings["k"]) == 10
    [hits] = retriever.search([query], k=k)
    assert len(hits) == k
    assert all(h.text != query for h in hits) and len({h.id for h in hits}) == k
    assert [h.rank for h in hits] == list(range(1, k + 1))


def test_no_queries_no_hits(trained):
    assert Retriever(trained, ["one candidate", "another one"], EncodingSettings(cache_dir=None)).search([]) == []


@pytest.mark.slow
def test_candidates_are_embedded_once(trained, tmp_path, encoder_calls):
    texts = [f"candidate number {i} says something about schools" for i in range(40)]
    first = Retriever(trained, texts, EncodingSettings(cache_dir=tmp_path / "cache"))
    assert encoder_calls  # the first time the candidates are encoded
    encoder_calls.clear()
    second = Retriever(trained, texts, EncodingSettings(cache_dir=tmp_path / "cache"))
    assert encoder_calls == []  # the second time they come from the cache
    torch.testing.assert_close(first.candidates.sim, second.candidates.sim)
    second.search(["homework should be banned"], k=2)
    assert len(encoder_calls) == 1  # only the query is encoded


def test_input_formats(tmp_path):
    (tmp_path / "a.txt").write_text("first\n\n  second  \n")
    (tmp_path / "a.jsonl").write_text('{"text": "first", "id": "x"}\n\n{"text": "second"}\n')
    (tmp_path / "a.csv").write_text("key,body\nk1,first\nk2,second\n")
    assert read_texts(tmp_path / "a.txt") == (["first", "second"], ["1", "3"])
    assert read_texts(tmp_path / "a.jsonl") == (["first", "second"], ["x", "3"])
    assert read_texts(tmp_path / "a.csv", text_column="body", id_column="key") == (["first", "second"], ["k1", "k2"])
    (tmp_path / "null.jsonl").write_text('{"text": "first"}\n{"text": null}\n')
    with pytest.raises(InputError, match=r"null.jsonl' line 2: 'text' is null, not a string"):
        read_texts(tmp_path / "null.jsonl")  # not the query "None"


@pytest.mark.slow
def test_cli_outputs(trained, tmp_path, capsys):
    (tmp_path / "c.jsonl").write_text(
        "".join(json.dumps({"text": f"candidate {i} about schools", "id": f"c{i}"}) + "\n" for i in range(12))
    )
    args = [str(trained), "--candidates", str(tmp_path / "c.jsonl"), "--cache-dir", str(tmp_path / "cache"), "-k", "4"]
    assert main(args + ["--query", "first query", "--query", "second query", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["query"] for r in records] == ["first query", "second query"]
    assert [h["rank"] for h in records[0]["hits"]] == [1, 2, 3, 4]
    assert set(records[0]["hits"][0]) == {"rank", "id", "text", "retrieval_distance", "rerank_score"}
    assert records[0]["hits"][0]["id"].startswith("c")
    assert main(args + ["--query", "a query"]) == 0
    captured = capsys.readouterr()
    assert "rank" in captured.out and "12 candidates" in captured.err
    assert (
        main(
            [
                str(trained),
                "--corpus",
                "demo",
                "--split",
                "val",
                "--query",
                "q",
                "--jsonl",
                "-k",
                "2",
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    assert len(json.loads(capsys.readouterr().out.splitlines()[0])["hits"]) == 2


@pytest.mark.parametrize(
    "case, make, message",
    [
        ("empty query", lambda t, run: [run, "--corpus", "demo", "--query", "  "], "an empty query"),
        ("empty file", lambda t, run: [run, "--candidates", str(t / "empty.txt"), "--query", "q"], "holds no texts"),
        ("missing file", lambda t, run: [run, "--candidates", str(t / "nope.txt"), "--query", "q"], "does not exist"),
        (
            "missing column",
            lambda t, run: [run, "--candidates", str(t / "c.csv"), "--text-column", "body", "--query", "q"],
            "has no column 'body' (columns: text)",
        ),
        ("not utf-8", lambda t, run: [run, "--candidates", str(t / "latin1.txt"), "--query", "q"], "is not UTF-8"),
        ("no best.pt", lambda t, run: [str(t), "--corpus", "demo", "--query", "q"], "has no best.pt"),
        ("no such run", lambda t, run: [str(t / "nowhere"), "--corpus", "demo", "--query", "q"], "does not exist"),
        ("bad k", lambda t, run: [run, "--corpus", "demo", "--query", "q", "-k", "0"], "-k 0 is not valid"),
    ],
)
def test_bad_inputs_are_one_line(trained, tmp_path, capsys, case, make, message):
    (tmp_path / "empty.txt").write_text("\n \n")
    (tmp_path / "c.csv").write_text("text\nhello\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    assert main(make(tmp_path, str(trained)) + ["--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("error: ") and len(err.splitlines()) == 1


def test_a_moved_run_folder_needs_nothing_else(trained, tmp_path, monkeypatch):
    """best.pt carries the encoder's architecture and the tokenizer's files: a copy works with the original encoder
    folder out of reach (from_pretrained refused), and says how the run was selected."""
    import transformers

    moved = tmp_path / "elsewhere"
    shutil.copytree(trained, moved)
    ckpt = torch.load(moved / "best.pt", weights_only=True)
    assert {"encoder_config", "tokenizer_files", "run", "model_cfg"} <= set(ckpt)
    assert ckpt["run"]["retrieve"] == "sim" and ckpt["run"]["dedup"] is True and ckpt["run"]["variant"] == "ln_relu"

    def refused(*args, **kwargs):
        raise OSError("no access to the original encoder folder")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", refused)
    model, tokenizer, _, _ = load_checkpoint(moved)
    original, _, _, _ = load_checkpoint(trained)
    for a, b in zip(model.state_dict().values(), original.state_dict().values(), strict=False):
        assert torch.equal(a, b)
    assert tokenizer("a test sentence")["input_ids"] == load_checkpoint(trained)[1]("a test sentence")["input_ids"]


@pytest.mark.slow
def test_evaluate_follows_the_retrieve_space_the_run_was_selected_with(tmp_path):
    """A run trained with eval.retrieve=encoder is evaluated (and retrieves) in that space unless told otherwise."""
    from biencoder.engine.inference.evaluation import run_evaluation

    out = tmp_path / "run"
    final = run(compose_cfg(FAST + ["+variant=relu", "trainer.max_epochs=1", "eval.retrieve=encoder"]), out)
    base = ["model=tiny", "trainer.progress=false", f"eval.checkpoint={out}"]
    same = run_evaluation(compose_cfg(base, config_name="evaluate"), tmp_path / "a")
    assert same["retrieve"] == "encoder"
    assert same["tasks"]["epa"]["accuracy_at_1"] == pytest.approx(final["tasks"]["test"]["epa"]["accuracy_at_1"])
    other = run_evaluation(compose_cfg(base + ["eval.retrieve=sim"], config_name="evaluate"), tmp_path / "b")
    assert other["retrieve"] == "sim"
    assert Retriever(out, ["a text", "another text"], EncodingSettings(cache_dir=None)).space == "encoder"
