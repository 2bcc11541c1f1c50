"""A local PostgreSQL server for tests, benchmarks and development, from Debian's binaries.

`start` makes a cluster in a directory (``initdb`` the first time) and starts it on
127.0.0.1 with its unix sockets in that directory; `stop` stops it; `throwaway` does both
around a temporary directory and deletes it after. Authentication is ``trust`` for
connections from this machine as the ``postgres`` role: never expose such a server.

PostgreSQL refuses to run as root: when the current user is root, the server runs as the
system user `SERVER_USER` (created if missing) and owns its directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import asyncpg

SERVER_USER: Final = "gateway-pg"
"""The unprivileged system user a server started by root runs as."""
ROLE: Final = "postgres"
"""The database superuser of a cluster made here."""
INSTALL_GLOB: Final = "/usr/lib/postgresql/*/bin"
"""Where Debian's ``postgresql`` package puts the server binaries (one folder per version)."""
START_TIMEOUT_S: Final = 60


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed, or a server could not be started."""


def find_binaries() -> Path | None:
    """The ``bin`` folder of the newest installed PostgreSQL, or None."""
    found = [Path(p) for p in glob.glob(INSTALL_GLOB) if Path(p, "pg_ctl").exists()]
    if not found:
        return None
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


@dataclass(frozen=True, slots=True)
class PostgresServer:
    """A running local server: its directory and port."""

    directory: Path
    port: int

    @property
    def url(self) -> str:
        """URL of the server's ``postgres`` database."""
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        """URL of database ``name`` on this server (TCP on 127.0.0.1)."""
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are ended)."""
        stop(self.directory)


def _binaries() -> Path:
    found = find_binaries()
    if found is None:
        raise PostgresUnavailable(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/pg_ctl): "
            "apt-get install postgresql")
    return found


def _server_user() -> str | None:
    """The user to run the server as: None for the current one, `SERVER_USER` for root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home",
             "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", SERVER_USER],
            check=True, capture_output=True)
    return SERVER_USER


def _run(user: str | None, command: Sequence[str | os.PathLike[str]]) -> str:
    """Run a server binary (as ``user``); its output, or `PostgresUnavailable` with it."""
    argv = [os.fspath(part) for part in command]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          check=False)
    if done.returncode != 0:
        raise PostgresUnavailable(
            f"{Path(argv[argv.index('--') + 1] if user else argv[0]).name} failed "
            f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done.stdout


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _initdb(bin_dir: Path, directory: Path, user: str | None, durable: bool) -> None:
    data = directory / "data"
    _run(user, [bin_dir / "initdb", "-D", data, "-U", ROLE, "--auth=trust", "-E", "UTF8",
                "--no-locale", "--no-sync", "--no-instructions"])
    settings = [
        "listen_addresses = '127.0.0.1'",
        f"unix_socket_directories = '{directory / 'sockets'}'",
        "max_connections = 200",
    ]
    if not durable:
        # A throwaway server for tests: commits are not flushed to disk (nothing else changes:
        # visibility and ordering are those of a durable server).
        settings += ["fsync = off", "full_page_writes = off"]
    with open(data / "postgresql.conf", "a", encoding="utf-8") as conf:
        conf.write("\n# store.pg_server\n" + "\n".join(settings) + "\n")


def start(directory: str | os.PathLike[str], port: int | None = None, *,
          durable: bool = True) -> PostgresServer:
    """Start a server in ``directory`` (made with ``initdb`` if it holds none) on ``port``
    (default: a free one) and wait until it accepts connections; if it runs already, that
    server (on the port it runs on).

    ``durable=False`` makes a new cluster with ``fsync = off``: fast, for tests only. The
    server keeps running after this process exits; `stop` stops it.
    """
    bin_dir = _binaries()
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    user = _server_user()
    (root / "sockets").mkdir(exist_ok=True)
    if user is not None:
        info = pwd.getpwnam(user)
        for path in (root, root / "sockets"):
            os.chown(path, info.pw_uid, info.pw_gid)
        try:
            _run(user, ["test", "-w", root])
        except PostgresUnavailable:
            raise PostgresUnavailable(
                f"{root} is out of reach of the user {user} the server runs as (a folder "
                "above it is not searchable by others): choose a directory under /tmp, say"
            ) from None
    if not (root / "data" / "PG_VERSION").exists():
        _initdb(bin_dir, root, user, durable)
    elif (root / "port").exists() and _running(bin_dir, root, user):
        return PostgresServer(root, int((root / "port").read_text()))
    attempts = 1 if port is not None else 3
    for attempt in range(attempts):
        chosen = port if port is not None else _free_port()
        try:
            _run(user, [bin_dir / "pg_ctl", "-D", root / "data", "-l", root / "server.log",
                        "-o", f"-p {chosen}", "-w", "-t", str(START_TIMEOUT_S), "start"])
        except PostgresUnavailable as error:
            if attempt + 1 == attempts:
                log = root / "server.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise PostgresUnavailable(f"{error}\n{tail}") from None
            continue
        (root / "port").write_text(f"{chosen}\n")
        return PostgresServer(root, chosen)
    raise AssertionError("unreachable")


def _running(bin_dir: Path, root: Path, user: str | None) -> bool:
    try:
        _run(user, [bin_dir / "pg_ctl", "-D", root / "data", "status"])
    except PostgresUnavailable:
        return False
    return True


def stop(directory: str | os.PathLike[str], *, immediate: bool = False) -> None:
    """Stop the server running in ``directory`` (nothing if none runs there)."""
    bin_dir = _binaries()
    data = Path(directory).resolve() / "data"
    if not (data / "postmaster.pid").exists():
        return
    _run(_server_user(), [bin_dir / "pg_ctl", "-D", data, "-m",
                          "immediate" if immediate else "fast", "-w", "stop"])


@contextlib.contextmanager
def throwaway(*, durable: bool = False) -> Iterator[PostgresServer]:
    """A new server in a temporary directory, stopped and deleted afterwards.

    Should this process be killed before it can clean up, a watchdog process does it.
    """
    directory = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    watchdog = _watchdog(directory)
    try:
        server = start(directory, durable=durable)
        try:
            yield server
        finally:
            stop(directory, immediate=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        watchdog.kill()
        watchdog.wait()


def _watchdog(directory: Path) -> subprocess.Popen[bytes]:
    """A process that stops the server in ``directory`` and deletes it once this process
    is gone (checked every second)."""
    user = _server_user()
    stop_command = [os.fspath(_binaries() / "pg_ctl"), "-D", os.fspath(directory / "data"),
                    "-m", "immediate", "-w", "stop"]
    if user is not None:
        stop_command = ["runuser", "-u", user, "--", *stop_command]
    script = (f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
              f"{shlex.join(stop_command)} >/dev/null 2>&1; "
              f"rm -rf {shlex.quote(os.fspath(directory))}")
    return subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def create_database(server_url: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (a copy of ``template`` if given) on the server of
    ``server_url``; its URL."""
    sql = f"CREATE DATABASE {_quote(name)}"
    if template is not None:
        sql += f" TEMPLATE {_quote(template)} STRATEGY FILE_COPY"
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()
    return server_url.rsplit("/", 1)[0] + "/" + name


async def ensure_database(server_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``server_url`` unless it exists; its URL."""
    conn = await asyncpg.connect(server_url)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f"CREATE DATABASE {_quote(name)}")
    finally:
        await conn.close()
    return server_url.rsplit("/", 1)[0] + "/" + name


async def drop_database(server_url: str, name: str) -> None:
    """Drop database ``name`` on the server of ``server_url``, ending its sessions."""
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
    finally:
        await conn.close()
