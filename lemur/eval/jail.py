"""Enter the sandbox, then exec the untrusted program (run by path: stdlib only, no lemur).

    python -I -S jail.py SPEC  (the spec dict, marshal-ed, in hex)

lemur.eval.sandbox starts this script instead of the program itself so that no
`preexec_fn` runs in the (multi-threaded) evaluating process. In order, it:
1. joins the run's cgroups (pids, memory), if any were made;
2. unshares the network namespace (only a loopback interface, down: no network at all),
   the mount, pid and IPC namespaces; without root, a user namespace as well;
3. forks the first process of the new pid namespace (its init), which builds the run's
   own root on a tmpfs and moves into it (pivot_root): the `binds` (the interpreter's
   prefixes, the system's libraries) read-only, a minimal /dev, a fresh /proc that shows
   this namespace's processes only, and size-capped tmpfs for /tmp, /var/tmp, /dev/shm and
   the working directory (the program copied in). Nothing else of the host is there: no
   project files, no host Unix sockets. Init then forks the program, reaps orphans, and
   exits with the program's status; the kernel then kills whatever is left in the namespace;
4. the program drops to the run's own unprivileged uid and gid (root only), so that
   RLIMIT_NPROC counts only this run's processes and no other process can be signalled,
   moves the report channel (if any) to fd 3, sets no_new_privs, a parent-death signal and
   the resource limits, and execs in the working directory with a minimal environment.
Without `mountns` there is no pid namespace and no fork: steps 3's root is skipped and
this process becomes the program. Any failure exits with status 125 and one line on
stderr starting with "lemur-jail:".
"""

import ctypes
import marshal
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 0x2, 0x4, 0x8, 0x1000
MS_MOVE, MS_REC, MS_PRIVATE = 0x2000, 0x4000, 0x40000
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
# pivot_root has no libc wrapper and a number per architecture; elsewhere: MS_MOVE + chroot.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
REPORT_FD = 3
DEVICES = ("null", "zero", "full", "random", "urandom")
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


def set_readonly(path: str, recursive: bool) -> None:
    """Make the mount(s) at `path` read-only (mount_setattr(2))."""
    attr = MountAttr(MOUNT_ATTR_RDONLY, 0)
    flags = AT_RECURSIVE if recursive else 0
    ret = libc.syscall(
        SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    check(ret, f"mount_setattr {path}")


def tmpfs(target: str, size: int, mode: int) -> None:
    """A fresh tmpfs of at most `size` bytes at `target` (made if missing)."""
    os.makedirs(target, exist_ok=True)
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode:o}")


def bind_readonly(source: str, target: str) -> None:
    """Show `source` (a directory, a file or a symbolic link) at `target`, read-only."""
    if os.path.islink(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(source), target)
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    mount(source, target, None, MS_BIND | MS_REC)
    set_readonly(target, recursive=True)


def _outermost(paths: list[str]) -> list[str]:
    """`paths` without those inside another of them (a bind of the outer one shows them)."""
    return [
        p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths)
    ]


def make_dev(root: str, scratch: int) -> None:
    """A minimal /dev: the harmless character devices, the usual links, a private shm."""
    dev = root + "/dev"
    tmpfs(dev, 1 << 16, 0o755)
    for name in DEVICES:
        open(f"{dev}/{name}", "w").close()
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    os.symlink("/proc/self/fd", f"{dev}/fd")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")
    tmpfs(f"{dev}/shm", scratch, 0o1777)
    set_readonly(dev, recursive=False)


def copy_workdir(source_fd: int, target: str, uid: int | None) -> None:
    """Copy the regular files of the host working directory into the run's own one."""
    for name in os.listdir(source_fd):
        src = os.open(name, os.O_RDONLY, dir_fd=source_fd)
        with os.fdopen(src, "rb") as f, open(os.path.join(target, name), "wb") as out:
            out.write(f.read())
        if uid is not None:
            os.chown(os.path.join(target, name), uid, uid)
    if uid is not None:
        os.chown(target, uid, uid)


def enter_root(root: str) -> None:
    """Make `root` the root directory; the host's root is detached (or, without
    pivot_root, moved under and out of reach)."""
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None and libc.syscall(number, b".", b".") == 0:
        check(libc.umount2(b".", MNT_DETACH), "umount old root")
    else:
        mount(".", "/", None, MS_MOVE)
        check(libc.chroot(b"."), "chroot")
    os.chdir("/")


def build_root(spec: dict) -> None:
    """Build the run's own root (see the module's step 3) and move into it."""
    root, workdir, scratch = spec["root"], spec["workdir"], spec["scratch_bytes"]
    work_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    tmpfs(root, 1 << 20, 0o755)
    for path in ("/tmp", "/var/tmp"):  # first: an interpreter under /tmp is bound inside it
        tmpfs(root + path, scratch, 0o1777)
    for path in _outermost(spec["binds"]):
        bind_readonly(path, root + path)
    make_dev(root, scratch)
    os.makedirs(root + "/proc", exist_ok=True)
    try:
        mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except JailError:
        pass  # refused (a user namespace under a masked /proc): an empty /proc hides more
    tmpfs(root + workdir, scratch, 0o700)
    copy_workdir(work_fd, root + workdir, spec.get("uid"))
    os.close(work_fd)
    set_readonly(root, recursive=False)
    enter_root(root)


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


def unshare(spec: dict) -> None:
    """Join the run's cgroups and unshare the namespaces the spec asks for."""
    for cgroup in spec.get("cgroups", []):
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    flags = (CLONE_NEWNET if spec.get("netns") else 0) | (
        CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID if spec.get("mountns") else 0
    )
    own_userns = bool(flags) and os.geteuid() != 0
    if own_userns:
        flags |= CLONE_NEWUSER  # unprivileged: namespaces need a user namespace of our own
    uid, gid = os.getuid(), os.getgid()
    if flags:
        check(libc.unshare(flags), "unshare")
    if own_userns:
        map_ids(uid, gid)


def become_program(spec: dict) -> None:
    """Drop privileges, hand over the report channel, set limits; then exec the program."""
    if spec.get("uid") is not None:
        drop_privileges(spec["uid"])
    report = spec.get("report_fd")
    if report is not None and report != REPORT_FD:
        os.dup2(report, REPORT_FD)
        os.close(report)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl pdeathsig")
    for name, value in spec.get("limits", {}).items():
        soft, hard = (value, value) if name != "cpu" else (value, value + 1)
        resource.setrlimit(LIMITS[name], (soft, hard))
    os.chdir(spec["workdir"])
    argv = spec["argv"]
    os.execve(argv[0], argv, spec["env"])


def exit_code(status: int) -> int:
    """A wait status as an exit code: the program's own, or 128 + the signal that ended it."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def guarded(step, *args) -> None:  # noqa: ANN001 - a step function and its arguments
    """Run a step of entering the sandbox; on failure say why on stderr and exit 125."""
    try:
        step(*args)
    except (JailError, OSError, ValueError) as e:
        sys.stderr.write(f"lemur-jail: {e}\n")
        sys.stderr.flush()
        os._exit(125)


def init(spec: dict) -> None:
    """The pid namespace's first process: build the root, fork the program, reap, exit."""
    # Dies with the jail (the harness kills the jail on timeout), and then the kernel kills
    # the whole namespace. (Should the jail die before this, the harness's sweeps by uid and
    # by cgroup still find everything.)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.umask(0o022)
    guarded(build_root, spec)
    program = os.fork()
    if program == 0:
        guarded(become_program, spec)
    while True:  # orphans of the program are re-parented here: reap them too
        pid, status = os.wait()
        if pid == program:
            os._exit(exit_code(status))


def main() -> None:
    """Enter the sandbox described by argv[1] and exec the program."""
    # marshal, not json: importing json (and re) would double the jail's start-up time.
    spec = marshal.loads(bytes.fromhex(sys.argv[1]))
    guarded(unshare, spec)
    if not spec.get("mountns"):
        guarded(become_program, spec)
    child = os.fork()
    if child == 0:
        init(spec)
    _, status = os.waitpid(child, 0)
    os._exit(exit_code(status))


if __name__ == "__main__":
    main()
