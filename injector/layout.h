/* SPDX-License-Identifier: GPL-2.0-or-later
 *
 * madtrace shared-memory layout: the single definition.
 *
 * Included by injector/trampolines.S (the code that runs inside the target)
 * and parsed by madtrace/target/templates.py (the tracer side), so the two can
 * never disagree.  Only plain "#define NAME <integer expression>" lines.
 *
 * The shared mappings (memfds mapped by both tracer and target):
 *   control area: [control block, 4 KiB][slot table, 4 KiB]
 *   ring chunks:  [ring block][ring block]... (mapped as threads need them)
 * A thread finds its ring block through the slot table, keyed by NOT(its fs
 * base): 0 and 1 (free, tombstone) then stand for fs bases no thread has.  The
 * trampolines look up the word at %fs:0 first (a load; the x86-64 TLS ABI
 * keeps the fs base there), then rdfsbase (~7 cycles) if that misses.  Each ring block holds one
 * thread's records (single writer: that thread; single reader: the tracer).
 */
#define MT_MAGIC              0x45434152544d
#define MT_LAYOUT_VERSION     4

/* control block */
#define MT_CTL_MAGIC          0
#define MT_CTL_VERSION        8
#define MT_CTL_FLAGS          16     /* byte: MT_FLAG_*, written by the tracer */
#define MT_CTL_NOWAIT         17     /* byte: nonzero: a full ring drops at once (set by a writer
                                        whose wait timed out, cleared by the tracer's drain) */
#define MT_CTL_UNREGISTERED   24     /* u64: records of threads without a slot (lock inc) */
#define MT_CTL_EPOCH          128    /* u32 (own cache line): allocation events so far, counted
                                        by the hook stubs (lock xadd: each event's stamp);
                                        every data record carries the value it read (below) */
#define MT_CTL_SIZE           4096
#define MT_FLAG_ENABLED       1      /* records are written (each ring's LIMIT says it too) */
/* the ring pool (layout.h "Ring pool", below): */
#define MT_FLAG_POOL          2      /* a thread without a ring takes one from the pool */
#define MT_CTL_POOL_EMPTY     18     /* byte: set by a thread that found the pool empty */
#define MT_CTL_CLAIM          32     /* u64: mt_claim's address (every slow path calls it) */
#define MT_CTL_PID            40     /* u64: the traced process's pid */
#define MT_CTL_OWNER_OFF      48     /* u64: where a thread's owner word is, from its thread
                                        pointer (glibc: struct pthread's tid) */
#define MT_CTL_TRACER         56     /* u64: the tracer's thread id (its TracerPid) */
#define MT_CTL_SEIZEME        64     /* u64: mt_seizeme's address (the fork and exec hooks) */
#define MT_CTL_DRAINER        72     /* u64, written by the tracer: its process id while it
                                        drains (0: none); a writer that waited MT_SPIN_LIMIT
                                        pauses on a full ring asks the kernel whether it still
                                        lives (kill(pid, 0)) and waits on while it does */
#define MT_CTL_POOL           256    /* MT_POOL_ENTRIES u64: a ring block's address (free),
                                        a thread id (< 2^32: taken by that thread, until the
                                        tracer adopts it), 0 (empty) */
#define MT_POOL_ENTRIES       8
#define MT_CTL_SEIZE          512    /* MT_SEIZE_ENTRIES u64: ids of untraced threads that
                                        wait to be traced before a fork or an exec (0: free) */
#define MT_SEIZE_ENTRIES      16

/* slot table: 2*MT_SLOTS entries {u64 key = NOT(fs base) (0 free, 1 tombstone), u64 ring block address} */
#define MT_SLOTS              128
#define MT_SLOT_HASH_SHIFT    12
#define MT_SLOT_TABLE         4096
#define MT_SLOT_ENTRY_SIZE    16
#define MT_SLOT_TABLE_SIZE    4096

/* ring blocks */
#define MT_CONTROL_AREA       8192   /* control block + slot table */
#define MT_RINGS_PER_CHUNK    16     /* ring blocks per mapping of rings (live sessions: the first
                                        holds the ring pool too) */
#define MT_RING_HEAD          0      /* u64, written by the target: records written so far */
#define MT_RING_DROPS         8      /* u64, written by the target: records dropped (ring full) */
#define MT_RING_SHADOW_TOP    16     /* u64, written by the target: shadow stack depth */
#define MT_RING_EXITS_LOST    24     /* u64: entries not redirected (shadow stack full) */
#define MT_RING_LIMIT         32     /* u64, written by the tracer: a record may be written
                                        while HEAD < LIMIT: TAIL + MT_RING_RECORDS while
                                        recording, 0 while not.  The writer's one test per
                                        record; the tracer writes it once per drain, so the
                                        fast path never reads the cache line of TAIL */
#define MT_RING_WAITS         40     /* u64, written by the target: records that found the ring
                                        full and waited for the tracer */
#define MT_RING_CONTROL       48     /* u64, written by the tracer: the control block's address
                                        (for the trampolines' slow paths) */
#define MT_RING_OWNER         56     /* u64: the owner word of the ring's thread (layout.h "Ring
                                        pool"); the lookup compares its low 32 bits */
#define MT_RING_TAIL          64     /* u64, written by the tracer: records consumed */
#define MT_RING_TID           72     /* u64, written by the tracer (or the claiming thread):
                                        owner thread id */
#define MT_RING_KEY           80     /* u64, written by the claiming thread: its slot key */
#define MT_RING_OWNERS_W      96     /* u64, written by a thread taking the ring over: owners
                                        recorded in MT_RING_OWNERS */
#define MT_RING_OWNERS_R      104    /* u64, written by the tracer: owners it has read */
#define MT_RING_OWNERS        128    /* MT_RING_OWNER_SLOTS {u64 HEAD when taken over, u64 the new
                                        owner's id}: its records from that HEAD on are its own */
#define MT_RING_OWNER_SLOTS   128    /* (a power of two) */
#define MT_RING_SHADOW        4096   /* shadow stack: {u64 return address, u64 entry rsp} */
#define MT_SHADOW_ENTRIES     4096
#define MT_RING_RECORDS_OFF   69632  /* MT_RING_SHADOW + 16 * MT_SHADOW_ENTRIES */
#define MT_RING_RECORDS       262144 /* power of two (4 MiB of records per thread) */
#define MT_RING_MASK          262143
#define MT_RING_COUNTS        4265984 /* u64 per site id < MT_COUNTED_SITES, written by the target
                                        only: entry records this thread wrote for the site
                                        (the calls, counted where they happen: the tracer's
                                        drain only writes records out).  At MT_RING_RECORDS_OFF
                                        + 16 * MT_RING_RECORDS + 2048: site 0's counter does
                                        not share HEAD's offset within a page (4K aliasing) */
#define MT_COUNTED_SITES      65536  /* sites with a counter; the trampolines of further sites
                                        count into the spare one after them (never read), and
                                        the drain counts their entry records instead */
#define MT_RING_BLOCK         4792320 /* MT_RING_COUNTS + 8 * (MT_COUNTED_SITES + 1), page-rounded */
#define MT_SPIN_LIMIT         16000000 /* pause iterations a writer waits on a full ring: ~0.25 s
                                        where a pause takes 15 ns (this project's VMs: 4 M were
                                        61 ms, shorter than a starved drain), ~0.8 s at 50 ns */
#define MT_SPIN_ROUNDS        40     /* rounds of MT_SPIN_LIMIT pauses a writer waits while the
                                        drainer lives (~10 s: a drain starved by a loaded
                                        machine, not a tracer gone, whose death ends the wait
                                        after one round) */
#define MT_SPIN_YIELD         16384  /* a waiting writer calls sched_yield every that many
                                        pauses (a power of 2): a drain thread starved by other
                                        work gets the CPU this writer would spin on */

/* Unwind information registered with the target's unwinder (target/trampoline_unwind.py,
 * target/unwind_registry.py): areas named madtrace-unwind, each a chain of objects
 * [state][next][.eh_frame object][libgcc's struct object], the first at offset 0.
 * The state tells a later session whether the unwinder still holds an object.
 * Offsets are from the object's start. */
#define MT_UNWIND_STATE       0      /* u64: 0 not registered, 1 being registered, 2 registered */
#define MT_UNWIND_NEXT        8      /* u64: offset in the area of the next object (0: the last) */
#define MT_UNWIND_FRAMES      16     /* the .eh_frame object (the registration's begin) */

/* one record = 16 bytes:
 *   u64 timestamp (rdtsc; 0 without timestamps)
 *   u32 code = site id << 1 | MT_KIND_EXIT for exit records
 *   u32 low 32 bits of the stack pointer at the callee's entry (points at its return address) */
#define MT_RECORD_SIZE        16
#define MT_KIND_EXIT          1
#define MT_MAX_SITES          0x3fffffff

/* ---------------------------------------------------------------------------
 * Data-access fast path (MadT faults, one ptrace stop per access).
 *
 * The data area (a memfd mapped read-write-execute in the target, read-write in
 * the tracer): [slot 0][slot 1]...[slot MT_DATA_SLOTS-1][stubs...]
 * At a fault on a protected page the tracer copies the operand's bytes into a
 * slot and points the thread at a stub: the faulting instruction re-encoded
 * with its memory operand redirected to the slot ([rip + disp32]), then
 * "mov [rip + done], rsp" (marks the slot done), then "jmp [rip]; .quad back".
 * The page stays protected throughout; bytes the instruction changed are
 * written back from the slot to their real address by the tracer at its next stop (any thread: every
 * access to the page faults first, every system call stops first), or by the
 * in-target guard if the tracer is gone.
 * Hybrid engine, a page reached through its alias: relocated code reads the
 * alias without a stop, so nothing may wait for a write-back there; the stub
 * is then the instruction on [rA], rA loaded from MT_DSLOT_ALIAS (saved in
 * MT_DSLOT_SAVED and restored), the same tail, and the slot holds no bytes.
 */
#define MT_DATA_SLOTS         256
#define MT_DSLOT_SIZE         192
#define MT_DSLOT_BYTES        0      /* 64 bytes: the operand's copy (64-byte aligned) */
#define MT_DSLOT_BYTES_MAX    64
#define MT_DSLOT_ORIGINAL     64     /* 64 bytes: the copy as it was filled */
#define MT_DSLOT_ADDR         128    /* u64: the real address of the bytes (0: slot free) */
#define MT_DSLOT_LEN          136    /* u64: the operand's size */
#define MT_DSLOT_DONE         144    /* u64: nonzero once the stub's instruction ran */
#define MT_DSLOT_ALIAS        152    /* u64: hybrid engine, an aliased page: the operand's
                                        address in the alias; the stub accesses it there
                                        (arch/x86_64/alias_access.py) and LEN is 0 */
#define MT_DSLOT_SAVED        160    /* u64: that stub's address register, saved */

/* The guard: madtrace's SIGSEGV and SIGTRAP handler in the target while data
 * tracing is on.  The tracer never lets its own faults and traps reach the
 * target, so the guard only runs for a signal of the target's own that the
 * tracer delivered, or when no tracer is left (killed with SIGKILL).  It reads
 * TracerPid in /proc/self/status:
 * - a tracer is there: the signal is the target's own: the target's action
 *   (DELIVER for SIGSEGV) is put back and the signal queued again with its own
 *   siginfo (rt_tgsigqueueinfo), delivered as the guard returns; the tracer
 *   reinstalls the guard afterwards;
 * - no tracer: every page gets its original protection back (the runs table),
 *   finished slots are written back, the breakpoints get their original
 *   bytes, the return addresses of calls that were to return through a trap
 *   get their real value, a trap being taken resumes at the real return
 *   address (or a breakpoint at its instruction), the target's own actions are
 *   put back, and the program goes on.
 * The table (after the slots): */
#define MT_GUARD              49152  /* MT_DATA_SLOTS * MT_DSLOT_SIZE */
#define MT_GUARD_ACTIVE       0      /* u64: 1 while the guard is the SIGSEGV action */
#define MT_GUARD_NRUNS        8      /* u64: entries of the runs table */
#define MT_GUARD_FIRED        16     /* u64: set when the guard restored the pages */
#define MT_GUARD_TRAP_ACTIVE  24     /* u64: 1 while the guard is the SIGTRAP action */
#define MT_GUARD_ACTION       32     /* 32 bytes: the target's own kernel sigaction */
#define MT_GUARD_SELF         64     /* 32 bytes: the guard's kernel sigaction */
#define MT_GUARD_DELIVER      96     /* 32 bytes: the target's action as the kernel gets it
                                        while a tracer is there: SA_NODEFER, SIGSEGV never in
                                        its mask (a fault of madtrace's inside the handler must
                                        not meet a blocked SIGSEGV: the kernel would reset the
                                        action to SIG_DFL) */
#define MT_GUARD_RUNS         128    /* {u64 start, u64 length, u64 prot} per run */
#define MT_GUARD_RUN_SIZE     24
#define MT_GUARD_MAX_RUNS     2048
#define MT_GUARD_TRAP_ACTION  49280  /* 32 bytes: the target's own SIGTRAP action */
#define MT_GUARD_NBREAKS      49312  /* u64: breakpoints in the table */
#define MT_GUARD_BREAKS       49344  /* {u64 address, u64 original bytes (up to 8, the first
                                        lowest), u8 page prot, u8 count: the int3s written
                                        from address (0 counts as 1), 6 bytes unused}.  A
                                        thread resumed after its tracer took the stop of
                                        the first int3 and died runs into the next one:
                                        any of them takes it back to address */
#define MT_GUARD_BREAK_SIZE   24
#define MT_GUARD_MAX_BREAKS   64
#define MT_GUARD_NTRAPS       50880  /* u64: trap entries in use (highest index + 1) */
#define MT_GUARD_TRAPS        50944  /* {u64 trap address (0: free), u64 return address,
                                        u64 address of the stack slot that holds the trap} */
#define MT_GUARD_TRAP_SIZE    24
#define MT_GUARD_MAX_TRAPS    1024
#define MT_GUARD_BITMAP       75520  /* u64: the hybrid engine's alias bitmap (0: none); the
                                        guard maps zeros over it: every probe then accesses
                                        the address itself (data/hybrid/alias.py) */
#define MT_GUARD_BITMAP_SIZE  75528  /* u64: its size */
#define MT_GUARD_TRACER       75536  /* u64: madtrace's pid (the sender of its death signal) */
#define MT_GUARD_DELIVER_TID  75544  /* u64: the thread the tracer delivers a signal of the
                                        target's own to (0: none): the guard hands that one to
                                        the target's action; any other means no tracer */
#define MT_GUARD_DEATH_FD     75552  /* u64: the target's fd of madtrace's death pipe (0: none):
                                        SIGSEGV with si_code SI_SIGIO and this si_fd when
                                        madtrace dies (data/guard.py watch_tracer) */
#define MT_UC_RIP             168    /* offsetof(ucontext_t, uc_mcontext.gregs[REG_RIP]) */
#define MT_UC_ERR             192    /* offsetof(ucontext_t, uc_mcontext.gregs[REG_ERR]) */
#define MT_GUARD_CODE         151552 /* page-aligned, after the table */
#define MT_DATA_STUBS         155648 /* first stub, after the guard's code */

/* ---------------------------------------------------------------------------
 * Data probes (hybrid data engine: madtrace/arch/x86_64/function_copy.py).
 * An instruction that may touch traced memory becomes, in a relocated copy
 * of its function: probe_head (rsp below the red zone, rax/rcx/rdx saved in
 * the frame), the effective address into rcx, probe (a data record into the
 * thread's ring when the address's page is aliased, and the alias address),
 * then the instruction with its memory operand [rA] (a register it does not
 * use, saved in the frame).  A data record is {u64 address, u32 MT_DATA_CODE |
 * instruction id, u32 epoch}: the control block's MT_CTL_EPOCH when it was
 * written (the tracer names its heap block after exactly the allocation events
 * whose stamps are below it, whichever thread made them: madtrace/rings/
 * hook_events.py); call records have codes below MT_DATA_CODE, hook records
 * (below) codes from MT_HOOK_CODE on, data records those between.
 * A string instruction (madtrace/arch/x86_64/string_probes.py) takes one
 * iteration per probe: stos, lods and scas the probe above on rdi or rsi,
 * movs and cmps string_probe, which records both operands and publishes
 * them at once; a rep prefix becomes a loop around the probe.
 */
#define MT_DATA_CODE          0x80000000
#define MT_PROBE_FRAME        200    /* 128 (red zone) + the slots below */
#define MT_PF_RAX             0
#define MT_PF_RCX             8
#define MT_PF_RDX             16
#define MT_PF_ADDR            24     /* the address the instruction uses */
#define MT_PF_FLAGS           32     /* ah: SF ZF AF PF CF (lahf), al: OF (seto) */
#define MT_PF_SAVED           40     /* rA, the register that holds the address */
#define MT_PF_ADDR2           48     /* string probe: its second address (MT_PF_ADDR: the first) */
#define MT_PF_MASK            56     /* string probe: 1 the first's page aliased, 2 the second's */
#define MT_PF_SAVED2          64     /* string probe: the second address's register, the thread's */
#define MT_ALIAS_BIT_INDEX    45     /* alias address = address ^ (1 << 45) (data/hybrid/alias.py) */
#define MT_PROBE_SPIN_LIMIT   40000000 /* pause iterations a probe waits on a full ring before it
                                        drops (~1-5 s: a loaded machine stalls the drain for
                                        a while; a dead tracer only costs this wait once) */

/* ---------------------------------------------------------------------------
 * Hook stubs (hybrid data engine: madtrace/data/heap/inline_hooks.py).  The entry
 * of malloc & co. and of memcpy/memmove/memset jumps to a stub that writes a
 * group of records into the thread's ring, calls the function (its relocated
 * prologue, or the data engine's copy: the continuation slot), and for the
 * allocator writes a second group when it returns.  A group is published with
 * one (unlocked) cmpxchg of HEAD, retried if a signal handler wrote records
 * meanwhile, so it is whole or absent.  Every record of a group has a code >=
 * MT_HOOK_CODE: code = MT_HOOK_CODE | hook << 2 | kind.
 *   MT_HOOK_ENTRY (4 records): {a0 (rdi), code, u32 epoch}
 *                              {a1 (rsi), MT_HOOK_CONT, u32 position (its ring index, low 32)}
 *                              {a2 (rdx), MT_HOOK_CONT, u32 entry rsp (low 32)}
 *                              {return address, MT_HOOK_CONT, 0}
 *   MT_HOOK_RETURN (2 records): {result (rax), code, u32 stamp (lock xadd of MT_CTL_EPOCH)}
 *                               {entry rsp, MT_HOOK_CONT, u32 position}
 *   MT_HOOK_VOID: a group the tracer consumed out of ring order (hook = its records)
 * Memcpy & co. write an entry group only, and only when a buffer reaches traced
 * pages (the traced-page bitmap); the call then reaches them through the alias.
 */
#define MT_HOOK_CODE          0xfffff000
#define MT_HOOK_ENTRY         0
#define MT_HOOK_RETURN        1
#define MT_HOOK_CONT          0xfffffffe /* MT_HOOK_CODE | 0x3ff << 2 | 2 */
#define MT_HOOK_VOID          3
#define MT_HOOK_MAX           1022       /* hook indexes 0 .. MT_HOOK_MAX - 1 */
#define MT_HOOK_ENTRY_RECORDS 4
#define MT_HOOK_RETURN_RECORDS 2
#define MT_HOOK_MAX_PAGES     262144     /* longer buffers are checked by the tracer (a trap) */
/* the stub's frame at its trap (int3; r11 = what trapped): rsp + these */
#define MT_HF_R11             0
#define MT_HF_R10             8
#define MT_HF_R9              16
#define MT_HF_R8              24
#define MT_HF_RDX             32
#define MT_HF_RCX             40
#define MT_HF_RAX             48
#define MT_HF_PAD             56         /* a ret of the program's (see inline_hooks.py) */
#define MT_HF_RETURN          64         /* the caller's return address (entry rsp) */
#define MT_HT_ENTRY           0          /* r11 at the trap: the entry group was not written */
#define MT_HT_RETURN          1          /* ... the return group, no stamp taken */
#define MT_HT_STAMPED         2          /* ... the return group, stamp in r8d */

/* ---------------------------------------------------------------------------
 * Ring pool (live sessions: rings/ring_pool.py, calls/thread_pool.py).
 * A thread created while madtrace is attached is not traced; its first record
 * finds no slot (or a slot whose ring's owner word is not its own: glibc gave
 * it a dead thread's TCB, whose slot key is the same) and calls mt_claim:
 * with signals blocked, it takes a ring from the pool (lock cmpxchg: ring
 * address -> its thread id), writes its id, owner word and key in it, and
 * puts {key, ring} in the slot table with cmpxchg16b (over its key's stale
 * entry, or at the first free or tombstone entry); the tracer adopts the ring
 * afterwards (the pool entry holds the thread id), refills the pool, and
 * takes the ring back once the thread's owner word in its TCB is no longer
 * its id (the kernel clears it when the thread ends; glibc reuses the TCB).
 * The owner word: the u32 at the thread pointer + MT_CTL_OWNER_OFF (glibc:
 * struct pthread's tid); each lookup compares it with the ring's.
 * Such a thread that forks or execs through the C library first asks to be
 * traced: the hooks at fork, _Fork, execve and execveat call mt_seizeme,
 * which, while the tracer is there, puts the thread's id in an
 * MT_CTL_SEIZE entry and waits until the tracer has seized it and cleared
 * the entry: the fork or exec is then seen as any traced thread's.
 */
#define MT_SLOT_TOMBSTONE     1
#define MT_SEIZE_WAIT_NS      100000  /* mt_seizeme's wait between two looks (ns) */
#define MT_SEIZE_CHECK_EVERY  256     /* ... and how often it looks for the tracer */
