"""Start, recognise and stop background processes by PID, safely across restarts of whoever started them.

A PID alone can be reused by an unrelated process after ours exits, so each record also keeps the process
start time from /proc/<pid>/stat; a record only matches the process that has both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

# Popen objects of processes this interpreter started, kept so they are reaped (no zombies) and never garbage
# collected while running (which would warn).
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    start_ticks: int
    argv: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "argv": list(self.argv)}) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ProcessRecord:
        data = json.loads(text)
        return cls(pid=int(data["pid"]), start_ticks=int(data["start_ticks"]), argv=tuple(data["argv"]))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or parentheses.
    return text[text.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat, counted from field 3


def session_threads(sessions: Collection[int]) -> dict[int, list[int]]:
    """The thread ids of every process in each of `sessions` (a process `spawn` started and the ones it
    started, unless they left its session), in one pass over /proc."""
    threads: dict[int, list[int]] = {session: [] for session in sessions}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        found = threads.get(int(fields[3])) if fields else None  # field 6 of stat, counted from field 3
        if found is None:
            continue
        try:
            found.extend(int(task) for task in os.listdir(f"/proc/{entry.name}/task"))
        except OSError:
            continue  # it exited meanwhile
    return threads


def _reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        del _children[pid]


def pid_running(pid: int) -> bool:
    """Whether `pid` exists and has not exited (a zombie waiting to be reaped counts as exited)."""
    _reap(pid)
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def is_alive(record: ProcessRecord) -> bool:
    _reap(record.pid)
    fields = _stat_fields(record.pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return int(fields[19]) == record.start_ticks


def spawn(
    argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> ProcessRecord:
    """Start `argv` in its own session (so it outlives its parent and can be signalled as a group)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    _children[child.pid] = child
    ticks = start_ticks(child.pid)
    if ticks is None:
        child.wait()
        raise RuntimeError(f"{argv[0]} exited at once (exit {child.returncode}); see {log}")
    return ProcessRecord(pid=child.pid, start_ticks=ticks, argv=tuple(argv))


def signal_group(record: ProcessRecord, signum: int) -> None:
    if not is_alive(record):
        return
    try:
        os.killpg(record.pid, signum)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(record.pid, signum)


def wait_gone(records: Sequence[ProcessRecord], timeout: float) -> list[ProcessRecord]:
    """Wait until every record's process is gone; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    alive = [record for record in records if is_alive(record)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [record for record in alive if is_alive(record)]
    return alive


def terminate(records: Sequence[ProcessRecord], grace_seconds: float) -> None:
    """SIGTERM each process group, wait up to `grace_seconds`, then SIGKILL what is left."""
    for record in records:
        signal_group(record, signal.SIGTERM)
    for record in wait_gone(records, grace_seconds):
        signal_group(record, signal.SIGKILL)
    wait_gone(records, 5.0)


def read_record(path: Path) -> ProcessRecord | None:
    try:
        return ProcessRecord.from_json(path.read_text())
    except (OSError, ValueError, KeyError):
        return None


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
