# SPDX-License-Identifier: GPL-2.0-or-later
"""Reading a trace's files ahead of their reader: ``read_ahead(items)`` yields
the items of an iterator that a thread of its own produces, at most ``depth``
ahead.  The producers are file reads, zstd and the access pass (C through
ctypes, which releases the GIL), so the next block is decompressed and
decoded while the reader works on this one.  An error of the producer is
raised in the reader, at the item it would have been; a reader that stops
early stops the producer (and closes its iterator)."""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
_END = object()


def read_ahead(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    pipe: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                pipe.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = iter(items)
        try:
            for item in source:
                if not put((item, None)):
                    return
            put((_END, None))
        except BaseException as exc:     # raised in the reader
            put((_END, exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="madtrace-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = pipe.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()
