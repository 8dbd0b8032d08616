# SPDX-License-Identifier: GPL-2.0-or-later
"""The hybrid engine's function copies, decoded back (arch/x86_64/function_copy.py).

Every function of the test programs is copied with a probe wanted on every
memory operand; capstone's own Python API (not the copier's column reader)
then decodes the copy and each original instruction must be found, at its
``old_to_new`` address, as an equivalent one: the same bytes; a relative
branch to the copy of its target (or to its target outside the function);
a RIP-relative operand reaching the same address; a probe's address
computation taking the original operand and the instruction itself on
``[rA]``; an indirect jump's stub loading the same target; the pieces end to
end, the copy closed by a jump to the function's end, the jump table mapping
every instruction.  ``test_checker_finds_wrong_copies`` shows the checker
fails on copies made wrong on purpose."""

from __future__ import annotations

import dataclasses
import glob
import os

import pytest
from capstone import CS_GRP_BRANCH_RELATIVE, CS_GRP_CALL, CS_GRP_JUMP, CS_GRP_RET
from capstone import x86_const as X

from madtrace.arch.x86_64.decode import capstone_detail, decode_one
from madtrace.arch.x86_64.function_copy import FRAME, FunctionCopy, analyse, copy_function
from madtrace.binary.eh_frame import EhFrame
from madtrace.binary.elf import ElfImage
from madtrace.target.templates import load_injector

from .util import PROGS_SRC, prog

PROGRAMS = sorted(os.path.splitext(os.path.basename(p))[0]
                  for p in glob.glob(os.path.join(PROGS_SRC, "*.c*")))
CTL, BITMAP = 0x7F0000001000, 0x7F1000002000
LOOPS = ("loop", "loope", "loopne", "jrcxz", "jecxz")


@pytest.fixture(scope="module")
def injector():
    return load_injector()


def functions(path: str):
    image = ElfImage.load(path)
    ranges: dict[int, int] = {}
    for symbol in image.functions():
        if symbol.size and symbol.address:
            ranges.setdefault(symbol.address, symbol.address + symbol.size)
    eh = EhFrame(image)
    for _start, fde_at in eh.table:
        fde = eh._fde(fde_at)
        if fde is not None and fde.end > fde.start:
            ranges.setdefault(fde.start, fde.end)
    for start, end in sorted(ranges.items()):
        section = image.section_at(start)
        if section is not None and section.is_exec and end <= section.address + section.size:
            yield start, end, bytes(image.read(section.offset + start - section.address, end - start))


def copies(path: str, injector, want=lambda mem: True):
    image = ElfImage.load(path)
    address = (max(s.address + s.size for s in image.sections if s.is_alloc) + (1 << 20)) & ~0xFFFF
    ids = iter(range(1, 1 << 30))
    for start, end, code in functions(path):
        copy = copy_function(code, start, end, address, injector, want, lambda mem, *_: next(ids),
                             CTL, BITMAP)
        yield start, end, code, copy


def _memory(insn):
    return next((op for op in insn.operands if op.type == X.X86_OP_MEM), None)


def _rip_target(insn) -> int | None:
    op = _memory(insn)
    if op is None or op.mem.base != X.X86_REG_RIP:
        return None
    return insn.address + insn.size + op.mem.disp


def check_copy(copy: FunctionCopy, code: bytes, start: int, end: int, injector) -> list[str]:
    """What is wrong with ``copy`` (see the module docstring)."""
    problems: list[str] = []
    base, out = copy.address, copy.code

    def at(address: int):
        return decode_one(out[address - base:address - base + 16], address)

    def translated(target: int) -> int:
        return copy.old_to_new.get(target, -1) if start <= target < end else target

    insns = list(capstone_detail().disasm(code, start))
    piece_ends: dict[int, int] = {}      # original address -> where its piece ends
    probes = {p.original: p for p in copy.probes}
    stubs = {s.original: s for s in copy.stubs}
    head = injector.templates["probe_head"]
    template = injector.templates["probe"]
    ends: list[tuple[int, int]] = []        # (where the piece starts, where it ends)
    for insn in insns:
        new = copy.old_to_new.get(insn.address)
        where = f"{insn.address:#x} '{insn.mnemonic} {insn.op_str}'"
        if new is None:
            problems.append(f"{where}: not in old_to_new")
            continue
        groups = set(insn.groups)
        raw = code[insn.address - start:insn.address - start + insn.size]
        if insn.address in probes and probes[insn.address].string:
            p = probes[insn.address]
            problems += [f"{where}: {x}" for x in _check_string_probe(p, insn, at, out, base, head,
                                                                     injector)]
            ends.append((new, p.last))
        elif insn.address in probes:
            p = probes[insn.address]
            problems += [f"{where}: {x}" for x in _check_probe(p, insn, at, out, base, head, template,
                                                              injector)]
            piece_end = p.end
            # a call or a tail jump through memory: then the call or jump, on the target the
            # probe loaded
            branch = "call" if CS_GRP_CALL in groups else "jmp" if CS_GRP_JUMP in groups else None
            if branch is not None:
                after = at(p.end)
                if after is None or (after.mnemonic, after.op_str) != (branch, "r11"):
                    problems.append(f"{where}: the probe is not followed by '{branch} r11'")
                else:
                    piece_end = p.end + after.size
            ends.append((new, piece_end))
        elif insn.address in stubs:
            s = stubs[insn.address]
            problems += [f"{where}: {x}" for x in _check_stub(s, insn, at)]
            ends.append((new, s.end))
        elif CS_GRP_BRANCH_RELATIVE in groups:
            got = at(new)
            target = insn.operands[0].imm
            piece_end = got.address + got.size if got else new
            if got is not None and insn.mnemonic in LOOPS:
                hop, jump = at(piece_end), at(piece_end + 2)
                ok = got.mnemonic == insn.mnemonic and got.operands[0].imm == piece_end + 2 and \
                    hop is not None and hop.bytes == b"\xeb\x05" and jump is not None and \
                    jump.mnemonic == "jmp" and jump.operands[0].imm == translated(target)
                piece_end = piece_end + 7
            else:
                ok = got is not None and got.mnemonic == insn.mnemonic and \
                    CS_GRP_BRANCH_RELATIVE in got.groups and got.operands[0].imm == translated(target)
            if not ok:
                problems.append(f"{where}: branch copied as "
                                f"{got.mnemonic + ' ' + got.op_str if got else 'nothing'}")
            ends.append((new, piece_end))
        else:
            got = at(new)
            if got is None:
                problems.append(f"{where}: undecodable in the copy")
                continue
            if _rip_target(insn) is not None:
                if (got.mnemonic, got.size, _rip_target(got)) != \
                        (insn.mnemonic, insn.size, _rip_target(insn)):
                    problems.append(f"{where}: copied as '{got.mnemonic} {got.op_str}'")
            elif bytes(got.bytes) != raw:
                problems.append(f"{where}: copied as '{got.mnemonic} {got.op_str}'")
            ends.append((new, new + insn.size))
        piece_ends[insn.address] = ends[-1][1]
        if CS_GRP_JUMP in groups and CS_GRP_RET not in groups and \
                CS_GRP_BRANCH_RELATIVE not in groups and insn.address not in stubs:
            probe = probes.get(insn.address)
            if probe is None or insn.operands[0].type != X.X86_OP_MEM or insn.operands[0].mem.index:
                problems.append(f"{where}: an indirect jump without its stub (or a probe: a "
                                f"jump through memory without an index)")
    for insn in insns:
        # a call's or a system call's end in the copy leads back to the original's
        piece_end = piece_ends.get(insn.address)
        if piece_end is not None and (CS_GRP_CALL in insn.groups or insn.mnemonic == "syscall"):
            if copy.returns.get(piece_end) != insn.address + insn.size:
                problems.append(f"{insn.address:#x} '{insn.mnemonic}': no return point at "
                                f"{piece_end:#x}")
    for (_s, e), (s2, _e2) in zip(ends, ends[1:]):
        if e != s2:
            problems.append(f"a piece ends at {e:#x}, the next begins at {s2:#x}")
    if ends:
        tail = at(ends[-1][1])
        if tail is None or tail.mnemonic != "jmp" or tail.operands[0].imm != end:
            problems.append("the copy is not closed by a jump to the function's end")
    if copy.stubs:
        table_at = (base + copy.code_size + 7) & ~7
        table = memoryview(out)[table_at - base:].cast("i")
        for insn in insns:
            if table[insn.address - start] != copy.old_to_new[insn.address] - base:
                problems.append(f"{insn.address:#x}: jump table entry {table[insn.address - start]}")
    return problems


def _check_probe(p, insn, at, out, base, head, template, injector) -> list[str]:
    problems = []
    if out[p.start - base:p.start - base + head.size] != head.code:
        problems.append("no probe_head at the probe's start")
    lea = at(p.start + head.size)
    orig = _memory(insn)
    if lea is None or lea.mnemonic != "lea" or lea.op_str.split(",")[0] != "rcx" or \
            lea.address + lea.size != p.body:
        problems.append("no lea rcx before the probe's body")
    elif orig.mem.base == X.X86_REG_RIP:
        if _rip_target(lea) != _rip_target(insn):
            problems.append("lea rcx takes another address")
    else:
        a, b = orig.mem, lea.operands[1].mem
        if (a.base, a.index, a.scale, a.disp) != (b.base, b.index, b.scale, b.disp):
            problems.append("lea rcx takes another operand")
    made = template.instantiate(p.body, bitmap=BITMAP, ctl=CTL,
                                code=(injector.MT_DATA_CODE | p.ident) - (1 << 32))
    if out[p.body - base:p.body - base + template.size] != made:
        problems.append("the probe template is not the one for this instruction id")
    moved = at(p.insn)
    if CS_GRP_CALL in set(insn.groups) or CS_GRP_JUMP in set(insn.groups):
        # a call or a jump through memory: the probe loads its target into r11
        if moved is None or (moved.mnemonic, moved.address + moved.size) != ("mov", p.insn_end) or \
                moved.op_str != f"r11, qword ptr [{p.reg}]" or p.reg == "r11":
            problems.append(f"the branch's target load in the probe is "
                            f"'{moved.mnemonic + ' ' + moved.op_str if moved else None}'")
        return problems
    if p.stack:
        return _check_push_probe(p, insn, at, injector)
    if moved is None or moved.mnemonic != insn.mnemonic or moved.address + moved.size != p.insn_end \
            or len(moved.operands) != len(insn.operands):
        problems.append(f"the instruction in the probe is '{moved.mnemonic if moved else None}'")
        return problems
    for a, b in zip(insn.operands, moved.operands):
        if a.type != b.type or a.size != b.size:
            problems.append("operands differ in the probe")
        elif a.type == X.X86_OP_MEM and (moved.reg_name(b.mem.base), b.mem.index, b.mem.disp) != \
                (p.reg, 0, 0):
            problems.append(f"memory operand not on [{p.reg}]")
        elif a.type == X.X86_OP_REG and a.reg != b.reg:
            problems.append("register operand changed in the probe")
        elif a.type == X.X86_OP_IMM and a.imm != b.imm:
            problems.append("immediate changed in the probe")
    return problems


def _check_push_probe(p, insn, at, injector) -> list[str]:
    """A push's probe (insn_entries.py ``_push_plan``): the value loaded from
    [rA], stored in the 8 bytes below the thread's stack pointer, rA reloaded,
    the frame popped 8 bytes short."""
    frame = injector.MT_PROBE_FRAME
    want = [f"mov {p.reg}, qword ptr [{p.reg}]",
            f"mov qword ptr [rsp + {frame - 8:#x}], {p.reg}",
            f"mov {p.reg}, qword ptr [rsp + {injector.MT_PF_SAVED:#x}]",
            f"lea rsp, [rsp + {frame - 8:#x}]"]
    got, where = [], p.insn
    for _ in want:
        moved = at(where)
        if moved is None:
            break
        got.append(f"{moved.mnemonic} {moved.op_str}")
        where = moved.address + moved.size
        if len(got) == 2 and where != p.insn_end:
            return [f"the push's store ends at {where:#x}, not at {p.insn_end:#x}"]
    if insn.mnemonic != "push" or p.stack != -8 or got != want or where != p.end:
        return [f"the push's probe is {got}"]
    return []


def _check_string_probe(p, insn, at, out, base, head, injector) -> list[str]:
    """A string instruction's probe (string_probes.py): its loop (a rep prefix),
    its address computation, its template with this id, the instruction without
    rep on its own registers, the fix-up of those registers."""
    L = injector
    problems = []
    name = insn.mnemonic.split()[-1]
    rep = insn.mnemonic.split()[0] if " " in insn.mnemonic else None
    if bool(p.loop) != (rep is not None):
        problems.append(f"loop {p.loop} for '{insn.mnemonic}'")
    if out[p.head - base:p.head - base + head.size] != head.code:
        problems.append("no probe_head at the probe's head")
    regs = ("rsi", "rdi") if name.startswith("movs") else ("rdi", "rsi") if name.startswith("cmps") \
        else None
    first = at(p.head + head.size)
    if regs is None:
        if first is None or (first.mnemonic, first.op_str) != ("lea", f"rcx, [{p.reg}]") or \
                first.address + first.size != p.body:
            problems.append("no lea rcx, [rA] before the probe's body")
        template = L.templates["probe"]
        fields = template.recognise(out[p.body - base:], p.body)
        if fields is None or fields["code"] != (L.MT_DATA_CODE | p.ident) - (1 << 32):
            problems.append("the probe template is not the one for this instruction id")
    else:
        second = at(first.address + first.size) if first is not None else None
        wanted = [f"qword ptr [rsp + {hex(L.MT_PF_ADDR)}], {regs[0]}",
                  f"qword ptr [rsp + {hex(L.MT_PF_ADDR2)}], {regs[1]}"]
        if [i.op_str if i else None for i in (first, second)] != wanted or \
                second.address + second.size != p.body:
            problems.append("the two addresses are not stored in their order before the body")
        template = L.templates["string_probe"]
        fields = template.recognise(out[p.body - base:], p.body)
        if fields is None or fields["first"] != (L.MT_DATA_CODE | p.ident) - (1 << 32):
            problems.append("the string probe template is not the one for this instruction id")
    moved = at(p.insn)
    if moved is None or moved.mnemonic != name or moved.op_str != insn.op_str:
        problems.append(f"the instruction in the probe is '{moved.mnemonic if moved else None}'")
        return problems
    fix, k = [], moved.address + moved.size
    while k < p.insn_end:
        i = at(k)
        if i is None:
            break
        fix.append(i.mnemonic)
        k += i.size
    touched = 2 if regs else 1
    if k != p.insn_end or fix != ["pushfq"] + ["sub", "add"] * touched + ["popfq", "mov"]:
        problems.append(f"the registers' fix-up is {fix}")
    if p.loop:
        enter = at(p.start)
        steps = []
        k = p.end
        while k < p.last:
            i = at(k)
            if i is None:
                break
            steps.append((i.mnemonic, i.op_str))
            k += i.size
        names = [m for m, _ in steps]
        want = ["lea"] + (["jne" if p.loop == 2 else "je"] if p.loop in (2, 3) else []) + ["jrcxz", "jmp"]
        if names != want or steps[-1][1] != hex(p.head) or steps[-2][1] != hex(p.last) or \
                steps[0][1] != "rcx, [rcx - 1]":
            problems.append(f"the loop is {steps}")
        if enter is None or enter.mnemonic != "jmp" or int(enter.op_str, 16) != p.last - 7:
            problems.append("the loop does not begin with a jump to its test")
    elif p.end != p.last:
        problems.append("a probe without a loop ends after its end")
    return problems


def _check_stub(s, insn, at) -> list[str]:
    first, load = at(s.start), at(s.load)
    if first is None or (first.mnemonic, first.op_str) != ("lea", f"rsp, [rsp - {hex(FRAME)}]"):
        return ["the stub does not begin by stepping over the red zone"]
    op = insn.operands[0]
    if load is None or load.mnemonic != "mov" or not load.op_str.startswith("rax, "):
        return ["the stub does not load the target into rax"]
    got = load.operands[1]
    if op.type == X.X86_OP_REG:
        ok = got.type == X.X86_OP_REG and got.reg == op.reg
    elif op.mem.base == X.X86_REG_RIP:
        ok = _rip_target(load) == _rip_target(insn)
    else:
        extra = FRAME if insn.reg_name(op.mem.base) == "rsp" else 0
        ok = got.type == X.X86_OP_MEM and (got.mem.base, got.mem.index, got.mem.scale,
                                           got.mem.disp, got.mem.segment) == \
            (op.mem.base, op.mem.index, op.mem.scale, op.mem.disp + extra, op.mem.segment)
    return [] if ok else [f"the stub loads '{load.op_str}'"]


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
@pytest.mark.parametrize("name", PROGRAMS)
def test_copies_decode_back(name, variant, injector):
    made = 0
    problems = []
    for start, end, code, copy in copies(prog(name, variant), injector):
        if not isinstance(copy, FunctionCopy):
            continue
        made += 1
        problems += [f"{start:#x}: {p}" for p in check_copy(copy, code, start, end, injector)]
    assert made >= 3
    assert not problems, problems[:10]


LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.skipif(not os.path.exists(LIBC), reason="no x86-64 glibc at " + LIBC)
def test_system_calls_in_libc_copies_have_return_points(injector):
    """The C library's functions that make system calls (poll, read, clone...):
    copied, each ``syscall``'s end in the copy leads back to the original's (a
    stale %rcx a thread spilled on its stack is given back at detach)."""
    made = 0
    for start, end, code, copy in copies(LIBC, injector):
        if isinstance(copy, FunctionCopy) and b"\x0f\x05" in code:
            assert check_copy(copy, code, start, end, injector) == [], hex(start)
            made += 1
            if made == 40:
                break
    assert made == 40


def test_copies_with_some_probes_decode_back(injector):
    """Two in three memory operands probed, the copy made again from the kept
    analysis with all of them: both decode back."""
    path = prog("data_kernels", "O2-pie")
    made = 0
    for start, end, code, copy in copies(path, injector, lambda mem: mem.address % 3 != 0):
        if not isinstance(copy, FunctionCopy):
            continue
        again = copy_function(code, start, end, copy.address, injector, lambda mem: True,
                              lambda mem, *_: 7, CTL, BITMAP, analysis=analyse(code, start, end))
        assert isinstance(again, FunctionCopy)
        assert len(again.probes) >= len(copy.probes)
        for c in (copy, again):
            assert check_copy(c, code, start, end, injector) == []
        made += 1
    assert made >= 3


def test_checker_finds_wrong_copies(injector):
    """The checker is not blind: a branch sent elsewhere, a probe said to be on
    another register, an instruction's copy said to be a byte further are each
    found."""
    path = prog("data_kernels", "O2-pie")
    found = {}
    for start, end, code, copy in copies(path, injector):
        if isinstance(copy, FunctionCopy) and copy.probes and \
                any(i.group(CS_GRP_BRANCH_RELATIVE) for i in capstone_detail().disasm(code, start)):
            found[start] = (start, end, code, copy)
    start, end, code, copy = max(found.values(), key=lambda f: len(f[3].probes))
    assert check_copy(copy, code, start, end, injector) == []
    insns = list(capstone_detail().disasm(code, start))
    branch = next(i for i in insns if i.group(CS_GRP_BRANCH_RELATIVE) and i.mnemonic != "call")
    new = copy.old_to_new[branch.address] - copy.address
    size = decode_one(copy.code[new:new + 16], 0).size
    wrong = bytearray(copy.code)
    wrong[new + size - 4] ^= 1                           # the rel32, one byte off
    assert any("branch copied" in p for p in
               check_copy(dataclasses.replace(copy, code=bytes(wrong)), code, start, end, injector))
    probe = copy.probes[0]
    other = dataclasses.replace(probe, reg="r15" if probe.reg != "r15" else "r14")
    wrong_probes = [dataclasses.astuple(other) if p == probe else dataclasses.astuple(p)
                    for p in copy.probes]
    assert any("not on [" in p for p in check_copy(dataclasses.replace(copy, probe_rows=wrong_probes),
                                                   code, start, end, injector))
    shifted = dict(copy.old_to_new)
    shifted[insns[-1].address] += 1
    assert check_copy(dataclasses.replace(copy, old_to_new=shifted), code, start, end, injector)


@pytest.mark.parametrize("path", [prog("data_kernels", "O2-pie"), "/lib/x86_64-linux-gnu/libc.so.6"])
def test_detail_columns_are_capstones(path):
    """What the copier reads of capstone's C structures (detail.py, insn_entries.py)
    is what capstone's Python API gives: size, id, mnemonic, text, groups,
    operands (type, register, immediate, memory operand, size, access),
    ModRM/displacement offsets, immediate size, registers read or written."""
    from madtrace.arch.x86_64.detail import decode
    from madtrace.arch.x86_64.insn_entries import _Rows

    checked = 0
    found = list(functions(path))
    for start, _end, code in found[::20] if len(found) > 1000 else found:
        d = decode(code, start)
        rows = _Rows(d)
        insns = list(capstone_detail().disasm(code, start))
        assert d.n == len(insns)
        for k, insn in enumerate(insns):
            v = d.view(k)
            assert (v.address, v.size, v.id, v.mnemonic, v.op_str, v.groups, v.modrm_offset,
                    v.disp_offset, v.imm_size) == \
                (insn.address, insn.size, insn.id, insn.mnemonic, insn.op_str, list(insn.groups),
                 insn.modrm_offset, insn.disp_offset, insn.imm_size)
            assert len(v.operands) == len(insn.operands)
            for a, b in zip(v.operands, insn.operands):
                assert (a.type, a.size, a.access) == (b.type, b.size, b.access)
                if b.type == X.X86_OP_REG:
                    assert a.reg == b.reg
                elif b.type == X.X86_OP_IMM:
                    assert a.imm == b.imm
                elif b.type == X.X86_OP_MEM:
                    assert (a.mem.segment, a.mem.base, a.mem.index, a.mem.scale, a.mem.disp) == \
                        (b.mem.segment, b.mem.base, b.mem.index, b.mem.scale, b.mem.disp)
            if k in rows.mem_row:
                read, written = insn.regs_access()
                assert rows.registers(k) == set(read) | set(written)
            checked += 1
    assert checked > 100


SMALL = {   # hand-made functions: (bytes, the refusal expected or None)
    "side entry past a lock prefix": ("7401f0480fb10ac3", None),
    "loop and jrcxz": ("e2fee302c3c3c3", None),
    "jmp rax": ("ffe0", None),
    "jmp [rip]": ("ff2500000000", None),
    "jmp [rsp + 8]": ("ff642408", None),
    "jmp fs:[0x10]": ("64ff242510000000", None),
    "notrack jmp r9": ("3e41ffe1", None),
    "read-modify-writes": ("480fb10a4801084883000141ff0c24c3", None),
    "VEX loads": ("c5f8100783c001c4c17a1001c3", None),
    "ah and a load": ("8a2788e7c3", None),
    "SSE moves": ("660f6f07660fd60fc3", None),
    "a RIP-relative load": ("8b0500000000c3", None),
    "xbegin": ("c7f800000000c3", "'xbegin' at 0x400000"),
    "call of the next instruction": ("e800000000c3", "call of the next instruction at 0x400000"),
    "into an instruction": ("eb014889c8c3", "branch at 0x400000 into the middle of an instruction"),
    "jmp [eax]": ("67ff20", "indirect jump 'jmp qword ptr [eax]' at 0x400000: 32-bit address"),
    "jecxz": ("67e300c3", "internal: branch at 0x400000 is 10 bytes, planned 9"),
}


@pytest.mark.parametrize("code, probed", [
    ("ff2500000000", True),                 # jmp [rip]: a tail call through memory
    ("488b07ff6008", True),                 # mov rax, [rdi]; jmp [rax + 8]: a type slot's
    ("ff24c500104000", False),              # jmp [rax*8 + table]: a switch, keeps its stub
    ("4c89d8ff2500000000", False),          # mov rax, r11; jmp [rip]: r11 is the function's
    ("4189c3ff2500000000", False),          # mov r11d, eax; jmp [rip]: a part of r11
    ("498b0bff2500000000", False),          # mov rcx, [r11]; jmp [rip]: r11 in an address
])
def test_jumps_through_memory_take_probes_where_r11_is_free(code, probed, injector):
    """A jump through memory without an index register (a tail call) takes a
    probe that loads its target into r11, then ``jmp r11``, in a function that
    never uses r11; any other keeps the stub, which preserves every register."""
    code = bytes.fromhex(code)
    start = 0x400000
    copy = copy_function(code, start, start + len(code), 0x500000, injector, lambda mem: True,
                         lambda mem, *_: 3, CTL, BITMAP)
    assert isinstance(copy, FunctionCopy), copy
    jump = max(copy.old_to_new)
    assert (copy.probe_of(jump) is not None) == probed
    assert (jump in {s.original for s in copy.stubs}) == (not probed)
    assert check_copy(copy, code, start, start + len(code), injector) == []


@pytest.mark.parametrize("name", SMALL)
def test_small_functions(name, injector):
    """Hand-made functions: copies decode back, refusals say why."""
    code, refusal = bytes.fromhex(SMALL[name][0]), SMALL[name][1]
    start = 0x400000
    copy = copy_function(code, start, start + len(code), 0x500000, injector, lambda mem: True,
                         lambda mem, *_: 3, CTL, BITMAP)
    if refusal is not None:
        assert not isinstance(copy, FunctionCopy) and copy.reason == refusal
        return
    assert isinstance(copy, FunctionCopy), copy
    assert check_copy(copy, code, start, start + len(code), injector) == []
