"""How the frozen path grows with the data: an epoch by phase, the peak memory, and the growth exponents, on synthetic
pair files of N pairs (``scripts/make_synthetic_pairs.py``; 60 / 20 / 20 % train / val / test).

    python scripts/bench_scale.py --sizes 10000 30000 100000 [--epochs 3] [--threads 2] [--sample 2000]

Each size runs in a fresh process (its own peak memory), through the runner's own epoch (:class:`Runner`, timed by its
:attr:`~biencoder.engine.training.runner.Runner.phase` hook, as ``scripts/bench.py`` does): ``model=tiny`` with a
frozen encoder (the pooled vectors computed once into ``--cache-dir``), ``eval.tasks=false`` (the 8 tasks are
ArguAna's), ``eval.baselines=true``, the files read by ``data=pairs``.

Per phase: wall and CPU seconds (the fastest of the epochs after the first, which warms caches and allocators, phase
by phase: on a shared machine other work only adds time; with ``--epochs 1`` the one epoch), the process's
resident-memory high-water mark during it (``VmHWM`` of ``/proc/self/status``, reset before each phase through
``/proc/self/clear_refs``) and how far it rose over the phase. The growth exponent of a phase is the slope of
log(seconds) on log(N), least squares over the sizes, on CPU seconds (steadier than wall seconds on a shared
machine): 1 is linear, 2 quadratic. ``--sample Q`` adds a second run per size with ``eval.train_queries``,
``eval.val_queries`` and ``eval.test_queries`` = Q: what a user sets when the per-epoch evaluation grows too slow.
``--beir TRAIN VAL TEST`` reads the same pairs as a BEIR folder (``data=beir``, :func:`synthetic_beir`): their
distinct positives as documents (about N), every one a candidate of every split, and TRAIN / VAL / TEST queries, the
shape of a BEIR dataset with a large corpus.
Results: a table per run, then one JSON line per run (``--json`` writes them to a file too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "val", "test")


# -- memory -----------------------------------------------------------------------------------------------------------
def status_kb(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmHWM``, ``VmRSS``); 0 where there is none (not Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current resident size (Linux ≥ 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class PhaseMeter:
    """Per phase name: wall and CPU seconds (summed over calls), the peak resident MB while it ran and how far that
    peak rose above the resident MB it started at (``grew_mb``; maxed over calls); and the process's peak over
    everything measured (``overall_mb``). Used as :attr:`Runner.phase`; phases nest (an epoch holds its phases)."""

    def __init__(self):
        self.wall, self.cpu, self.peak_mb, self.grew_mb, self.overall_mb = {}, {}, {}, {}, 0.0
        self.open: list[float] = []  # the peaks of the enclosing phases so far, innermost last

    def __call__(self, name: str, fn):
        peak_so_far = status_kb("VmHWM") / 1024
        self.overall_mb = max(self.overall_mb, peak_so_far)
        if self.open:  # the enclosing phase's peak until now, before the reset forgets it
            self.open[-1] = max(self.open[-1], peak_so_far)
        reset_peak()
        start_mb = status_kb("VmRSS") / 1024
        self.open.append(0.0)
        begin, begin_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall, cpu = time.perf_counter() - begin, time.process_time() - begin_cpu
        peak = max(self.open.pop(), status_kb("VmHWM") / 1024)
        if self.open:
            self.open[-1] = max(self.open[-1], peak)
        self.wall[name] = self.wall.get(name, 0.0) + wall
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu
        self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), peak)
        self.grew_mb[name] = max(self.grew_mb.get(name, 0.0), peak - start_mb)
        self.overall_mb = max(self.overall_mb, peak)
        return result


# -- data -------------------------------------------------------------------------------------------------------------
def synthetic_folder(data_dir: Path, n_pairs: int, seed: int) -> Path:
    """``<data_dir>/synthetic-<N>-s<seed>/`` with train/val/test.jsonl, generated when absent."""
    folder = data_dir / f"synthetic-{n_pairs}-s{seed}"
    if not all((folder / f"{name}.jsonl").exists() for name in SPLITS):
        subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts" / "make_synthetic_pairs.py"),
                "--pairs",
                str(n_pairs),
                "--out",
                str(folder),
                "--seed",
                str(seed),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return folder


def synthetic_beir(pairs_folder: Path, queries: list[int]) -> Path:
    """``<pairs_folder>-beir-<q>/``: a BEIR folder (``data=beir``) of those pair files, made when absent: every
    distinct positive of the N pairs a document of ``corpus.jsonl`` (the candidates of every split), the anchors of
    the first ``queries`` = (train, val, test) pairs of each split the queries, each judged relevant to its own
    positive (score 1) in ``qrels/{train,dev,test}.tsv``. A positive that two pairs share is one document, relevant
    to both."""
    folder = pairs_folder.with_name(f"{pairs_folder.name}-beir-{'-'.join(map(str, queries))}")
    if (folder / "qrels" / "test.tsv").exists():
        return folder
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    doc_ids: dict[str, str] = {}
    judged = {}
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as out_queries:
        for name, want in zip(SPLITS, queries, strict=True):
            rows = [json.loads(line) for line in (pairs_folder / f"{name}.jsonl").read_text().splitlines()]
            for row in rows:
                doc_ids.setdefault(row["positive"], f"d{len(doc_ids)}")
            judged[name] = []
            for i, row in enumerate(rows[:want]):
                judged[name].append((f"{name}-q{i}", doc_ids[row["positive"]]))
                out_queries.write(json.dumps({"_id": f"{name}-q{i}", "text": row["anchor"]}) + "\n")
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as corpus:
        for text, doc in doc_ids.items():
            corpus.write(json.dumps({"_id": doc, "title": "", "text": text}) + "\n")
    for name, qrels in zip(("train", "dev", "test"), judged.values(), strict=True):
        lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t1" for q, d in qrels)]
        (folder / "qrels" / f"{name}.tsv").write_text("\n".join(lines) + "\n")
    return folder


# -- one size, in its own process -------------------------------------------------------------------------------------
def run_overrides(args, data: Path) -> list[str]:
    """The run's overrides: the tiny frozen model on the data in ``data``: the pair files' folder, or with
    ``args.beir`` their BEIR folder (:func:`synthetic_beir`)."""
    overrides = [
        "model=tiny",
        "model.encoder.freeze=true",
        f"trainer.cache_dir={args.cache_dir}",
        f"trainer.max_epochs={args.epochs}",
        "trainer.progress=false",
        "eval.tasks=false",
        "eval.baselines=true",
        f"seed={args.seed}",
    ]
    if args.sample:
        overrides += [f"eval.{name}_queries={args.sample}" for name in SPLITS]
    if args.beir:
        return overrides + ["data=beir", f"data.root={data}"]
    return overrides + ["data=pairs"] + [f"data.{name}={data / f'{name}.jsonl'}" for name in SPLITS]


def timed_epochs(runner, meter: PhaseMeter, epochs: int, train_sim, best) -> tuple[dict, list[float], object]:
    """Run ``epochs`` epochs: (each phase's fastest wall and CPU seconds over the epochs after the first, the epochs'
    wall seconds, the best record). With 2+ epochs, epoch 0 warms caches and allocators: not the measure; of the
    others each phase's fastest, since on a shared machine other work only ever adds time."""
    epoch_wall, per_epoch = [], []
    for epoch in range(epochs):
        meter.wall, meter.cpu = {}, {}
        begin = time.perf_counter()
        train_sim, best = meter("epoch", partial(runner.run_epoch, epoch, train_sim, best))
        epoch_wall.append(time.perf_counter() - begin)
        per_epoch.append({"wall": meter.wall, "cpu": meter.cpu})
    measured = per_epoch[1:] or per_epoch
    phases = {
        kind: {
            name: min(e[kind][name] for e in measured if name in e[kind])
            for name in dict.fromkeys(n for e in measured for n in e[kind])
        }
        for kind in ("wall", "cpu")
    }
    return phases, epoch_wall, best


def run_one(args) -> dict:
    """One run of ``args.pairs`` pairs: the per-phase table of its epochs after the first, and its set-up."""
    import torch

    torch.set_num_threads(args.threads)
    from biencoder.bench.common import compose_config
    from biencoder.engine.training import runner as runner_module

    meter = PhaseMeter()
    pairs = meter("generate", lambda: synthetic_folder(args.data_dir, args.pairs, args.seed))
    data = meter("generate BEIR", lambda: synthetic_beir(pairs, args.beir)) if args.beir else pairs
    cfg = compose_config(run_overrides(args, data))
    out = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        runner = meter("set-up", lambda: runner_module.Runner(cfg, out))
        runner.phase = meter
        _, best, train_sim = meter("begin", runner.begin)
        once = {"wall": meter.wall, "cpu": meter.cpu}  # generate, read, set-up, begin
        phases, epoch_wall, best = timed_epochs(runner, meter, args.epochs, train_sim, best)
        meter.wall, meter.cpu = once["wall"], once["cpu"]
        baselines = runner.evaluation.baselines
        runner.evaluation.baselines = lambda: meter("baselines", baselines)
        final = runner._finish(best)
        return {
            "pairs": args.pairs,
            "beir_queries": args.beir,
            "documents": len(runner.data.splits["test"].pool_rows) if args.beir else None,
            "split_pairs": {n: s.n_pairs for n, s in runner.data.splits.items()},
            "sample": args.sample,
            "threads": torch.get_num_threads(),
            "epochs": args.epochs,
            "phases": phases,
            "once": once,
            "peak_mb": meter.peak_mb,
            "grew_mb": meter.grew_mb,
            "overall_peak_mb": meter.overall_mb,
            "epoch_wall": epoch_wall,
            "loadavg": list(os.getloadavg()),
            "top1": {n: final["best"][n]["top1"] for n in SPLITS},
            "baselines": {n: {s: v["top1"] for s, v in final["baselines"][n].items()} for n in ("val", "test")},
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the run folder this process made


# -- the driver -------------------------------------------------------------------------------------------------------
def exponent(sizes: list[int], seconds: list[float]) -> float | None:
    """Least-squares slope of log(seconds) on log(sizes); None with fewer than 2 positive points."""
    import numpy as np

    points = [(math.log(n), math.log(s)) for n, s in zip(sizes, seconds, strict=False) if s and s > 0]
    if len(points) < 2:
        return None
    x, y = np.array(points).T
    return float(np.polyfit(x, y, 1)[0])


def evaluation_s(result: dict, kind: str = "cpu") -> float:
    """The per-epoch evaluation's seconds: encode and retrieve + rerank of every split."""
    return sum(v for k, v in result["phases"][kind].items() if k.startswith(("encode ", "retrieve+rerank ")))


def data_rise_mb(result: dict) -> float:
    """The largest rise of resident memory over a phase of the epoch or the baselines: what the data path adds on top
    of what the process holds (the model, the splits, their vectors)."""
    return max(v for k, v in result["grew_mb"].items() if k not in ("generate", "read", "set-up", "begin"))


def print_run(result: dict) -> None:
    sizes = "/".join(str(result["split_pairs"][n]) for n in SPLITS)
    sample = f", eval.*_queries={result['sample']}" if result["sample"] else ""
    if result.get("beir_queries"):
        queries = "/".join(map(str, result["beir_queries"]))
        sample += f"; BEIR: {result['documents']} documents, {queries} queries"
    load = " ".join(f"{v:.1f}" for v in result["loadavg"])
    print(
        f"\n{result['pairs']} pairs (train/val/test {sizes}{sample}; "
        f"{result['threads']} threads; load average after the run {load})"
    )
    print(f"   {'phase':<30} {'wall s':>9} {'CPU s':>9} {'peak RSS MB':>12} {'rise MB':>9}")
    for table, label in ((result["phases"], "per epoch"), (result["once"], "once")):
        for name, seconds in table["wall"].items():
            print(
                f"   {name + (' (once)' if label == 'once' else ''):<30} {seconds:>9.2f} {table['cpu'][name]:>9.2f} "
                f"{result['peak_mb'].get(name, 0):>12.0f} {result['grew_mb'].get(name, 0):>9.0f}"
            )
    print(f"   {'process peak':<30} {'':>9} {'':>9} {result['overall_peak_mb']:>12.0f}")
    top1 = " / ".join(f"{result['top1'][n]:.3f}" for n in SPLITS)
    print(
        f"   top1 train/val/test {top1}; test baselines "
        + ", ".join(f"{k} {v:.3f}" for k, v in result["baselines"]["test"].items())
    )


def _two_places(value: float | None) -> str:
    """An exponent with 2 decimals, or n/a where there is none."""
    return "n/a" if value is None else f"{value:.2f}"


def build_parser() -> argparse.ArgumentParser:
    """The command line: sizes, epochs, threads, sample, seed, folders, --json, --beir, and the internal --one."""
    out = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out.add_argument("--sizes", type=int, nargs="+", default=[10000, 30000, 100000], help="pairs (all splits)")
    out.add_argument(
        "--epochs",
        type=int,
        default=3,
        help="epochs per run; with 2 or more the first is a warm-up, not timed (default 3)",
    )
    out.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    out.add_argument(
        "--sample", type=int, default=0, help="also run every size with eval.{train,val,test}_queries=SAMPLE"
    )
    out.add_argument("--seed", type=int, default=0)
    out.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "biencoder-synthetic")
    out.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "biencoder-synthetic-cache",
        help="embedding cache of the synthetic texts (kept apart from ~/.cache/biencoder)",
    )
    out.add_argument("--json", type=Path, help="also write the JSON lines here")
    out.add_argument(
        "--beir",
        type=int,
        nargs=3,
        metavar=("TRAIN", "VAL", "TEST"),
        help="read the data as a BEIR folder (data=beir): every pair's positive a document, the anchors of the first "
        "TRAIN / VAL / TEST pairs of each split the queries",
    )
    out.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one size in this process
    out.add_argument("--one-sample", type=int, default=0, help=argparse.SUPPRESS)
    return out


def run_size(args, n: int, sample: int) -> dict | None:
    """One size in a process of its own (its own peak memory): its result, or None after printing why it failed."""
    cmd = [sys.executable, __file__, "--one", str(n), "--one-sample", str(sample), "--epochs", str(args.epochs)]
    cmd += ["--threads", str(args.threads), "--seed", str(args.seed)]
    cmd += ["--data-dir", str(args.data_dir), "--cache-dir", str(args.cache_dir)]
    cmd += ["--beir", *map(str, args.beir)] if args.beir else []
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
        print(f"{n} pairs: the run failed (exit {done.returncode})", file=sys.stderr)
        return None
    return json.loads(lines[-1][len("RESULT ") :])


def print_growth(results: list[dict]) -> None:
    """The growth exponents of each phase over the sizes, per sample setting."""
    print("\ngrowth exponents: slope of log(seconds) on log(N), CPU (wall); of log(MB) for the memory rise")
    for sample in sorted({r["sample"] for r in results}):
        group = [r for r in results if r["sample"] == sample]
        if len(group) < 2:
            continue
        sizes = [r["pairs"] for r in group]
        label = f"eval.*_queries={sample}" if sample else "every query"
        for name, get in (
            ("mine", lambda r, k: r["phases"][k].get("mine")),
            ("train", lambda r, k: r["phases"][k].get("train")),
            ("per-epoch evaluation", lambda r, k: evaluation_s(r, k)),
            ("epoch", lambda r, k: r["phases"][k].get("epoch")),
            ("baselines", lambda r, k: r["once"][k].get("baselines")),
        ):
            cpu, wall = (exponent(sizes, [get(r, kind) for r in group]) for kind in ("cpu", "wall"))
            print(f"   {label:<24} {name:<22} {_two_places(cpu)} ({_two_places(wall)})")
        rise = exponent(sizes, [data_rise_mb(r) for r in group])
        print(f"   {label:<24} {'memory rise (data path)':<22} {_two_places(rise)}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.epochs < 1:
        print(f"--epochs {args.epochs}: use at least 1", file=sys.stderr)
        return 2
    if args.one is not None:
        args.pairs, args.sample = args.one, args.one_sample
        print("RESULT " + json.dumps(run_one(args)))
        return 0
    results = []
    for sample in [0] + ([args.sample] if args.sample else []):
        for n in args.sizes:
            result = run_size(args, n, sample)
            if result is None:
                return 1
            results.append(result)
            print_run(result)
    print_growth(results)
    lines = [json.dumps(r) for r in results]
    print("\n" + "\n".join(lines))
    if args.json:
        args.json.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
