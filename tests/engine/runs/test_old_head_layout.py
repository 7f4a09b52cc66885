"""A run folder written before the pair head was a component of the model (``BiModel.head``) and before the head keys
existed: its ``last.pt`` resumes, its ``best.pt`` loads, retrieves and exports with the same numbers, and it shares
its cell with a run made today. The old folder is made here from a run of today's code by writing its files as the
old code wrote them: the state dicts with the head's keys at the top level (``norm.*``, ``out.*``) and the configs
with the two flags alone."""

import copy

import numpy as np
import pytest
import torch
import yaml

from biencoder.engine.runs.checkpoint import load_checkpoint
from biencoder.engine.training.run import run
from biencoder.engine.training.runner import Runner
from biencoder.report.runs import assign_cells, find_runs
from conftest import FAST, compose_cfg

OLD_HEAD = {"use_layernorm": True, "use_relu": True}


def old_keys(state: dict) -> dict:
    """The state-dict layout of the model that was itself the pair head."""
    return {k[len("head.") :] if k.startswith("head.") else k: v for k, v in state.items()}


def make_old(folder) -> None:
    """Rewrite a run folder of today's code as the code before the head keys wrote it."""
    for name in ("config_resolved.yaml", ".hydra/config.yaml"):
        path = folder / name
        if path.is_file():
            config = yaml.safe_load(path.read_text())
            config["model"]["head"] = dict(OLD_HEAD)
            path.write_text(yaml.safe_dump(config, sort_keys=False))
    last = folder / "last.pt"
    if last.is_file():
        state = torch.load(last, weights_only=False)
        state["model"] = old_keys(state["model"])
        state["best"]["state"] = old_keys(state["best"]["state"])
        torch.save(state, last)
    best = folder / "best.pt"
    if best.is_file():
        ckpt = torch.load(best, weights_only=True)
        ckpt["state_dict"] = old_keys(ckpt["state_dict"])
        ckpt["model_cfg"]["head"] = dict(OLD_HEAD)
        torch.save(ckpt, best)


@pytest.mark.slow
def test_an_old_run_folder_resumes_loads_retrieves_exports_and_keeps_its_cell(tmp_path, monkeypatch):
    overrides = FAST + [
        "+variant=ln_relu",
        "model.encoder.freeze=true",
        "trainer.max_epochs=3",
        "trainer.device=cpu",
        "eval.tasks=false",
        f"trainer.cache_dir={tmp_path / 'cache'}",
    ]
    whole = run(compose_cfg(overrides), tmp_path / "whole")
    run_epoch = Runner.run_epoch

    def stopped_at_2(self, epoch, *args):
        if epoch == 2:
            raise KeyboardInterrupt  # after epoch 1's last.pt
        return run_epoch(self, epoch, *args)

    monkeypatch.setattr(Runner, "run_epoch", stopped_at_2)
    with pytest.raises(KeyboardInterrupt):
        run(compose_cfg(overrides), tmp_path / "old")
    monkeypatch.setattr(Runner, "run_epoch", run_epoch)
    old = tmp_path / "old"
    make_old(old)
    assert "norm.weight" in torch.load(old / "last.pt", weights_only=False)["model"]

    # resume: the settings compare equal (flags alone, or flags and the keys), the weights load, the run ends as one
    # that was never stopped
    resumed = run(compose_cfg(overrides + [f"trainer.resume={old}"]), old)
    assert (resumed["best_epoch"], resumed["best"]) == (whole["best_epoch"], whole["best"])
    saved = [torch.load(f / "best.pt", weights_only=True)["state_dict"] for f in (tmp_path / "whole", old)]
    assert list(saved[0]) == list(saved[1]) and all(torch.equal(saved[0][k], saved[1][k]) for k in saved[0])

    # best.pt as the old code wrote it: the same model, the same margins
    make_old(old)
    model, _, model_cfg, _ = load_checkpoint(old)
    reference, _, _, _ = load_checkpoint(tmp_path / "whole")
    assert model_cfg["head"] == OLD_HEAD
    assert [type(m).__name__ for m in model.head.children()] == ["ModuleList", "LayerNorm", "ReLU", "Linear"]
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key

    # biencoder-retrieve on the old folder: the hits of today's run
    from biencoder.engine.inference.retriever import EncodingSettings, Retriever

    texts = [f"candidate {i}: schools should {'not ' * (i % 2)}give homework" for i in range(12)]
    queries = ["homework should be banned", "taxes on sugar"]
    hits = [
        Retriever(f, texts, EncodingSettings(cache_dir=None)).search(queries, k=4) for f in (old, tmp_path / "whole")
    ]
    assert [[(h.id, h.rerank_score) for h in q] for q in hits[0]] == [
        [(h.id, h.rerank_score) for h in q] for q in hits[1]
    ]

    # the plot: the old folder has today's settings to the key (so the two, both seed 0, are one draw: a repeat)
    runs = find_runs([tmp_path / "whole", old])
    assert len(runs) == 1 and assign_cells(runs) == [] and runs[0].cell == "ln_relu"
    (alone,) = find_runs([old])
    assert assign_cells([alone]) == [] and alone.cell == "ln_relu" and alone.name == "ln_relu"

    # biencoder-export of the old folder: the classifier gives the run's logits
    pytest.importorskip("sentence_transformers", reason="pip install -e '.[export]'")
    from biencoder.engine.inference.export import export, load_pair_classifier
    from biencoder.engine.modeling.model import Embeddings

    classifier = load_pair_classifier(export(old, tmp_path / "st"))
    torch.manual_seed(0)
    a, b = Embeddings(torch.randn(5, 128), torch.randn(5, 32)), Embeddings(torch.randn(5, 128), torch.randn(5, 32))
    with torch.no_grad():
        expected = copy.deepcopy(reference.head).eval().classify_pair(a, b)
        np.testing.assert_array_equal(classifier.classify_pair(a, b).numpy(), expected.numpy())
