# SPDX-License-Identifier: GPL-2.0-or-later
"""Where the store is and its meta.json (columnar.py has the format): kept
apart from columnar.py so that asking about a store does not import pyarrow."""

from __future__ import annotations

import json
import os

STORE_DIR = "store"
STORE_META = "meta.json"
STORE_FORMAT = 2        # 2: accesses.allocator, block_events


def store_path(directory: str, *parts: str) -> str:
    return os.path.join(directory, STORE_DIR, *parts)


def read_store_meta(directory: str) -> dict | None:
    try:
        with open(store_path(directory, STORE_META)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def write_store_meta(directory: str, meta: dict) -> None:
    meta = dict(meta, format_version=STORE_FORMAT)
    os.makedirs(store_path(directory), exist_ok=True)
    tmp = store_path(directory, STORE_META + ".tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, store_path(directory, STORE_META))


def store_is_complete(directory: str) -> bool:
    meta = read_store_meta(directory)
    return bool(meta and meta.get("format_version") == STORE_FORMAT and meta.get("complete"))
