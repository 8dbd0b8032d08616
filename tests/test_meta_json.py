# SPDX-License-Identifier: GPL-2.0-or-later
"""meta.json's writer (trace/format.py _json_text): small containers indented as
json.dumps(indent=1) would, large ones on one line (json's C encoder); read
back by json.loads, it is the value written, whatever the value."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from madtrace.trace.format import JSON_ONE_LINE_ITEMS, _json_text

leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=JSON_ONE_LINE_ITEMS + 8)
        | st.dictionaries(st.text(), inner, max_size=JSON_ONE_LINE_ITEMS + 8)
    ),
    max_leaves=400,
)


@settings(max_examples=200, deadline=None)
@given(values)
def test_meta_text_reads_back_as_the_value(value):
    assert json.loads(_json_text(value)) == json.loads(json.dumps(value))


def test_small_containers_are_indented_large_ones_on_one_line():
    text = _json_text({"b": [1, 2], "a": {str(i): i for i in range(JSON_ONE_LINE_ITEMS + 1)}})
    lines = text.splitlines()
    assert lines[0] == "{" and lines[1].startswith(' "a": {"0": 0, ') and lines[2] == ' "b": ['
    assert lines[3:] == ["  1,", "  2", " ]", "}"]


def test_keys_that_are_not_strings_are_written_as_json_writes_them():
    value = {1: "a", "b": {None: 1, True: 2, 2.5: 3}}
    assert json.loads(_json_text(value)) == json.loads(json.dumps(value))
