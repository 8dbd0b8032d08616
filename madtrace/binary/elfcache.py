# SPDX-License-Identifier: GPL-2.0-or-later
"""The ELF symbol cache: a binary's symbol tables (``.symtab`` and ``.dynsym``,
merged as elf.py does) and its PLT entries (found by decoding the PLT and
reading the relocations), kept on disk once per binary file, so that a new
tracer process on a file seen before does not parse them again (libpython3.11:
14 000 symbols and 1 400 PLT entries, 40-60 ms; every file a target maps is
parsed at attach).

Same directory, key, checks and notice as the DWARF cache (cache/disk.py): one
file ``<key>.elf``: ``MTELF001``, u32 header length, the header (JSON: format,
the binary's path, size, build-id, the arrays' dtypes and lengths, the
payload's length and CRC-32), then the names (NUL-separated UTF-8) and the
arrays.  A corrupt entry is rebuilt and one line says so.

``tables_of(image, parse, symbol_type) -> (symbols, plt entries)``: from the cache, else
``parse()`` (elf.py's own parsing) and written.
"""

from __future__ import annotations


import numpy as np

from ..cache import disk
from ..cache.disk import CorruptEntry

MAGIC = b"MTELF001"
FORMAT = 1
SUFFIX = ".elf"
KINDS = ("NOTYPE", "OBJECT", "FUNC", "COMMON", "TLS", "IFUNC", "PLT")
BINDINGS = ("LOCAL", "GLOBAL", "WEAK", "UNIQUE")

loaded = 0          # entries read (a test's and a benchmark's account)
built = 0           # entries written


def entry_path(image) -> str | None:
    return disk.entry_path_of(image, SUFFIX)


def tables_of(image, parse, symbol_type):
    """(symbols, [(name, address, size)] of the PLT) of ``image``; see the module doc.
    ``symbol_type``: what a symbol is made of (elf.py's Symbol)."""
    global loaded, built
    result, how = disk.cached(
        image, SUFFIX, MAGIC, FORMAT, "symbol-table cache",
        lambda header, payload: decode(header, payload, symbol_type=symbol_type),
        parse, lambda tables: encode(*tables))
    loaded += how == "read"
    built += how == "written"
    return result


def encode(symbols, entries) -> tuple[dict, bytes]:
    names: dict[str, int] = {}
    index = [names.setdefault(s.name, len(names)) for s in symbols]
    plt_index = [names.setdefault(name, len(names)) for name, _, _ in entries]
    arrays: dict[str, np.ndarray] = {
        "name": np.array(index, np.uint32),
        "address": np.array([s.address for s in symbols], np.uint64),
        "size": np.array([s.size for s in symbols], np.uint64),
        "kind": np.array([KINDS.index(s.kind) for s in symbols], np.uint8),
        "binding": np.array([BINDINGS.index(s.binding) for s in symbols], np.uint8),
        "section": np.array([s.section for s in symbols], np.uint32),
        "dynamic": np.array([s.dynamic for s in symbols], np.uint8),
        "plt_name": np.array(plt_index, np.uint32),
        "plt_address": np.array([a for _, a, _ in entries], np.uint64),
        "plt_size": np.array([n for _, _, n in entries], np.uint64),
    }
    blob = "\0".join(names).encode("utf-8", "surrogatepass")
    header = {"names": len(names), "names_bytes": len(blob),
              "arrays": [[k, a.dtype.str, len(a)] for k, a in arrays.items()]}
    return header, blob + b"".join(a.tobytes() for a in arrays.values())


def decode(header: dict, payload: bytes, symbol_type):
    """What ``encode`` wrote; CorruptEntry when it does not hold together."""
    try:
        at = header["names_bytes"]
        names = payload[:at].decode("utf-8", "surrogatepass").split("\0") if header["names"] else []
        if len(names) != header["names"]:
            raise CorruptEntry("names and their count differ")
        a = disk.unpack_arrays(header, payload, at)
        if len(a["name"]) and int(a["name"].max()) >= len(names) or \
                len(a["plt_name"]) and int(a["plt_name"].max()) >= len(names):
            raise CorruptEntry("a name out of range")
        symbols = [symbol_type(names[n], ad, sz, KINDS[k], BINDINGS[b], sec, bool(dy))
                   for n, ad, sz, k, b, sec, dy in zip(
                       a["name"].tolist(), a["address"].tolist(), a["size"].tolist(),
                       a["kind"].tolist(), a["binding"].tolist(), a["section"].tolist(),
                       a["dynamic"].tolist())]
        entries = [(names[n], ad, sz) for n, ad, sz in zip(
            a["plt_name"].tolist(), a["plt_address"].tolist(), a["plt_size"].tolist())]
        return symbols, entries
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptEntry(f"bad content ({type(exc).__name__}: {exc})") from None


def list_entries() -> list[dict]:
    return disk.list_entries(SUFFIX, MAGIC, FORMAT)


def clear() -> tuple[int, int]:
    return disk.clear(SUFFIX)
