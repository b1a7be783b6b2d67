"""Enter the sandbox, then exec the untrusted program (run by path: stdlib only, no lemur).

    python -I -S jail.py SPEC_JSON

lemur.eval.sandbox starts this script instead of the program itself so that no
`preexec_fn` runs in the (multi-threaded) evaluating process. In order, it:
1. joins the run's pids cgroup, if one was made (a hard cap on processes);
2. unshares the network namespace (only a loopback interface, down: no network at all),
   the mount namespace and the IPC namespace; without root, a user namespace as well;
3. in the new mount namespace, makes every mount read-only, puts fresh size-capped
   tmpfs over /tmp, /var/tmp and /dev/shm (they vanish with the namespace), makes the
   interpreter reachable (`expose`), and binds the working directory back, writable;
4. drops to the run's own unprivileged uid and gid (root only), so that RLIMIT_NPROC
   counts only this run's processes and no other process can be signalled;
5. sets no_new_privs, a parent-death signal and the resource limits;
6. execs the program in the working directory with a minimal environment.
Any failure exits with status 125 and one line on stderr starting with "lemur-jail:".
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND = 0x1, 0x2, 0x4, 0x1000
MS_REMOUNT, MS_REC, MS_PRIVATE = 0x20, 0x4000, 0x40000
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
LIMITS = {
    "as": resource.RLIMIT_AS,
    "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE,
    "nproc": resource.RLIMIT_NPROC,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}

libc = ctypes.CDLL(None, use_errno=True)


class JailError(Exception):
    """A step of entering the sandbox failed."""


def check(ret: int, what: str) -> None:
    """Raise JailError naming `what` and errno when a libc call returned -1."""
    if ret == -1:
        err = ctypes.get_errno()
        raise JailError(f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """mount(2)."""
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


class MountAttr(ctypes.Structure):
    """struct mount_attr (linux/mount.h)."""

    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def set_readonly(path: str, readonly: bool, recursive: bool) -> None:
    """Set or clear the read-only flag of the mount(s) at `path` (mount_setattr(2))."""
    attr = MountAttr(MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else MOUNT_ATTR_RDONLY)
    flags = AT_RECURSIVE if recursive else 0
    ret = libc.syscall(
        SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    check(ret, f"mount_setattr {path}")


def closed_ancestor(path: str) -> str | None:
    """The highest directory on the way to `path` that other users cannot traverse."""
    parts = os.path.abspath(path).split(os.sep)[1:]
    for i in range(len(parts)):
        ancestor = os.sep + os.path.join(*parts[: i + 1])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def bind(fd: int, target: str, readonly: bool) -> None:
    """Bind the directory open as `fd` (an O_PATH descriptor) onto `target`."""
    os.makedirs(target, exist_ok=True)
    mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    set_readonly(target, readonly, recursive=readonly)


def expose(paths: list[str]) -> None:
    """Make `paths` (the interpreter's prefixes) reachable by the unprivileged uid.

    A prefix under a directory closed to others (a Python in /root/.pyenv) is reached
    through a small read-only tmpfs laid over that directory, which hides the rest of it.
    """
    needed = []
    for path in paths:
        if (closed := closed_ancestor(path)) is not None:
            needed.append((closed, path, os.open(path, os.O_PATH | os.O_DIRECTORY)))
    covered: set[str] = set()
    for closed, path, fd in needed:
        if closed not in covered:
            mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            covered.add(closed)
        bind(fd, path, readonly=True)
        os.close(fd)
    for closed in covered:
        set_readonly(closed, True, recursive=False)


def private_filesystem(
    workdir: str, scratch_bytes: int, interpreter: list[str], to_others: bool
) -> None:
    """Read-only view of every mount, fresh scratch tmpfs, the working directory writable.

    `interpreter` (its prefixes) stays reachable; `to_others`: also by another uid.
    """
    fd = os.open(workdir, os.O_PATH | os.O_DIRECTORY)  # reachable after /tmp is covered
    scratch = [p for p in SCRATCH if os.path.isdir(p) and not os.path.islink(p)]
    # An interpreter prefix inside a scratch directory (a venv in a CI clone under /tmp)
    # would vanish under the fresh tmpfs: hold it open now and bind it back read-only.
    held = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in interpreter if _inside(p, scratch)]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    set_readonly("/", True, recursive=True)
    for path in scratch:
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={scratch_bytes},mode=1777")
    for path, held_fd in held:
        bind(held_fd, path, readonly=True)
        os.close(held_fd)
    if to_others:
        expose([p for p in interpreter if not _inside(p, scratch)])
    bind(fd, workdir, readonly=False)
    os.close(fd)


def _inside(path: str, roots: list[str]) -> bool:
    """Whether `path` is one of `roots` or below one of them."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def map_ids(uid: int, gid: int) -> None:
    """Map our own uid and gid into the new user namespace, unchanged.

    Unmapped, every file would belong to nobody there (stat fails with EOVERFLOW). Mapped
    to themselves (not to root), the program has no capabilities after exec, so it cannot
    undo the read-only mounts made before.
    """
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def drop_privileges(uid: int) -> None:
    """Become `uid`/`uid` with no supplementary groups (and so no capabilities)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def enter(spec: dict) -> None:
    """Apply every step of the spec to this process."""
    if spec.get("cgroup"):
        with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    flags = (CLONE_NEWNET if spec.get("netns") else 0) | (
        CLONE_NEWNS | CLONE_NEWIPC if spec.get("mountns") else 0
    )
    own_userns = bool(flags) and os.geteuid() != 0
    if own_userns:
        flags |= CLONE_NEWUSER  # unprivileged: namespaces need a user namespace of our own
    uid, gid = os.getuid(), os.getgid()
    if flags:
        check(libc.unshare(flags), "unshare")
    if own_userns:
        map_ids(uid, gid)
    if spec.get("mountns"):
        scratch = spec.get("scratch_bytes", 64 << 20)
        interpreter = spec.get("interpreter", [])
        private_filesystem(spec["workdir"], scratch, interpreter, bool(spec.get("expose")))
    if spec.get("uid") is not None:
        drop_privileges(spec["uid"])
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl pdeathsig")
    for name, value in spec.get("limits", {}).items():
        soft, hard = (value, value) if name != "cpu" else (value, value + 1)
        resource.setrlimit(LIMITS[name], (soft, hard))
    os.chdir(spec["workdir"])


def main() -> None:
    """Enter the sandbox described by argv[1] and exec the program."""
    spec = json.loads(sys.argv[1])
    try:
        enter(spec)
    except (JailError, OSError, ValueError) as e:
        sys.stderr.write(f"lemur-jail: {e}\n")
        sys.stderr.flush()
        os._exit(125)
    argv = spec["argv"]
    os.execve(argv[0], argv, spec["env"])


if __name__ == "__main__":
    main()
