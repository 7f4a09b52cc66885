"""The documents keep their word: links resolve, nothing points outside the repository, commands compose.

Every Markdown file of the repository (tracked or not ignored) is read:

- every relative link (``[text](path#anchor)``, images too) names a file of the repository, and an anchor names a
  heading of its target (GitHub's slugs);
- no document names a path outside the repository (``../``) or under ``/tmp``: a clone has neither;
- every ``python -m biencoder...``, ``biencoder-...``, ``torchrun ... -m biencoder...`` and ``python scripts/...``
  command in a fenced code block runs: train and evaluate commands compose with ``--cfg job`` appended (a ``-m`` sweep
  as its first job), the others print ``--help``. All of them run in one Python process, with the real corpus
  replaced by an empty folder (composing reads no data), inside the test's own folder;
- the table of ``docs/architecture.md`` is the output of ``scripts/import_graph.py``;
- the README's test command is ``pytest``, the command ``.ci/run`` runs.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import importlib.util
import io
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".git", ".venv", "logs", "outputs", "multirun", "node_modules", "build", "dist"}
NOT_SHELL = {"python", "py", "yaml", "yml", "json", "toml", "bibtex", "diff"}
HYDRA_APPS = {"biencoder.train", "biencoder.evaluate"}


# -- reading the documents --------------------------------------------------------------------------------------
def markdown_files(root: Path = REPO) -> list[Path]:
    """The repository's Markdown files: what git tracks or would track; without git, every ``*.md`` outside the
    build, log and virtualenv folders."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        files = [root / name for name in listed if name and (root / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in root.rglob("*.md") if not SKIPPED_DIRS & set(p.relative_to(root).parts)]
    return sorted(set(files))


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(info string, line number of the first line, lines) of every fenced code block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not opening:
            i += 1
            continue
        fence, info, start, body = opening[1], opening[2].lower(), i + 2, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append((info, start, body))
        i += 1
    return blocks


def without_fences(text: str) -> str:
    """``text`` without its fenced code blocks (a ``# comment`` there is no heading, a link there no link)."""
    return re.sub(r"^\s*(```+|~~~+).*?^\s*\1\s*$", "", text, flags=re.M | re.S)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans: what a reader sees as links."""
    return re.sub(r"`[^`\n]*`", "", without_fences(text))


def links(text: str) -> list[str]:
    """Inline link and image targets, and reference-style definitions."""
    body = prose(text)
    inline = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", body)
    return inline + re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", body, flags=re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, markup dropped, lower case, punctuation removed, spaces → -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[`*]", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", without_fences(text), flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def broken_links(files: list[Path], root: Path = REPO) -> list[str]:
    """``file: target (why)`` for every relative link that does not resolve inside ``root``."""
    problems = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for target in links(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, https:, mailto:
                continue
            name, _, anchor = target.partition("#")
            where = (path.parent / name).resolve() if name else path.resolve()
            shown = f"{path.relative_to(root)}: {target}"
            if root.resolve() not in where.parents and where != root.resolve():
                problems.append(f"{shown} (outside the repository)")
            elif not where.exists():
                problems.append(f"{shown} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where.read_text(encoding="utf-8")):
                problems.append(f"{shown} (no heading with that anchor in {where.name})")
    return problems


UP = re.compile(r"(?<![\w.])(?:\.\./)+[\w.-]*")
TMP = re.compile(r"(?<![\w.])/tmp(?![\w-])")


def outside_paths(files: list[Path], root: Path = REPO) -> list[str]:
    """``file:line: text`` for every line that names a path under /tmp, or a relative path (``../x``) that leaves
    the repository from the document's folder."""
    problems = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            up = [(path.parent / m).resolve() for m in UP.findall(line)]
            if TMP.search(line) or any(root.resolve() not in p.parents for p in up):
                problems.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return problems


# -- the commands in code blocks -----------------------------------------------------------------------------------
def shell_segments(line: str) -> list[list[str]]:
    """The simple commands of one logical shell line (split at |, &&, ||, ;), comments dropped, without leading
    ``VAR=value`` assignments and ``do``/``then`` keywords."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: not a command line
        return []
    segments, current = [], []
    for token in tokens:
        if token in ("|", "||", "&&", ";", "&"):
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    out = []
    for seg in segments:
        redirect = next((i for i, t in enumerate(seg) if re.fullmatch(r"\d?(>>?|<)", t)), len(seg))
        seg = seg[:redirect]
        while seg and (re.match(r"^[A-Za-z_]\w*=", seg[0]) or seg[0] in ("do", "then", "time", "nice")):
            seg = seg[1:]
        if seg:
            out.append(seg)
    return out


def doc_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, argv) of every command line in the shell-like fenced blocks of a document."""
    found = []
    for info, start, body in fenced_blocks(text):
        if info in NOT_SHELL:
            continue
        logical, first = "", None
        for offset, raw in enumerate(body):
            first = start + offset if not logical else first
            if raw.rstrip().endswith("\\"):
                logical += raw.rstrip()[:-1] + " "
                continue
            logical += raw
            # a placeholder (<run>, <folder on a shared file system>) is a value to fill in, not a redirection
            found += [(first, seg) for seg in shell_segments(re.sub(r"<[^\s<>][^<>\n]*>", "X", logical))]
            logical = ""
    return found


def program(argv: list[str], scripts: dict[str, str]) -> tuple[str, list[str]] | None:
    """(what to run, its arguments) for a biencoder command: ``module:function``, ``module`` (``python -m``) or
    ``script.py``; None for any other command."""
    name = argv[0]
    if name in scripts:
        return scripts[name], argv[1:]
    if name == "torchrun" or re.fullmatch(r"python3?(\.\d+)?", name):
        if "-c" in argv:
            return None
        if "-m" in argv and argv.index("-m") + 1 < len(argv):
            module = argv[argv.index("-m") + 1]
            if module == "biencoder" or module.startswith("biencoder."):
                target = next((t for t in scripts.values() if t.split(":")[0] == module), module)
                return target, argv[argv.index("-m") + 2 :]
            return None
        script = next((a for a in argv[1:] if a.endswith(".py")), None)
        if name != "torchrun" and script and script.startswith("scripts/"):
            return script, argv[argv.index(script) + 1 :]
    return None


def first_job(args: list[str], conf: Path) -> list[str]:
    """A sweep's overrides as one job: ``-m`` dropped, ``a,b,c`` → ``a``, ``glob(p)`` → the first option of the group
    that matches; placeholders (``<run>``) → ``X``."""
    out = []
    for arg in args:
        if arg in ("-m", "--multirun"):
            continue
        arg = re.sub(r"<[^>]*>", "X", arg)
        key, sep, value = arg.partition("=")
        if sep and not key.startswith("-"):
            glob = re.fullmatch(r"glob\((.*)\)", value)
            if glob:
                group = conf / key.lstrip("+~").replace(".", "/")
                options = sorted(p.stem for p in group.glob("*.yaml") if fnmatch.fnmatch(p.stem, glob[1]))
                value = options[0] if options else value
            elif "," in value and value[:1] not in "[{'\"":
                value = value.split(",")[0]
            arg = f"{key}={value}"
        out.append(arg)
    return out


def help_args(args: list[str]) -> list[str]:
    """The arguments with ``--help`` appended: a value the shell would fill in (``$q``) is dropped with its option,
    so that argparse, which checks a choice before it reaches ``--help``, sees only what the document wrote."""
    out: list[str] = []
    for arg in args:
        if "$" in arg:
            if out and out[-1].startswith("-") and "=" not in out[-1]:
                out.pop()
            continue
        if arg not in ("--help", "-h"):
            out.append(re.sub(r"<[^>]*>", "X", arg))
    return out + ["--help"]


def planned_calls(files: list[Path], root: Path = REPO) -> dict[tuple[str, tuple[str, ...]], list[str]]:
    """{(target, argv to run): [where the documents show it]} for every biencoder command of ``files``."""
    from helpers import console_scripts  # here: this file also runs as a script, without tests/ on its path

    scripts = console_scripts(root)
    calls: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for path in files:
        for line, argv in doc_commands(path.read_text(encoding="utf-8")):
            found = program(argv, scripts)
            if found is None:
                continue
            target, args = found
            if target.split(":")[0] in HYDRA_APPS and "--help" not in args:
                run = first_job(args, root / "conf") + ["--cfg", "job"]
            else:
                run = help_args(args)
            calls.setdefault((target, tuple(run)), []).append(f"{path.relative_to(root)}:{line}: {shlex.join(argv)}")
    return calls


def run_calls(calls: list[tuple[str, list[str]]]) -> list[dict]:
    """Run each (target, argv) in this process, one after the other: {"rc", "out", "err"} each. Hydra's global state
    and the environment are reset between calls."""
    from hydra.core.global_hydra import GlobalHydra

    results = []
    for target, argv in calls:
        env, out, err = dict(os.environ), io.StringIO(), io.StringIO()
        sys.argv = [target, *argv]
        rc: object = 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if target.endswith(".py"):
                    runpy.run_path(str(REPO / target), run_name="__main__")
                elif ":" in target:
                    module, function = target.split(":")
                    getattr(importlib.import_module(module), function)()
                else:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) or stop.code is None else 1
        except Exception as exc:  # a traceback is a failure too; say which
            rc = f"{type(exc).__name__}: {exc}"
        finally:
            os.environ.clear()
            os.environ.update(env)
            GlobalHydra.instance().clear()
        results.append({"rc": rc or 0, "out": out.getvalue()[-300:], "err": err.getvalue()[-600:]})
    return results


# -- the tests -------------------------------------------------------------------------------------------------------
def test_every_relative_link_resolves():
    files = markdown_files()
    assert {"README.md", "RESULTS.md", "BENCHMARKS.md"} <= {p.name for p in files}
    assert broken_links(files) == []


def test_no_document_names_a_path_outside_the_repository():
    assert outside_paths(markdown_files()) == []


def test_the_checks_catch_a_broken_link_an_anchor_and_an_outside_path(tmp_path):
    """A document with one good link and each kind of fault: every fault is reported, the good link is not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## The run folder\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/a.md#the-run-folder) [gone](docs/b.md) [anchor](docs/a.md#no-such) "
        "[up](../outside.md) `[code](not/a/link.md)`\n\nsee ../shared/docs/protocol.md and /tmp/r8/\n"
        "```\n[in a block](nowhere.md)\n```\n"
    )
    assert broken_links([doc], tmp_path) == [
        "README.md: docs/b.md (no such file)",
        "README.md: docs/a.md#no-such (no heading with that anchor in a.md)",
        "README.md: ../outside.md (outside the repository)",
    ]
    assert outside_paths([doc], tmp_path) == [
        "README.md:1: [ok](docs/a.md#the-run-folder) [gone](docs/b.md) [anchor](docs/a.md#no-such) "
        "[up](../outside.md) `[code](not/a/link.md)`",
        "README.md:3: see ../shared/docs/protocol.md and /tmp/r8/",
    ]
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n[back](../README.md), ../README.md\n")
    assert outside_paths([tmp_path / "docs" / "a.md"], tmp_path) == []


def test_slugs_are_githubs():
    assert slug("6. Full fine-tuning on one H100: where an epoch goes") == (
        "6-full-fine-tuning-on-one-h100-where-an-epoch-goes"
    )
    assert slug("The loss axis: `triplet_ce` vs `infonce`") == "the-loss-axis-triplet_ce-vs-infonce"
    assert slug("Same seed, same numbers?") == "same-seed-same-numbers"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n### The loss: `triplet_ce` or `infonce`\n") == {
        "a",
        "a-1",
        "the-loss-triplet_ce-or-infonce",
    }


def test_commands_are_found_and_turned_into_one_job():
    text = (
        "```bash\nBIENCODER_JOBS=8 python -m biencoder.train -m data=arguana '+variant=glob(*)' \\\n"
        "    seed=0,1,2 trainer.resume=logs/runs/<run>   # a comment\n"
        "echo hi | biencoder-retrieve logs/runs/<run> --corpus demo -k 3\n"
        "for q in a b; do python scripts/compare_baselines.py $G --queries $q; done\n"
        "python -c 'import biencoder'\npip install -e .\n```\n```python\nbiencoder-train\n```\n"
    )
    commands = doc_commands(text)
    assert [line for line, _ in commands] == [2, 4, 4, 5, 5, 5, 6, 7]
    from helpers import console_scripts

    scripts = console_scripts()
    found = [program(argv, scripts) for _, argv in commands]
    found = [f for f in found if f]
    assert [target for target, _ in found] == [
        "biencoder.train:cli",
        "biencoder.retrieve:main",
        "scripts/compare_baselines.py",
    ]
    assert first_job(found[0][1], REPO / "conf") == [
        "data=arguana",
        "+variant=ln",
        "seed=0",
        "trainer.resume=logs/runs/X",
    ]


@pytest.mark.slow
def test_every_command_in_a_code_block_composes_or_prints_its_help(tmp_path):
    """One subprocess runs them all (composing needs no corpus: ARGUANA_ROOT is an empty folder), in tmp_path."""
    calls = planned_calls(markdown_files())
    targets = {target for target, _ in calls}
    assert {"biencoder.train:cli", "biencoder.evaluate:cli", "scripts/plot_top1.py"} <= targets
    (tmp_path / "corpus").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "BIENCODER_", "ARGUANA_"))}
    env.update(
        ARGUANA_ROOT=str(tmp_path / "corpus"),
        BIENCODER_LOG_DIR=str(tmp_path / "logs"),
        BIENCODER_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    work = tmp_path / "cwd"
    work.mkdir()
    payload = json.dumps([[target, list(argv)] for target, argv in calls])
    done = subprocess.run(
        [sys.executable, __file__], input=payload, capture_output=True, text=True, env=env, cwd=work, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.splitlines()[-1])
    failed = [
        f"{' / '.join(where)}\n    ran: {target} {shlex.join(argv)}\n    rc {r['rc']}: {r['err'].strip()}"
        for ((target, argv), where), r in zip(calls.items(), results, strict=True)
        if r["rc"] != 0
    ]
    assert failed == [], "\n".join(failed)
    assert sorted(p.name for p in work.iterdir()) == []  # composing wrote nothing


@pytest.mark.slow
def test_the_architecture_table_is_the_import_graph_scripts_output():
    from biencoder.bench import import_graph as tool

    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    found = re.search(re.escape(tool.BEGIN) + r"\n(.*?)\n" + re.escape(tool.END), text, flags=re.S)
    assert found, "docs/architecture.md lost its <!-- import_graph.py: begin/end --> markers"
    expected = tool.markdown(tool.import_graph())
    assert found[1].strip() == expected.strip(), (
        "docs/architecture.md's table is not the import graph of src/: run "
        "`python scripts/import_graph.py --write docs/architecture.md`"
    )


def test_the_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shell_lines = [
        line.split("#")[0].strip() for info, _, body in fenced_blocks(readme) if info == "bash" for line in body
    ]
    assert "pytest" in shell_lines
    ci = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "pytest" in ci


def test_the_configuration_page_lists_every_option_of_every_config_group():
    """docs/configuration.md's "Groups and keys" table names each YAML file of conf/<group>/ (the option a user picks
    with <group>=<name>): a newcomer found the data row missing two of its four."""
    rows = {}
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
        cells = line.split("|")
        if len(cells) > 3 and re.fullmatch(r" `[a-z_/]+` ", cells[1]):
            rows[cells[1].strip(" `")] = cells[2]
    missing = [
        f"{group}={option.stem}"
        for group, options in rows.items()
        if (REPO / "conf" / group).is_dir()
        for option in (REPO / "conf" / group).glob("*.yaml")
        if f"`{option.stem}`" not in options
    ]
    assert {"data", "model", "variant", "experiment", "logger"} <= set(rows) and missing == []


def test_the_documented_run_summaries_begin_as_a_run_prints_them():
    """The summary blocks of README.md and docs/own-data.md start with the header line a run prints for their values
    (a newcomer found `best epoch 7 (of 0-9, by val top1) | 43 s` where runs print `best epoch 7 of 0-9, by val
    top-1 (reranked) | 168 s`)."""
    from biencoder.report.run_summary import header_line

    headers = [
        (page, line)
        for page in ("README.md", "docs/own-data.md")
        for line in (REPO / page).read_text().splitlines()
        if line.startswith("== ") and " seed " in line
    ]
    assert len(headers) >= 2
    for page, line in headers:
        parts = re.match(
            r"== (\S+) seed (\d+) \| (\S+) on (\S+) \| best epoch \D*(\d+)\D+?\d+-(\d+).*\| (\d+) s$", line
        )
        assert parts, f"{page}: {line}"
        variant, seed, model, data, best, last, seconds = parts.groups()
        final = {"variant": variant, "seed": seed, "model": model, "data": data, "best_epoch": int(best)}
        final |= {"epochs": int(last) + 1, "wall_time_s": float(seconds)}
        assert line == header_line(final), page


if __name__ == "__main__":  # the runner of test_every_command_in_a_code_block_composes_or_prints_its_help
    print(json.dumps(run_calls(json.loads(sys.stdin.read()))))
