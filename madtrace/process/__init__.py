"""Process control: the only package that issues ptrace requests.

- ``ptrace_raw``: ctypes binding, register and siginfo structures
- ``memory``: /proc/PID/mem reads and writes
- ``events``: typed wait results
- ``tracee``: one traced process and its threads (spawn, attach, stop, detach)
- ``controller``: the run loop and its policy (signals, forks, exec, stop requests)
- ``remote_syscall``: syscalls run inside the target, registers restored exactly
- ``cpu``: same-CPU placement for tight stop loops
"""
