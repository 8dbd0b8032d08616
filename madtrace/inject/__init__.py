"""Code injection: shared memory and code areas in the target, trampolines,
and the patch set that applies and reverts them.

- ``templates``: the trampoline templates built from injector/ and the shared layout
- ``areas``: the shared mapping and the code areas near each module (remote mmap)
- ``patchset``: 5-byte patches, applied and reverted transactionally
- ``functions``: selection of functions and of their patching method
"""
