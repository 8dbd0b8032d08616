/* SPDX-License-Identifier: GPL-2.0-or-later
 *
 * Trampoline templates of madtrace (HMTT_FBI call-site technique, plus
 * function-entry patching for functions that are also called indirectly).
 *
 * Assembled once by the Makefile; injector/build_templates.py extracts each
 * template's bytes between mt_<name>_start and mt_<name>_end and the offsets of
 * its patch points: every label mt_<name>_pp_<field>_<kind> marks the END of
 * a field of <kind> imm32 / abs64 / rel32 (a rel32 is relative to its own end,
 * as for jmp/call rel32 and rip-relative disp32).  The tracer fills them per
 * site (madtrace/target/templates.py).
 *
 * Register use: at a call site and at a function entry the flags, r10 and r11
 * are dead by the SysV ABI, but argument registers and rax (al = vector
 * register count of varargs calls) are live, and after a return rax/rdx hold
 * the result: every register a template touches is saved below the stack
 * pointer and restored.  Below the stack pointer is free at these points (the
 * call just overwrote the caller's red zone anyway).  No template calls
 * anything, so stack alignment does not matter.  DF is never touched.
 */
#include "layout.h"
        .intel_syntax noprefix
        .text

/* SAVE/RESTORE: the three registers a record needs; SAVE4/RESTORE4 with rsi
 * too, for the templates that keep a shadow stack */
.macro SAVE
        push rax
        push rcx
        push rdx
.endm
.macro RESTORE
        pop rdx
        pop rcx
        pop rax
.endm
.macro SAVE4
        SAVE
        push rsi
.endm
.macro RESTORE4
        pop rsi
        RESTORE
.endm

/* Each record is written by a straight fast path (LOOKUP, EMIT) that uses rax,
 * rcx and rdx only; what it may branch to (a slot found further on, a thread
 * without a slot, a full ring) is laid out after the template's last jump
 * (LOOKUP_SLOW, EMIT_SLOW) and saves what else it uses, so the fast path takes
 * no branch.  Labels are .L<what>_<template><tag>. */

/* SLOT_OF: rdx = the slot where key rax is probed first (rcx = control
 * block), compared with the key (flags: equal if the slot holds it) */
.macro SLOT_OF
        mov edx, eax
        shr edx, MT_SLOT_HASH_SHIFT - 4
        and edx, (MT_SLOTS - 1) << 4
        lea rdx, [rcx + rdx + MT_SLOT_TABLE]
        cmp [rdx], rax
.endm

/* PROBE_OUT end: a data probe's flags, rdx, rcx and rax back from its frame */
.macro PROBE_OUT end
        mov rax, [rsp + MT_PF_FLAGS]
        add al, 0x7f                        /* OF back (al: 1 if it was set) */
        sahf                                /* SF ZF AF PF CF back */
        mov rdx, [rsp + MT_PF_RDX]
        mov rcx, [rsp + MT_PF_RCX]
        mov rax, [rsp + MT_PF_RAX]
        jmp \end
.endm

/* PROBE_ON probe, found, noslot: the rest of a data probe's linear probe for
 * %fs:0 from slot rdx (rcx = control block), at label probe */
.macro PROBE_ON probe, found, noslot
\probe:
        cmp qword ptr [rdx], 0
        je \noslot
        add rdx, MT_SLOT_ENTRY_SIZE
        lea rax, [rcx + MT_SLOT_TABLE + MT_SLOT_TABLE_SIZE]
        cmp rdx, rax
        jae \noslot
        mov rax, fs:[0]
        not rax
        cmp [rdx], rax
        jne \probe
        jmp \found
.endm

/* LOOKUP name, tag: rcx = this thread's ring block.
 * The slot table is keyed by NOT(fs base) (layout.h).  The fast path takes the
 * word at %fs:0 for the fs base: one load, where rdfsbase costs ~7 cycles, and
 * the same value wherever the x86-64 TLS ABI is followed (the TCB's first word
 * points at the TCB: glibc, musl); LOOKUP_SLOW tries rdfsbase when it misses.
 * Key K is probed first at slot ((K >> MT_SLOT_HASH_SHIFT) & (MT_SLOTS - 1)).
 * The ring found must be the thread's own: its owner word (patch point
 * mt_<name>_pp_owner<tag>_imm32: the offset from the thread pointer) equals
 * the ring's MT_RING_OWNER; else, and without a slot, mt_claim decides.
 * owner=0 (the hybrid data engine's hook stubs: every thread is traced, its
 * slot is its own): no owner check, no claim. */
.macro LOOKUP name, tag, owner=1
        movabs rcx, 0x1122334455667788
mt_\name\()_pp_ctl\tag\()_abs64:
        mov rax, fs:[0]
        not rax
        SLOT_OF
        jne .Lprobe_\name\tag
.Lfound_\name\tag:
.if \owner
        mov eax, dword ptr fs:[0x7fffffff]  /* the owner word (layout.h "Ring pool") */
mt_\name\()_pp_owner\tag\()_imm32:
        mov rdx, [rdx + 8]
        cmp eax, [rdx + MT_RING_OWNER]
        jne .Lclaim_\name\tag            /* a dead thread's ring (its TCB reused): claim one */
        mov rcx, rdx
.else
        mov rcx, [rdx + 8]
.endif
.Lowned_\name\tag:
.endm

/* the rest of the linear probe for key rax (rcx = control block, rdx = the
 * slot probed); then the same for the fs base itself (a thread whose %fs:0 is
 * not its thread pointer); a thread without a slot, or whose slot's ring is
 * not its own, asks mt_claim for its ring (none: no record, counted by
 * mt_claim, \nothread); count=0 (hook stubs): no claim, \nothread with rcx =
 * the control block (the stub's trap gives the tracer its group) */
.macro LOOKUP_SLOW name, tag, nothread, count=1
.Lprobe_\name\tag:
        push rsi
        lea rsi, [rcx + MT_SLOT_TABLE + MT_SLOT_TABLE_SIZE]
1:      cmp qword ptr [rdx], 0
        je 3f
        add rdx, MT_SLOT_ENTRY_SIZE
        cmp rdx, rsi
        jae 3f
        cmp [rdx], rax
        jne 1b
        pop rsi
        jmp .Lfound_\name\tag
3:      rdfsbase rsi
        not rsi
        cmp rax, rsi
        je 4f                       /* that was the fs base: no slot */
        mov rax, rsi
        pop rsi
        SLOT_OF
        je .Lfound_\name\tag
        jmp .Lprobe_\name\tag
4:      pop rsi
.Lclaim_\name\tag:                  /* rcx = control block */
.if \count
        call qword ptr [rcx + MT_CTL_CLAIM]
        mov qword ptr [rsp - 8], 0          /* no return address left on the stack (footprint.py) */
        test rax, rax
        jz \nothread
        mov rcx, rax
        jmp .Lowned_\name\tag
.else
        jmp \nothread
.endif
.endm

/* EMIT name, tag, ts, rsp_off: one record into ring rcx if HEAD < LIMIT;
 * clobbers rax, rdx; ends at .Ldone_<name><tag>.  From mark write<tag> up to
 * mark publish<tag> (the inc of HEAD) the record is written but not published:
 * a signal delivered there is delivered at the write mark instead, so that a
 * handler's records are never overwritten (rings/writer_windows.py).  The
 * site code (site id << 1 | kind) is patch point
 * mt_<name>_pp_code<tag>_imm32; rsp_off: where the
 * callee's entry stack pointer is, relative to rsp.  An entry record also
 * counts the call: the thread's counter of the site (patch point
 * mt_<name>_pp_count<tag>_imm32: MT_RING_COUNTS + 8 * site id), once the
 * record is published. */
.macro EMIT name, tag, ts, rsp_off
mt_\name\()_at_write\tag:
.if \ts
        rdtsc                       /* first: its latency overlaps what follows */
        shl rdx, 32
        or rdx, rax
.endif
        mov rax, [rcx + MT_RING_HEAD]
        cmp rax, [rcx + MT_RING_LIMIT]
        jae .Lfull_\name\tag
.Lroom_\name\tag:
        and eax, MT_RING_MASK
        shl eax, 4
.if \ts
        mov [rcx + rax + MT_RING_RECORDS_OFF], rdx
.else
        mov qword ptr [rcx + rax + MT_RING_RECORDS_OFF], 0
.endif
        lea rdx, [rsp + \rsp_off]
        shl rdx, 32
        or rdx, 0x7fffffff
mt_\name\()_pp_code\tag\()_imm32:
        mov [rcx + rax + MT_RING_RECORDS_OFF + 8], rdx
mt_\name\()_at_publish\tag:
        inc qword ptr [rcx + MT_RING_HEAD]
.ifc \tag,_entry
        inc qword ptr [rcx + 0x7fffffff]
mt_\name\()_pp_count\tag\()_imm32:
.endif
.Ldone_\name\tag:
.endm

/* HEAD >= LIMIT: recording is off (LIMIT 0: no record), or the ring is full:
 * wait for the tracer to drain (it raises LIMIT), in rounds of MT_SPIN_LIMIT
 * pauses (giving the CPU away every MT_SPIN_YIELD of them); after a round,
 * another one while the drainer lives (kill(MT_CTL_DRAINER, 0): 0, or EPERM),
 * up to MT_SPIN_ROUNDS; then drop the record and count it (and drop at once
 * from then on, until the tracer drains again).  With timestamps, rdx holds
 * the record's timestamp, taken before the wait. */
.macro EMIT_SLOW name, tag, ts
.Lfull_\name\tag:
        cmp qword ptr [rcx + MT_RING_LIMIT], 0
        je .Ldone_\name\tag
        push rsi
        mov rsi, [rcx + MT_RING_CONTROL]
        cmp byte ptr [rsi + MT_CTL_NOWAIT], 0
        jne 8f
        inc qword ptr [rcx + MT_RING_WAITS]
.if \ts
        push rdx
.endif
        push MT_SPIN_ROUNDS             /* [rsp + 8]: rounds left */
        push MT_SPIN_LIMIT              /* [rsp]: pauses left in this round */
7:      pause
        mov rax, [rcx + MT_RING_HEAD]
        mov rdx, [rcx + MT_RING_LIMIT]
        test rdx, rdx
        jz 9f
        cmp rax, rdx
        jb 10f
        dec qword ptr [rsp]
        jz 12f
        test dword ptr [rsp], MT_SPIN_YIELD - 1
        jnz 7b
        push rcx                        /* a drain starved of CPU gets it (2 cores, this */
        push r11                        /* writer spinning on one: drops in test_live_threads) */
        mov eax, 24                     /* sched_yield */
        syscall
        pop r11
        pop rcx
        jmp 7b
12:     dec qword ptr [rsp + 8]         /* a round is over: another while the drainer lives */
        jz 11f
        push rcx
        push r11
        push rsi
        push rdi
        mov rdi, [rsi + MT_CTL_DRAINER]
        mov rax, -3                     /* none: as gone (ESRCH) */
        test rdi, rdi
        jz 13f
        xor esi, esi
        mov eax, 62                     /* kill(drainer, 0) */
        syscall
13:     pop rdi
        pop rsi
        pop r11
        pop rcx
        cmp rax, -1                     /* EPERM: it lives, as another user */
        je 14f
        test rax, rax
        jnz 11f
14:     mov qword ptr [rsp], MT_SPIN_LIMIT
        jmp 7b
11:     add rsp, 16 + 8 * \ts
        mov byte ptr [rsi + MT_CTL_NOWAIT], 1
8:      inc qword ptr [rcx + MT_RING_DROPS]
        pop rsi
        jmp .Ldone_\name\tag
9:      add rsp, 16 + 8 * \ts       /* recording was turned off meanwhile */
        pop rsi
        jmp .Ldone_\name\tag
10:     add rsp, 16
.if \ts
        pop rdx
.endif
        pop rsi
        jmp .Lroom_\name\tag
.endm

/* TAG: one record with every register preserved (rsp_off: where the callee's
 * entry stack pointer is, relative to rsp after SAVE); TAG_SLOW its branches. */
.macro TAG name, tag, ts, rsp_off
        SAVE
        LOOKUP \name, \tag
        EMIT \name, \tag, \ts, \rsp_off
        RESTORE
.endm
.macro TAG_SLOW name, tag, ts
        LOOKUP_SLOW \name, \tag, .Ldone_\name\tag
        EMIT_SLOW \name, \tag, \ts
.endm

/* ---------------------------------------------------------------------------
 * Call-site trampoline: the site's `call f` became `jmp mt_callsite`.
 * entry record, call f (rsp as at the original call), exit record, jmp back
 * through an 8-byte slot (8-aligned: the template starts 16-aligned, as the
 * tracer places it): the site's return address, or its equivalent in the data
 * engine's copy of the calling function (calls/entry_links.py).  The jmp
 * rel32 after the slot also reaches the return address (it names it for a
 * later session cleaning up after a killed one: leftovers.py).
 * Record rsp = callee entry rsp = call-site rsp - 8 = [rsp + 24 - 8].
 */
.macro CALLSITE name, ts
        .balign 16, 0xcc
        .globl mt_\name\()_start
mt_\name\()_start:
        TAG \name, _entry, \ts, 16
        .byte 0xe8
        .long 0
mt_\name\()_pp_target_rel32:
        TAG \name, _exit, \ts, 16
        jmp qword ptr [rip + .Lresume_\name]
        .balign 8, 0xcc
.Lresume_\name:
        .quad 0
mt_\name\()_pp_resume_abs64:
        .byte 0xe9
        .long 0
mt_\name\()_pp_return_rel32:
        TAG_SLOW \name, _entry, \ts
        TAG_SLOW \name, _exit, \ts
mt_\name\()_end:
.endm

/* ---------------------------------------------------------------------------
 * Tail-call trampoline: the site's `jmp f` became `jmp mt_tailsite`.
 * entry record (flagged by the site table as a tail call), then jmp f; the
 * callee returns straight to our caller's caller, so there is no exit record:
 * the tracer closes the frame when the enclosing one returns (rsp order).
 */
.macro TAILSITE name, ts
mt_\name\()_start:
        TAG \name, _entry, \ts, 24
        .byte 0xe9
        .long 0
mt_\name\()_pp_target_rel32:
        TAG_SLOW \name, _entry, \ts
mt_\name\()_end:
.endm

/* ---------------------------------------------------------------------------
 * Function-entry trampoline (functions also reached indirectly): entry
 * record, the return address is saved on the thread's shadow stack and
 * replaced by the function's exit stub; then the relocated first
 * instructions (appended by the tracer) and a jmp back into the function.
 * rsp at entry points at the return address = [rsp + 32] after SAVE.
 */
.macro ENTRY name, ts
mt_\name\()_start:
        SAVE4
        LOOKUP \name, _entry
        EMIT \name, _entry, \ts, 32
        mov rax, [rcx + MT_RING_SHADOW_TOP]
        cmp rax, MT_SHADOW_ENTRIES
        jae 18f
        mov rdx, rax
        shl rdx, 4
        add rdx, rcx
        inc rax                         /* the entry is taken before it is written: a */
        mov [rcx + MT_RING_SHADOW_TOP], rax     /* handler's calls push above it */
        mov rsi, [rsp + 32]
        mov [rdx + MT_RING_SHADOW], rsi
        lea rsi, [rsp + 32]
        mov [rdx + MT_RING_SHADOW + 8], rsi
        movabs rax, 0x1122334455667788
mt_\name\()_pp_exitstub_abs64:
        mov [rsp + 32], rax
.Lout_\name:
        RESTORE4
        jmp 19f
18:     inc qword ptr [rcx + MT_RING_EXITS_LOST]
        jmp .Lout_\name
        LOOKUP_SLOW \name, _entry, .Lout_\name
        EMIT_SLOW \name, _entry, \ts
19:
mt_\name\()_end:
        /* the tracer appends: relocated instructions, jmp rel32 f+consumed */
.endm

/* Exit stub of an entry-patched function: the function returned here
 * (rsp = entry rsp + 8).  Pop the shadow stack down to this frame (frames
 * above it were left by longjmp), write the exit record, return to the
 * saved address. */
.macro EXITSTUB name, ts
mt_\name\()_start:
        sub rsp, 8
        SAVE4
        LOOKUP \name, _exit
        lea rdx, [rsp + 32]
        mov rax, [rcx + MT_RING_SHADOW_TOP]
20:     test rax, rax
        jz 29f
        dec rax
        mov rsi, rax
        shl rsi, 4
        add rsi, rcx
        cmp [rsi + MT_RING_SHADOW + 8], rdx
        jb 20b
        mov rdx, [rsi + MT_RING_SHADOW] /* read before the entry is given up: a */
        mov [rcx + MT_RING_SHADOW_TOP], rax     /* handler's calls push there */
        mov [rsp + 32], rdx
        EMIT \name, _exit, \ts, 32
        RESTORE4
        ret
29:     ud2     /* no shadow frame: cannot happen unless memory was corrupted */
        LOOKUP_SLOW \name, _exit, 29b
        EMIT_SLOW \name, _exit, \ts
mt_\name\()_end:
.endm

        CALLSITE callsite_ts, 1
        CALLSITE callsite_nots, 0
        TAILSITE tailsite_ts, 1
        TAILSITE tailsite_nots, 0
        ENTRY entry_ts, 1
        ENTRY entry_nots, 0
        EXITSTUB exitstub_ts, 1
        EXITSTUB exitstub_nots, 0

/* ---------------------------------------------------------------------------
 * Data-access stub tail (MadT fast path, layout in layout.h "data area").
 * The tracer writes the faulting instruction, re-encoded with its memory
 * operand redirected to the thread's slot, and appends this tail: mark the
 * slot done (rsp is never zero; a mov leaves the flags alone), then jump
 * back after the original instruction through an absolute address, so that
 * the data area may lie anywhere.  One ptrace stop per access: the stub
 * makes no system call and the protected page is never opened.
 */
mt_dataslot_start:
        mov qword ptr [rip + 0x11223344], rsp
mt_dataslot_pp_done_rel32:
        jmp qword ptr [rip]
        .quad 0x1122334455667788
mt_dataslot_pp_return_abs64:
mt_dataslot_end:

/* ---------------------------------------------------------------------------
 * Data probes (layout.h "Data probes").  probe_head, then the tracer's
 * "lea rcx, [effective address]", then probe, then the tracer's tail (the
 * instruction on [rA]).  probe uses rax, rcx and rdx only and never the stack
 * beyond its frame, so that the tracer can move a thread stopped anywhere in
 * it back to the original instruction (before the record is published: the
 * registers are in the frame) or forward (after); the marks mt_probe_at_*
 * tell it where the flags are saved, where the record is published and where
 * the slow paths begin.  Threads whose %fs:0 is not their fs base are not
 * recorded (counted as unregistered).
 */
mt_probe_head_start:
        lea rsp, [rsp - MT_PROBE_FRAME]
        mov [rsp + MT_PF_RAX], rax
        mov [rsp + MT_PF_RCX], rcx
        mov [rsp + MT_PF_RDX], rdx
mt_probe_head_end:

mt_probe_start:
        lahf
        seto al
        mov [rsp + MT_PF_FLAGS], rax
mt_probe_at_flags:
        mov [rsp + MT_PF_ADDR], rcx
        mov rdx, rcx
        shr rdx, 15
        movabs rax, 0x1122334455667788
mt_probe_pp_bitmap_abs64:
        movzx eax, byte ptr [rax + rdx]
        mov edx, ecx
        shr edx, 12
        and edx, 7
        bt eax, edx
        jnc .Lpr_out                        /* not aliased: the address itself */
        movabs rcx, 0x1122334455667788
mt_probe_pp_ctl_abs64:
        mov rax, fs:[0]
        not rax
        SLOT_OF
        jne .Lpr_probe
.Lpr_found:
        mov rcx, [rdx + 8]
        mov rax, [rcx + MT_RING_HEAD]
        cmp rax, [rcx + MT_RING_LIMIT]
        jae .Lpr_full
.Lpr_room:
        and eax, MT_RING_MASK
        shl eax, 4
        mov rdx, [rsp + MT_PF_ADDR]
        mov [rcx + rax + MT_RING_RECORDS_OFF], rdx
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 8], 0x7fffffff
mt_probe_pp_code_imm32:
        mov rdx, [rcx + MT_RING_CONTROL]    /* the epoch: allocation events so far */
        mov edx, [rdx + MT_CTL_EPOCH]
        mov [rcx + rax + MT_RING_RECORDS_OFF + 12], edx
        inc qword ptr [rcx + MT_RING_HEAD]
mt_probe_at_published:
.Lpr_alias:
        btc qword ptr [rsp + MT_PF_ADDR], MT_ALIAS_BIT_INDEX
.Lpr_out:
        PROBE_OUT .Lpr_end
mt_probe_at_slow:
        PROBE_ON .Lpr_probe, .Lpr_found, .Lpr_noslot
.Lpr_noslot:
        test byte ptr [rcx + MT_CTL_FLAGS], MT_FLAG_ENABLED
        jz .Lpr_alias
        lock inc qword ptr [rcx + MT_CTL_UNREGISTERED]
        jmp .Lpr_alias
.Lpr_full:                                  /* HEAD >= LIMIT: off, or full */
        cmp qword ptr [rcx + MT_RING_LIMIT], 0
        je .Lpr_alias
        mov rdx, [rcx + MT_RING_CONTROL]
        cmp byte ptr [rdx + MT_CTL_NOWAIT], 0
        jne .Lpr_drop
        inc qword ptr [rcx + MT_RING_WAITS]
        mov edx, MT_PROBE_SPIN_LIMIT
.Lpr_wait:
        pause
        mov rax, [rcx + MT_RING_HEAD]
        cmp qword ptr [rcx + MT_RING_LIMIT], 0
        je .Lpr_alias
        cmp rax, [rcx + MT_RING_LIMIT]
        jb .Lpr_room
        dec edx
        jnz .Lpr_wait
        mov rdx, [rcx + MT_RING_CONTROL]
        mov byte ptr [rdx + MT_CTL_NOWAIT], 1
.Lpr_drop:
        inc qword ptr [rcx + MT_RING_DROPS]
        jmp .Lpr_alias
.Lpr_end:
mt_probe_end:

/* ---------------------------------------------------------------------------
 * String probe (layout.h "Data probes"): one iteration of a string
 * instruction with two memory operands (movs: [rsi] then [rdi]; cmps: [rdi]
 * then [rsi]).  probe_head, then the tracer's stores of the two addresses
 * into MT_PF_ADDR and MT_PF_ADDR2 in that order, then string_probe, then the
 * tracer's tail (the instruction on the alias addresses, then both registers
 * set back by what it moved them).  A record for each address whose page is
 * aliased (codes: first, the first address's; second, the second's after
 * it; alone, the second's without it), both published by one add: a thread
 * stopped before mt_string_probe_at_published is moved back to the
 * instruction, after it forward, as in probe.  Uses rax, rcx and rdx only.
 */
mt_string_probe_start:
        lahf
        seto al
        mov [rsp + MT_PF_FLAGS], rax
mt_string_probe_at_flags:
        mov qword ptr [rsp + MT_PF_MASK], 0
        movabs rax, 0x1122334455667788
mt_string_probe_pp_bitmap_abs64:
        mov rdx, [rsp + MT_PF_ADDR]
        shr rdx, 15
        movzx edx, byte ptr [rax + rdx]
        mov ecx, [rsp + MT_PF_ADDR]
        shr ecx, 12
        and ecx, 7
        bt edx, ecx
        jnc 1f
        or byte ptr [rsp + MT_PF_MASK], 1
1:
        mov rdx, [rsp + MT_PF_ADDR2]
        shr rdx, 15
        movzx edx, byte ptr [rax + rdx]
        mov ecx, [rsp + MT_PF_ADDR2]
        shr ecx, 12
        and ecx, 7
        bt edx, ecx
        jnc 2f
        or byte ptr [rsp + MT_PF_MASK], 2
2:
        cmp byte ptr [rsp + MT_PF_MASK], 0
        je .Lsp_out                         /* neither aliased: the addresses themselves */
        movabs rcx, 0x1122334455667788
mt_string_probe_pp_ctl_abs64:
        mov rax, fs:[0]
        not rax
        SLOT_OF
        jne .Lsp_probe
.Lsp_found:
        mov rcx, [rdx + 8]
        mov rax, [rcx + MT_RING_HEAD]
        lea rdx, [rax + 1]                  /* room for two records */
        cmp rdx, [rcx + MT_RING_LIMIT]
        jae .Lsp_full
.Lsp_room:
        and eax, MT_RING_MASK
        test byte ptr [rsp + MT_PF_MASK], 1
        jz .Lsp_second_alone
        shl eax, 4
        mov rdx, [rsp + MT_PF_ADDR]
        mov [rcx + rax + MT_RING_RECORDS_OFF], rdx
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 8], 0x7fffffff
mt_string_probe_pp_first_imm32:
        mov rdx, [rcx + MT_RING_CONTROL]
        mov edx, [rdx + MT_CTL_EPOCH]
        mov [rcx + rax + MT_RING_RECORDS_OFF + 12], edx
        test byte ptr [rsp + MT_PF_MASK], 2
        jz .Lsp_publish
        shr eax, 4
        inc eax
        and eax, MT_RING_MASK
        shl eax, 4
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 8], 0x7fffffff
mt_string_probe_pp_second_imm32:
        jmp .Lsp_second
.Lsp_second_alone:
        shl eax, 4
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 8], 0x7fffffff
mt_string_probe_pp_alone_imm32:
.Lsp_second:
        mov rdx, [rsp + MT_PF_ADDR2]
        mov [rcx + rax + MT_RING_RECORDS_OFF], rdx
        mov rdx, [rcx + MT_RING_CONTROL]
        mov edx, [rdx + MT_CTL_EPOCH]
        mov [rcx + rax + MT_RING_RECORDS_OFF + 12], edx
.Lsp_publish:
        movzx eax, byte ptr [rsp + MT_PF_MASK]     /* 1, 2, 3 -> 1, 1, 2 records */
        mov edx, eax
        shr edx, 1
        and eax, 1
        add eax, edx
        add [rcx + MT_RING_HEAD], rax
mt_string_probe_at_published:
.Lsp_alias:
        test byte ptr [rsp + MT_PF_MASK], 1
        jz 3f
        btc qword ptr [rsp + MT_PF_ADDR], MT_ALIAS_BIT_INDEX
3:
        test byte ptr [rsp + MT_PF_MASK], 2
        jz .Lsp_out
        btc qword ptr [rsp + MT_PF_ADDR2], MT_ALIAS_BIT_INDEX
.Lsp_out:
        PROBE_OUT .Lsp_end
mt_string_probe_at_slow:
        PROBE_ON .Lsp_probe, .Lsp_found, .Lsp_noslot
.Lsp_noslot:
        test byte ptr [rcx + MT_CTL_FLAGS], MT_FLAG_ENABLED
        jz .Lsp_alias
        lock inc qword ptr [rcx + MT_CTL_UNREGISTERED]
        test byte ptr [rsp + MT_PF_MASK], 1
        jz .Lsp_alias
        test byte ptr [rsp + MT_PF_MASK], 2
        jz .Lsp_alias
        lock inc qword ptr [rcx + MT_CTL_UNREGISTERED]
        jmp .Lsp_alias
.Lsp_full:                                  /* HEAD + 1 >= LIMIT: off, or full */
        cmp qword ptr [rcx + MT_RING_LIMIT], 0
        je .Lsp_alias
        mov rdx, [rcx + MT_RING_CONTROL]
        cmp byte ptr [rdx + MT_CTL_NOWAIT], 0
        jne .Lsp_drop
        inc qword ptr [rcx + MT_RING_WAITS]
        mov edx, MT_PROBE_SPIN_LIMIT
.Lsp_wait:
        pause
        mov rax, [rcx + MT_RING_HEAD]
        cmp qword ptr [rcx + MT_RING_LIMIT], 0
        je .Lsp_alias
        lea rax, [rax + 1]
        cmp rax, [rcx + MT_RING_LIMIT]
        lea rax, [rax - 1]
        jb .Lsp_room
        dec edx
        jnz .Lsp_wait
        mov rdx, [rcx + MT_RING_CONTROL]
        mov byte ptr [rdx + MT_CTL_NOWAIT], 1
.Lsp_drop:
        movzx eax, byte ptr [rsp + MT_PF_MASK]
        mov edx, eax
        shr edx, 1
        and eax, 1
        add eax, edx
        add [rcx + MT_RING_DROPS], rax
        jmp .Lsp_alias
.Lsp_end:
mt_string_probe_end:

/* ---------------------------------------------------------------------------
 * Hook stubs (layout.h "Hook stubs"; madtrace/data/heap/inline_hooks.py).  The
 * function's entry jumps here; its own code runs through the continuation
 * slot (patch points cont*: rel32 to an 8-byte slot holding the address of its
 * relocated prologue, or of the data engine's copy of it).  A group of
 * records is written from HEAD (r11) on and published with one cmpxchg of
 * HEAD, written again if a signal handler published records meanwhile.  When
 * a group cannot go into the ring (a thread without one, a ring that stays
 * full) the stub stops at its int3 (mark "trap", r11 = MT_HT_*) and the tracer
 * takes the group from the registers and the frame (layout.h MT_HF_*); with
 * no tracer left the guard turns that int3 into a nop and the call goes on
 * unrecorded.  Labels .L<what>_<name>.
 */

/* HREC k, lo, code, hi: record HEAD + k (r11 = HEAD, rcx = ring) := {lo, code, hi}; clobbers rax */
.macro HREC k, lo, code, hi
        lea eax, [r11 + \k]
        and eax, MT_RING_MASK
        shl eax, 4
        mov [rcx + rax + MT_RING_RECORDS_OFF], \lo
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 8], \code
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 12], \hi
.endm

/* HROOM n, full: r11 = HEAD; to \full unless n more records fit (clobbers rax) */
.macro HROOM n, full
        mov r11, [rcx + MT_RING_HEAD]
        lea rax, [r11 + \n]
        cmp rax, [rcx + MT_RING_LIMIT]
        ja \full
.endm

/* HPUBLISH n, retry, mark: HEAD += n unless a signal handler moved it meanwhile (then
 * \retry).  One instruction, not locked: only this thread writes HEAD.  \mark labels
 * it: from the stub's write mark up to it the group is written but not published,
 * and a signal delivered there is delivered at the write mark (rings/writer_windows.py) */
.macro HPUBLISH n, retry, mark
        lea r10, [r11 + \n]
        mov rax, r11
\mark:
        cmpxchg [rcx + MT_RING_HEAD], r10
        jne \retry
.endm

/* HWAIT n, room, off, trap: the ring had no room for n records: recording off
 * (LIMIT 0): \off; else wait for the drain (MT_PROBE_SPIN_LIMIT pauses) and go to
 * \room with r11 = HEAD, or to \trap (r9 = control block; clobbers rax, r10) */
.macro HWAIT n, room, off, trap
        cmp qword ptr [rcx + MT_RING_LIMIT], 0
        je \off
        cmp byte ptr [r9 + MT_CTL_NOWAIT], 0
        jne \trap
        inc qword ptr [rcx + MT_RING_WAITS]
        mov r10d, MT_PROBE_SPIN_LIMIT           /* as long as a probe waits */
1:      pause
        cmp qword ptr [rcx + MT_RING_LIMIT], 0
        je \off
        mov r11, [rcx + MT_RING_HEAD]
        lea rax, [r11 + \n]
        cmp rax, [rcx + MT_RING_LIMIT]
        jbe \room
        dec r10d
        jnz 1b
        mov byte ptr [r9 + MT_CTL_NOWAIT], 1
        jmp \trap
.endm

.macro HSAVE
        push rax
        push rcx
        push rdx
        push r8
        push r9
        push r10
        push r11
.endm
.macro HRESTORE
        pop r11
        pop r10
        pop r9
        pop r8
        pop rdx
        pop rcx
        pop rax
.endm

/* hook_alloc: malloc, calloc, realloc, free, operator new and delete.  Every
 * register but the flags is as the caller left it when the function starts,
 * and as the function left it when the caller gets it back.  The frame: the
 * caller's return address, the pad (a ret of the program's: at detach the
 * return into this stub becomes a return to that ret, which pops the pad and
 * returns to the caller), the saved registers (MT_HF_*). */
mt_hook_alloc_start:
        push qword ptr [rip + 0x11223344]
mt_hook_alloc_pp_gadget_rel32:
        HSAVE
        LOOKUP hook_alloc, _entry, 0
        mov r9, [rcx + MT_RING_CONTROL]
.Lretry_hook_alloc:
mt_hook_alloc_at_write_entry:
        HROOM MT_HOOK_ENTRY_RECORDS, .Lfull_hook_alloc
.Lroom_hook_alloc:
        mov eax, r11d
        and eax, MT_RING_MASK
        shl eax, 4
        mov [rcx + rax + MT_RING_RECORDS_OFF], rdi
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 8], 0x7fffffff
mt_hook_alloc_pp_code_entry_imm32:
        mov r8d, [r9 + MT_CTL_EPOCH]
        mov [rcx + rax + MT_RING_RECORDS_OFF + 12], r8d
        HREC 1, rsi, MT_HOOK_CONT, r11d
        mov r10, [rsp + MT_HF_RDX]
        lea r8, [rsp + MT_HF_RETURN]
        HREC 2, r10, MT_HOOK_CONT, r8d
        mov r10, [rsp + MT_HF_RETURN]
        HREC 3, r10, MT_HOOK_CONT, 0
        HPUBLISH MT_HOOK_ENTRY_RECORDS, .Lretry_hook_alloc, mt_hook_alloc_at_publish_entry
.Lentered_hook_alloc:
        HRESTORE
        call qword ptr [rip + 0x11223344]
mt_hook_alloc_pp_cont_rel32:
mt_hook_alloc_at_returned:
        HSAVE
        LOOKUP hook_alloc, _ret, 0
        mov r9, [rcx + MT_RING_CONTROL]
        HROOM MT_HOOK_RETURN_RECORDS, .Lrfull_hook_alloc
.Lstamp_hook_alloc:
        mov r8d, 1
        lock xadd [r9 + MT_CTL_EPOCH], r8d      /* r8d: this event's stamp */
.Lrretry_hook_alloc:
mt_hook_alloc_at_write_return:
        HROOM MT_HOOK_RETURN_RECORDS, .Lsfull_hook_alloc
.Lrroom_hook_alloc:
        mov eax, r11d
        and eax, MT_RING_MASK
        shl eax, 4
        mov r10, [rsp + MT_HF_RAX]
        mov [rcx + rax + MT_RING_RECORDS_OFF], r10
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 8], 0x7fffffff
mt_hook_alloc_pp_code_return_imm32:
        mov [rcx + rax + MT_RING_RECORDS_OFF + 12], r8d
        lea r10, [rsp + MT_HF_RETURN]
        HREC 1, r10, MT_HOOK_CONT, r11d
        HPUBLISH MT_HOOK_RETURN_RECORDS, .Lrretry_hook_alloc, mt_hook_alloc_at_publish_return
.Lreturned_hook_alloc:
        HRESTORE
        lea rsp, [rsp + 8]                      /* the pad */
        ret
        /* slow paths */
        LOOKUP_SLOW hook_alloc, _entry, .Lnoring_hook_alloc, 0
        LOOKUP_SLOW hook_alloc, _ret, .Lrnoring_hook_alloc, 0
.Lnoring_hook_alloc:                            /* rcx = control block */
        test byte ptr [rcx + MT_CTL_FLAGS], MT_FLAG_ENABLED
        jz .Lentered_hook_alloc
        jmp .Ltrap_entry_hook_alloc
.Lrnoring_hook_alloc:
        test byte ptr [rcx + MT_CTL_FLAGS], MT_FLAG_ENABLED
        jz .Lreturned_hook_alloc
        jmp .Ltrap_return_hook_alloc
.Lfull_hook_alloc:
        HWAIT MT_HOOK_ENTRY_RECORDS, .Lroom_hook_alloc, .Lentered_hook_alloc, .Ltrap_entry_hook_alloc
.Lrfull_hook_alloc:
        HWAIT MT_HOOK_RETURN_RECORDS, .Lstamp_hook_alloc, .Lreturned_hook_alloc, .Ltrap_return_hook_alloc
.Lsfull_hook_alloc:                             /* stamped: a signal handler filled the ring */
        HWAIT MT_HOOK_RETURN_RECORDS, .Lrroom_hook_alloc, .Ltrap_stamped_hook_alloc, .Ltrap_stamped_hook_alloc
.Ltrap_entry_hook_alloc:
        mov r11d, MT_HT_ENTRY
        jmp .Ltrap_hook_alloc
.Ltrap_return_hook_alloc:
        mov r11d, MT_HT_RETURN
        jmp .Ltrap_hook_alloc
.Ltrap_stamped_hook_alloc:
        mov r11d, MT_HT_STAMPED
.Ltrap_hook_alloc:
mt_hook_alloc_at_trap:
        int3
        test r11d, r11d                         /* no tracer: the guard made the int3 a nop */
        jz .Lentered_hook_alloc
        jmp .Lreturned_hook_alloc
mt_hook_alloc_end:

/* RANGE p, out, tmp: the pages of [p, p + rdx) (rdx > 0): out bit 0: one is
 * traced (bitmap r8), bit 1: one is not aliased (bitmap r9); out = 3 when there
 * are more than MT_HOOK_MAX_PAGES or they lie beyond the user address space (the
 * tracer checks those).  A page's bit is bit (page & 63) of the bitmap's
 * qword page >> 6 (bt on a register: bt on memory is microcoded); an untraced
 * page is not aliased (the alias bitmap is not read for it).  Clobbers rax,
 * rcx, tmp, flags. */
.macro RANGE p, out, tmp
        mov rax, \p
        shr rax, 12
        lea rcx, [\p + rdx - 1]
        shr rcx, 12
        mov \out, rcx
        sub \out, rax
        cmp \out, MT_HOOK_MAX_PAGES
        ja 3f
        mov \out, rcx
        shr \out, 35
        jnz 3f
1:      mov \tmp, rax
        shr \tmp, 6
        mov \tmp, [r8 + \tmp * 8]
        bt \tmp, rax
        jnc 2f                                  /* untraced: not aliased either */
        or \out, 1
        mov \tmp, rax
        shr \tmp, 6
        mov \tmp, [r9 + \tmp * 8]
        bt \tmp, rax
        jc 4f
2:      or \out, 2
4:      inc rax
        cmp rax, rcx
        jbe 1b
        jmp 5f
3:      mov \out, 3
5:
.endm

/* hook_copy (memcpy, memmove: rdi dst, rsi src) and hook_set (memset: rdi
 * dst): a buffer on traced pages makes an entry group (the block event) and
 * the call reaches it through the alias (its pointer ^ 1 << MT_ALIAS_BIT_INDEX,
 * given back in rax at the return); buffers on untraced pages go straight to
 * the function; a buffer on traced pages that are not all aliased, or too
 * long to check here, stops at the int3 "slow" with the registers as at the
 * function's entry (the tracer's breakpoint hooks take it from there).  The
 * function itself clobbers rax, rcx, r8-r11: so may the stub.  Frame of the
 * trap: [rsp] n, [rsp + 8] which pointers go through the alias (bit 0 dst,
 * bit 1 src), [rsp + 16] the caller's return address. */
.macro HOOK_MEM name, src
mt_\name\()_start:
        test rdx, rdx
        jz .Lplain_\name                        /* nothing moves: no event */
        movabs r8, 0x1122334455667788
mt_\name\()_pp_traced_abs64:
        movabs r9, 0x1122334455667788
mt_\name\()_pp_alias_abs64:
.if \src
        RANGE rdi, r10, r11
        push r10                                /* r10 is the next one's temporary */
        RANGE rsi, r11, r10
        pop r10
.else
        RANGE rdi, r10, r11
        xor r11d, r11d
.endif
        cmp r10d, 3
        je .Lslow_\name
        cmp r11d, 3
        je .Lslow_\name
        mov eax, r10d
        or eax, r11d
        test al, 1
        jz .Lplain_\name                        /* no traced page */
        xor eax, eax                            /* which pointers go through the alias */
        cmp r10d, 1
        sete al
        cmp r11d, 1
        sete cl
        shl cl, 1
        or al, cl
        push rax                                /* the frame (rsp is 16-byte aligned now) */
        push rdx
        LOOKUP \name, _entry, 0
        mov r9, [rcx + MT_RING_CONTROL]
.Lretry_\name:
mt_\name\()_at_write:
        HROOM MT_HOOK_ENTRY_RECORDS, .Lfull_\name
.Lroom_\name:
        mov eax, r11d
        and eax, MT_RING_MASK
        shl eax, 4
        mov [rcx + rax + MT_RING_RECORDS_OFF], rdi
        mov dword ptr [rcx + rax + MT_RING_RECORDS_OFF + 8], 0x7fffffff
mt_\name\()_pp_code_imm32:
        mov r8d, [r9 + MT_CTL_EPOCH]
        mov [rcx + rax + MT_RING_RECORDS_OFF + 12], r8d
        HREC 1, rsi, MT_HOOK_CONT, r11d
        mov r10, [rsp]
        lea r8, [rsp + 16]
        HREC 2, r10, MT_HOOK_CONT, r8d
        mov r10, [rsp + 16]
        HREC 3, r10, MT_HOOK_CONT, 0
        HPUBLISH MT_HOOK_ENTRY_RECORDS, .Lretry_\name, mt_\name\()_at_publish
.Lrecorded_\name:
        pop rdx
        test byte ptr [rsp], 1
        jz 6f
        btc rdi, MT_ALIAS_BIT_INDEX
6:      test byte ptr [rsp], 2
        jz 7f
        btc rsi, MT_ALIAS_BIT_INDEX
7:      call qword ptr [rip + 0x11223344]
mt_\name\()_pp_cont_rel32:
mt_\name\()_at_returned:
        test byte ptr [rsp], 1
        jz 8f
        btc rax, MT_ALIAS_BIT_INDEX             /* the destination as the caller gave it */
8:      lea rsp, [rsp + 8]
        ret
.Lslow_\name:
mt_\name\()_at_slow:
        int3
.Lplain_\name:
        jmp qword ptr [rip + 0x11223344]
mt_\name\()_pp_contjmp_rel32:
        LOOKUP_SLOW \name, _entry, .Lnoring_\name, 0
.Lnoring_\name:                                 /* rcx = control block */
        test byte ptr [rcx + MT_CTL_FLAGS], MT_FLAG_ENABLED
        jz .Lrecorded_\name
        jmp .Ltrap_\name
.Lfull_\name:
        HWAIT MT_HOOK_ENTRY_RECORDS, .Lroom_\name, .Lrecorded_\name, .Ltrap_\name
.Ltrap_\name:
        mov r11d, MT_HT_ENTRY
mt_\name\()_at_trap:
        int3
        jmp .Lrecorded_\name
mt_\name\()_end:
.endm

        HOOK_MEM hook_copy, 1
        HOOK_MEM hook_set, 0

/* In the guard (r9: siginfo, rbp: ucontext, rbx: its table): a fault
   (SEGV_ACCERR) on a page of the runs table whose own protection allows the
   access (read, write, instruction fetch) goes on to \ours, anything else to
   \other.  Clobbers rax, rdx, r12, r13. */
.macro OURS_OR ours, other
        cmp dword ptr [r9 + 8], 2           /* SEGV_ACCERR */
        jne \other
        mov rax, [r9 + 16]                  /* si_addr */
        mov r12, [rbx + MT_GUARD_NRUNS]
        lea r13, [rbx + MT_GUARD_RUNS]
1:      test r12, r12
        jz \other
        mov rdx, rax
        sub rdx, [r13]
        cmp rdx, [r13 + 8]
        jb 2f
        add r13, MT_GUARD_RUN_SIZE
        dec r12
        jmp 1b
2:      mov rdx, [r13 + 16]                 /* the page's own protection */
        test qword ptr [rbp + MT_UC_ERR], 16 /* an instruction fetch */
        jz 3f
        test edx, 4                         /* PROT_EXEC */
        jz \other
        jmp \ours
3:      test edx, 1                         /* PROT_READ */
        jz \other
        test qword ptr [rbp + MT_UC_ERR], 2 /* a write */
        jz \ours
        test edx, 2                         /* PROT_WRITE */
        jz \other
        jmp \ours
.endm

/* ---------------------------------------------------------------------------
 * The guard (layout.h "The guard"): the SIGSEGV and SIGTRAP handler installed
 * while data tracing is on (SA_SIGINFO | SA_RESTORER, restorer: mt_sigreturn).
 * Every register is restored by rt_sigreturn from the signal frame, so the
 * guard clobbers what it likes; it returns with rsp as it came.
 * r14 = signal, r9 = siginfo, rbp = ucontext, rbx = table, r15 = rsp at entry.
 */
mt_guard_start:
        mov r15, rsp
        mov r14, rdi
        mov r9, rsi                         /* syscalls leave r9 alone */
        mov rbp, rdx
        movabs rbx, 0x1122334455667788
mt_guard_pp_table_abs64:
        /* madtrace's death (attached): the kernel's SIGSEGV for its death pipe
           (si_code SI_SIGIO, si_fd ours: data/guard.py watch_tracer) */
        cmp r14, 11
        jne 14f
        cmp dword ptr [r9 + 8], -5          /* SI_SIGIO */
        jne 14f
        mov eax, [r9 + 24]                  /* si_fd */
        test eax, eax
        jz 14f
        cmp rax, [rbx + MT_GUARD_DEATH_FD]
        jne 14f
        cmp qword ptr [rbx + MT_GUARD_FIRED], 0
        je 40f                              /* give everything back */
        ret                                 /* given back already */
14:     cmp qword ptr [rbx + MT_GUARD_FIRED], 0
        jne 60f                             /* it gave everything back already */
        /* a fault on a page madtrace protected is never the target's own: a live
           tracer takes every such fault itself, so its tracer is dead or dying (a
           thread stopped at such a fault when madtrace was killed gets it at the
           detach): give back, even on a thread marked below */
        cmp r14, 11
        jne 15f
        OURS_OR 40f, 15f
        /* the tracer marks the thread it delivers a signal of the target's own to
           (MT_GUARD_DELIVER_TID); any other signal here means no tracer is left
           (not TracerPid: a dying tracer still shows there) */
15:     mov eax, 186                        /* gettid */
        syscall
        cmp rax, [rbx + MT_GUARD_DELIVER_TID]
        jne 40f
        mov qword ptr [rbx + MT_GUARD_DELIVER_TID], 0

        /* a tracer is there: a signal of the target's own, for the target's action:
           that action goes back and the signal is queued again with its own siginfo
           (pending until we return; a fault's handler returning runs the faulting
           instruction again, as without the guard) */
30:     mov rsp, r15
        cmp r14, 5
        je 31f
        lea rsi, [rbx + MT_GUARD_DELIVER]
        mov qword ptr [rbx + MT_GUARD_ACTIVE], 0
        jmp 32f
31:     lea rsi, [rbx + MT_GUARD_TRAP_ACTION]
        mov qword ptr [rbx + MT_GUARD_TRAP_ACTIVE], 0
32:     mov rdi, r14
        xor edx, edx
        mov r10d, 8
        mov eax, 13                         /* rt_sigaction */
        syscall
        mov eax, 39                         /* getpid */
        syscall
        mov r12, rax
        mov eax, 186                        /* gettid */
        syscall
        mov rsi, rax
        mov rdi, r12
        mov rdx, r14
        mov r10, r9                         /* the siginfo we were given */
        mov eax, 297                        /* rt_tgsigqueueinfo */
        syscall
        ret

        /* no tracer: every probe accesses addresses themselves (zeros over the bitmap),
           original protections back, finished slots written back */
40:     mov rsp, r15
        mov rdi, [rbx + MT_GUARD_BITMAP]
        test rdi, rdi
        jz 39f
        mov rsi, [rbx + MT_GUARD_BITMAP_SIZE]
        mov edx, 1                          /* PROT_READ */
        mov r10d, 0x4032                    /* MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE */
        mov r8, -1
        xor r9d, r9d
        mov eax, 9                          /* mmap */
        syscall
39:
        mov r12, [rbx + MT_GUARD_NRUNS]
        lea r13, [rbx + MT_GUARD_RUNS]
41:     test r12, r12
        jz 42f
        mov rdi, [r13]
        mov rsi, [r13 + 8]
        mov rdx, [r13 + 16]
        mov eax, 10                         /* mprotect */
        syscall
        add r13, MT_GUARD_RUN_SIZE
        dec r12
        jmp 41b
42:     lea r13, [rbx - MT_GUARD]           /* slot 0 */
        mov r12d, MT_DATA_SLOTS
43:     cmp qword ptr [r13 + MT_DSLOT_ADDR], 0
        je 44f
        cmp qword ptr [r13 + MT_DSLOT_DONE], 0
        je 45f
        mov rcx, [r13 + MT_DSLOT_LEN]
        test rcx, rcx
        jz 45f
        lea rsi, [r13 + MT_DSLOT_BYTES]
        lea rdi, [r13 + MT_DSLOT_ORIGINAL]
        repe cmpsb
        je 45f                              /* unchanged: nothing to write */
        mov rdi, [r13 + MT_DSLOT_ADDR]
        lea rsi, [r13 + MT_DSLOT_BYTES]
        mov rcx, [r13 + MT_DSLOT_LEN]
        rep movsb
45:     mov qword ptr [r13 + MT_DSLOT_ADDR], 0
44:     add r13, MT_DSLOT_SIZE
        dec r12
        jnz 43b
        /* the breakpoints get their original bytes (their page writable meanwhile) */
        mov r12, [rbx + MT_GUARD_NBREAKS]
        lea r13, [rbx + MT_GUARD_BREAKS]
46:     test r12, r12
        jz 47f
        mov rdi, [r13]
        and rdi, -4096
        mov esi, 4096
        mov edx, 7
        mov eax, 10
        syscall
        mov rdi, [r13]
        mov rax, [r13 + 8]                  /* up to 8 original bytes, first byte lowest */
        movzx ecx, byte ptr [r13 + 17]      /* how many (the int3s written, 1-8) */
        test ecx, ecx
        jnz 58f
        inc ecx
58:     mov [rdi], al
        shr rax, 8
        inc rdi
        dec ecx
        jnz 58b
        mov rdi, [r13]
        and rdi, -4096
        mov esi, 4096
        movzx edx, byte ptr [r13 + 16]      /* the page's protection */
        mov eax, 10
        syscall
        add r13, MT_GUARD_BREAK_SIZE
        dec r12
        jmp 46b
        /* calls that were to return through a trap return to their caller */
47:     mov r12, [rbx + MT_GUARD_NTRAPS]
        lea r13, [rbx + MT_GUARD_TRAPS]
48:     test r12, r12
        jz 49f
        mov rax, [r13]
        test rax, rax
        jz 52f
        mov rdi, [r13 + 16]
        cmp [rdi], rax
        jne 53f
        mov rdx, [r13 + 8]
        mov [rdi], rdx
53:     inc rax                             /* a trap being taken: on to the caller */
        cmp [rbp + MT_UC_RIP], rax
        je 51f
        inc rax                             /* its second int3 (resumed after its stop */
        cmp [rbp + MT_UC_RIP], rax          /* was taken, its tracer dead) */
        jne 52f
51:     mov rdx, [r13 + 8]
        mov [rbp + MT_UC_RIP], rdx
52:     add r13, MT_GUARD_TRAP_SIZE
        dec r12
        jmp 48b
        /* a breakpoint being taken: its instruction runs */
49:     cmp r14, 5
        jne 55f
        mov r12, [rbx + MT_GUARD_NBREAKS]
        lea r13, [rbx + MT_GUARD_BREAKS]
        mov rax, [rbp + MT_UC_RIP]
        dec rax
54:     test r12, r12
        jz 55f
        mov rdx, rax                        /* rip - 1 in [address, address + count): */
        sub rdx, [r13]                      /* an int3 of this breakpoint, the first or */
        movzx ecx, byte ptr [r13 + 17]      /* one after it (a thread resumed after its */
        test ecx, ecx                       /* stop was taken and its tracer died) */
        jnz 59f
        inc ecx
59:     cmp rdx, rcx
        jae 56f
        mov rdx, [r13]
        mov [rbp + MT_UC_RIP], rdx          /* the instruction runs from its start */
56:     add r13, MT_GUARD_BREAK_SIZE
        dec r12
        jmp 54b
55:     mov qword ptr [rbx + MT_GUARD_NBREAKS], 0
        mov qword ptr [rbx + MT_GUARD_NTRAPS], 0
        mov qword ptr [rbx + MT_GUARD_FIRED], 1
        /* the target's own actions back */
        cmp qword ptr [rbx + MT_GUARD_TRAP_ACTIVE], 0
        je 57f
        mov edi, 5
        lea rsi, [rbx + MT_GUARD_TRAP_ACTION]
        xor edx, edx
        mov r10d, 8
        mov eax, 13
        syscall
        mov qword ptr [rbx + MT_GUARD_TRAP_ACTIVE], 0
57:     ret                                 /* it stays the SIGSEGV action: see 60 */

        /* after it gave everything back: madtrace's death signal (SI_USER from its pid)
           and a fault on a page madtrace had protected (taken before, reported after)
           that the page's own protection allows end here; any other signal goes to
           the program's own action (30: a jump into its heap spun here for ever) */
60:     cmp r14, 11
        jne 30b
        mov eax, [r9 + 8]                   /* si_code */
        test eax, eax                       /* SI_USER */
        jnz 62f
        mov eax, [r9 + 16]                  /* si_pid */
        cmp rax, [rbx + MT_GUARD_TRACER]
        jne 30b
        ret
62:     OURS_OR 66f, 30b                    /* open again: the instruction runs again */
66:     ret
mt_guard_end:

/* the guard's sa_restorer */
mt_sigreturn_start:
        mov eax, 15                         /* rt_sigreturn */
        syscall
mt_sigreturn_end:

/* ---------------------------------------------------------------------------
 * mt_claim (layout.h "Ring pool"): called by a trampoline's slow path with rcx =
 * the control block, for a thread that has no slot or whose slot's ring is not
 * its own.  Returns rax = the thread's ring block, 0 for none (its record is
 * not written: counted as unregistered while recording).  The thread of a fork
 * child that was not cleaned (its tracer is gone) gets its slot's ring, its
 * parent thread's, as it did before the pool: an exit stub needs its shadow
 * stack.  Keeps every other register; no
 * system call unless a ring may be claimed or a slot's ring may be the
 * thread's own.  A slot under the thread's key whose ring is a dead thread's
 * (glibc reuses TCBs) is taken over in place: its owner id changes with
 * lock cmpxchg (the tracer takes a ring back with the same), and the ring's
 * owners (MT_RING_OWNERS) say from which record on it is the new thread's.  Helpers: 70 (rdi = the entry of key r10, rsi = the first
 * free or tombstone entry on its chain, 0: none), 75 (ZF set: no ring in the
 * pool).  rbx = control block, r8 = thread id, r9 = the ring, r10 = the key.
 * After each call the return address is wiped off the stack: a stale one
 * found later in a live frame would keep madtrace's code mapped at detach
 * (footprint.py cannot tell it from a real one).
 */
mt_claim_start:
        push rbx
        push rcx
        push rdx
        push rsi
        push rdi
        push r8
        push r9
        push r10
        push r11
        mov rbx, rcx
        xor r9d, r9d
        test byte ptr [rbx + MT_CTL_FLAGS], MT_FLAG_ENABLED
        jz 90f                              /* not recording: no record, nothing counted */
        mov r10, fs:[0]
        not r10
        call 70f
        mov qword ptr [rsp - 8], 0
        test rdi, rdi
        jnz 10f                             /* a slot under this key: whose ring? */
        test byte ptr [rbx + MT_CTL_FLAGS], MT_FLAG_POOL
        jz 81f
        call 75f
        mov qword ptr [rsp - 8], 0
        jnz 10f
        mov byte ptr [rbx + MT_CTL_POOL_EMPTY], 1
        jmp 81f
10:     sub rsp, 16                         /* every signal blocked while claiming */
        mov qword ptr [rsp + 8], -1
        mov edi, 2                          /* SIG_SETMASK */
        lea rsi, [rsp + 8]
        mov rdx, rsp                        /* the old mask */
        mov r10d, 8
        mov eax, 14                         /* rt_sigprocmask */
        syscall
        mov eax, 186                        /* gettid */
        syscall
        mov r8, rax
        mov r10, fs:[0]
        not r10
        call 70f
        mov qword ptr [rsp - 8], 0
        test rdi, rdi
        jz 20f
        mov rax, [rdi + 8]
        cmp [rax + MT_RING_TID], r8
        jne 20f
        mov rdx, [rbx + MT_CTL_OWNER_OFF]   /* its own ring, its owner word changed: */
        mov edx, fs:[rdx]                   /* the ring takes the new one */
        mov [rax + MT_RING_OWNER], rdx
        mov r9, rax
        jmp 60f
20:     test byte ptr [rbx + MT_CTL_FLAGS], MT_FLAG_POOL
        jz 59f
        mov eax, 39                         /* getpid */
        syscall
        cmp rax, [rbx + MT_CTL_PID]
        jne 21f
        mov rdx, [rbx + MT_CTL_OWNER_OFF]
        mov eax, fs:[rdx]
        cmp eax, r8d
        jne 59f                             /* its owner word is not its id: no ring */
        test rdi, rdi
        jz 26f
        /* its key's ring was a dead thread's (glibc gave this thread that thread's TCB):
           taken over in place, unless the tracer is taking it back or its owners are full */
        mov r9, [rdi + 8]
        mov rax, [r9 + MT_RING_TID]
        test rax, rax
        jz 25f
        mov rdx, [r9 + MT_RING_OWNERS_W]
        sub rdx, [r9 + MT_RING_OWNERS_R]
        cmp rdx, MT_RING_OWNER_SLOTS
        jae 25f
        lock cmpxchg [r9 + MT_RING_TID], r8 /* the dead thread's id -> this one's */
        jne 25f
        mov rdx, [r9 + MT_RING_OWNERS_W]
        mov eax, edx
        and eax, MT_RING_OWNER_SLOTS - 1
        shl eax, 4
        mov rcx, [r9 + MT_RING_HEAD]
        mov [r9 + rax + MT_RING_OWNERS], rcx
        mov [r9 + rax + MT_RING_OWNERS + 8], r8
        inc rdx
        mov [r9 + MT_RING_OWNERS_W], rdx    /* records from HEAD on are this thread's */
        mov qword ptr [r9 + MT_RING_SHADOW_TOP], 0   /* the dead thread's calls are gone */
        mov [r9 + MT_RING_OWNER], r8
        jmp 60f
25:     xor r9d, r9d
        jmp 26f
21:     test rdi, rdi                       /* a fork child's thread (not cleaned: its tracer */
        jz 60f                              /* is gone): its parent's ring, as before the pool */
        mov r9, [rdi + 8]                   /* (an exit stub needs its shadow stack) */
        jmp 60f
26:     lea rsi, [rbx + MT_CTL_POOL]
        mov ecx, MT_POOL_ENTRIES
30:     mov rax, [rsi]
        mov rdx, rax
        shr rdx, 32
        jz 31f                              /* empty, or taken by a thread */
        lock cmpxchg [rsi], r8              /* ring address -> this thread's id */
        je 32f
31:     add rsi, 8
        dec ecx
        jnz 30b
        mov byte ptr [rbx + MT_CTL_POOL_EMPTY], 1
        jmp 59f
32:     mov r9, rax
        mov [r9 + MT_RING_TID], r8
        mov [r9 + MT_RING_OWNER], r8
        mov [r9 + MT_RING_KEY], r10
40:     call 70f                            /* {key, ring} into the slot table */
        mov qword ptr [rsp - 8], 0
        test rdi, rdi
        jnz 41f
        mov rdi, rsi
        test rdi, rdi
        jz 58f                              /* full: the ring stays unused (taken back later) */
        mov rax, [rdi]
        cmp rax, MT_SLOT_TOMBSTONE
        ja 40b                              /* taken meanwhile */
        jmp 42f
41:     mov rax, [rdi]                      /* this key's entry: its ring is replaced */
42:     mov rdx, [rdi + 8]
        push rbx
        mov rbx, r10
        mov rcx, r9
        lock cmpxchg16b [rdi]
        pop rbx
        jne 40b                             /* changed meanwhile: look again */
        jmp 60f
58:     xor r9d, r9d
59:     lock inc qword ptr [rbx + MT_CTL_UNREGISTERED]
60:     mov edi, 2                          /* the thread's own mask back */
        mov rsi, rsp
        xor edx, edx
        mov r10d, 8
        mov eax, 14
        syscall
        add rsp, 16
        jmp 90f
81:     lock inc qword ptr [rbx + MT_CTL_UNREGISTERED]
90:     mov rax, r9
        pop r11
        pop r10
        pop r9
        pop r8
        pop rdi
        pop rsi
        pop rdx
        pop rcx
        pop rbx
        ret
70:     mov eax, r10d                       /* the chain of key r10, as SLOT_OF starts it */
        shr eax, MT_SLOT_HASH_SHIFT - 4
        and eax, (MT_SLOTS - 1) << 4
        lea rdx, [rbx + rax + MT_SLOT_TABLE]
        lea rax, [rbx + MT_SLOT_TABLE + MT_SLOT_TABLE_SIZE]
        xor edi, edi
        xor esi, esi
71:     cmp rdx, rax
        jae 74f
        mov r11, [rdx]
        cmp r11, r10
        je 73f
        cmp r11, MT_SLOT_TOMBSTONE
        ja 72f                              /* another key */
        test rsi, rsi
        jnz 76f
        mov rsi, rdx
76:     test r11, r11
        jz 74f                              /* a free entry ends the chain */
72:     add rdx, MT_SLOT_ENTRY_SIZE
        jmp 71b
73:     mov rdi, rdx
74:     ret
75:     lea rsi, [rbx + MT_CTL_POOL]
        mov ecx, MT_POOL_ENTRIES
77:     mov rax, [rsi]
        shr rax, 32
        jnz 78f                             /* a ring (ZF clear) */
        add rsi, 8
        dec ecx
        jnz 77b                             /* none: ZF set */
78:     ret
mt_claim_end:

/* ---------------------------------------------------------------------------
 * mt_seizeme (layout.h "Ring pool"): called by the fork and exec hooks with rcx
 * = the control block (rax, rcx, rdx, rsi, rdi and r8-r11 are theirs to
 * restore).  A thread that is not traced, of a process madtrace traces (the
 * process's TracerPid is MT_CTL_TRACER), puts its id in a free MT_CTL_SEIZE
 * entry and waits (MT_SEIZE_WAIT_NS at a time) until the tracer, which seizes
 * it, has cleared the entry; every MT_SEIZE_CHECK_EVERY waits it looks for
 * the tracer, and takes its request back once the tracer is gone, or the
 * pool closed (MT_FLAG_POOL: the session ends).  The
 * frame: [rsp] a timespec, [rsp + 16] 512 bytes of /proc status; helpers: 50
 * (rax = the TracerPid in the status file named by rdi, -1: unknown), 60 (one
 * wait), 65 (ZF set: the process's tracer is still madtrace).
 */
mt_seizeme_start:
        push rbx
        push rbp
        push r12
        push r13
        push r14
        mov rbx, rcx
        sub rsp, 528
        lea rdi, [rip + 95f]
        call 50f
        mov qword ptr [rsp - 8], 0
        test rax, rax
        jnz 49f                             /* traced already (or cannot tell) */
        call 65f
        mov qword ptr [rsp - 8], 0
        jne 49f                             /* no madtrace session traces the process */
        mov eax, 186                        /* gettid */
        syscall
        mov r12, rax
        xor r14d, r14d
41:     test byte ptr [rbx + MT_CTL_FLAGS], MT_FLAG_POOL
        jz 49f                              /* the pool closed (the session ends) */
        lea r13, [rbx + MT_CTL_SEIZE]
        mov ecx, MT_SEIZE_ENTRIES
42:     xor eax, eax
        lock cmpxchg [r13], r12             /* 0 -> this thread's id */
        je 44f
        add r13, 8
        dec ecx
        jnz 42b
        call 60f                            /* every entry taken: a moment */
        mov qword ptr [rsp - 8], 0
        call 66f
        mov qword ptr [rsp - 8], 0
        je 41b
        jmp 49f
44:     cmp [r13], r12
        jne 49f                             /* the tracer took it: traced now */
        test byte ptr [rbx + MT_CTL_FLAGS], MT_FLAG_POOL
        jz 48f
        call 60f
        mov qword ptr [rsp - 8], 0
        call 66f
        mov qword ptr [rsp - 8], 0
        je 44b
48:     mov rax, r12                        /* the tracer is gone, or the pool closed: */
        xor ecx, ecx                        /* the request goes */
        lock cmpxchg [r13], rcx
49:     add rsp, 528
        pop r14
        pop r13
        pop r12
        pop rbp
        pop rbx
        ret
50:     mov rsi, rdi                        /* openat(AT_FDCWD, rdi, O_RDONLY) */
        mov edi, -100
        xor edx, edx
        mov eax, 257
        syscall
        test rax, rax
        js 58f
        mov rbp, rax
        mov rdi, rax
        lea rsi, [rsp + 24]
        mov edx, 511
        xor eax, eax                        /* read */
        syscall
        mov r8, rax
        mov rdi, rbp
        mov eax, 3                          /* close */
        syscall
        test r8, r8
        jle 58f
        xor ecx, ecx
51:     lea rax, [rcx + 11]
        cmp rax, r8
        ja 58f                              /* no TracerPid line */
        movabs rax, 0x6950726563617254      /* "TracerPi" */
        cmp [rsp + 24 + rcx], rax
        jne 52f
        cmp word ptr [rsp + 24 + rcx + 8], 0x3a64   /* "d:" */
        je 53f
52:     inc rcx
        jmp 51b
53:     add rcx, 10
54:     cmp rcx, r8
        jae 58f
        movzx edx, byte ptr [rsp + 24 + rcx]
        inc rcx
        cmp dl, 9
        je 54b
        cmp dl, 32
        je 54b
        xor eax, eax
55:     sub edx, 0x30
        cmp edx, 9
        ja 57f
        imul rax, rax, 10
        add rax, rdx
        cmp rcx, r8
        jae 57f
        movzx edx, byte ptr [rsp + 24 + rcx]
        inc rcx
        jmp 55b
57:     ret
58:     mov rax, -1
        ret
60:     mov qword ptr [rsp + 8], 0          /* nanosleep(MT_SEIZE_WAIT_NS) */
        mov qword ptr [rsp + 16], MT_SEIZE_WAIT_NS
        lea rdi, [rsp + 8]
        xor esi, esi
        mov eax, 35
        syscall
        ret
65:     lea rdi, [rip + 96f]                /* ZF set: the process's tracer is madtrace's */
        call 50b
        mov qword ptr [rsp - 8], 0
        cmp rax, [rbx + MT_CTL_TRACER]
        ret
66:     inc r14d                            /* ZF set: go on waiting (looks for the tracer */
        cmp r14d, MT_SEIZE_CHECK_EVERY      /* every MT_SEIZE_CHECK_EVERY waits) */
        jb 67f
        xor r14d, r14d
        jmp 65b
67:     cmp eax, eax
        ret
95:     .asciz "/proc/thread-self/status"
96:     .asciz "/proc/self/status"
mt_seizeme_end:

/* ---------------------------------------------------------------------------
 * The hook at the entry of fork, _Fork, execve and execveat (live sessions with
 * the ring pool): mt_seizeme with every argument register kept, then the
 * function's first instructions, relocated and appended by the tracer, and a
 * jump back into it.
 */
mt_forkhook_start:
        push rax
        push rcx
        push rdx
        push rsi
        push rdi
        push r8
        push r9
        push r10
        push r11
        movabs rcx, 0x1122334455667788
mt_forkhook_pp_ctl_abs64:
        call qword ptr [rcx + MT_CTL_SEIZEME]
        mov qword ptr [rsp - 8], 0
        pop r11
        pop r10
        pop r9
        pop r8
        pop rdi
        pop rsi
        pop rdx
        pop rcx
        pop rax
mt_forkhook_end:
        /* the tracer appends: relocated instructions, jmp rel32 back */
