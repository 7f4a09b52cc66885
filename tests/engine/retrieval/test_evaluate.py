import json

import numpy as np
import pytest
import torch

from biencoder.engine.modeling.encoding import TokenizedTexts, encode
from biencoder.engine.modeling.model import Embeddings
from biencoder.engine.retrieval.official_tasks import evaluate_tasks
from biencoder.engine.retrieval.order import retrieve
from biencoder.engine.retrieval.rerank import Rerank, retrieve_rerank
from helpers import candidate_scorer, paired_split


@pytest.fixture
def planted(tiny_model_and_tokenizer):
    """3 pairs on a line; counter 2 has counter 0's text. Classifier P(positive) = sigmoid(candidate pooled[0])."""
    split = paired_split(["p0", "p1", "p2"], ["c0", "c1", "c0"])
    #        rows: 0=P0  1=P1  2=P2  3=C0  4=C1  5=C2
    position = [0.0, 0.4, 10.0, 1.0, 5.0, 10.5]
    preference = [0.0, 0.0, 2.0, 1.0, 2.0, 0.5]
    sim = torch.zeros(6, 128)
    sim[:, 0] = torch.tensor(position)
    pooled = torch.zeros(6, 32)
    pooled[:, 0] = torch.tensor(preference)
    return split, Embeddings(sim, pooled), candidate_scorer(tiny_model_and_tokenizer[0])


def test_pools_exclude_query_and_true_counter_duplicates(planted):
    split, _, _ = planted
    mask = split.is_candidate(np.tile(np.arange(6), (3, 1)))
    assert [np.flatnonzero(~m).tolist() for m in mask] == [[0, 5], [1], [2, 3]]
    assert split.twins_of_true_counter().tolist() == [1, 0, 1]


def test_retrieve_rerank_by_hand(planted):
    split, emb, model = planted
    rows, dist = retrieve(emb.sim.numpy(), split, k=2, index="exact")
    # query 0 at 0.0: P1 (0.4), C0 (1.0) — C2 is a twin of C0 and excluded
    # query 1 at 0.4: P0 (0.4), C0 (0.6) — its counter C1 (4.6) is not among the 2
    # query 2 at 10:  C2 (0.5), C1 (5.0) — C0 is a twin of the true counter and excluded, P2 itself too
    assert rows.tolist() == [[1, 3], [0, 3], [5, 4]]
    metrics, hits = retrieve_rerank(model, emb, split, Rerank(k=2))
    # rerank by preference: q0 picks C0 (1.0 > 0.0) → hit; q1 misses; q2 picks C1 (2.0 > 0.5) → miss
    assert hits.tolist() == [True, False, False]
    assert metrics["top1"] == pytest.approx(1 / 3)
    assert metrics["retrieval_top1"] == pytest.approx(1 / 3)  # only q2's nearest is its counter
    assert metrics["recall_at_k"] == pytest.approx(2 / 3)
    assert metrics["mrr"] == pytest.approx((1 + 0 + 1 / 2) / 3)
    assert metrics["queries"] == 3  # every query counts


def test_ties_count_against_the_true_counter(planted):
    split, emb, model = planted
    emb.pooled[1, 0] = 1.0  # P1 now ties with C0 for query 0
    metrics, hits = retrieve_rerank(model, emb, split, Rerank(k=2))
    assert not hits[0] and metrics["mrr"] == pytest.approx((1 / 2 + 0 + 1 / 2) / 3)


def test_saturated_probabilities_do_not_tie(planted):
    """Margins 30 and 20 both give P(positive) = 1.0 in float32, a tie that counts against the true counter;
    ranked by the logit margin, the true counter (margin 30) wins. Checked in the per-epoch rerank and the 8 tasks."""
    split, emb, model = planted
    emb.pooled[3, 0], emb.pooled[1, 0] = 30.0, 20.0  # query 0 retrieves P1 and C0 (its counter)
    p = torch.tensor([30.0, 20.0]).sigmoid()
    assert p[0] == p[1] == 1.0  # the float32 tie the old ranking lost
    _, hits = retrieve_rerank(model, emb, split, Rerank(k=2))
    assert hits[0]
    tasks = evaluate_tasks(split, "rerank", model, emb, Rerank(k=2, batch_size=4096))
    classifier = evaluate_tasks(split, "classifier", model=model, emb=emb)
    assert tasks["epa"]["accuracy_at_1"] >= 1 / 3 and classifier["epa"]["accuracy_at_1"] >= 1 / 3


def test_query_embedding_is_the_points(planted):
    """The seed fed the counter's embedding where the point's belonged; moving the point must move the result."""
    split, emb, model = planted
    emb.sim[0, 0] = 4.9  # point 0 now sits next to C1
    rows, _ = retrieve(emb.sim.numpy(), split, k=1, index="exact")
    assert rows[0, 0] == 4


def test_classifier_is_called_in_blocks_not_per_pair(planted, monkeypatch):
    split, emb, model = planted
    calls = []
    original = model.head.forward  # the pair head, a module: every classifier call goes through its forward
    monkeypatch.setattr(model.head, "forward", lambda features: calls.append(len(features)) or original(features))
    retrieve_rerank(model, emb, split, Rerank(k=2))
    assert calls == [6]  # all 3 queries × 2 candidates in one call
    calls.clear()
    retrieve_rerank(model, emb, split, Rerank(k=2, batch_size=4))
    assert calls == [4, 2]  # blocks of 4 pairs, the last one partial


@pytest.mark.slow
def test_zero_shot_evaluation_json(tmp_path):
    from biencoder.engine.inference.evaluation import run_evaluation
    from conftest import compose_cfg

    cfg = compose_cfg(
        ["model=tiny", "model.pooling=mean", "eval.score=encoder_cosine", "trainer.progress=false"],
        config_name="evaluate",
    )
    result = run_evaluation(cfg, tmp_path)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["score"] == "encoder_cosine" and saved["split"] == "test" and saved["tasks"] == result["tasks"]
    assert set(saved["tasks"]["sdoc"]) == {"accuracy_at_1", "mrr", "queries", "candidates", "groups"}
    assert saved["tasks"]["sdoc"]["queries"] == 32 and saved["peak_rss_mb"] > 0
    # deduplicated splits (the default): no test query shares a text with a train/val pair in use
    assert saved["tasks"]["epa"]["groups"]["unseen"]["queries"] == 32
    assert saved["tasks"]["epa"]["groups"]["seen"] == {"accuracy_at_1": None, "mrr": None, "queries": 0}
    val = run_evaluation(
        compose_cfg(
            [
                "model=tiny",
                "model.pooling=mean",
                "eval.score=encoder_cosine",
                "trainer.progress=false",
                "eval.split=validation",
            ],
            config_name="evaluate",
        ),
        tmp_path / "val",
    )
    assert val["split"] == "val" and val["tasks"]["sdoc"]["queries"] == 30  # the folder name works; dedup applies


def test_retrieval_by_the_encoders_cosine_by_hand(planted):
    """eval.retrieve=encoder: the k come from the cosine of the pooled vectors, not their Euclidean distance and
    not the sim head. Query 0 points along (1, 0): C1 at (10, 1) is far away but nearly parallel, P1 at (0.5, 0.5)
    is close but at 45 degrees, C0 is orthogonal."""
    split, emb, model = planted
    pooled = torch.zeros(6, 32)
    pooled[:, 1:3] = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.0, 1.0], [10.0, 1.0], [-1.0, 0.0]])
    emb = Embeddings(emb.sim, pooled)
    rows, _ = retrieve(emb.retrieval("encoder").numpy(), split, k=2, index="exact")
    assert rows[0].tolist() == [4, 1]  # C1 (cos 0.995), then P1 (cos 0.707); C0 (cos 0) is not among the 2
    raw, _ = retrieve(pooled.numpy(), split, k=1, index="exact")
    assert raw[0, 0] == 1  # Euclidean on the raw vectors would have picked P1
    sim_rows, _ = retrieve(emb.sim.numpy(), split, k=2, index="exact")
    assert sim_rows[0].tolist() == [1, 3]  # and the sim head P1, C0
    metrics, _ = retrieve_rerank(model, emb, split, Rerank(k=2, space="encoder"))
    assert metrics["queries"] == 3


def test_encoder_retrieval_agrees_with_the_8_task_scores_on_demo(tiny_model_and_tokenizer, demo_corpus):
    """Per-epoch retrieval top-1 with eval.retrieve=encoder is the zero-shot encoder_cosine epa accuracy (its top-1
    is the epa rerank's: tests/engine/retrieval/test_rerank.py)."""
    model, tokenizer = tiny_model_and_tokenizer
    split = demo_corpus.paired("test")
    emb = encode(model, TokenizedTexts(split.texts, tokenizer, 64))
    metrics, _ = retrieve_rerank(model, emb, split, Rerank(k=5, space="encoder"))
    cosine = evaluate_tasks(split, "encoder_cosine", emb=emb)
    assert metrics["retrieval_top1"] == pytest.approx(cosine["epa"]["accuracy_at_1"])
    sim_metrics, _ = retrieve_rerank(model, emb, split, Rerank(k=5))
    assert sim_metrics["recall_at_k"] != metrics["recall_at_k"]  # a different shortlist, not the sim head's


@pytest.mark.slow
def test_zero_shot_evaluation_reads_the_embedding_cache(tmp_path, monkeypatch):
    """No checkpoint: the encoder as loaded, untrained, so its vectors are the embedding cache's (keyed by its
    weights), shared with the frozen runs; a second evaluation runs the encoder on no text and gives the same tasks."""
    from biencoder.engine.inference.evaluation import run_evaluation
    from biencoder.engine.modeling import encoding as encoding_module
    from conftest import compose_cfg

    encoded = []
    real = encoding_module.encode_pooled
    monkeypatch.setattr(
        encoding_module,
        "encode_pooled",
        lambda m, texts, *a, **k: encoded.append(len(texts)) or real(m, texts, *a, **k),
    )
    overrides = [
        "model=tiny",
        "model.pooling=mean",
        "eval.score=encoder_cosine",
        "trainer.progress=false",
        f"trainer.cache_dir={tmp_path / 'cache'}",
    ]
    first = run_evaluation(compose_cfg(overrides, config_name="evaluate"), tmp_path / "a")
    assert encoded == [63]  # the demo test split's distinct texts, once
    second = run_evaluation(compose_cfg(overrides, config_name="evaluate"), tmp_path / "b")
    assert encoded == [63] and second["tasks"] == first["tasks"]
    assert any((tmp_path / "cache").iterdir())
