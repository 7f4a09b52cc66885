import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml

from biencoder.engine.training import triplets as triplets_module
from biencoder.engine.training.epoch import EpochTrainer
from biencoder.engine.training.run import run
from biencoder.engine.training.runner import Runner
from conftest import FAST, REPO, compose_cfg, grid_layout
from helpers import read_rows, run_python

VOLATILE = {"epoch_time_s"}
DEDUP_QUERIES = {"train": 30, "val": 30, "test": 32}


def numbers(rows):
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    final = run(compose_cfg(FAST + ["+variant=ln"]), out)
    return out, final


@pytest.mark.slow
def test_run_folder_contents(demo_run):
    out, final = demo_run
    rows = read_rows(out / "metrics.jsonl")
    assert [(r["epoch"], r["split"]) for r in rows] == [(e, s) for e in (0, 1) for s in ("train", "val", "test")]
    for row in rows:
        assert {"top1", "retrieval_top1", "recall_at_k", "mrr", "variant", "seed"} <= set(row)
        # data.dedup (default): the demo shares one text across its splits, so train and val lose 2 pairs each
        assert row["variant"] == "ln" and row["seed"] == 0 and row["queries"] == DEDUP_QUERIES[row["split"]]
    train = rows[0]
    assert {
        "loss",
        "triplet",
        "ce_pos",
        "ce_neg",
        "random_rate",
        "share_random",
        "neg_distance",
        "head_pre_sample_var",
        "head_post_sample_var",
        "head_post_zero_share",
        "grad_norm_encoder",
        "grad_norm_head",
    } <= set(train)
    assert train["random_rate"] == pytest.approx(0.8) and rows[3]["random_rate"] == pytest.approx(0.79)
    # LayerNorm is on: the head input is normalised per sample
    assert train["head_post_sample_var"] == pytest.approx(1.0, abs=0.01)
    assert final["status"] == "done" and json.loads((out / "final.json").read_text()) == final
    assert final["best_epoch"] in (0, 1) and set(final["tasks"]) == {"score", "val", "test"}
    assert final["tasks"]["test"]["epa"]["candidates"] == 1982
    hits = np.load(out / "test_hits.npy")
    best_test = next(r for r in rows if r["epoch"] == final["best_epoch"] and r["split"] == "test")
    assert hits.shape == (32,) and hits.mean() == pytest.approx(best_test["top1"])
    ckpt = torch.load(out / "best.pt", weights_only=True)
    assert ckpt["model_cfg"]["head"] == {
        **{"use_layernorm": True, "use_relu": False, "norm": None, "activation": None},
        **{"dropout": 0.0, "hidden": []},
    }
    assert (out / "train.log").read_text().count("epoch") >= 2
    resolved = yaml.safe_load((out / "config_resolved.yaml").read_text())
    assert resolved["model"]["head"]["use_layernorm"] is True and "${" not in json.dumps(resolved)


@pytest.mark.slow
def test_same_seed_same_numbers(demo_run, tmp_path, global_determinism):
    out, _ = demo_run
    run(compose_cfg(FAST + ["+variant=ln"]), tmp_path / "again")
    assert numbers(read_rows(tmp_path / "again" / "metrics.jsonl")) == numbers(read_rows(out / "metrics.jsonl"))
    # torch's deterministic algorithms: on the CPU the same numbers again, to the last digit
    run(compose_cfg(FAST + ["+variant=ln", "trainer.deterministic=true"]), tmp_path / "deterministic")
    assert numbers(read_rows(tmp_path / "deterministic" / "metrics.jsonl")) == numbers(
        read_rows(out / "metrics.jsonl")
    )
    run(compose_cfg(FAST + ["+variant=ln", "seed=1"]), tmp_path / "other")
    assert numbers(read_rows(tmp_path / "other" / "metrics.jsonl")) != numbers(read_rows(out / "metrics.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule",
    [[], ["negatives.rank_range=[2,6]"], ["negatives.relative_margin=0.05"]],
    ids=["hardest", "ranks", "margin"],
)
def test_mined_negatives_are_the_ones_trained_on(tmp_path, monkeypatch, rule):
    """The seed's Dataset kept the stale column, so every 'negative' was the positive itself. Under every selection
    rule (negatives.rank_range, negatives.relative_margin) what is mined is what is trained on."""
    events = []
    real_mine, real_collate = EpochTrainer.mine, triplets_module.TripletCollate.__call__

    def mine(self, epoch, emb):
        mined = real_mine(self, epoch, emb)
        events.append(("mined", mined.row.copy()))
        return mined

    def collate(self, rows):
        batch = real_collate(self, rows)
        events.append(("batch", batch["rows"].numpy().copy()))
        return batch

    monkeypatch.setattr(EpochTrainer, "mine", mine)
    monkeypatch.setattr(triplets_module.TripletCollate, "__call__", collate)
    runner = Runner(compose_cfg(FAST + ["negatives.random_rate.start=0.5", *rule]), tmp_path)
    runner.fit()
    split = runner.data.splits["train"]
    epochs = []
    for kind, value in events:
        if kind == "mined":
            epochs.append((value, []))
        else:
            epochs[-1][1].append(value)
    assert len(epochs) == 2
    assert not np.array_equal(epochs[0][0], epochs[1][0])  # re-mined, not reused
    for mined, batches in epochs:
        rows = np.concatenate(batches)
        assert sorted(rows[:, 0]) == list(split.query)  # every pair once per epoch
        assert np.array_equal(rows[:, 2], mined[rows[:, 0]])  # the negative is the one mined for that point
        assert np.array_equal(rows[:, 1], split.counter[rows[:, 0]])
        assert (split.text_id[rows[:, 2]] != split.text_id[rows[:, 1]]).all()  # never the positive


@pytest.mark.slow
def test_the_run_log_names_the_arguments_left_out_for_want_of_their_pair(make_corpus, tmp_path, caplog):
    """The demo's grid with a counter file missing: train.log says how many arguments were left out and which."""
    layout = grid_layout(themes=1, debates=2, per_side=2)
    layout["validation"]["theme0"]["debate01"]["con"].append(("a point whose counter file is missing", None))
    root = make_corpus(layout)
    runner = Runner(compose_cfg(FAST + [f"data.root={root}"]), tmp_path)
    with caplog.at_level("WARNING", logger="biencoder"):
        runner.data.log(runner.evaluation.pairs)  # the run's set-up lines (Runner.begin)
    line = next(r.getMessage() for r in caplog.records if "left out" in r.getMessage())
    assert line.startswith("data: 1 argument(s) left out")
    assert "validation/theme0/debate01/con03: point without a counter" in line


@pytest.mark.slow
def test_the_run_says_what_it_is_before_its_set_up_and_counts_the_set_up_in_its_time(tmp_path, caplog, monkeypatch):
    """A frozen run's set-up encodes every text before the first epoch (minutes on the real corpus): its header comes
    first in train.log, a long encoding logs how far it got, and final.json's wall time (the summary's) includes
    the set-up."""
    from biencoder.engine.modeling import encoding
    from biencoder.engine.training import inputs

    monkeypatch.setattr(encoding, "LOG_EVERY_S", 0.0)  # every batch is "long"
    make = inputs.EncoderInputs.make

    def slow_make(*args, **kwargs):
        time.sleep(0.5)  # a set-up that takes time
        return make(*args, **kwargs)

    monkeypatch.setattr(inputs.EncoderInputs, "make", slow_make)
    cfg = compose_cfg(FAST + ["model.encoder.freeze=true", "trainer.max_epochs=1", "eval.tasks=false"])
    with caplog.at_level("INFO", logger="biencoder"):
        final = run(cfg, tmp_path / "run")
    messages = [r.getMessage() for r in caplog.records]
    header = next(i for i, m in enumerate(messages) if m.startswith("variant plain seed 0 on cpu"))
    encoded = [i for i, m in enumerate(messages) if " texts encoded (" in m]
    assert encoded and header < min(encoded)  # the header before the set-up's encoding lines
    assert final["wall_time_s"] >= 0.5


@pytest.mark.slow
def test_batches_carry_the_mined_tokens(tmp_path):
    runner = Runner(compose_cfg(FAST), tmp_path)
    tokens, split = runner.inputs.tokens["train"], runner.data.splits["train"]
    mined = runner.trainer.mine(0, runner.evaluation.embed("train").sim)
    rows = triplets_module.triplet_rows(split, mined)[:4]
    batch = triplets_module.TripletCollate(tokens)(list(rows))
    for i, (point, counter, negative) in enumerate(rows):  # layout: 4 points, 4 counters, 4 negatives
        for offset, row in ((0, point), (4, counter), (8, negative)):
            ids = tokens.ids[row]
            assert batch["input_ids"][offset + i, : len(ids)].tolist() == ids.tolist()
        assert negative == mined.row[point] and split.texts[negative] != split.texts[counter]


def cli(*args, cwd=REPO, env_extra=None):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env_extra or {})}
    return run_python(["-m", *args], env=env, cwd=cwd, own_process=True)


@pytest.mark.slow
def test_cli_single_run_and_evaluate_checkpoint(tmp_path):
    proc = cli("biencoder.train", "+variant=relu", *FAST[:-2], "trainer.max_epochs=1", f"paths.log_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("_relu_s0") and (run_dir / ".hydra" / "config.yaml").is_file()
    assert {"metrics.jsonl", "final.json", "train.log", "best.pt", "test_hits.npy"} <= {
        p.name for p in run_dir.iterdir()
    }
    assert "8 tasks" in proc.stdout + proc.stderr
    out = tmp_path / "eval.json"
    proc = cli(
        "biencoder.evaluate",
        f"eval.checkpoint={run_dir}",
        "eval.score=rerank",
        "eval.split=val",
        f"eval.output={out}",
        "trainer.progress=false",
        f"paths.log_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    final = json.loads((run_dir / "final.json").read_text())
    assert result["tasks"] == final["tasks"]["val"]  # the checkpoint reproduces the run's own numbers


@pytest.mark.slow
def test_cli_sweep_four_cells(tmp_path):
    proc = cli(
        "biencoder.train",
        "-m",
        "+variant=glob(*)",
        *FAST[:-2],
        "trainer.max_epochs=1",
        "eval.tasks=false",
        f"paths.log_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (sweep,) = (tmp_path / "sweeps").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert sorted(p.name.split("_", 1)[1] for p in jobs) == ["ln_relu_s0", "ln_s0", "plain_s0", "relu_s0"]
    configs = [yaml.safe_load((job / ".hydra" / "config.yaml").read_text()) for job in jobs]
    flags = []
    for c in configs:
        flags.append((c["model"]["head"].pop("use_layernorm"), c["model"]["head"].pop("use_relu")))
    assert all(c == configs[0] for c in configs) and len(set(flags)) == 4
    assert all((job / "final.json").is_file() for job in jobs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, expect",
    [
        (["model.head.use_layernorm=maybe"], "model.head.use_layernorm"),
        (["data.root=/no/such/corpus"], "/no/such/corpus"),
        (["trainer.device=cpu", "trainer.cuda_graphs=true"], "trainer.cuda_graphs=true cannot run"),
        (["trainer.cuda_graphs=sometimes"], "trainer.cuda_graphs='sometimes' is not valid"),
    ],
)
def test_cli_bad_input_one_line_exit_2_no_run_folder(tmp_path, args, expect):
    proc = cli("biencoder.train", *FAST, *args, f"paths.log_dir={tmp_path}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and lines[0].startswith("error:")
    assert not list((tmp_path / "runs").glob("*"))


@pytest.mark.slow
def test_cli_unknown_variant(tmp_path):
    proc = cli("biencoder.train", "+variant=layernorm", f"paths.log_dir={tmp_path}")
    assert proc.returncode != 0 and "variant/layernorm" in proc.stderr and "ln_relu" in proc.stderr


@pytest.mark.slow
def test_evaluate_needs_weights_for_rerank(tmp_path):
    proc = cli("biencoder.evaluate", "eval.score=rerank", f"paths.log_dir={tmp_path}")
    assert proc.returncode == 2 and "eval.checkpoint" in proc.stderr


@pytest.mark.slow
@pytest.mark.whole_run
def test_real_corpus_slice(real_root, tmp_path):
    cfg = compose_cfg(FAST + ["data=arguana", f"data.root={real_root}", "data.max_debates=12", "+variant=ln_relu"])
    final = run(cfg, tmp_path)
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert len(rows) == 6 and final["status"] == "done"
    assert rows[0]["queries"] > 50 and all(0.0 <= r["top1"] <= 1.0 for r in rows)


@pytest.mark.slow
@pytest.mark.whole_run
def test_bf16_autocast_path_runs_on_cpu(tmp_path):
    """trainer.precision=bf16 on the CPU: the run says bf16 and its linear layers did compute in bf16 (autocast)."""
    seen = set()  # (the module's training mode, its output dtype) of every Linear call of the run

    def record(module, inputs, output):
        if isinstance(module, torch.nn.Linear):
            seen.add((module.training, output.dtype))

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        final = run(
            compose_cfg(FAST + ["trainer.precision=bf16", "trainer.max_epochs=1", "eval.tasks=false"]), tmp_path
        )
    finally:
        handle.remove()
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert final["status"] == "done" and np.isfinite(rows[0]["loss"]) and rows[0]["loss"] > 0
    assert final["runtime"]["precision"] == "bf16"
    assert {(True, torch.bfloat16), (False, torch.bfloat16)} <= seen  # training steps and evaluation alike


def test_the_summary_says_what_its_numbers_are_against(demo_run, demo_corpus):
    """final.json and the printed summary carry the zero-shot and TF-IDF top-1 on the same queries and pools, a 95 %
    interval with the query count, a legend, and the best epoch counted from 0 (as in metrics.jsonl)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from biencoder.report.run_summary import summary_text
    from biencoder.report.statistics import wilson

    out, final = demo_run
    split = demo_corpus.used(True).paired("test")
    # TF-IDF by brute force: the nearest candidate (never the query itself or a twin of its counter) by cosine
    matrix = TfidfVectorizer(sublinear_tf=True).fit_transform(split.texts)
    scores = (matrix[split.query] @ matrix.T).toarray()
    pool = split.is_candidate(np.tile(np.arange(len(split.texts)), (split.n_pairs, 1)))
    true = scores[np.arange(split.n_pairs), split.counter]
    hits = ~((scores >= true[:, None]) & pool & (np.arange(len(split.texts)) != split.counter[:, None])).any(axis=1)
    assert final["baselines"]["test"]["tfidf"]["top1"] == pytest.approx(hits.mean())
    assert (
        final["baselines"]["test"]["tfidf"]["queries"] == 32 and "top1_unseen" in final["baselines"]["test"]["tfidf"]
    )
    assert 0 <= final["baselines"]["val"]["encoder_cosine"]["top1"] <= 1
    text = summary_text(final, out)
    low, high = wilson(round(final["best"]["test"]["top1"] * 32), 32)
    assert f"[{low:.3f}, {high:.3f}]" in text and "zero-shot" in text and "R@k: it is among the k" in text
    assert f"best epoch {final['best_epoch']} of 0-1, by val top-1 (reranked)" in text.splitlines()[0]
    # a run that picks by nDCG@10 (a BEIR run's rule) trained its classifier: no "not trained" note
    ndcg = summary_text({**final, "selection": {"split": "val", "metric": "ndcg_at_10"}}, out)
    assert "by val nDCG@10" in ndcg.splitlines()[0] and "not trained" not in ndcg


def test_wilson_interval_known_values():
    from biencoder.report.statistics import wilson

    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)  # z²/(n+z²)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(5, 32) == pytest.approx((0.0686, 0.3175), abs=1e-4)


@pytest.mark.slow
@pytest.mark.whole_run
@pytest.mark.parametrize("frozen", [False, True])
def test_infonce_trains_end_to_end(tmp_path, frozen):
    overrides = FAST + ["+variant=ln_relu", "loss=infonce"] + (["model.encoder.freeze=true"] if frozen else [])
    final = run(compose_cfg(overrides), tmp_path)
    assert final["status"] == "done"
    train = read_rows(tmp_path / "metrics.jsonl")[0]
    assert {"loss", "infonce", "ce_pos", "ce_neg", "masked"} <= set(train) and "triplet" not in train
    assert train["loss"] == pytest.approx(train["infonce"] + train["ce_pos"] + train["ce_neg"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("frozen", [False, True])
def test_infonce_batches_never_score_a_duplicate_positive(make_corpus, tmp_path, frozen):
    """A corpus with a planted duplicate: two training pairs share their counter text. In every batch the
    runner builds, no candidate with the text of a query's counter (other than that counter) keeps a score."""
    from conftest import grid_layout

    layout = grid_layout()
    pro = layout["training"]["theme0"]["debate00"]["pro"]
    pro[1] = (pro[1][0], pro[0][1])  # the counter of pro01 is now word for word the counter of pro00
    root = make_corpus(layout)
    cfg = compose_cfg(
        FAST
        + ["loss=infonce", f"data.root={root}", "trainer.batch_size=64"]
        + (["model.encoder.freeze=true"] if frozen else [])
    )
    runner = Runner(cfg, tmp_path)
    split = runner.data.splits["train"]
    mined = runner.trainer.mine(0, runner.evaluation.embed("train").sim)
    masked_total = 0
    for rows, inputs in runner.trainer.batches(0, mined):
        text_id = inputs.pop("text_id")
        assert text_id.tolist() == split.text_id[rows.T.ravel()].tolist()  # points, counters, negatives
        emb = runner.model.from_pooled(inputs["pooled"]) if frozen else runner.model.embed(**inputs)
        point, counter, negative = emb.chunk(3)
        scores, target, masked = runner.trainer.step.loss_fn.scores(
            point.sim, counter.sim, negative.sim, text_id.view(3, -1)
        )
        candidate_text = split.text_id[np.concatenate([rows[:, 1], rows[:, 2]])]
        for i, positive in enumerate(split.text_id[rows[:, 1]]):
            same = candidate_text == positive
            same[target[i].item()] = False
            assert torch.isinf(scores[i, torch.from_numpy(same)]).all()
            assert torch.isfinite(scores[i, target[i]])
        masked_total += int(masked.sum())
    assert masked_total >= 2  # the planted twin, once for each of the two queries


@pytest.mark.slow
def test_the_engine_runs_from_python_with_a_plain_config(tmp_path):
    """No Hydra anywhere: the schema's defaults (demo corpus, MiniLM's tokenizer) resolve with OmegaConf alone, the
    engine trains a tiny cell into a folder, and Hydra is never imported."""
    code = (
        "import sys\n"
        "from omegaconf import OmegaConf\n"
        "from biencoder.engine.training.run import run\n"
        "from biencoder.engine.config.schema import Schema\n"
        "cfg = OmegaConf.structured(Schema)\n"
        "cfg.model.encoder.random_init = {'num_hidden_layers': 2, 'hidden_size': 32, 'num_attention_heads': 2,"
        " 'intermediate_size': 64}\n"
        "cfg.model.max_length = 64\n"
        "cfg.trainer.max_epochs = 1\n"
        "cfg.trainer.progress = False\n"
        "cfg.eval.tasks = False\n"
        f"final = run(cfg, {str(tmp_path / 'run')!r})\n"
        "print(final['status'], final['best']['test']['queries'], 'hydra' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-3:] == ["done", str(DEDUP_QUERIES["test"]), "False"]
    assert (tmp_path / "run" / "final.json").is_file()


@pytest.mark.slow
def test_the_run_reads_its_config_once_at_set_up(tmp_path):
    """The runner and every object of the package it holds (its epochs, evaluation, data, tracker, settings, ...) hold
    settings made at set-up, never the config: a config changed after set-up changes nothing the run does (issue 52:
    torchtune's recipes read theirs in ``setup`` only)."""
    from omegaconf import Container

    runner = Runner(compose_cfg(FAST + ["logger=tensorboard"]), tmp_path)
    found, seen, todo = [], set(), [("runner", runner)]
    while todo:  # every object of the package reachable from the runner, through attributes and containers
        path, value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, Container):
            found.append(path)
        elif isinstance(value, dict):
            todo += [(f"{path}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, list | tuple):
            todo += [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif type(value).__module__.startswith("biencoder") and hasattr(value, "__dict__"):
            todo += [(f"{path}.{k}", v) for k, v in vars(value).items()]
    assert found == []
    held = (runner.tracker, runner.evaluation.settings, runner.trainer.settings, runner.data, runner.text_encoder)
    assert all(id(obj) in seen for obj in held)
    assert runner.settings.max_epochs == 2 and runner.settings.model["name"] == "tiny"
