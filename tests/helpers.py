"""Helpers that tests in several files share: hand-countable pair files (:data:`ROWS`, :func:`write_jsonl`), a
paired split from texts (:func:`paired_split`), a classifier whose margins are known (:func:`candidate_scorer`), the
finished run folders under a root (:func:`finished_folders`) and a run folder in the runner's format
(:func:`write_run`), the console scripts of pyproject.toml (:func:`console_scripts`), a command line run in this
process as its own process would run it (:func:`run_in_process`). Test files import them from here, never from one
another."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import os
import random
import re
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from biencoder.engine.data.paired import PairedSplit
from biencoder.engine.modeling.model import Embeddings

REPO = Path(__file__).resolve().parents[1]


def write_run(
    folder: Path,
    variant: str,
    seed: int,
    val: list[float],
    test: list[float],
    hits=None,
    complete=True,
    data="demo",
    tasks=None,
    head=None,
):
    """A run folder in the runner's format with the given per-epoch val/test top1 (train rows too); ``head``: its
    ``model.head`` (default: the card variant's two flags, as every run wrote them before the head keys)."""
    (folder / ".hydra").mkdir(parents=True)
    if head is None:
        flags = {"ln_relu": (True, True), "ln": (True, False), "relu": (False, True), "plain": (False, False)}
        head = dict(zip(("use_layernorm", "use_relu"), flags[variant], strict=True))
    config = {
        "seed": seed,
        "data": {"name": data, "root": None},
        "model": {"name": "tiny", "head": head},
    }
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for epoch, (v, t) in enumerate(zip(val, test, strict=False)):
        base = {
            "epoch": epoch,
            "variant": variant,
            "seed": seed,
            "retrieval_top1": 0.0,
            "mrr": 0.0,
            "recall_at_k": 0.0,
        }
        rows += [
            {**base, "split": "train", "top1": 0.5, "loss": 2.0 - epoch, "head_post_sample_var": 1.0},
            {**base, "split": "val", "top1": v},
            {**base, "split": "test", "top1": t},
        ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if hits is not None:
        np.save(folder / "test_hits.npy", np.asarray(hits, dtype=bool))
    if complete:
        final = {"status": "done", "variant": variant, "seed": seed}
        if tasks:
            final["tasks"] = {"score": "rerank", "test": {k: {"accuracy_at_1": a} for k, a in tasks.items()}}
        (folder / "final.json").write_text(json.dumps(final))
    return folder


def finished_folders(root: Path) -> list[Path]:
    out = []
    for final in root.rglob("final.json"):
        try:
            if json.loads(final.read_text()).get("status") == "done":
                out.append(final.parent)
        except json.JSONDecodeError:
            pass
    return out


def candidate_scorer(tiny_model):
    """A copy of the tiny model (sim_dim 128, hidden 32) whose logit margin for (query, candidate) is the
    candidate's pooled[0]."""
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        model.head.out.weight.zero_(), model.head.out.bias.zero_()
        model.head.out.weight[1, 3 * 128 + 32] = 1.0  # features: s_a, s_b, |s_a - s_b|, p_a, p_b, |p_a - p_b|
    return model


def paired_split(points, counters, debate=None):
    """A PairedSplit from texts: row i = point i, row Q + i = counter i."""
    q = len(points)
    table = pd.DataFrame(
        {
            "theme": "t",
            "debate": debate or ["d"] * (2 * q),
            "stance": "pro",
            "kind": ["point"] * q + ["counter"] * q,
            "text": list(points) + list(counters),
            "pair_id": [f"p{i}" for i in range(q)] * 2,
        }
    )
    table["text_id"] = pd.factorize(table["text"])[0]
    return PairedSplit("train", table)


#: a hand-countable set: test t0..t2; val repeats test's "a2"; train repeats val's "va1" and holds a duplicated pair
ROWS = {
    "train": [
        ("ta0", "tp0", "g1", "tn0"),
        ("ta1", "tp1", "g1", None),
        ("ta1", "tp1", "g2", None),
        ("va1", "tp3", "g2", None),
        ("ta4", "tp4", "g2", "tp0"),
    ],
    "val": [("va0", "vp0", "g1", None), ("va1", "vp1", "g1", None), ("a2", "vp2", "g2", None)],
    "test": [("a0", "p0", "g1", None), ("a1", "p1", "g1", None), ("a2", "p2", "g2", None)],
}


def records(split):
    return [{"anchor": a, "positive": p, "group": g, **({"negative": n} if n else {})} for a, p, g, n in ROWS[split]]


def write_jsonl(folder, rows_by_split=None, **extra):
    """``train.jsonl``, ``val.jsonl``, ``test.jsonl`` of ROWS (or ``rows_by_split``: split -> list of dicts) in
    ``folder``; returns the data config of them."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        rows = (rows_by_split or {}).get(split, records(split))
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"layout": "pairs", **{s: str(folder / f"{s}.jsonl") for s in ("train", "val", "test")}, **extra}


def console_scripts(root: Path = REPO) -> dict[str, str]:
    """``biencoder-train`` → ``biencoder.train:cli``, from pyproject.toml's [project.scripts]."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    section = re.search(r"^\[project\.scripts\]\s*$(.*?)(?=^\[)", text, flags=re.M | re.S)
    return dict(re.findall(r'^\s*"?([\w-]+)"?\s*=\s*"([\w.]+:\w+)"', section[1], flags=re.M))


def run_python(
    args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, own_process=False, timeout=600
):
    """``python *args`` in a process of its own (``own_process``, killed after ``timeout`` seconds) or in this one
    (:func:`run_in_process`), as the same :class:`subprocess.CompletedProcess` either way: one case per program proves
    the process path, the others skip importing torch again."""
    if not own_process:
        return run_in_process(args, env=env, cwd=cwd)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (``metrics.jsonl``), in order."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_in_process(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None):
    """``python *args`` (``-m biencoder.<app> ...`` or a script's path and its arguments) run in this process, as a
    :class:`subprocess.CompletedProcess` with the exit code and both outputs: a command's refusal (``SystemExit``)
    gives its code, an exception that escapes it gives 1 and its traceback on stderr, as the interpreter would.
    Afterwards the environment (``env`` replaces it for the call), the working folder, ``sys.argv``, the root and
    ``biencoder`` loggers' handlers, Hydra's global state, the random generators and torch's determinism switches are
    as they were. Where starting a process proves nothing more (a refusal before any work), this is the same code path
    at a fraction of the cost of importing torch again."""
    from hydra.core.global_hydra import GlobalHydra

    saved_env, saved_argv, saved_cwd, saved_torch = dict(os.environ), sys.argv[:], os.getcwd(), _torch_state()
    loggers = [logging.getLogger(), logging.getLogger("biencoder")]
    saved_logs = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    out, err, code = io.StringIO(), io.StringIO(), 0
    if env is not None:
        _set_environ(env)
    try:
        os.chdir(cwd or saved_cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(args)
                runpy.run_path(args[0], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            err.write(stop.code + "\n")
    except Exception:  # what escapes a command: the interpreter would print it and exit 1
        code = 1
        err.write(traceback.format_exc())
    finally:
        os.chdir(saved_cwd)
        _set_environ(saved_env)
        sys.argv = saved_argv
        GlobalHydra.instance().clear()
        _restore_torch_state(saved_torch)
        for lg, handlers, level, propagate in saved_logs:
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate
    return subprocess.CompletedProcess([sys.executable, *args], code, out.getvalue(), err.getvalue())


def _set_environ(wanted: dict[str, str]) -> None:
    """Make ``os.environ`` equal ``wanted``, touching only the keys that differ."""
    for key in [k for k in os.environ if k not in wanted]:
        del os.environ[key]
    os.environ.update({k: v for k, v in wanted.items() if os.environ.get(k) != v})


def _torch_state() -> tuple:
    """The process-wide state a run sets (:func:`set_seed_everywhere`, :meth:`Runtime.apply`)."""
    flags = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), flags, cudnn


def _restore_torch_state(state: tuple) -> None:
    python, numpy_state, torch_rng, (deterministic, warn_only), (cudnn_deterministic, cudnn_benchmark) = state
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_rng)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn_deterministic, cudnn_benchmark


def tied_split(n_pairs=57, seed=0):
    """A split of 3 themes × 2 debates × 2 sides whose texts repeat: some true counters have twins (other counters of
    the same text), some points carry a counter's text, one point its own counter's. Equal texts get equal vectors
    (the embedding cache's contract); the sim vectors are small integers, so distances tie between distinct texts."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(40)]

    def text():
        return " ".join(rng.choice(words, size=6))

    points, counters = [text() for _ in range(n_pairs)], [text() for _ in range(n_pairs)]
    for i in range(0, n_pairs, 7):
        counters[i + 1 if i + 1 < n_pairs else 0] = counters[i]  # twins of a true counter
    for i in range(3, n_pairs, 11):
        points[i] = counters[(i * 5) % n_pairs]  # a point with another pair's counter text
    points[2] = counters[2]  # a point with its own counter's text
    theme = rng.integers(0, 3, n_pairs)
    debate = theme * 2 + rng.integers(0, 2, n_pairs)
    table = pd.DataFrame(
        {
            "theme": [f"t{t}" for t in np.tile(theme, 2)],
            "debate": [f"d{d}" for d in np.tile(debate, 2)],
            "stance": np.tile(rng.choice(["pro", "con"], n_pairs), 2),
            "kind": ["point"] * n_pairs + ["counter"] * n_pairs,
            "text": points + counters,
            "pair_id": [f"p{i}" for i in range(n_pairs)] * 2,
        }
    )
    table["text_id"] = pd.factorize(table["text"])[0]
    split = PairedSplit("test", table)
    ids = split.text_id
    sim = torch.zeros(len(ids), 128)
    sim[:, :3] = torch.from_numpy(rng.integers(0, 3, (ids.max() + 1, 3))[ids]).float()
    pooled = torch.from_numpy(rng.normal(size=(ids.max() + 1, 32))[ids]).float()
    return split, Embeddings(sim, pooled)


def beir_folder(folder: Path, corpus: list, queries: list, qrels: dict[str, list[str] | None]) -> Path:
    """A BEIR folder: ``corpus``/``queries`` rows (dicts, or lines as they are), ``qrels`` split file name -> its
    lines after the header (None: leave the file out)."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    for name, rows in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
        (folder / name).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    for name, lines in qrels.items():
        if lines is not None:
            (folder / "qrels" / name).write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{x}\n" for x in lines))
    return folder
