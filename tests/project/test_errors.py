"""One error type and one error-to-exit-code path (biencoder.errors)."""

import importlib
import pkgutil
import subprocess
import sys

import pytest

import biencoder
from biencoder.errors import BAD_INPUT, BiencoderError, ConfigError, command


def test_every_error_of_the_package_is_a_biencoder_error():
    """Found by importing every module: the error classes named by hand below, each a BiencoderError that keeps its
    old base (so an ``except ValueError`` written before still catches it)."""
    found = {}
    for info in pkgutil.walk_packages(biencoder.__path__, "biencoder."):
        if info.name.endswith(".__main__"):  # a command line (python -m biencoder.bench), not a module to import
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                isinstance(obj, type)
                and issubclass(obj, Exception)
                and obj.__module__ == info.name
                and name.endswith("Error")
                and obj is not BiencoderError
            ):
                found[name] = obj
    assert sorted(found) == [
        "BeirError",
        "CacheError",
        "ConfigError",
        "CorpusError",
        "InputError",
        "PairsError",
        "RunFolderError",
        "SummaryError",
    ]
    assert all(issubclass(cls, BiencoderError) for cls in found.values())
    assert issubclass(found["CacheError"], RuntimeError)
    assert all(issubclass(found[n], ValueError) for n in found if n != "CacheError")


def test_command_turns_bad_input_into_one_line_and_exit_2_and_keeps_bugs_loud(capsys):
    @command
    def bad_input(argv=None):
        raise ConfigError("trainer.lr=-1 is not valid: it must be a number >= 0")

    @command
    def bug(argv=None):
        raise KeyError("a bug")

    @command
    def fine(argv=None):
        return 0 if argv == ["x"] else 1

    assert bad_input([]) == BAD_INPUT == 2
    assert capsys.readouterr().err == "error: trainer.lr=-1 is not valid: it must be a number >= 0\n"
    with pytest.raises(KeyError):
        bug()
    assert fine(["x"]) == 0 and capsys.readouterr().err == ""


@pytest.mark.parametrize("module", ["corpus", "tasks", "retrieve", "export", "summary"])
def test_every_argparse_command_goes_through_the_one_path(module):
    main = importlib.import_module(f"biencoder.{module}").main
    assert main.__wrapped__ is not None and main.__code__ is command(lambda argv=None: 0).__code__


def test_a_reader_that_leaves_ends_the_command_quietly():
    """``biencoder-plot ... | head``: the rest of the output has no reader; exit 0, nothing on stderr."""
    code = (
        "import sys\nfrom biencoder.errors import command\n@command\ndef main(argv=None):\n"
        "    for _ in range(20000):\n        print('x' * 99)\n    return 0\nsys.exit(main())\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout.read(10) == b"x" * 10
    writer.stdout.close()  # the reader leaves after 10 of 2 MB
    assert writer.wait(timeout=60) == 0 and writer.stderr.read() == b""
