"""nbclient's private names: its kernel cleanup, which the runner calls itself on a second Ctrl-C and on a failed start.

neuron_lab supports nbclient 0.8 and later (``pyproject.toml``).
"""

from __future__ import annotations

import atexit

import nbclient
from nbclient.util import ensure_async


async def shut_down(client: nbclient.NotebookClient) -> None:
    """Shut the client's kernel down and close its channels, as nbclient does when its own run ends.

    The private ``NotebookClient._async_cleanup_kernel``, in every nbclient neuron_lab supports (checked
    through 0.11). Missing: the kernel manager's public ``shutdown_kernel(now=True)``, which ends the kernel
    but leaves the channels to nbclient's own cleanup.
    """
    cleanup = getattr(client, "_async_cleanup_kernel", None)
    if cleanup is not None:
        await cleanup()
    elif client.km is not None:
        await ensure_async(client.km.shutdown_kernel(now=True))


def forget_exit_hook(client: nbclient.NotebookClient) -> None:
    """Drop the exit hook ``async_setup_kernel`` registers, after a kernel that did not start was cleaned up.

    nbclient registers its private ``NotebookClient._cleanup_kernel`` with :mod:`atexit` (every version
    neuron_lab supports, checked through 0.11) and does not unregister it when the kernel fails to start; at
    exit it would fail on the cleaned client. Missing: nothing was registered under that name, nothing to drop.
    """
    hook = getattr(client, "_cleanup_kernel", None)
    if hook is not None:
        atexit.unregister(hook)
