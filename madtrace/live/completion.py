# SPDX-License-Identifier: GPL-2.0-or-later
"""Tab completion: command names first, then what each command says its next
argument is (``Command.completion_kind``): functions, instrumented functions,
variables, symbols, threads, data regions, commands, fixed keywords, or
paths (completed here, where the user is)."""

from __future__ import annotations

import os
import shlex

from prompt_toolkit.completion import Completer, Completion

from . import registry


def complete_path(word: str) -> list[str]:
    folder, _ = os.path.split(word)
    try:
        names = sorted(os.listdir(os.path.expanduser(folder) or "."))
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(folder, name)
        out.append(path + "/" if os.path.isdir(os.path.expanduser(path)) else path)
    return out


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:              # an open quote: complete its word as typed
        return text.split()


class CommandCompleter(Completer):
    def __init__(self, backend):
        self.backend = backend

    def candidates(self, text: str) -> tuple[str, list[str]]:
        """(the word being completed, its candidates) for the text before the cursor."""
        words = _words(text)
        at_new_word = not text or text[-1].isspace()
        word = "" if at_new_word else words[-1]
        if len(words) == 0 or (len(words) == 1 and not at_new_word):
            return word, registry.names()
        command = registry.lookup(words[0])
        if command is None:
            return word, []
        typed = words[1:] if at_new_word else words[1:-1]
        typed = [w for w in typed if w != "--json" and w not in command.flags]
        kind = command.completion_kind(typed)
        found = list(command.keywords(typed))
        if kind == "commands":
            found += registry.names()
        elif kind == "paths":
            found += complete_path(word)
        elif kind:
            found += self.backend.complete(kind, word)
        found += [flag for flag in command.flags if flag not in words]
        if command.json_form and "--json" not in words:
            found.append("--json")
        return word, found

    def get_completions(self, document, complete_event):
        word, found = self.candidates(document.text_before_cursor)
        bare = word.lstrip("'\"")
        for candidate in found:
            # a quoted candidate ('.bss of prog') also completes the word typed without quote
            if candidate.startswith(word) or candidate.lstrip("'").startswith(bare):
                yield Completion(candidate, start_position=-len(word))
