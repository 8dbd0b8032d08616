# SPDX-License-Identifier: GPL-2.0-or-later
"""Tests of madtrace.binary against live processes, with nm/objdump as oracles."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from fnmatch import fnmatchcase

import pytest

from .util import ROOT, VARIANTS, prog
from madtrace.binary import (
    AddressSpace,
    ElfImage,
    Member,
    TypeInfo,
    Variable,
    describe_in_variable,
    parse_maps,
    read_maps,
)
from madtrace.binary.maps import unmapped_parts
from madtrace.errors import NoSuchProcessError, NotElfError, UnknownSymbolError

NM_TYPES = set("TtDdBbRrWV")
LIBPYTHON = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"


# ----------------------------------------------------------------- oracles
def nm(path, *opts):
    """[(name, addr, size or None, type)] from nm --defined-only (versions cut)."""
    out = subprocess.run(["nm", "-S", "--defined-only", *opts, path],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 4:
            addr, size, typ, name = int(f[0], 16), int(f[1], 16), f[2], f[3]
        elif len(f) == 3:
            addr, size, typ, name = int(f[0], 16), None, f[1], f[2]
        else:
            continue
        rows.append((name.split("@")[0], addr, size, typ))
    return rows


def nm_set(path, *opts, types=NM_TYPES):
    return {(n, a) for n, a, _, t in nm(path, *opts) if t in types and a != 0}


def objdump_plt_pairs(path):
    """{(name, addr)} of the <name@plt> labels objdump prints."""
    out = subprocess.run(["objdump", "-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got", path],
                         capture_output=True, text=True).stdout
    return {(m.group(2), int(m.group(1), 16))
            for m in re.finditer(r"^([0-9a-f]+) <([^>]+@plt)>:", out, re.M)}


def objdump_plt(path):
    return dict(objdump_plt_pairs(path))


def addr_info(proc):
    return {k: int(v, 16) for k, v in proc.info.items() if v.startswith("0x")}


@pytest.fixture
def live(launch):
    """launch symbols-VARIANT -> (proc, AddressSpace, printed addresses)."""
    def _live(variant):
        proc = launch("symbols", variant)
        space = AddressSpace.from_pid(proc.pid)
        return proc, space, addr_info(proc)
    return _live


# ----------------------------------------------------------- /proc/PID/maps
def test_parse_maps_fields():
    text = (
        "55d0c0000000-55d0c0001000 r--p 00000000 fd:01 1234   /usr/bin/my prog\n"
        "55d0c0001000-55d0c0002000 r-xp 00001000 fd:01 1234   /usr/bin/my prog\n"
        "7f0000000000-7f0000021000 rw-p 00000000 00:00 0 \n"
        "7f0000100000-7f0000101000 r--p 00002000 08:02 99 /tmp/x.so (deleted)\n"
        "55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0    [heap]\n"
        "garbage line\n"
    )
    ms = parse_maps(text)
    assert [m.start for m in ms] == sorted(m.start for m in ms)
    assert len(ms) == 5
    first = ms[0]
    assert (first.start, first.end, first.perms, first.offset, first.dev, first.inode) == (
        0x55D0C0000000, 0x55D0C0001000, "r--p", 0, "fd:01", 1234)
    assert first.path == "/usr/bin/my prog" and first.label == "my prog"
    assert ms[1].offset == 0x1000
    heap = [m for m in ms if m.path == "[heap]"][0]
    assert heap.label == "[heap]" and heap.size == 0x21000
    anon = [m for m in ms if m.start == 0x7F0000000000][0]
    assert anon.path == "" and anon.label == "anon"
    deleted = [m for m in ms if m.inode == 99][0]
    assert deleted.deleted and deleted.file_path == "/tmp/x.so" and deleted.label == "x.so"


def test_unmapped_parts_are_the_holes_between_mappings():
    ms = parse_maps("1000-3000 rw-p 00000000 00:00 0\n"
                    "5000-6000 rw-p 00000000 00:00 0\n"
                    "6000-7000 r--p 00000000 00:00 0\n")
    assert unmapped_parts(0x1000, 0x3000, ms) == []
    assert unmapped_parts(0x2000, 0x8000, ms) == [(0x3000, 0x5000), (0x7000, 0x8000)]
    assert unmapped_parts(0x0, 0x1800, ms) == [(0x0, 0x1000)]
    assert unmapped_parts(0x3000, 0x4000, ms) == [(0x3000, 0x4000)]
    assert unmapped_parts(0x3000, 0x4000, []) == [(0x3000, 0x4000)]


def test_aliased_ranges_gone_from_the_maps_are_found():
    """A thread inside munmap when the tracer leaves: the range it took away is
    no longer the alias, and the restore must not read it."""
    from madtrace.data.hybrid.alias import AliasMap, Spans
    alias = AliasMap.__new__(AliasMap)
    alias.spans = Spans()
    alias.spans.add(0x10000, 0x14000)
    alias.spans.add(0x20000, 0x22000)
    ms = parse_maps("10000-12000 rw-s 00000000 00:01 7 /memfd:madtrace-alias (deleted)\n"
                    "12000-14000 rw-p 00000000 00:00 0\n"       # mapped over (MAP_FIXED)
                    "20000-22000 rw-s 00002000 00:01 7 /memfd:madtrace-alias (deleted)\n")
    assert alias.gone(ms) == [(0x12000, 0x14000)]
    assert alias.gone(ms[:1]) == [(0x12000, 0x14000), (0x20000, 0x22000)]


def test_missing_pid_raises_no_such_process():
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) + 1  # larger than any pid the kernel hands out
    with pytest.raises(NoSuchProcessError):
        read_maps(pid)
    with pytest.raises(NoSuchProcessError):
        AddressSpace.from_pid(pid)
    for bad in (0, -5, "abc"):
        with pytest.raises(NoSuchProcessError):
            AddressSpace.from_pid(bad)


def test_exited_process_raises_no_such_process():
    p = subprocess.Popen(["true"])
    p.wait()  # reaped: the pid no longer exists
    with pytest.raises(NoSuchProcessError):
        AddressSpace.from_pid(p.pid)


# ------------------------------------------------------------------ not ELF
def test_non_elf_inputs_raise_not_elf(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("hello, I am not an ELF file\n" * 10)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    real = open(prog("symbols", "O0-pie"), "rb").read()
    truncated = tmp_path / "truncated"
    truncated.write_bytes(real[:200])
    bad_class = tmp_path / "elf32"
    bad_class.write_bytes(real[:4] + b"\x01" + real[5:])
    bad_machine = tmp_path / "aarch64"
    bad_machine.write_bytes(real[:18] + (183).to_bytes(2, "little") + real[20:])
    for path in (text, empty, truncated, bad_class, bad_machine, tmp_path,
                 tmp_path / "does-not-exist"):
        with pytest.raises(NotElfError):
            ElfImage.load(str(path))
    for data in (b"", b"\x7fELF", b"garbage" * 100, real[:100]):
        with pytest.raises(NotElfError):
            ElfImage.from_bytes(data, "mem")


def test_relocatable_object_is_rejected(tmp_path):
    obj = tmp_path / "x.o"
    subprocess.run(["gcc", "-c", "-o", str(obj), os.path.join(ROOT, "tests/progs/symbols.c")], check=True)
    with pytest.raises(NotElfError):
        ElfImage.load(str(obj))


def test_image_cache_returns_same_object(tmp_path):
    path = prog("symbols", "O0-pie")
    assert ElfImage.load(path) is ElfImage.load(path)
    copy = tmp_path / "copy"
    shutil.copy(path, copy)
    a = ElfImage.load(str(copy))
    assert a is not ElfImage.load(path)
    os.utime(copy, ns=(1, 1))  # new mtime: must be parsed again
    assert ElfImage.load(str(copy)) is not a


# ------------------------------------------------------ symbols vs nm, live
@pytest.mark.parametrize("variant", VARIANTS)
def test_executable_symbols_match_nm(live, variant):
    proc, space, addrs = live(variant)
    main = space.main
    assert main is not None and os.path.samefile(main.path, prog("symbols", variant))
    img = main.image
    assert not img.stripped and img.has_debug_info
    assert img.is_pie == variant.endswith("-pie")
    assert img.elf_type == ("DYN" if img.is_pie else "EXEC")

    expected = nm_set(main.path)
    model = {(s.name, s.address) for s in img.symbols}
    assert expected <= model, sorted(expected - model)[:20]
    funcs_objs = {(s.name, s.address) for s in img.symbols if s.kind in ("FUNC", "OBJECT")}
    assert funcs_objs <= expected, sorted(funcs_objs - expected)[:20]
    # FUNC/OBJECT kinds agree with nm's letters
    text_syms = nm_set(main.path, types=set("TtW"))
    data_syms = nm_set(main.path, types=set("DdBbRrV"))
    for s in img.symbols:
        if s.kind == "FUNC":
            assert (s.name, s.address) in text_syms, s
        elif s.kind == "OBJECT" and s.binding != "WEAK":
            assert (s.name, s.address) in data_syms, s

    # bias: independent oracle = addresses printed by the program itself
    nm_compute = [a for n, a in expected if n == "compute"]
    assert nm_compute
    assert main.bias == addrs["compute"] - nm_compute[0]
    if not img.is_pie:
        assert main.bias == 0
    else:
        assert main.bias != 0 and main.bias % 0x1000 == 0
    assert space.find_symbol("compute").address == addrs["compute"]
    assert space.find_symbol("counters").address == addrs["counters"]
    assert space.find_symbol("libc.so.6:malloc").address == addrs["libc_malloc"]
    assert space.module_for(addrs["libc_malloc"]).name == "libc.so.6"


def test_libc_dynsym_matches_nm_dynamic(live):
    _, space, addrs = live("O0-pie")
    libc = space.module_named("libc.so.6")
    assert libc is not None
    expected = nm_set(libc.path, "-D", types=NM_TYPES | {"i", "u"})
    model = {(s.name, s.address) for s in libc.image.symbols if s.dynamic}
    assert len(expected) > 1000
    assert expected <= model, sorted(expected - model)[:20]
    typed = {(s.name, s.address) for s in libc.image.symbols
             if s.dynamic and s.kind in ("FUNC", "OBJECT", "IFUNC", "TLS")}
    assert typed <= expected, sorted(typed - expected)[:20]
    malloc = [s for s in libc.image.symbols if s.name == "malloc"]
    assert malloc and libc.bias + malloc[0].address == addrs["libc_malloc"]


def test_libpython_symbols_and_plt():
    if not os.path.exists(LIBPYTHON):
        pytest.skip("libpython3.11 not installed here")
    img = ElfImage.load(LIBPYTHON)
    expected = nm_set(LIBPYTHON)
    model = {(s.name, s.address) for s in img.symbols}
    assert len(expected) > 10000
    assert expected <= model, sorted(expected - model)[:20]
    assert img.plt == objdump_plt(LIBPYTHON)
    assert img.is_shared and not img.is_pie


# --------------------------------------------------------------------- PLT
@pytest.mark.parametrize("variant", VARIANTS + ("O2-pie-stripped",))
def test_plt_names_match_objdump(variant):
    path = prog("symbols", variant)
    img = ElfImage.load(path)
    expected = objdump_plt(path)
    assert {"malloc@plt", "free@plt", "printf@plt", "strlen@plt"} <= set(expected)
    assert img.plt == expected
    for s in img.plt_symbols:
        assert s.kind == "PLT" and s.size in (8, 16)


def test_plt_names_match_objdump_libc():
    libc = next(m for m in read_maps(os.getpid()) if m.label.startswith("libc.so"))
    img = ElfImage.load(libc.file_path)
    ifunc_names = {}
    for s in img.symbols:
        if s.kind == "IFUNC":
            ifunc_names.setdefault(s.address, set()).add(s.name)
    ours = {s.address: s.name for s in img.plt_symbols}
    assert len(ours) == len(img.plt_symbols)  # one stub per address
    theirs = objdump_plt_pairs(libc.file_path)
    assert len(theirs) > 30 and set(ours) == {a for _, a in theirs}
    irelative = 0
    for name, addr in theirs:
        m = re.fullmatch(r"\*ABS\*\+0x([0-9a-f]+)@plt", name)
        if m:  # IRELATIVE slot: named after the IFUNC whose resolver is the addend
            irelative += 1
            assert ours[addr] == name or ours[addr][:-4] in ifunc_names[int(m.group(1), 16)]
        else:
            assert ours[addr] == name
    assert irelative > 0


@pytest.mark.parametrize("pie", [True, False], ids=["pie", "nopie"])
def test_plt_sec_ibt_layout(tmp_path, pie):
    out = tmp_path / ("ibt-pie" if pie else "ibt-nopie")
    flags = ["-fPIE", "-pie"] if pie else ["-fno-pie", "-no-pie"]
    r = subprocess.run(["gcc", "-O1", "-fcf-protection=full", "-Wl,-z,ibtplt", *flags,
                        "-o", str(out), os.path.join(ROOT, "tests/progs/symbols.c")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"toolchain cannot build IBT PLT: {r.stderr[:200]}")
    img = ElfImage.load(str(out))
    assert img.section(".plt.sec") is not None
    expected = objdump_plt(str(out))
    assert "malloc@plt" in expected
    assert img.plt == expected
    sec = img.section(".plt.sec")
    assert sec.address <= img.plt["malloc@plt"] < sec.address + sec.size


# ------------------------------------------------------------------- DWARF
EXPECTED_TYPES = {
    "counters": ("int[16]", 64),
    "initialized_table": ("long int[8]", 64),
    "global_config": ("struct config", 32),
    "points": ("point_t[5]", 40),
    "greeting": ("const char[15]", 15),
    "matrix": ("int[3][4]", 48),
    "byte_buffer": ("volatile unsigned char[100]", 100),
    "heap_block": ("char *", 8),
    "static_counter": ("int", 4),
    "static_weights": ("double[3]", 24),
    "calls_in_main": ("int", 4),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_dwarf_variables_match_nm(variant):
    path = prog("symbols", variant)
    img = ElfImage.load(path)
    variables = img.variables()
    by_name = {v.name: v for v in variables}
    assert set(EXPECTED_TYPES) <= set(by_name), set(EXPECTED_TYPES) - set(by_name)
    rows = [r for r in nm(path) if r[3] in NM_TYPES and r[1]]
    for v in variables:
        # nm names function-local statics "calls_in_main.0"
        hits = [r for r in rows if r[1] == v.address and
                (r[0] == v.name or r[0].startswith(v.name + "."))]
        assert hits, f"{v.name} at {v.address:#x} not in nm"
        assert hits[0][2] == v.size, (v.name, v.size, hits[0][2])
    for name, (tname, size) in EXPECTED_TYPES.items():
        assert (by_name[name].type_name, by_name[name].size) == (tname, size), name
    assert by_name["calls_in_main"].scope == "main"
    assert by_name["counters"].scope is None and by_name["counters"].external
    assert not by_name["static_counter"].external
    cfg = by_name["global_config"].type.strip()
    assert [(m.name, m.offset, m.size) for m in cfg.members] == [
        ("id", 0, 4), ("name", 8, 8), ("ratio", 16, 8), ("flags", 24, 8)]


def test_variables_are_lazy():
    img = ElfImage.from_bytes(open(prog("symbols", "O2-nopie"), "rb").read(), "copy")
    assert img._variables is None  # nothing parsed by loading symbols
    assert img.variables() and img._variables is not None


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_variable_at_describes_fields_live(live, variant):
    _, space, a = live(variant)
    cases = {
        "counters_3": "counters[3]",
        "global_config_name_2": "global_config.name+2",
        "points_2_y": "points[2].y",
        "matrix_2_1": "matrix[2][1]",
        "calls_in_main": "calls_in_main",
        "greeting": "greeting[0]",
        "static_counter": "static_counter",
    }
    for key, want in cases.items():
        ref = space.variable_at(a[key])
        assert ref is not None, key
        assert ref.describe() == want
    assert space.variable_at(a["heap_block"]) is None
    assert space.find_variable("counters").address == a["counters"]
    assert space.find_variable("global_config").address == a["global_config"]
    with pytest.raises(UnknownSymbolError):
        space.find_variable("no_such_variable_anywhere")


def test_describe_in_variable_synthetic():
    i32 = TypeInfo("base", "int", 4)
    short = TypeInfo("base", "short", 2)
    arr = TypeInfo("array", "short[4]", 8, short, 4)
    st = TypeInfo("struct", "struct s", 16, members=[
        Member("a", 0, 4, i32), Member("b", 4, 4, i32), Member("c", 8, 8, arr)])
    td = TypeInfo("typedef", "s_t", 16, st)
    var = Variable("v", 0x1000, 48, TypeInfo("array", "s_t[3]", 48, td, 3), "s_t[3]")
    assert describe_in_variable(var, 0) == "v[0].a"
    assert describe_in_variable(var, 5) == "v[0].b+1"
    assert describe_in_variable(var, 16 + 8 + 6) == "v[1].c[3]"
    assert describe_in_variable(var, 47) == "v[2].c[3]+1"
    assert describe_in_variable(var, 60) == "v+60"  # past the end: no element
    assert describe_in_variable(Variable("x", 0, 4), 2) == "x+2"


# ------------------------------------------------- symbolize / region, live
@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_symbolize_and_region_live(live, variant):
    _, space, a = live(variant)
    exe = f"symbols-{variant}"
    assert space.region(a["counters_3"]) == f".bss of {exe}"
    assert space.region(a["points_2_y"]) == f".bss of {exe}"
    assert space.region(a["initialized_table"]) == f".data of {exe}"
    assert space.region(a["global_config"]) == f".data of {exe}"
    assert space.region(a["greeting"]) == f".rodata of {exe}"
    assert space.region(a["compute"]) == f".text of {exe}"
    assert space.region(a["heap_block"]) == "[heap]"
    assert space.region(a["stack"]) == "[stack]"
    assert space.region(a["libc_malloc"]) == ".text of libc.so.6"
    assert space.region(a["vdso"]) == "[vdso]"

    assert space.symbolize(a["compute"]) == f"compute ({exe})"
    assert space.symbolize(a["compute"] + 1) == f"compute+0x1 ({exe})"
    assert space.symbolize(a["counters_3"]) == f"counters+0xc ({exe})"
    assert space.symbolize(a["libc_malloc"] + 0x10) == "malloc+0x10 (libc.so.6)"
    heap = next(m for m in space.mappings if m.path == "[heap]")
    assert space.symbolize(a["heap_block"]) == f"[heap]+{a['heap_block'] - heap.start:#x}"
    plt = space.main.image.plt["malloc@plt"]
    assert space.symbolize(space.main.bias + plt + 4) == f"malloc@plt+0x4 ({exe})"

    vdso = space.module_for(a["vdso"])
    assert vdso is not None and vdso.name == "[vdso]" and vdso.start == a["vdso"]
    assert space.module_for(a["counters_3"]) is space.main  # .bss tail belongs to the exe
    assert space.module_for(a["heap_block"]) is None


def test_vdso_read_from_memory_matches_nm(live, tmp_path):
    proc, space, a = live("O0-pie")
    vdso = space.module_named("[vdso]")
    assert vdso is not None and not space.warnings
    dump = tmp_path / "vdso.so"
    with open(f"/proc/{proc.pid}/mem", "rb") as f:
        f.seek(vdso.start)
        dump.write_bytes(f.read(vdso.mappings[0].size))
    expected = nm_set(str(dump), "-D")
    model = {(s.name, s.address) for s in vdso.image.symbols if s.dynamic}
    assert expected and expected <= model
    hits = space.find_functions("[vdso]:*clock_gettime")
    assert {h.name for h in hits} >= {"__vdso_clock_gettime"}
    for h in hits:
        assert space.module_for(h.address) is vdso
        aliases = {s.name for s in vdso.image.symbols if s.address == h.symbol.address}
        assert space.symbolize(h.address) in {f"{n} ([vdso])" for n in aliases}


def test_from_maps_without_reader_uses_own_vdso(launch):
    proc = launch("symbols", "O0-nopie")
    with open(f"/proc/{proc.pid}/maps") as f:
        maps = parse_maps(f.read())
    space = AddressSpace.from_maps(maps)  # no reader, no exe path
    assert space.main is not None and space.main.name == "symbols-O0-nopie"
    assert space.main.bias == 0
    vdso = space.module_named("[vdso]")
    assert vdso is not None and vdso.image.symbols
    assert space.find_symbol("compute").address == int(proc.info["compute"], 16)


# ------------------------------------------------------------ find by name
def test_find_functions_globs(live):
    _, space, a = live("O2-pie")
    mem = space.find_functions("libc.so.6:mem*")
    names = {h.name for h in mem}
    assert {"memcpy", "memset", "memmove", "memcmp"} <= names
    assert all(h.module.name == "libc.so.6" and fnmatchcase(h.name, "mem*") for h in mem)
    assert all(h.module.contains(h.address) for h in mem)
    assert {(h.name, h.address) for h in space.find_functions("libc:mem*")} == \
        {(h.name, h.address) for h in mem}
    unscoped = space.find_functions("comp*")
    assert [h.address for h in unscoped if h.name == "compute"] == [a["compute"]]
    assert all(h.symbol.kind in ("FUNC", "IFUNC") for h in unscoped)
    plts = space.find_functions("symbols-O2-pie:*@plt")
    assert {h.name for h in plts} == set(space.main.image.plt)
    assert not any(h.symbol.kind == "PLT" for h in space.find_functions("malloc*"))
    assert space.find_functions("no_such_function_*") == []
    assert space.find_functions("no_such_module:*") == []
    module, symbol = space.find_symbol("main")  # unpacks as a pair
    assert module is space.main and symbol.kind == "FUNC"
    with pytest.raises(UnknownSymbolError):
        space.find_symbol("no_such_symbol_xyz")
    with pytest.raises(UnknownSymbolError):
        space.find_symbol("libc.so.6:compute")  # compute is not in libc


def test_counts_summary(live):
    _, space, _ = live("O0-pie")
    c = space.counts()
    exe = c["symbols-O0-pie"]
    assert exe["functions"] >= 4 and exe["objects"] >= 8 and exe["plt"] >= 4
    assert exe["stripped"] is False
    assert c["libc.so.6"]["symbols"] > 1000
    assert list(c)[0] == "symbols-O0-pie"  # main executable first


# ---------------------------------------------------------------- stripped
def test_stripped_binary_uses_what_is_left(live):
    path = prog("symbols", "O2-pie-stripped")
    img = ElfImage.load(path)
    assert img.stripped and not img.has_debug_info
    assert img.variables() == []
    assert not ElfImage.load(prog("symbols", "O2-pie")).stripped
    # dynsym survives strip
    expected = nm_set(path, "-D")
    model = {(s.name, s.address) for s in img.symbols}
    assert expected <= model
    assert not any(s.name == "compute" for s in img.symbols)

    proc, space, a = live("O2-pie-stripped")
    exe = "symbols-O2-pie-stripped"
    assert space.main.name == exe and space.main in space.stripped_modules()
    assert space.counts()[exe]["stripped"] is True
    assert space.main.image.plt == objdump_plt(path)
    plt = space.find_symbol(f"{exe}:malloc@plt")
    assert space.symbolize(plt.address + 2) == f"malloc@plt+0x2 ({exe})"
    with pytest.raises(UnknownSymbolError):
        space.find_symbol(f"{exe}:compute")
    assert space.region(a["counters_3"]) == f".bss of {exe}"
    assert re.fullmatch(rf"\.bss\+0x[0-9a-f]+ \({exe}\)", space.symbolize(a["counters_3"]))
    assert space.variable_at(a["counters_3"]) is None
    assert space.find_symbol("libc.so.6:malloc").address == a["libc_malloc"]


def _elf_files(limit: int = 400):
    """ELF files of this machine with PLT sections: the test programs, the
    shared libraries and programs madtrace may meet (the first ``limit``)."""
    roots = [os.path.join(ROOT, "build", "tests"), os.path.join(ROOT, "build", "examples"),
             "/usr/lib/x86_64-linux-gnu", "/usr/bin", os.path.dirname(LIBPYTHON)]
    for root in roots:
        for folder, _dirs, names in os.walk(root):
            for name in sorted(names):
                path = os.path.join(folder, name)
                if limit <= 0:
                    return
                if not os.path.isfile(path) or os.path.islink(path):
                    continue
                with open(path, "rb") as f:
                    if f.read(4) != b"\x7fELF":
                        continue
                limit -= 1
                yield path


def test_plt_decoder_agrees_with_capstone():
    """The PLT stubs are decoded by hand (reading a trace must not need
    capstone); on every ELF file found here, sections the hand decoder
    accepts give exactly the stubs capstone's disassembly gives."""
    from madtrace.binary import plt
    decoded = unknown = 0
    for path in _elf_files():
        try:
            img = ElfImage.load(path)
        except NotElfError:
            continue
        got = img._got_names()
        if not got:
            continue
        for sec in img.sections:
            if sec.name not in plt.PLT_SECTIONS or sec.size == 0 or sec.type == 8:
                continue
            code = img.read(sec.offset, sec.size)
            reference = list(plt._capstone_instructions(code, sec.address))
            try:
                mine = list(plt._stub_instructions(code, sec.address))
            except plt._Unknown:
                unknown += 1
                continue
            decoded += 1
            end = sec.address + sec.size
            assert plt._stubs(mine, end, got) == plt._stubs(reference, end, got), (path, sec.name)
            assert [i[:2] for i in mine] == [i[:2] for i in reference], (path, sec.name)
    assert decoded >= 50 and unknown <= decoded // 20, (decoded, unknown)
