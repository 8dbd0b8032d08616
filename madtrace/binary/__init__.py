# SPDX-License-Identifier: GPL-2.0-or-later
"""Binary model of a process: mappings, ELF symbols/sections/PLT, DWARF
variables, and address -> symbol/region/variable lookups.

* ``maps``          -- ``Mapping``, ``parse_maps``, ``read_maps``
* ``elf``           -- ``ElfImage`` (``load``/``from_bytes``), ``Symbol``, ``Section``
* ``plt``           -- naming ``x@plt`` stubs by disassembly (capstone)
* ``dwarf_vars``    -- ``Variable``, ``TypeInfo``, ``describe_in_variable``
* ``address_space`` -- ``Module``, ``AddressSpace`` (``from_pid``/``from_maps``)

See each module's docstring for the full API.
"""

import importlib

_WHERE = {"AddressSpace": "address_space", "Module": "address_space",
          "ModuleSymbol": "address_space", "VariableRef": "address_space",
          "Member": "dwarf_vars", "TypeInfo": "dwarf_vars", "Variable": "dwarf_vars",
          "describe_in_variable": "dwarf_vars", "ElfImage": "elf", "Section": "elf",
          "Segment": "elf", "Symbol": "elf", "Mapping": "maps", "parse_maps": "maps",
          "read_maps": "maps"}


def __getattr__(name: str):
    """The names below, imported on first use (``binary.maps`` alone stays light)."""
    if name not in _WHERE:
        raise AttributeError(name)
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = [
    "AddressSpace", "Module", "ModuleSymbol", "VariableRef",
    "Member", "TypeInfo", "Variable", "describe_in_variable",
    "ElfImage", "Section", "Segment", "Symbol",
    "Mapping", "parse_maps", "read_maps",
]
