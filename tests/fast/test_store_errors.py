"""Which errors are a store outage (the workflow waits for the store) and which are bugs
(inboxcrm/activities/store_outage.py): a table, plus the errors asyncpg really raises against a port
nobody listens on and a closed pool."""

from __future__ import annotations

import errno
import socket

import asyncpg
import pytest

from inboxcrm.activities.store_outage import is_store_unavailable

STORE_DOWN = [
    ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"),
    ConnectionResetError(errno.ECONNRESET, "reset by peer"),
    OSError("Multiple exceptions: [Errno 111] Connect call failed"),
    OSError(errno.EHOSTUNREACH, "No route to host"),
    TimeoutError(),                                          # pool acquire, connect timeout
    socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle"),
    asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.AdminShutdownError("terminating connection"),
    asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
    asyncpg.exceptions.DiskFullError("could not extend file"),
    asyncpg.exceptions.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only"),
    asyncpg.InterfaceError("connection is closed"),
    asyncpg.InterfaceError("pool is closing"),
]
NOT_THE_STORE = [
    FileNotFoundError(errno.ENOENT, "policies/acme.json"),
    PermissionError(errno.EACCES, "denied"),
    OSError(errno.ENOSPC, "No space left on device"),
    KeyError("route"),
    ValueError("bad value"),
    TypeError("wrong type"),
    asyncpg.InterfaceError("the server expects 3 arguments for this query, 2 were passed"),
    asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
    asyncpg.exceptions.UndefinedColumnError("column does not exist"),
    asyncpg.exceptions.UniqueViolationError("duplicate key"),
    asyncpg.exceptions.DataError("invalid input"),
]


@pytest.mark.parametrize("exc", STORE_DOWN, ids=lambda e: f"{type(e).__name__}:{e}")
def test_store_outages_are_store_errors(exc: BaseException) -> None:
    assert is_store_unavailable(exc)


@pytest.mark.parametrize("exc", NOT_THE_STORE, ids=lambda e: f"{type(e).__name__}:{e}")
def test_other_errors_are_not_store_errors(exc: BaseException) -> None:
    assert not is_store_unavailable(exc)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_refused_connection_is_a_store_error() -> None:
    with pytest.raises(BaseException) as refused:
        await asyncpg.connect(f"postgresql://u@localhost:{_closed_port()}/db", timeout=5)
    assert is_store_unavailable(refused.value), repr(refused.value)


async def test_a_closed_pool_is_a_store_error() -> None:
    pool = await asyncpg.create_pool(f"postgresql://u@127.0.0.1:{_closed_port()}/db",
                                     min_size=0)
    await pool.close()
    with pytest.raises(asyncpg.InterfaceError) as closed:
        await pool.acquire()
    assert is_store_unavailable(closed.value), repr(closed.value)
