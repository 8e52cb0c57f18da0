"""Which lines issued an op: the innermost frame that belongs to the user, and the innermost library frame
between it and the op (``modeling_t5.py``'s line under the cell's ``model.generate(...)``).

A locator answers "is this code object the user's, a library's or internal" (:mod:`neuron_lab.frames`:
PyTorch, the standard library, neuron_lab) from a code object, with a cache per code object so the common
case is one dict lookup per frame. Backward kernels run on autograd's device thread, whose stack has no
user frame; their site is the line the main thread is blocked on (the ``loss.backward()`` call).
"""

from __future__ import annotations

import linecache
import sys
import threading
from types import CodeType, FrameType

from neuron_lab import frames
from neuron_lab.backend.events import ASK, INTERNAL, LIBRARY, USER
from neuron_lab.report.model import Site

SHELL = -1  # a stack chain's role for IPython's own frames, which bound it from above (not a producer's role)
# A walk up a call's frames (Locator.walk): the innermost user frame, the innermost library frame below it, and the
# chain of library and user frames as (code, line), innermost first, with how many reach the outermost user frame
Walk = tuple[FrameType | None, FrameType | None, tuple[list[tuple[CodeType, int]], int]]

class Locator:
    """Maps frames to user sites. Subclasses decide what counts as user code."""

    def __init__(self) -> None:
        # keyed by id: a code object's own hash is recomputed on every look-up (its constants, names, bytecode)
        self._role: dict[int, int] = {}
        self._codes: list[CodeType] = []  # those in _role, kept alive: an id is not reused while it is cached
        self._lines: dict[tuple[int, int], str] = {}  # (id of a code object in _role, line): its stack frame
        # id of a code object in _role: its role in a stack's chain, SHELL (IPython's, above every chain) or _role's
        self._links: dict[int, int] = {}
        # (file, line): linecache's entry of the file it was read from, and the site; kept for the session, so a line
        # that issues ops cell after cell (a model's forward, a library's) is read once while its file is unchanged
        self._sites: dict[tuple[str, int], tuple[object, Site]] = {}

    def is_user_file(self, filename: str) -> bool:
        raise NotImplementedError

    def is_user_code(self, code: CodeType) -> bool:
        return self.is_user_file(code.co_filename)

    def site(self, filename: str, line: int) -> Site:
        """The line as a site, made again only when linecache's entry of its file is another (the file changed and
        was read again, or a cell's text was cached anew)."""
        key = (filename, line)
        text = linecache.cache.get(filename)
        kept = self._sites.get(key)
        if kept is not None and kept[0] is text:
            return kept[1]
        site = self._new_site(filename, line)
        read = linecache.cache.get(filename)  # the entry the site was read from; none: not kept (nothing to check)
        if read is not None:
            self._sites[key] = (read, site)
        return site

    def _new_site(self, filename: str, line: int) -> Site:
        return Site(filename, line, linecache.getline(filename, line).strip())

    def user_frame(self, frame: FrameType | None) -> FrameType | None:
        """The innermost user frame at or above ``frame``; on a non-main thread, the main thread's."""
        return self.frames(frame)[0]

    def frames(self, frame: FrameType | None) -> tuple[FrameType | None, FrameType | None]:
        """(the innermost user frame, the innermost library frame below it) at or above ``frame``; on a thread
        with no user frame (autograd's), the main thread's user frame. Either is None when there is none."""
        return self.walk(frame, chain=False)[:2]

    def walk(self, frame: FrameType | None, chain: bool = True, caller: bool = False) -> Walk:
        """One walk up from ``frame`` for a recorded call: what :meth:`frames` finds (from ``frame``'s caller with
        ``caller``: ``frame`` is the recorder's) and, with ``chain``, the chain of library and user frames that
        :meth:`stack` formats (a call's site and its stack read the frames once)."""
        user, library, chained = self._walk(frame, chain, frame if caller else None)
        if user is None and frame is not None and threading.current_thread() is not threading.main_thread():
            # autograd's device threads run no user code: the op was caused by what the main thread runs
            user, main_library, _ = self._walk(sys._current_frames().get(threading.main_thread().ident), False, None)
            library = library or main_library
        return user, library, chained

    def _walk(self, frame: FrameType | None, chain: bool, passed: FrameType | None) -> Walk:
        """The innermost user frame (not dynamo's entry of a compiled function) but ``passed``, the innermost library
        frame below it, and (``chain``) the library and user frames as (code, line), innermost first, up to the
        shell's frames (IPython's, above every user's chain), with how many of them reach the outermost user frame (0:
        none)."""
        user = library = None
        links = self._links  # one dict look-up per frame once its code object is known
        out: list[tuple[CodeType, int]] = []
        outermost_user = 0
        f = frame
        while f is not None:
            code = f.f_code
            key = id(code)
            link = links.get(key)
            if link is None:
                link = self._link_of(code)
            if link == INTERNAL:  # most frames (PyTorch's, neuron_lab's): in no chain, neither user nor library
                f = f.f_back
                continue
            line = -1  # not read yet: Python finds it by scanning the code's line table
            if chain:
                if link == SHELL:  # a cell magic's body: not the magic's line
                    chain = False
                    if user is not None:
                        break
                else:
                    line = f.f_lineno
                    if line != code.co_firstlineno or not _compiled_entry(f):
                        out.append((code, line))
                        if link == USER:
                            outermost_user = len(out)
            if user is None and f is not passed:
                role = link if link != SHELL else self._role[key]  # the shell's own role (a library's)
                if role == USER:
                    if line < 0:
                        line = f.f_lineno
                    if line != code.co_firstlineno or not _compiled_entry(f):
                        user = f
                        if not chain:
                            break
                elif role == LIBRARY and library is None:
                    library = f
            f = f.f_back
        return user, library, (out, outermost_user)

    def _role_of(self, code: CodeType) -> int:
        role = self._role.get(id(code))
        if role is None:
            role = self._role[id(code)] = (USER if self.is_user_code(code) else
                                           INTERNAL if frames.is_internal(code.co_filename) else LIBRARY)
            self._codes.append(code)
        return role

    def role(self, code: CodeType) -> int:
        """The code object's role for a producer that walks frames itself (``subscribe(roles=)``): as :meth:`frames`
        decides it; ASK for dynamo's code of a compiled function, whose ``def`` line :meth:`frames` passes over."""
        role = self._role_of(code)
        dynamo = sys.modules.get("torch._dynamo.utils")
        return ASK if role == USER and dynamo is not None and code in dynamo.orig_code_map else role

    def locate(self, frame: FrameType | None) -> Site | None:
        f = self.user_frame(frame)
        return None if f is None else self.site(f.f_code.co_filename, f.f_lineno)

    def stack(self, walked: Walk, depth: int) -> tuple[str, ...]:
        """The chain of a :meth:`walk` from the outermost user line down to the innermost library line, as "where in
        function: source": library and user frames, none internal (PyTorch, neuron_lab), none of the shell's
        (IPython's) and none above them. Longer than ``depth``: the outermost line and the innermost ``depth - 1``."""
        user, _, chained = walked
        chain, has_user = _to_user(chained)
        if not has_user and user is not None:  # autograd's thread: the main thread's line
            chain = chain + _to_user(self._walk(user, True, None)[2])[0]
        if len(chain) > depth:
            chain = chain[:depth - 1] + chain[-1:]
        return tuple([self._frame_line(code, line) for code, line in reversed(chain)])

    def _frame_line(self, code: CodeType, line: int) -> str:
        """A stack frame as "where in function: source", formatted once per line of a code object (the chain
        kept ``code`` in :attr:`_codes`, so its id is not reused): a loop's calls repeat the same few frames."""
        key = (id(code), line)
        text = self._lines.get(key)
        if text is None:
            s = self.site(code.co_filename, line)
            text = self._lines[key] = f"{s.label} in {code.co_name}: {s.source}"
        return text

    def _link_of(self, code: CodeType) -> int:
        """The code object's role in a chain, found once (:meth:`_role_of` keeps it alive, so its id is not reused)."""
        role = self._role_of(code)
        self._links[id(code)] = role = SHELL if frames.is_shell(code.co_filename) else role
        return role


def _to_user(chained: tuple[list[tuple[CodeType, int]], int]) -> tuple[list[tuple[CodeType, int]], bool]:
    """A walk's chain up to its outermost user frame, and whether it met one (if not: all of it)."""
    chain, outermost_user = chained
    return (chain[:outermost_user], True) if outermost_user else (chain, False)


def _compiled_entry(frame: FrameType) -> bool:
    """Dynamo's code for a compiled function, at its ``def`` line: it calls the compiled graphs, whose ops have
    lines of their own (or, without them, the line that called the function says more than a ``def``)."""
    code = frame.f_code
    if frame.f_lineno != code.co_firstlineno:  # the common case, answered without a module look-up
        return False
    dynamo = sys.modules.get("torch._dynamo.utils")
    return dynamo is not None and code in dynamo.orig_code_map


class FileLocator(Locator):
    """Scripts and tests: user code is anything outside installed packages and the standard library."""

    def is_user_file(self, fn: str) -> bool:
        if fn.startswith("<"):
            return False  # <frozen ...>, <string>, generated code
        return not (frames.is_internal(fn) or frames.is_installed(fn))
