# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace.arch.x86_64: call-site scan (checked against objdump), address-taken
functions, and prologue relocation (checked by decoding and by running the
relocated code)."""

from __future__ import annotations

import ctypes
import glob
import mmap
import os
import re
import shutil
import subprocess

import pytest

from madtrace.arch.x86_64 import (
    Refusal,
    Relocation,
    address_taken,
    decode_one,
    encode_jmp,
    find_call_sites,
    relocate_entry,
)
from madtrace.binary.elf import ElfImage

from .util import ALL_VARIANTS, PROGS_SRC, prog

PROGRAMS = sorted(os.path.splitext(os.path.basename(p))[0]
                  for p in glob.glob(os.path.join(PROGS_SRC, "*.c")))
needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump not installed")
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objcopy") is None,
                               reason="gcc/objcopy not installed")

# ------------------------------------------------------------ objdump oracle
_LINE = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f ]+?)\s*\t(.*)$")
_PREFIX_WORDS = {"bnd", "notrack", "data16", "addr32", "cs", "ds", "es", "ss", "fs", "gs"}


def objdump_branches(path: str) -> dict[int, tuple[str, int, int, str]]:
    """{insn address: (mnemonic, target, length, annotation)} of every direct
    branch objdump shows outside the .plt* sections."""
    out = subprocess.run(["objdump", "-d", "-w", path], capture_output=True, text=True,
                         check=True).stdout
    sec, res = None, {}
    for line in out.splitlines():
        if line.startswith("Disassembly of section "):
            sec = line[len("Disassembly of section "):].rstrip(":")
            continue
        m = _LINE.match(line)
        if sec is None or sec.startswith(".plt") or not m:
            continue
        words = m.group(3).split()
        while words and (words[0] in _PREFIX_WORDS or words[0].startswith("rex")):
            words = words[1:]
        if len(words) < 3 or not words[0].startswith(("j", "call", "loop")):
            continue
        if not re.fullmatch(r"[0-9a-f]+", words[1]) or not words[2].startswith("<"):
            continue
        res[int(m.group(1), 16)] = (words[0], int(words[1], 16), len(m.group(2).split()),
                                    " ".join(words[2:]))
    return res


LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@needs_objdump
@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("name", PROGRAMS)
def test_call_sites_match_objdump(name, variant):
    _check_against_objdump(prog(name, variant))


@needs_objdump
@pytest.mark.skipif(not os.path.exists(LIBC), reason="no libc.so.6 at the Debian path")
def test_call_sites_match_objdump_libc():
    """A stripped library with conditional tail calls (jcc to a function start)."""
    scan = _check_against_objdump(LIBC)
    assert any(u.kind == "jcc" for u in scan.unpatchable)


def _check_against_objdump(path):
    img = ElfImage.load(path)
    scan = find_call_sites(img)
    ob = objdump_branches(path)
    starts = scan.function_starts

    # every FUNC/IFUNC symbol and PLT stub is a function start
    assert {s.address for s in img.functions() if s.address} <= starts
    assert {s.address for s in img.plt_symbols} <= starts
    if not img.stripped:
        # objdump's "<f>" (no offset) on a FUNC symbol or a stub: our start too
        funcs = {s.name for s in img.functions()} | {s.name for s in img.plt_symbols}
        for mn, tgt, _, ann in ob.values():
            name_ = ann.strip("<>").split("@@")[0]
            if "+" not in ann and (name_ in funcs or ann.strip("<>") in funcs):
                assert tgt in starts, (mn, hex(tgt), ann)

    expected = {a: v for a, v in ob.items() if v[1] in starts}
    got = {s.insn_address: (s.kind, s.target) for s in scan.sites}
    got.update({u.address: (u.kind, u.target) for u in scan.unpatchable})
    assert set(got) == set(expected)
    for a, (mn, tgt, length, _) in expected.items():
        kind, target = got[a]
        assert target == tgt, hex(a)
        if mn in ("call", "jmp") and length == 5:
            assert kind == mn, hex(a)
        elif mn == "jmp" and length == 2:
            assert kind == "jmp8", hex(a)
        elif mn.startswith("j") and mn != "jmp":
            assert kind == "jcc", hex(a)
    assert scan.sites, "no call site at all"
    # the 5 bytes at a site are E8/E9 rel32 reaching the target
    for s in scan.sites:
        sec = img.section_at(s.address)
        raw = img.read(sec.offset + s.address - sec.address, 5)
        assert raw[0] == (0xE8 if s.kind == "call" else 0xE9)
        assert s.address + 5 + int.from_bytes(raw[1:], "little", signed=True) == s.target
    return scan


def test_call_site_details():
    img = ElfImage.load(prog("calls_plt", "O2-pie"))
    scan = find_call_sites(img)
    by_name = {s.name: s.address for s in img.functions()}
    main = by_name["main"]
    in_main = [s for s in scan.sites if s.caller == "main"]
    assert in_main and all(main <= s.address < main + 4096 for s in in_main)
    plt = set(img.plt.values())
    assert any(s.target in plt for s in scan.sites), "no call of an x@plt stub"
    # targets= restricts
    one = next(iter(plt & {s.target for s in scan.sites}))
    only = find_call_sites(img, targets={one})
    assert only.sites and {s.target for s in only.sites} == {one}
    assert len(only.sites) == sum(1 for s in scan.sites if s.target == one)
    # a code reader works like the file
    sec_by_addr = {s.address: s for s in img.sections}

    def reader(addr, size):
        sec = sec_by_addr[addr]
        return img.read(sec.offset, size)
    assert find_call_sites(img, code_reader=reader).sites == scan.sites
    # every direct branch is recorded
    for s in scan.sites[:10]:
        assert (s.insn_address, s.target) in scan.branches_into(s.target - 1, s.target + 1)


def test_tail_calls_listed():
    img = ElfImage.load(prog("calls_tail", "O2-pie"))
    scan = find_call_sites(img)
    assert any(s.kind == "jmp" for s in scan.sites) or scan.unpatchable
    for u in scan.unpatchable:
        assert u.kind in ("jmp8", "jcc", "call", "jmp") and u.reason


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_address_taken(variant):
    img = ElfImage.load(prog("calls_callbacks", variant))
    taken = address_taken(img)
    ref = ElfImage.load(prog("calls_callbacks", "O2-pie" if "stripped" in variant else variant))
    addr = {s.name: s.address for s in ref.functions()}
    for f in ("op_add", "op_sub", "op_mul", "op_xor", "op_rot", "main"):
        assert addr[f] in taken, f
    # only ever called directly
    assert addr["run_table"] not in taken
    assert addr["apply"] not in taken


# ---------------------------------------------------------------- relocation
ASM = r"""
    .text
    .globl f_table
    .p2align 6
f_table:                        # long f_table(long i) { return table[i]; }
    endbr64
    lea table(%rip), %rax
    mov (%rax,%rdi,8), %rax
    ret
    .p2align 3
table:
    .quad 11, 22, 33, 44

    .p2align 6
f_jcc:                          # long f_jcc(long x) { return x > 0 ? x * 3 : -7; }
    test %rdi, %rdi
    jle 1f
    lea (%rdi,%rdi,2), %rax
    ret
1:  mov $-7, %rax
    ret

    .p2align 6
f_call:                         # long f_call(long x) { return helper(x) + 1; }
    call helper
    add $1, %rax
    ret

    .p2align 6
helper:
    lea 100(%rdi), %rax
    ret

    .p2align 6
f_sse:                          # comisd with a 66 prefix and a RIP operand
    comisd half(%rip), %xmm0
    ja 1f
    xor %eax, %eax
    ret
1:  mov $1, %eax
    ret
    .p2align 3
half:
    .double 0.5

    .p2align 6
f_loop:                         # branch back into the first 5 bytes
    push %rbx
    mov %rdi, %rbx
2:  dec %rbx
    jnz 2b
    pop %rbx
    ret

    .p2align 6
f_ret:
    xor %eax, %eax
    ret
    nop
    nop
    nop
    nop

    .p2align 6
f_short:
    mov %edi, %eax
    ret
    .p2align 6
end:
"""


@pytest.fixture(scope="module")
def asm_funcs(tmp_path_factory):
    if shutil.which("gcc") is None or shutil.which("objcopy") is None:
        pytest.skip("gcc/objcopy not installed")
    d = tmp_path_factory.mktemp("reloc")
    (d / "f.s").write_text(ASM)
    subprocess.run(["gcc", "-c", "f.s", "-o", "f.o"], cwd=d, check=True)
    subprocess.run(["objcopy", "-O", "binary", "-j", ".text", "f.o", "f.bin"], cwd=d, check=True)
    nm = subprocess.run(["nm", "f.o"], cwd=d, check=True, capture_output=True, text=True).stdout
    syms = {}
    for line in nm.splitlines():
        v, _t, n = line.split()
        syms[n] = int(v, 16)
    code = (d / "f.bin").read_bytes()
    order = sorted(syms.items(), key=lambda kv: kv[1])
    funcs = {n: (a, (order[i + 1][1] if i + 1 < len(order) else len(code)) - a)
             for i, (n, a) in enumerate(order)}
    return code, funcs


BASE = 0x7F0000400000


def _reloc(asm_funcs, name, new_addr=BASE + 0x10000, **kw):
    code, funcs = asm_funcs
    off, size = funcs[name]
    return relocate_entry(code[off:off + size], BASE + off, size, new_addr, **kw), BASE + off


def _decoded(code: bytes, addr: int):
    out, pos = [], 0
    while pos < len(code):
        i = decode_one(code[pos:], addr + pos)
        assert i is not None
        out.append(i)
        pos += i.size
    return out


def test_relocate_rip_lea_and_endbr(asm_funcs):
    code, funcs = asm_funcs
    r, fa = _reloc(asm_funcs, "f_table")
    assert isinstance(r, Relocation) and r
    assert r.consumed == 11  # endbr64 (4) + lea (7)
    ins = _decoded(r.code, BASE + 0x10000)
    assert [i.mnemonic for i in ins] == ["endbr64", "lea"]
    table = BASE + funcs["table"][0]
    lea = ins[1]
    assert lea.operands[1].mem.disp + lea.address + lea.size == table
    assert r.notes


def test_relocate_jcc_rel8(asm_funcs):
    r, fa = _reloc(asm_funcs, "f_jcc")
    assert r and r.consumed == 5  # test (3) + jle (2)
    ins = _decoded(r.code, BASE + 0x10000)
    assert [i.mnemonic for i in ins] == ["test", "jle"]
    assert ins[1].size == 6 and r.code[3:5] == b"\x0f\x8e"
    orig = _decoded(asm_funcs[0][fa - BASE:fa - BASE + 5], fa)
    assert ins[1].operands[0].imm == orig[1].operands[0].imm


def test_relocate_call(asm_funcs):
    code, funcs = asm_funcs
    r, fa = _reloc(asm_funcs, "f_call", new_addr=BASE - 0x5000000)
    assert r and r.consumed == 5
    (ins,) = _decoded(r.code, BASE - 0x5000000)
    assert ins.mnemonic == "call" and ins.operands[0].imm == BASE + funcs["helper"][0]


def test_relocate_66_prefixed_rip(asm_funcs):
    code, funcs = asm_funcs
    r, fa = _reloc(asm_funcs, "f_sse")
    assert r and r.consumed == 8
    (ins,) = _decoded(r.code, BASE + 0x10000)
    assert ins.mnemonic == "comisd"
    assert ins.address + ins.size + ins.operands[1].mem.disp == BASE + funcs["half"][0]


def test_relocate_refusals(asm_funcs):
    r, _ = _reloc(asm_funcs, "f_loop")
    assert isinstance(r, Refusal) and not r and "inside the relocated" in r.reason
    r, _ = _reloc(asm_funcs, "f_ret")
    assert not r and "ret" in r.reason
    code, funcs = asm_funcs
    off, _size = funcs["f_short"]
    r = relocate_entry(code[off:off + 3], BASE + off, 3, BASE + 0x10000)
    assert not r and "shorter" in r.reason
    # RIP target out of disp32 range
    r, _ = _reloc(asm_funcs, "f_table", new_addr=BASE + (3 << 30))
    assert not r and "range" in r.reason
    # int3 / indirect jmp in the first bytes
    assert not relocate_entry(b"\xcc" + b"\x90" * 8, 0x1000, 9, 0x2000)
    r = relocate_entry(b"\x90\xff\xe0" + b"\x90" * 8, 0x1000, 11, 0x2000)
    assert not r and "indirect" in r.reason
    assert not relocate_entry(b"\x90\x06\x90\x90\x90\x90", 0x1000, 6, 0x2000)  # 06: invalid
    # a branch from elsewhere into the prologue, reported by branches_into
    r = relocate_entry(b"\x55\x48\x89\xe5\x90\xc3", 0x1000, 6, 0x2000,
                       branches_into=lambda lo, hi: [(0x5000, 0x1001)])
    assert not r and "0x5000" in r.reason
    assert relocate_entry(b"\x55\x48\x89\xe5\x90\xc3", 0x1000, 6, 0x2000,
                          branches_into=lambda lo, hi: [])


def _rwx(size):
    m = mmap.mmap(-1, size, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


@pytest.mark.parametrize("name,args", [
    ("f_table", [0, 1, 2, 3]),
    ("f_jcc", [5, 0, -3, 100]),
    ("f_call", [1, 2, -100]),
])
def test_relocated_code_runs(asm_funcs, name, args):
    code, funcs = asm_funcs
    try:
        m, base = _rwx(2 * 65536)
    except (OSError, ValueError) as e:
        pytest.skip(f"no RWX mapping: {e}")
    try:
        m[:len(code)] = code
        fn_type = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)
        off, size = funcs[name]
        fa = base + off
        expected = [fn_type(fa)(a) for a in args]
        tramp = base + 65536
        r = relocate_entry(code[off:off + size], fa, size, tramp)
        assert r, r
        back = encode_jmp(tramp + len(r.code), fa + r.consumed)
        m[65536:65536 + len(r.code) + 5] = r.code + back
        patch = encode_jmp(fa, tramp)
        m[off:off + 5] = patch
        got = [fn_type(fa)(a) for a in args]   # runs through the trampoline
        assert got == expected
        assert fn_type(tramp)(args[0]) == expected[0]
    finally:
        m.close()


# ------------------------------------------------------------ operand redirection
# Each line: an instruction with one memory operand, as gas encodes it (legacy with
# REX, fs segment, VEX, EVEX with compressed disp8, zmm16+ registers, masks, broadcast).
REDIRECT_CASES = [
    "movq 0x10(%rbx,%r12,8), %rax",
    "addl $0x12345, 0x40(%r13)",
    "movq %fs:0x28, %rcx",
    "lock xaddq %rdx, (%r9)",
    "vmovdqu 0x20(%rsi), %ymm3",
    "vpcmpeqb (%rdi,%rcx), %ymm0, %ymm1",
    "vmovdqu64 0x40(%rsi), %zmm17",
    "vmovdqu8 %zmm16, -0x40(%rdi,%rdx){%k1}",
    "vpcmpeqb 0x80(%r8), %zmm2, %k0",
    "vpaddd (%r10){1to16}, %zmm5, %zmm6{%k2}{z}",
    "vmovdqu64 %ymm31, 0x7f(%rax)",
]


@needs_gcc
def test_redirect_operand_to_slot(tmp_path):
    """Each instruction re-encoded at another address with its memory operand
    [rip+disp32] at the slot: same mnemonic, same register operands, same size of
    memory operand (decoded by capstone from bytes that gas produced)."""
    from madtrace.arch.x86_64.redirect import redirect_operand

    (tmp_path / "r.s").write_text("".join(f"    {line}\n" for line in REDIRECT_CASES))
    subprocess.run(["gcc", "-c", "r.s", "-o", "r.o"], cwd=tmp_path, check=True)
    subprocess.run(["objcopy", "-O", "binary", "-j", ".text", "r.o", "r.bin"],
                   cwd=tmp_path, check=True)
    code = (tmp_path / "r.bin").read_bytes()
    at, stub, slot = 0x401000, 0x7F0000400000, 0x7F0000500040
    for old in _decoded(code, at):
        off = old.address - at
        new_bytes = redirect_operand(code[off:off + old.size], old.address, stub, slot)
        assert not isinstance(new_bytes, Refusal), (old.mnemonic, old.op_str, new_bytes)
        new = decode_one(new_bytes, stub)
        assert new.mnemonic == old.mnemonic and new.size == len(new_bytes)
        mem = [o for o in new.operands if o.type == 3]      # X86_OP_MEM
        assert len(mem) == 1 and stub + new.size + mem[0].mem.disp == slot
        old_regs = [o.reg for o in old.operands if o.type == 1]
        assert [o.reg for o in new.operands if o.type == 1] == old_regs
        assert [o.size for o in new.operands] == [o.size for o in old.operands]
        assert "fs:" not in new.op_str and "rip" in new.op_str


REGS64 = ("rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
          "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")


@pytest.mark.parametrize("reg", [r for r in REGS64 if r != "rsp"])
def test_indirect_jump_stub_loads_the_target_register(reg):
    """The stub of a relocated ``jmp REG`` starts with ``mov rax, REG`` (checked
    by decoding): with r8-r15 the register is ModRM.reg, which REX.R extends (a
    REX.B there once made ``jmp r9`` in CPython's PyObject_Call jump to rax)."""
    from madtrace.arch.x86_64.jump_stubs import target_load as _target_load
    n = REGS64.index(reg)
    jump = bytes([0x41] if n >= 8 else []) + bytes([0xFF, 0xE0 | (n & 7)])   # jmp reg
    insn = decode_one(jump, 0x1000)
    assert insn.mnemonic == "jmp" and insn.op_str == reg
    load = _target_load(insn, 0x2000)
    moved = decode_one(load, 0x2000)
    assert (moved.mnemonic, moved.op_str, moved.size) == ("mov", f"rax, {reg}", len(load))
