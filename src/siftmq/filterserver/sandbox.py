"""The walls around a filter worker, raised in the worker itself before the program loads.

In order: every descriptor but its two pipes and ``/dev/null`` on 0-2 is closed; rlimits (address
space, no file writes, no core dumps); an unprivileged user when it runs as root; the worker dies
with the broker (``PR_SET_PDEATHSIG``, asked after the change of user: the kernel clears it at a
change of credentials); no new descriptors; then a seccomp filter (libseccomp
through ``pyseccomp``, which also sets ``no_new_privs``) that allows only :data:`ALLOWED_SYSCALLS`:
what a running interpreter needs to compute, allocate memory, tell the time and use its pipes.
Anything else — opening a file, a socket, exec, fork or clone (threads), kill, ptrace — fails with
``EPERM``, which Python raises as an exception the worker reports; executable mappings are refused
the same way, so no new machine code can be brought in. The native code already loaded can still be
called (``ctypes`` is imported here, and a program that gets out of Python's restrictions reaches
it), and it reads and writes the worker's own memory: the seccomp filter is the boundary.

Linux only: elsewhere :func:`check_supported` says why, and the broker runs no program.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import sys
from typing import Final

ALLOWED_SYSCALLS: Final = (
    "read", "write", "close", "fstat", "newfstatat", "lseek",
    "mmap", "munmap", "mremap", "brk", "madvise", "mprotect",
    "rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "sigaltstack",
    "futex", "exit", "exit_group", "getpid", "gettid", "getppid",
    "getuid", "geteuid", "getgid", "getegid",
    "clock_gettime", "clock_getres", "gettimeofday", "time", "nanosleep", "clock_nanosleep",
    "getrandom", "sched_yield", "restart_syscall", "getrusage",
)  # fmt: skip
#: mmap and mprotect are allowed only without this flag
PROT_EXEC: Final = 0x4
NOBODY: Final = 65534
PR_SET_PDEATHSIG: Final = 1


class SandboxUnavailable(RuntimeError):
    """The filter server cannot sandbox a program here (and so runs none)."""


def check_supported() -> None:
    """Raises :class:`SandboxUnavailable` with the reason when programs cannot be sandboxed here."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"filter programs need Linux (seccomp); this is {sys.platform}")
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, RuntimeError) as exc:
        raise SandboxUnavailable(
            "filter programs need libseccomp and pyseccomp (pip install pyseccomp; apt install "
            f"libseccomp2): {exc}"
        ) from exc


def enter(*, keep_fds: tuple[int, ...], memory_bytes: int) -> None:
    """Raise the walls around this process (irreversibly). Call after every import the program
    may need and before running any of it."""
    import pyseccomp

    broker = os.getppid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2 and fd not in keep_fds:
            try:
                os.close(fd)
            except OSError:
                pass  # the directory's own descriptor, already gone
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    # the broker gone, this worker goes too; asked after the change of user, which clears it
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != broker:  # the broker died before that took effect
        os._exit(1)
    highest = max(keep_fds) + 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest, highest))
    syscalls = pyseccomp.SyscallFilter(defaction=pyseccomp.ERRNO(errno.EPERM))
    for name in ALLOWED_SYSCALLS:
        if name in ("mmap", "mprotect"):
            syscalls.add_rule(pyseccomp.ALLOW, name, pyseccomp.Arg(2, pyseccomp.MASKED_EQ, PROT_EXEC, 0))
        else:
            try:
                syscalls.add_rule(pyseccomp.ALLOW, name)
            except (OSError, RuntimeError, ValueError):
                pass  # not a system call on this architecture
    syscalls.load()
