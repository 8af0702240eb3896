"""A local sandbox: one temporary checkout per episode, safe file tools, limited subprocesses.

Life cycle: ``Checkout.create(prefix)`` makes a fresh temporary directory (the episode's
checkout); the environment copies a project into it; file tools resolve every agent path with
``Checkout.resolve``; commands run with ``run_limited``; ``Checkout.remove()`` deletes it.

Confinement (what "an agent cannot write outside its checkout" means here, precisely):

1. *File tools* (view / edit / write): a path must be relative, must not contain ``..``, must not
   pass through a symlink (every component is ``lstat``-ed), and its real path must lie inside the
   checkout; files are opened with ``O_NOFOLLOW``. Anything else is refused with an observation.
2. *Python processes* (the tests, which execute code the agent wrote) start through a guard
   (``GUARD``, run as ``python -I -B -c GUARD ...``) that sets resource limits and installs a
   ``sys.addaudithook`` hook before any project code runs. Audit hooks cannot be removed from
   Python code. The hook refuses: opening a file for writing, creating, removing, renaming,
   linking or chmod-ing a path whose real path is outside the checkout; starting processes
   (``subprocess``, ``os.system``, ``exec*``, ``spawn*``, ``fork``); loading native code through
   ``ctypes``; and network sockets (episodes are offline). Modelling choice: an audit hook is not
   a kernel boundary (native extensions already installed could bypass it), but the code under test
   here is pure Python the agent wrote, and that is exactly what the hook sees. Kernel-level
   isolation is what the Docker backend (``envs.swebench``) provides.
3. *Limits* (``resource.setrlimit`` in the child, plus a wall clock in the parent): address space
   (``RLIMIT_AS``), CPU seconds (``RLIMIT_CPU``), size of any file written (``RLIMIT_FSIZE``), no
   core dumps; wall-clock timeout kills the whole process group (``start_new_session``); output is
   captured up to a cap (head and tail kept, the middle counted and dropped).
4. A raw ``shell`` command cannot be confined by rule 2, so environments built on this sandbox
   offer the shell tool only when explicitly allowed (``allow_shell``), and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


class PathRefused(ValueError):
    """An agent path was refused; ``str(err)`` is the observation text."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Per-command limits. ``time_s``: wall clock (CPU limit = ceil(time_s) + 1 s)."""

    time_s: float = 30.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_output_chars: int = 16_000


@dataclass(frozen=True, slots=True)
class ProcResult:
    returncode: int
    output: str
    timed_out: bool = False
    omitted_chars: int = 0  # output dropped from the middle (over max_output_chars)

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """One line for the observation: how the process ended."""
        if self.timed_out:
            return "the command was killed: it exceeded its time limit"
        sig = self.signal_name
        if sig == "SIGXCPU":
            return "the command was killed: it exceeded its CPU time limit"
        if sig == "SIGXFSZ":
            return "the command was killed: it wrote a file larger than the size limit"
        if sig is not None:
            return f"the command was killed by {sig}"
        return f"exit code {self.returncode}"


# The guard runs in the child before any project code (see the module docstring, rule 2).
# argv: root mem_bytes cpu_s fsize_bytes -- module args...
GUARD = r"""
import os, resource, sys
root = os.path.realpath(sys.argv[1])
mem, cpu, fsize = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if mem > 0: resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
if cpu > 0: resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
if fsize > 0: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_BLOCKED = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
            "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "socket.connect",
            "socket.bind", "socket.sendto"}
_PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.mkdir": (0,),
                "os.symlink": (1,), "os.link": (0, 1), "os.chmod": (0,), "os.chown": (0,),
                "os.truncate": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "os.mknod": (0,)}
_realpath, _join, _getcwd, _fsdecode, _isdir = os.path.realpath, os.path.join, os.getcwd, os.fsdecode, os.path.isdir
def _outside(p):
    if isinstance(p, int) or p is None:
        return False
    real = _realpath(_join(_getcwd(), _fsdecode(p)))
    return real != root and not real.startswith(root + os.sep)
def _hook(event, args):
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and _outside(path):
            raise PermissionError(f"sandbox: writing {path!r} outside the checkout is not allowed")
        # os.open of a directory outside would give a dir_fd that relative paths could escape through
        if mode is None and isinstance(flags, int) and _outside(path) and _isdir(_fsdecode(path)):
            raise PermissionError(f"sandbox: opening the directory {path!r} outside the checkout is not allowed")
    elif event in _PATH_EVENTS:
        for i in _PATH_EVENTS[event]:
            if i < len(args) and _outside(args[i]):
                raise PermissionError(f"sandbox: {event} on {args[i]!r} outside the checkout is not allowed")
    elif event in _BLOCKED:
        raise PermissionError(f"sandbox: {event} is not allowed in this environment")
sys.path.insert(0, root)
sys.addaudithook(_hook)
import runpy
sep = sys.argv.index("--")
module = sys.argv[sep + 1]
sys.argv = [module] + sys.argv[sep + 2:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def python_command(root: Path, limits: SandboxLimits, module: str, *args: str) -> list[str]:
    """argv that runs ``python -m module args`` under the guard, confined to ``root``."""
    cpu = int(limits.time_s) + 1
    return [sys.executable, "-I", "-B", "-c", GUARD, str(root), str(limits.memory_mb * 2**20), str(cpu),
            str(limits.file_size_mb * 2**20), "--", module, *args]


_LIMITS_LAUNCHER = r"""
import os, resource, sys
mem, cpu, fsize = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.argv[4], sys.argv[4:])
"""


def limited_argv(argv: list[str], limits: SandboxLimits) -> list[str]:
    """``argv`` (absolute executable) started through a launcher that applies the rlimits only
    (no audit hook: for non-Python commands such as the shell tool)."""
    return [sys.executable, "-I", "-S", "-c", _LIMITS_LAUNCHER, str(limits.memory_mb * 2**20),
            str(int(limits.time_s) + 1), str(limits.file_size_mb * 2**20), *argv]


def sandbox_env(root: Path) -> dict[str, str]:
    """A small, explicit environment for child processes (no inherited secrets)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    }


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, int]:
    """Read to EOF keeping the first 2/3 and the last 1/3 of ``cap`` bytes; returns (kept, omitted)."""
    head_cap, tail_cap = (2 * cap) // 3, cap - (2 * cap) // 3
    head, tail = bytearray(), bytearray()
    total = 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        room = head_cap - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            tail += chunk
            if len(tail) > tail_cap:
                del tail[: len(tail) - tail_cap]
    omitted = total - len(head) - len(tail)
    if omitted:
        return bytes(head) + f"\n[... {omitted} bytes of output omitted ...]\n".encode() + bytes(tail), omitted
    return bytes(head) + bytes(tail), 0


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_limited(argv: list[str], cwd: Path, limits: SandboxLimits, *, env: dict[str, str] | None = None,
                      stdin: bytes | None = None) -> ProcResult:
    """Run ``argv`` in ``cwd`` with a wall-clock limit and capped output (stdout+stderr merged).

    The process group is killed on timeout and on cancellation (the caller's ``CancelledError``
    is re-raised after the kill).
    """
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=str(cwd), env=env if env is not None else sandbox_env(cwd),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )
    assert proc.stdout is not None
    timed_out = False
    reader: asyncio.Future[tuple[bytes, int]] | None = None
    try:
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await proc.stdin.drain()
            proc.stdin.close()
        reader = asyncio.ensure_future(_read_capped(proc.stdout, limits.max_output_chars))
        try:
            async with asyncio.timeout(limits.time_s):
                await proc.wait()
        except TimeoutError:
            timed_out = True
            _kill_group(proc)
            await proc.wait()
        # The group may hold the pipe open (a grandchild): bound the drain, then kill the group.
        try:
            async with asyncio.timeout(2.0):
                data, omitted = await asyncio.shield(reader)
        except TimeoutError:
            _kill_group(proc)
            data, omitted = await reader
    except BaseException:
        if proc.returncode is None:
            _kill_group(proc)
            await proc.wait()
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        raise
    finally:
        _kill_group(proc)  # nothing of the episode's commands outlives them
    text = data.decode("utf-8", errors="replace")
    return ProcResult(proc.returncode if proc.returncode is not None else -9, text, timed_out, omitted)


# ----------------------------------------------------------------------------------- checkout
class Checkout:
    """A temporary directory owned by one episode, with path-safe file operations."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(root))

    @classmethod
    def create(cls, prefix: str, parent: str | Path | None = None) -> Checkout:
        return cls(Path(tempfile.mkdtemp(prefix=prefix, dir=parent)))

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def resolve(self, rel: str) -> Path:
        """The absolute path of agent path ``rel``; raises ``PathRefused`` (rule 1 above)."""
        rel = rel.strip()
        if not rel:
            raise PathRefused("Error: empty path: give a path relative to the repository root, e.g. src/module.py")
        if "\x00" in rel:
            raise PathRefused("Error: the path contains a NUL character")
        pure = PurePosixPath(rel)
        if pure.is_absolute() or rel.startswith("~"):
            raise PathRefused(f"Error: absolute path {rel!r} refused: use a path relative to the repository root")
        parts = [p for p in pure.parts if p not in ("", ".")]
        if ".." in parts:
            raise PathRefused(f"Error: path {rel!r} refused: '..' is not allowed (stay inside the repository)")
        cur = self.root
        for part in parts:
            cur = cur / part
            if cur.is_symlink():
                raise PathRefused(f"Error: path {rel!r} refused: it goes through a symlink ({part!r})")
        real = os.path.realpath(cur)
        if real != str(self.root) and not real.startswith(str(self.root) + os.sep):
            raise PathRefused(f"Error: path {rel!r} refused: it resolves outside the repository")
        return cur

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def read_text(self, rel: str) -> str:
        path = self.resolve(rel)
        if path.is_dir():
            raise PathRefused(f"Error: {rel!r} is a directory, not a file")
        if not path.is_file():
            raise PathRefused(f"Error: file {rel!r} does not exist (use view on '.' to list files)")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        return data.decode("utf-8", errors="replace")

    def write_text(self, rel: str, content: str) -> bool:
        """Write a file (creating parent folders inside the checkout); returns True if it was new."""
        path = self.resolve(rel)
        if path == self.root or path.is_dir():
            raise PathRefused(f"Error: {rel!r} is a directory; give a file path")
        parent = path.parent
        missing: list[Path] = []
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for d in reversed(missing):
            d.mkdir()
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(content.encode("utf-8"))
        return created

    def listing(self, rel: str, max_entries: int = 400) -> str:
        path = self.resolve(rel)
        if not path.is_dir():
            raise PathRefused(f"Error: {rel!r} is not a directory")
        rows: list[str] = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
            for name in sorted(filenames):
                rows.append(self.relative(Path(dirpath) / name))
                if len(rows) >= max_entries:
                    rows.append(f"[... listing stopped at {max_entries} entries ...]")
                    return "\n".join(rows)
        return "\n".join(rows) if rows else "(empty directory)"


def numbered(text: str, lines: str | None = None, max_chars: int = 16_000) -> str:
    """``text`` with 1-based line numbers, optionally only ``lines`` = 'START-END'."""
    all_lines = text.splitlines()
    start, end = 1, len(all_lines)
    if lines:
        try:
            a, _, b = lines.partition("-")
            start = max(1, int(a))
            end = min(len(all_lines), int(b)) if b.strip() else start
        except ValueError:
            raise PathRefused(f"Error: lines={lines!r} is not a range START-END of numbers, e.g. 10-40") from None
        if start > end:
            raise PathRefused(f"Error: lines={lines!r} is empty (the file has {len(all_lines)} lines)")
    width = len(str(end))
    out = [f"{i:>{width}}  {all_lines[i - 1]}" for i in range(start, end + 1)]
    body = "\n".join(out)
    if len(body) > max_chars:
        body = body[:max_chars] + f"\n[... cut: view a smaller range with <lines>, the file has {len(all_lines)} lines]"
    return body or "(empty file)"


def apply_edit(text: str, old: str, new: str, rel: str) -> str:
    """Replace the unique occurrence of ``old`` in ``text`` by ``new``; raises ``PathRefused``."""
    if not old:
        raise PathRefused("Error: <old> is empty; give the exact text to replace (use write for a new file)")
    count = text.count(old)
    if count == 0:
        hint = ""
        if old.strip() and text.count(old.strip()) == 1:
            hint = " (it matches when leading/trailing whitespace is removed: check the indentation)"
        raise PathRefused(f"Error: <old> was not found in {rel}{hint}; view the file and copy the text exactly")
    if count > 1:
        raise PathRefused(f"Error: <old> occurs {count} times in {rel}; include more surrounding lines to make it unique")
    return text.replace(old, new, 1)
