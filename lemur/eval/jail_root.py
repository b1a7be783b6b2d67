"""The run's own root for lemur/eval/jail.py (stdlib only, no lemur: loaded by path).

On a fresh tmpfs: the interpreter's prefixes and the system's libraries (`binds`) read-only,
a minimal /dev, a fresh /proc of the run's pid namespace, and size-capped tmpfs for /tmp,
/var/tmp, /dev/shm and the working directory (the program copied in); then pivot_root into
it, the host's root detached. Nothing else of the host is there: no project files, no host
Unix sockets.
"""

import ctypes
import os

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 0x2, 0x4, 0x8, 0x1000
MS_MOVE, MS_REC, MS_PRIVATE = 0x2000, 0x4000, 0x40000
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
# pivot_root has no libc wrapper and a number per architecture; elsewhere: MS_MOVE + chroot.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
DEVICES = ("null", "zero", "full", "random", "urandom")

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
    """Build the run's own root and move into it: on a tmpfs, the `binds` (interpreter,
    system libraries) read-only, a minimal /dev, a fresh /proc of the pid namespace, and
    size-capped tmpfs for /tmp, /var/tmp, /dev/shm and `cwd` (the program copied in)."""
    root, cwd, scratch = spec["root"], spec["cwd"], spec["scratch_bytes"]
    work_fd = os.open(spec["workdir"], os.O_RDONLY | os.O_DIRECTORY)
    # A mount namespace of this process's own: pivot_root moves the root of every process of
    # its namespace, and the jail (its parent) must keep the host's.
    check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    tmpfs(root, 1 << 20, 0o755)
    for path in ("/tmp", "/var/tmp"):  # first: an interpreter under /tmp is bound inside it
        tmpfs(root + path, scratch, 0o1777)
    tmpfs(root + cwd, scratch, 0o700)  # `cwd`, not the host's path of the workdir
    for path in _outermost(spec["binds"]):
        bind_readonly(path, root + path)
    make_dev(root, scratch)
    os.makedirs(root + "/proc", exist_ok=True)
    try:
        mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except JailError:
        pass  # refused (a user namespace under a masked /proc): an empty /proc hides more
    copy_workdir(work_fd, root + cwd, spec.get("uid"))
    os.close(work_fd)
    set_readonly(root, recursive=False)
    enter_root(root)
