# SPDX-License-Identifier: GPL-2.0-or-later
"""Tab completion: command names first, then each command's kind of argument
(functions, instrumented functions, symbols, threads, commands)."""

from __future__ import annotations

from prompt_toolkit.completion import Completer, Completion

from . import registry


class CommandCompleter(Completer):
    def __init__(self, backend):
        self.backend = backend

    def get_completions(self, document, complete_event):
        text = document.text_before_cursor
        words = text.split()
        if not words or (len(words) == 1 and not text.endswith(" ")):
            word = words[0] if words else ""
            candidates = registry.names()
        else:
            word = "" if text.endswith(" ") else words[-1]
            command = registry.lookup(words[0])
            if command is None:
                return
            if command.completes == "commands":
                candidates = registry.names()
            else:
                candidates = self.backend.complete(command.completes, word) if command.completes else []
            if command.json_form:
                candidates = list(candidates) + ["--json"]
        for candidate in candidates:
            if candidate.startswith(word):
                yield Completion(candidate, start_position=-len(word))
