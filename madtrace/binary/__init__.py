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

from .address_space import AddressSpace, Module, ModuleSymbol, VariableRef
from .dwarf_vars import Member, TypeInfo, Variable, describe_in_variable
from .elf import ElfImage, Section, Segment, Symbol
from .maps import Mapping, parse_maps, read_maps

__all__ = [
    "AddressSpace", "Module", "ModuleSymbol", "VariableRef",
    "Member", "TypeInfo", "Variable", "describe_in_variable",
    "ElfImage", "Section", "Segment", "Symbol",
    "Mapping", "parse_maps", "read_maps",
]
