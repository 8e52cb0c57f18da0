"""PyTorch's ``torch.backends`` autoload hook: ``import torch`` alone provides `neuron`.

An exception here would make ``import torch`` fail for everyone in the environment, so the
hook turns every failure into a warning plus a problem that ``neuron-lab doctor`` shows. The one
exception that passes is a Ctrl-C the user pressed during ``import torch``: they meant to stop it.
(``activate`` already turns a ``KeyboardInterrupt`` that ``torch_neuronx`` raised by itself into a problem.)
"""

from __future__ import annotations

import warnings

ran = False  # set when PyTorch called the hook in this process


def _autoload() -> None:
    global ran
    ran = True
    try:
        from neuron_lab import backend

        backend.activate()  # records and warns about its own failures
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001  (anything else: never break `import torch`)
        try:
            from neuron_lab import backend

            backend.note_problem(f"autoload failed: {type(e).__name__}: {e}")
        except BaseException:  # noqa: BLE001
            pass
        warnings.warn(f"neuron_lab: the neuron backend did not load ({type(e).__name__}: {e}); "
                      "run `neuron-lab doctor` for details", RuntimeWarning, stacklevel=2)
