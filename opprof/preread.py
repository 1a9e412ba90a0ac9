"""What was read of a job's files before its reader comes to them: the :class:`Ahead` handle
a command (or a pipeline) passes down to the reader, which takes what it holds once
(:meth:`Ahead.document`, :meth:`Ahead.text`, :meth:`Ahead.decoded`).

It holds the document a second process reads (:class:`Child`, started by
:mod:`opprof.readahead` for `opprof report`'s one file), or the file's gzip text inflating on a
second thread (:func:`opprof.gunzip.prefetch`), or documents already decoded (a job read rank
by rank that turns out to be of a whole-job format, :func:`opprof.job.report`: its files are
normalized together from what was decoded, not read again). No module state: the handle is a
parameter from the command to the reader (``pipeline.report`` → ``job.report`` →
``normalizers.read_native`` → ``read_doc`` → ``kineto.stream``). It lives apart from
:mod:`opprof.readahead`, which imports the Kineto reader to read in the second process, so
that the reader and the read-ahead never import each other. Standard library only at
import: the report command imports it before pandas.
"""

from __future__ import annotations

import os
from typing import Any

from opprof.gunzip import FileIdentity, Pieces, file_identity

#: What :meth:`Ahead.document` gives when the child found the file is none the streaming
#: reader takes (the caller reads it whole at once, without trying to stream it again).
NOT_STREAMED = "not streamed"


class Child:
    """A second process reading one file: what it reads, its pid, and what it has sent so
    far, drained from the pipe by a thread as it comes (so that the child ends as soon as it
    has read the file, instead of holding the columns until they are taken)."""

    def __init__(self, ident: FileIdentity, detail: bool, pid: int,
                 fd: int) -> None:
        import threading

        self.ident, self.detail, self.pid, self.fd = ident, detail, pid, fd
        self.data = bytearray()
        self.thread = threading.Thread(target=self._drain, name="opprof-readahead",
                                       daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        try:
            while piece := os.read(self.fd, 1 << 20):  # (no GIL held while it waits)
                self.data += piece
        except OSError:
            self.data = bytearray()
        finally:
            os.close(self.fd)
            _reap(self.pid)

    def document(self) -> Any:
        """What the child sent (waiting for it): its document, :data:`NOT_STREAMED`, or None
        when it failed or was killed."""
        import pickle

        self.thread.join()
        try:
            status, doc = pickle.loads(self.data)
        except Exception:  # noqa: BLE001 (the child failed or was killed: read it here)
            status, doc = "failed", None
        self.data = bytearray()
        return doc if status == "read" else None

    def stop(self) -> None:
        """End the child if it still runs (its document is no longer wanted)."""
        if not self.thread.is_alive():
            return
        import signal

        try:
            os.kill(self.pid, signal.SIGKILL)  # the thread then reads the end and reaps it
        except OSError:
            pass
        self.thread.join(5)


class Ahead:
    """What was read ahead: of one file (its identity when it was started), a :class:`Child`
    reading its document or its gzip text inflating (:class:`opprof.gunzip.Pieces`); of
    some files, their decoded documents (by identity). Each is handed out once, and only
    for its file unchanged since; :meth:`close` (also at exit) ends whatever nobody took."""

    def __init__(self, ident: FileIdentity | None = None, *, child: Child | None = None,
                 text: Pieces | None = None,
                 documents: dict[FileIdentity, Any] | None = None) -> None:
        self.ident = ident
        self._child = child
        self._text = text
        self._documents = dict(documents or {})
        if child is not None or text is not None:
            import atexit

            atexit.register(self.close)

    @property
    def child(self) -> Child | None:
        """The second process, while its document is not taken."""
        return self._child

    def _same(self, path: str | os.PathLike[str]) -> bool:
        return self.ident is not None and file_identity(str(path)) == self.ident

    def decoded(self, path: str | os.PathLike[str]) -> Any:
        """The document decoded before of ``path`` (as its reader decodes it), when the file
        is unchanged since; None otherwise."""
        ident = file_identity(str(path))
        return None if ident is None else self._documents.pop(ident, None)

    def document(self, path: str | os.PathLike[str], detail: bool) -> Any:
        """The document the child read of ``path`` when it was started on it, the file is
        unchanged since and ``detail`` is what it read with (waiting for it), or
        :data:`NOT_STREAMED`; None otherwise (then the caller reads the file itself)."""
        child = self._child
        if child is None or not self._same(path) or detail != child.detail:
            return None
        self._child = None
        doc = child.document()
        return doc if self._same(path) else None

    def text(self, path: str | os.PathLike[str]) -> Pieces | None:
        """The gzip text of ``path`` inflating since the handle was made, when the file is
        unchanged since; None otherwise (then the caller reads the file itself)."""
        pieces = self._text
        if pieces is None or not self._same(path):
            return None
        self._text = None
        return pieces

    def close(self) -> None:
        """End what nobody took: the child, the inflating thread."""
        child, self._child = self._child, None
        text, self._text = self._text, None
        self._documents.clear()
        if child is not None:
            child.stop()
        if text is not None:
            text.close()


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass
