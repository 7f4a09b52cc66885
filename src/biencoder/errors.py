"""The one error type of biencoder, and the one path from it to a command's exit code.

Every error a person can fix by changing an input (a config value, a corpus, a file, a folder) derives from
:class:`BiencoderError`: ``ConfigError``, ``CorpusError``, ``CacheError``, ``RunFolderError``, ``InputError``,
``SummaryError``. A command reports one as a single ``error: <message>`` line on stderr and exits with
:data:`BAD_INPUT`. This module imports nothing but the standard library, so every other module may import it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

#: exit code of a command stopped by bad input (a diverged run exits with 3, see biencoder.train)
BAD_INPUT = 2


class BiencoderError(Exception):
    """Bad input a person can fix; the message names the thing and what to do, in one line."""


class ConfigError(BiencoderError, ValueError):
    """A config value that cannot work; the message names the key and a fix. Defined here, not in
    :mod:`biencoder.engine.config.schema`, so that the engine's modules (model, runtime, checkpoint) can raise it
    without importing the config layer."""


def report(err: BaseException, code: int = BAD_INPUT) -> int:
    """Print ``err`` as the one line ``error: <message>`` on stderr; returns ``code`` (the exit code to use)."""
    print(f"error: {err}", file=sys.stderr)
    return code


def command(main: Callable[..., int]) -> Callable[..., int]:
    """Decorate an argparse ``main(argv=None) -> int`` so that a :class:`BiencoderError` ends it with one line on
    stderr and exit code :data:`BAD_INPUT`; a reader that left (``... | head``) ends it quietly with 0, as in the
    Hydra apps; anything else (a bug) keeps its traceback."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except BiencoderError as err:
            return report(err)
        except BrokenPipeError:  # nothing went wrong here; the rest of the output has nobody to read it
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
            return 0

    return run
