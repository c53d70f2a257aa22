"""The walls around the Python tool's code (design: "Environments and tools"): one bubblewrap sandbox per
call.

`sandbox_command(argv, ...)` wraps a command so that it runs in namespaces of its own: a mount namespace whose
root holds only /usr (read-only, with the /lib, /bin symlinks of a merged-/usr system), the interpreter's own
prefix (read-only, its site-packages hidden) and fresh tmpfs for /tmp (the working directory) and /dev/shm,
bounded in size; a PID namespace (the code sees only its own processes, and when the call's first process
ends the kernel kills every other one, so no daemon outlives the call); a network namespace (no IP, no
abstract Unix sockets of the host; `isolated=False` shares the host's); IPC and UTS namespaces; and a user
namespace of its own, in which the code runs as uid/gid 65534 with no capabilities (bounding set empty),
NoNewPrivs set, and a seccomp filter that refuses ptrace. The kernel counts RLIMIT_NPROC per user per user
namespace, so a process limit set inside binds each call on its own: a fork bomb stops at its own limit, and
64 calls at once do not share one.

As an ordinary user, one unprivileged `bwrap` does all of it. As root, `bwrap` would map the sandbox's uid to
root, which the kernel exempts from RLIMIT_NPROC, and a uid other than root could not read an interpreter
under /root: so root's `bwrap` builds the mounts and the PID, network, IPC and UTS namespaces, keeping only
the capabilities to change uid, then util-linux's `setpriv` hands the code to uid 65534 (no groups,
NoNewPrivs) and `unshare` gives it the user namespace of its own, before a second `setpriv` empties the
bounding set.

Why bubblewrap (Debian's `bubblewrap`, installed by scripts/install_bubblewrap.sh): it is in Debian, takes
plain arguments (no config language, unlike nsjail), is what Flatpak runs every app in, works unprivileged on
kernels with user namespaces, and has the switches this needs (--unshare-*, --die-with-parent, --cap-drop,
--new-session, tmpfs with --size). Where a wall cannot be put up, `check_sandbox` raises
`SandboxUnavailableError` naming it and the fix: a sandbox never silently loses a wall.
"""

from __future__ import annotations

import errno
import os
import platform
import shutil
import site
import struct
import subprocess
import sys
from functools import cache

from ascent.errors import AscentError

SANDBOX_UID = 65534  # `nobody` on Debian; a number, so no passwd entry is needed inside or outside
WORKDIR = "/tmp"  # the code's working directory, HOME and TMPDIR: a fresh tmpfs per call
# Read by name resolution and TLS when the network is shared; nothing else of /etc is visible.
NETWORK_ETC = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates")
PTRACE = {"x86_64": (0xC000003E, 101), "aarch64": (0xC00000B7, 117)}  # AUDIT_ARCH_*, __NR_ptrace
INSTALL_HINT = "run scripts/install_bubblewrap.sh (apt-get install bubblewrap) as root"


class SandboxUnavailableError(AscentError):
    """The sandbox cannot put up one of its walls on this machine (bubblewrap missing, no user namespaces)."""


def interpreter() -> str:
    """The real path of the interpreter the sandbox runs (a venv's python is a link to its base's)."""
    return os.path.realpath(sys.executable)


def sandbox_command(argv: list[str], *, disk_bytes: int, isolated: bool, seccomp_fd: int) -> list[str]:
    """`argv` (run inside, found on PATH=/usr/bin:/bin) wrapped in the sandbox described in the module
    docstring; each of /tmp and /dev/shm holds at most `disk_bytes`; `seccomp_fd` from `seccomp_pipe()`."""
    spaces = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "box"]
    spaces += ["--unshare-net"] if isolated else []
    bwrap = ["bwrap", "--die-with-parent", "--new-session", *spaces, *_filesystem(disk_bytes, isolated)]
    bwrap += ["--chdir", WORKDIR, "--cap-drop", "ALL", "--seccomp", str(seccomp_fd)]
    uid = str(SANDBOX_UID)
    if os.geteuid() != 0:
        return [*bwrap, "--unshare-user", "--disable-userns", "--uid", uid, "--gid", uid, "--", *argv]
    keep = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    ids = f"--reuid={uid} --regid={uid} --clear-groups"
    drop = f"setpriv {ids} --bounding-set=-all --inh-caps=-all --no-new-privs --".split()
    own_userns = ["unshare", "--user", f"--map-user={uid}", f"--map-group={uid}", "--keep-caps", "--"]
    no_caps = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--"]
    return [*bwrap, *keep, "--", *drop, *own_userns, *no_caps, *argv]


def seccomp_pipe() -> int:
    """The read end of a pipe holding the seccomp filter (bwrap reads it once; close it after the start)."""
    read, write = os.pipe()
    os.write(write, _no_ptrace_filter())
    os.close(write)
    return read


def _no_ptrace_filter() -> bytes:
    """A classic-BPF seccomp program: ptrace fails with EPERM, everything else is allowed. As an ordinary
    user the sandbox's init (bwrap, PID 1) shares the code's uid: without this the code could stop it."""
    if platform.machine() not in PTRACE:
        raise SandboxUnavailableError(
            f"the Python tool's sandbox knows the ptrace system call of x86_64 and aarch64, not of "
            f"{platform.machine()!r}: add it to PTRACE in ascent/envs/tools/sandbox.py."
        )
    arch, ptrace = PTRACE[platform.machine()]
    load, jump_eq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    steps = [(load, 0, 0, 4), (jump_eq, 0, 3, arch), (load, 0, 0, 0), (jump_eq, 0, 1, ptrace)]
    steps += [(ret, 0, 0, 0x00050000 | errno.EPERM), (ret, 0, 0, 0x7FFF0000)]  # SECCOMP_RET_ERRNO, _ALLOW
    return b"".join(struct.pack("=HBBI", *step) for step in steps)


def _filesystem(disk_bytes: int, isolated: bool) -> list[str]:
    """bwrap's mount arguments: the minimal read-only root, the interpreter, /proc, /dev and two tmpfs."""
    args = ["--ro-bind", "/usr", "/usr"]
    for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(link):  # merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    bound = ["/usr"]
    for path in _interpreter_dirs():
        if not any(_under(path, b) for b in bound):
            args += _ancestors(path) + ["--ro-bind", path, path]
            bound.append(path)
    for packages in _site_packages():  # third-party code is not the tool's: the standard library only
        if any(_under(packages, b) for b in bound):
            args += ["--tmpfs", packages, "--remount-ro", packages]
    if not isolated:
        args += [a for path in NETWORK_ETC for a in ("--ro-bind-try", path, path)]
    for path in (WORKDIR, "/dev/shm"):
        args += ["--perms", "1777", "--size", str(disk_bytes), "--tmpfs", path]
    return ["--proc", "/proc", "--dev", "/dev", *args, "--remount-ro", "/"]


def _interpreter_dirs() -> list[str]:
    """The directories the interpreter and its standard library live in (a pyenv or uv prefix, or /usr)."""
    dirs = [os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)]
    return [*dict.fromkeys([*dirs, os.path.dirname(interpreter())])]


def _site_packages() -> list[str]:
    prefixes = [os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)]
    return [p for p in dict.fromkeys(site.getsitepackages(prefixes)) if os.path.isdir(p)]


def _ancestors(path: str) -> list[str]:
    """Directories above `path` made traversable (bwrap would copy a private home's mode 0700 onto them)."""
    parts = path.strip("/").split("/")[:-1]
    return [
        a for i in range(len(parts)) for a in ("--perms", "0755", "--dir", "/" + "/".join(parts[: i + 1]))
    ]


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


@cache
def check_sandbox(isolated: bool) -> None:
    """Raise SandboxUnavailableError naming the wall that cannot be put up here, and the fix; cached."""
    missing = [tool for tool in ("bwrap", "prlimit", "setpriv", "unshare") if shutil.which(tool) is None]
    if "bwrap" in missing:
        raise SandboxUnavailableError(
            "the Python tool runs code in a bubblewrap sandbox and `bwrap` is not installed: "
            f"{INSTALL_HINT}, or install your distribution's bubblewrap package."
        )
    if missing:
        raise SandboxUnavailableError(
            f"the Python tool's sandbox needs util-linux's {', '.join(missing)} (limits, the change of "
            "user): install util-linux (apt-get install util-linux)."
        )
    argv = ["prlimit", "--nproc=16", "--", interpreter(), "-I", "-S", "-c", "pass"]
    seccomp = seccomp_pipe()
    probe = sandbox_command(argv, disk_bytes=1 << 20, isolated=isolated, seccomp_fd=seccomp)
    try:
        done = subprocess.run(
            probe, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, pass_fds=(seccomp,)
        )
        problem = done.stderr.decode(errors="replace").strip() if done.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        problem = str(e)
    finally:
        os.close(seccomp)
    if problem:
        raise SandboxUnavailableError(
            f"the Python tool cannot build its sandbox here: `bwrap` said {problem.splitlines()[-1]!r}. It "
            "needs bubblewrap 0.8 or newer (`bwrap --version`) and user namespaces: allow them (sysctl "
            "kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container, a seccomp "
            f"or AppArmor profile that permits them), and the interpreter {interpreter()} readable by uid "
            f"{SANDBOX_UID}."
        )
