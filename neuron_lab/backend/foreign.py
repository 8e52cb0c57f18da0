"""Importing another package (``torch_neuronx``) while ``import torch`` runs, without letting it end the process.

neuron_lab's backend is chosen inside PyTorch's ``import torch`` (the ``torch.backends`` autoload).
A broken install that calls ``sys.exit()`` or raises ``KeyboardInterrupt`` at import would otherwise
end ``import torch`` for every program in the environment; here both become an ordinary error that
the caller records for ``neuron-lab doctor``.

A Ctrl-C the user really pressed while the package imported is not turned into an error: it still
interrupts, as the user meant. Where Python's SIGINT handler can be watched (the main thread, with a
Python-level handler installed), a ``KeyboardInterrupt`` that no SIGINT caused is the package's own.
"""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType


class ForeignImportError(RuntimeError):
    """The package ended its own import with ``SystemExit``, ``KeyboardInterrupt`` or another BaseException."""


@contextmanager
def _sigint_watched() -> Iterator[Callable[[], bool]]:
    """Yields ``seen()``: whether a SIGINT arrived in the block. The previous handler still runs for each."""
    seen = [False]
    previous = None
    if threading.current_thread() is threading.main_thread():
        current = signal.getsignal(signal.SIGINT)
        if callable(current):
            previous = current

            def watching(signum, frame):
                seen[0] = True
                return previous(signum, frame)

            signal.signal(signal.SIGINT, watching)
    try:
        yield lambda: seen[0]
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def import_module(name: str) -> ModuleType:
    """``importlib.import_module(name)``; an exit or a self-raised interrupt becomes :class:`ForeignImportError`."""
    with _sigint_watched() as seen:
        try:
            return importlib.import_module(name)
        except SystemExit as e:
            raise ForeignImportError(f"importing {name} called sys.exit({e.code!r})") from None
        except KeyboardInterrupt:
            if seen():
                raise  # the user pressed Ctrl-C during the import
            raise ForeignImportError(f"importing {name} raised KeyboardInterrupt (no Ctrl-C was pressed)") from None
        except Exception:
            raise
        except BaseException as e:  # GeneratorExit, or a package's own BaseException subclass
            raise ForeignImportError(f"importing {name} raised {type(e).__name__}: {e}") from None
