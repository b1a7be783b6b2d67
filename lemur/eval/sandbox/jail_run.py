"""The jail's work (stdlib only, no lemur: loaded beside lemur/eval/sandbox/jail.py by path,
and importable as lemur.eval.sandbox.jail_run too): what jail.py says, in that order; and
the run's own root (`build_root`): on a fresh tmpfs, the interpreter's prefixes and the
system's libraries (`binds`) read-only, a minimal /dev, a fresh /proc of the run's pid
namespace, and size-capped tmpfs for /tmp, /var/tmp, /dev/shm and the working directory (the
program copied in); then pivot_root into it, the host's root detached. Nothing else of the
host is there: no project files, no host Unix sockets."""

# The C module: signal.py wraps it in enums, whose imports (enum, functools, collections)
# would add a tenth to the jail's start-up.
import _signal as signal
import ctypes
import errno
import marshal
import os
import resource
import sys
import time

# The run's own root.
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


def set_readonly(path: str, *, recursive: bool) -> None:
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


# The jail.
CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWCGROUP = 0x08000000, 0x20000000, 0x02000000
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# keyctl(2) has no glibc wrapper, and libkeyutils (the usual one) is often not installed:
# the system call is made directly where its number is known, through libkeyutils elsewhere.
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 288, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1
PROCESS_NAME = b"lemur-jail"  # what /proc/PID/cmdline of this process and of init shows
REPORT_FD = 3
LIMITS = {
    "as": resource.RLIMIT_AS,
    "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE,
    "nproc": resource.RLIMIT_NPROC,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}

RUN: dict = {}  # the spec and the first process's pid, for `abandon`


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


def join_cgroups(spec: dict) -> None:
    """Move this process into the run's cgroups ("0": the writer, in any pid namespace)."""
    for cgroup in spec.get("cgroups", []):
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write("0")


def own_cgroup_namespace() -> None:
    """A new cgroup namespace rooted at the run's cgroups (just joined): /proc/PID/cgroup
    then shows "/", not their host paths (which name the evaluator's pid and the host's own
    cgroups). Where none can be made (a kernel without them: EINVAL; no privilege: EPERM),
    the paths stay visible, as without this step."""
    if libc.unshare(CLONE_NEWCGROUP) == -1 and ctypes.get_errno() not in (
        errno.EINVAL,
        errno.EPERM,
    ):
        check(-1, "unshare cgroup namespace")


def unshare(spec: dict) -> None:
    """Unshare the namespaces the spec asks for (the mount namespace is init's alone: this
    process keeps the host's view, to remove the run's directory and cgroups in `abandon`)."""
    flags = (CLONE_NEWNET if spec.get("netns") else 0) | (
        CLONE_NEWIPC | CLONE_NEWPID if spec.get("mountns") else 0
    )
    own_userns = bool(flags) and os.geteuid() != 0
    if own_userns:
        flags |= CLONE_NEWUSER  # unprivileged: namespaces need a user namespace of our own
    uid, gid = os.getuid(), os.getgid()
    if flags:
        check(libc.unshare(flags), "unshare")
    if own_userns:
        map_ids(uid, gid)
        # New credentials: set the parent-death signal again, in case they cleared it.
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl pdeathsig")
        if os.getppid() != spec["parent"]:
            abandon()


def own_session_keyring() -> None:
    """Join a new, empty, anonymous session keyring (keyctl JOIN_SESSION_KEYRING, NULL).

    The session keyring is inherited across fork and exec: left as it is, the program could
    read the evaluating user's keys (Kerberos tickets, AFS tokens: pam_keyinit makes one
    per login) and plant its own there. The user keyrings are the run's own already (its
    own uid, or its own user namespace).
    """
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is not None:
        ret = libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)
    else:
        keyutils = ctypes.CDLL("libkeyutils.so.1", use_errno=True)  # OSError when missing
        ret = keyutils.keyctl_join_session_keyring(None)
    # ENOSYS: a kernel without keyrings; EPERM: keyctl refused to every process (a seccomp
    # filter, as Docker's): either way the program cannot reach a keyring either.
    if ret == -1 and ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM):
        check(ret, "keyctl join session keyring")


def become_program(spec: dict) -> None:
    """Drop privileges, hand over the report channel, set limits; then exec the program."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # `abandon` is for the jail alone
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if spec.get("uid") is not None:
        drop_privileges(spec["uid"])
    own_session_keyring()
    report = spec.get("report_fd")
    if report is not None and report != REPORT_FD:
        os.dup2(report, REPORT_FD)
        os.close(report)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl pdeathsig")
    for name, value in spec.get("limits", {}).items():
        soft, hard = (value, value) if name != "cpu" else (value, value + 1)
        resource.setrlimit(LIMITS[name], (soft, hard))
    os.chdir(spec["cwd"])
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
    # Dies with the jail (the jail's `abandon` kills it first, and the harness's timeout
    # kills the jail's process group, this one included), and then the kernel kills the
    # whole namespace.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # pid 1 then ignores it from inside
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.umask(0o022)
    guarded(build_root, spec)
    program = os.fork()
    if program == 0:
        guarded(become_program, spec)
    while True:  # orphans of the program are re-parented here: reap them too
        pid, status = os.wait()
        if pid == program:
            os._exit(exit_code(status))


def kill_all(find) -> None:  # noqa: ANN001 - a function listing pids
    """SIGKILL what `find()` lists until it lists nothing (a fork loop may add more)."""
    for _ in range(500):
        pids = find()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # gone meanwhile
        time.sleep(0.005)


def listed(path: str, field: int = 0, prefix: str = "") -> list[str]:
    """Field `field` of the lines of a file that start with `prefix` ([] if it is gone)."""
    try:
        with open(path) as f:
            return [line.split()[field] for line in f if line.startswith(prefix)]
    except OSError:
        return []


def uid_pids(uid: int) -> list[int]:
    """The processes whose real uid is `uid`."""
    found = filter(str.isdigit, os.listdir("/proc"))
    return [int(p) for p in found if listed(f"/proc/{p}/status", 1, "Uid:") == [str(uid)]]


def remove_cgroup(cgroup: str) -> None:
    """rmdir a cgroup, retrying (2 s at most) while its last processes are being reaped."""
    for _ in range(400):
        try:
            return os.rmdir(cgroup)
        except FileNotFoundError:
            return None
        except OSError:
            time.sleep(0.005)
    return None


def evaluator_gone(spec: dict) -> bool:
    """Whether the evaluator died: this process was re-parented away from it. The signal
    comes when the thread that started this process ends; the evaluator's other threads
    may still be ending (a kill -9 ends them one by one): wait for them, 2 s at most."""
    for _ in range(200):
        if os.getppid() != spec["parent"]:
            return True
        time.sleep(0.01)
    return False


def abandon(*_) -> None:  # noqa: ANN002 - also a signal handler
    """The evaluator died (or SIGTERM): kill every process of the run; with the evaluator
    gone, remove the run's cgroups and directory too (nobody else will); then exit."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second parent-death signal may come
    spec, child = RUN.get("spec", {}), RUN.get("child")
    if child:
        try:
            os.kill(child, signal.SIGKILL)  # init: the kernel then kills its whole namespace
            os.waitpid(child, 0)
        except OSError:
            pass  # gone already
    cgroups = spec.get("cgroups", [])
    for cgroup in cgroups:
        if os.path.exists(os.path.join(cgroup, "cgroup.kill")):  # cgroup v2, Linux >= 5.14
            with open(os.path.join(cgroup, "cgroup.kill"), "w") as f:
                f.write("1")
        kill_all(lambda c=cgroup: list(map(int, listed(os.path.join(c, "cgroup.procs")))))
    if spec.get("uid") is not None and not cgroups and not spec.get("mountns"):
        kill_all(lambda: uid_pids(spec["uid"]))
    if spec and evaluator_gone(spec):
        for cgroup in cgroups:
            remove_cgroup(cgroup)
        import shutil  # only here: it would slow every start

        if os.path.basename(spec["rundir"]).startswith("lemur-sandbox-"):
            shutil.rmtree(spec["rundir"], ignore_errors=True)
    os.killpg(0, signal.SIGKILL)  # the rest of the process group, this process included


def hide_command_line() -> None:
    """Overwrite this process's argv in memory: /proc/PID/cmdline shows PROCESS_NAME only.

    The namespace's init is a fork of this process, pid 1 to the program. The last byte of
    the area is left non-zero, so the kernel reads the command line up to the first NUL (as
    it does for setproctitle(3)), not the whole area.
    """
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5))
    if start and end - start > len(PROCESS_NAME) + 1:
        ctypes.memset(start, 0, end - start)
        ctypes.memmove(start, PROCESS_NAME, len(PROCESS_NAME))
        ctypes.memset(end - 1, ord(" "), 1)


def read_spec(fd: int) -> dict:
    """The spec from the inherited file `fd` (read from its start), which is then closed."""
    # marshal, not json: importing json (and re) would double the jail's start-up time.
    chunks = []
    while chunk := os.pread(fd, 1 << 16, sum(map(len, chunks))):
        chunks.append(chunk)
    os.close(fd)
    return marshal.loads(b"".join(chunks))


def main() -> None:
    """Enter the sandbox described by the file at fd argv[1] and run the program."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until RUN is filled in
    signal.signal(signal.SIGTERM, abandon)
    guarded(check, libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl pdeathsig")
    RUN["spec"] = spec = read_spec(int(sys.argv[1]))
    if os.getppid() != spec["parent"]:  # the evaluator died before the signal was set
        abandon()
    hide_command_line()
    guarded(unshare, spec)
    child = os.fork()
    if child == 0:
        guarded(join_cgroups, spec)
        guarded(own_cgroup_namespace)
        if spec.get("mountns"):
            init(spec)
        guarded(become_program, spec)
    RUN["child"] = child
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)  # a zombie: its pid stays its own
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    _, status = os.waitpid(child, 0)
    RUN["child"] = None
    if os.getppid() != spec["parent"]:  # the evaluator died meanwhile: what is left is ours
        abandon()
    os._exit(exit_code(status))
