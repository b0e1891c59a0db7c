"""A read-only IMAP client for one folder (RFC 9051 / 3501, IDLE RFC 2177, CONDSTORE RFC 7162
where offered), on the standard library's `imaplib`.

Blocking by nature: the watcher runs every call on one thread of its own (a single-thread
executor per connection, so calls never overlap and a close runs after the call in flight).
It never changes the mailbox: the folder is opened with `EXAMINE` and bodies are read with
`BODY.PEEK[]`, so no `\\Seen` flag is set. Failures are classified as every adapter's are:
a dropped or refused connection is transient (reconnect with backoff), a refused login is
permanent (the credential must be corrected).
"""

from __future__ import annotations

import contextlib
import imaplib
import re
import select
import ssl
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from email.policy import compat32

from inboxcrm.adapters.errors import classify_exception
from inboxcrm.schemas.outcomes import Category, Classified

# A header block larger than this is not searched for a Message-ID (the identity then rests
# on the content hash alone).
HEADER_SCAN_BYTES = 64 * 1024
MESSAGE_ID_MAX = 995
_UID = re.compile(rb"\bUID (\d+)")
_SIZE = re.compile(rb"\bRFC822\.SIZE (\d+)")
_MESSAGE_ID = re.compile(r"<[^<>\s]{1,993}>")
_CODE = re.compile(rb"\[([A-Z-]+)")


class ImapFailure(Exception):
    """A classified IMAP failure; the message is a short code, never mail content."""

    def __init__(self, classified: Classified) -> None:
        super().__init__(classified.reason)
        self.classified = classified


@dataclass(frozen=True)
class FolderState:
    uidvalidity: int
    uidnext: int | None
    exists: int
    highest_modseq: int | None


@dataclass(frozen=True)
class Credential:
    """A password (LOGIN) or an OAuth 2.0 access token (SASL XOAUTH2, as Gmail and
    Microsoft 365 IMAP take it)."""

    username: str
    secret: str
    oauth: bool = False


def xoauth2_string(username: str, token: str) -> bytes:
    """The XOAUTH2 initial response: `user=U^Aauth=Bearer T^A^A` (imaplib base64-encodes it)."""
    return f"user={username}\x01auth=Bearer {token}\x01\x01".encode()


def quote_folder(folder: str) -> str:
    """A folder name as an IMAP quoted string (names are modified UTF-7, so ASCII)."""
    return '"' + folder.replace("\\", "\\\\").replace('"', '\\"') + '"'


def message_id_of(raw: bytes) -> str | None:
    """The Message-ID header, bounded: only the header block within HEADER_SCAN_BYTES."""
    end = raw.find(b"\r\n\r\n", 0, HEADER_SCAN_BYTES)
    if end < 0:
        end = raw.find(b"\n\n", 0, HEADER_SCAN_BYTES)
    if end < 0:
        return None
    headers = BytesHeaderParser(policy=compat32).parsebytes(raw[:end + 2])
    value = headers.get("Message-ID")
    if not isinstance(value, str):
        return None
    found = _MESSAGE_ID.search(value[:MESSAGE_ID_MAX + 10])
    return found.group(0) if found else None


def classify_imap(exc: BaseException) -> Classified:
    """IMAP's share of the one classifier: what imaplib raises, on top of socket errors."""
    if isinstance(exc, ImapFailure):
        return exc.classified
    if isinstance(exc, imaplib.IMAP4.abort):
        return Classified(Category.TRANSIENT, "imap_connection_dropped")
    if isinstance(exc, imaplib.IMAP4.error):
        text = str(exc).encode(errors="replace")
        code = _CODE.search(text)
        name = code.group(1).decode() if code else ""
        if name in ("AUTHENTICATIONFAILED", "AUTHORIZATIONFAILED", "EXPIRED", "PRIVACYREQUIRED"):
            return Classified(Category.PERMANENT, f"imap_{name.lower()}")
        if b"authenticat" in text.lower() or b"login" in text.lower():
            return Classified(Category.PERMANENT, "imap_login_refused")
        if name == "NONEXISTENT" or b"exist" in text.lower():
            return Classified(Category.PERMANENT, "imap_no_such_folder")
        return Classified(Category.TRANSIENT, f"imap_{name.lower() or 'no'}")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return Classified(Category.PERMANENT, "imap_tls_certificate")
    # Reading changes nothing, so no outcome is unknown: everything else is a retry.
    return classify_exception(exc, sent=False)


class ImapFolderReader:
    """One IMAP connection reading one folder. Not thread-safe: one thread at a time."""

    def __init__(self, *, host: str, port: int, tls: str, credential: Credential,
                 timeout: float = 30.0) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.credential = credential
        self.timeout = timeout
        self._imap: imaplib.IMAP4 | None = None
        self._idle_tag: bytes | None = None
        self._idle_news = False
        self.capabilities: frozenset[str] = frozenset()

    # --- connection ---------------------------------------------------------------------------
    def connect(self) -> None:
        try:
            if self.tls == "tls":
                imap: imaplib.IMAP4 = imaplib.IMAP4_SSL(
                    self.host, self.port, ssl_context=ssl.create_default_context(),
                    timeout=self.timeout)
            else:
                imap = imaplib.IMAP4(self.host, self.port, timeout=self.timeout)
                if self.tls == "starttls":
                    imap.starttls(ssl.create_default_context())
            self._imap = imap
            cred = self.credential
            if cred.oauth:
                token = xoauth2_string(cred.username, cred.secret)
                imap.authenticate("XOAUTH2", lambda _challenge: token)
            else:
                imap.login(cred.username, cred.secret)
            # Servers name more capabilities once logged in (CONDSTORE, IDLE, MOVE).
            typ, data = imap.capability()
            names = _first(data).split() if typ == "OK" else list(imap.capabilities)
            self.capabilities = frozenset(c.upper() for c in names)
        except Exception as exc:
            self.close()
            raise ImapFailure(classify_imap(exc)) from None

    def close(self) -> None:
        imap, self._imap = self._imap, None
        if imap is None:
            return
        try:
            if self._idle_tag is not None:
                self._idle_tag = None
                imap.send(b"DONE\r\n")
            imap.logout()
        except Exception:  # noqa: BLE001 - closing a connection that may already be gone
            with contextlib.suppress(Exception):
                imap.shutdown()

    @property
    def _conn(self) -> imaplib.IMAP4:
        if self._imap is None:
            raise ImapFailure(Classified(Category.TRANSIENT, "imap_not_connected"))
        return self._imap

    # --- reading --------------------------------------------------------------------------
    def examine(self, folder: str, writable: bool = False) -> FolderState:
        """Open the folder read-only (EXAMINE; with CONDSTORE where offered). `writable`
        (SELECT) only for a mailbox whose after-store action flags or moves its mail."""
        imap = self._conn
        try:
            name = quote_folder(folder)
            if "CONDSTORE" in self.capabilities:
                name += " (CONDSTORE)"
            typ, data = imap.select(name, readonly=not writable)
            if typ != "OK":
                raise imaplib.IMAP4.error(_first(data))
            uidvalidity = _untagged_int(imap, "UIDVALIDITY")
            if not uidvalidity:
                # No UIDs to trust (RFC 9051 requires it): never store under a guess.
                raise ImapFailure(Classified(Category.PERMANENT, "imap_no_uidvalidity"))
            state = FolderState(
                uidvalidity=uidvalidity,
                uidnext=_untagged_int(imap, "UIDNEXT"),
                exists=int(_first(data) or 0),
                highest_modseq=_untagged_int(imap, "HIGHESTMODSEQ"))
            # imaplib leaves SELECT's EXISTS among the untagged answers: only one that comes
            # later announces new mail (`announced_new_mail`).
            imap.untagged_responses.pop("EXISTS", None)
            return state
        except ImapFailure:
            raise
        except Exception as exc:
            raise ImapFailure(classify_imap(exc)) from None

    def uids_after(self, cursor: int) -> list[int]:
        """UIDs above the cursor, ascending (`UID n:*` also names the last message when n
        is past it, so the answer is filtered)."""
        typ, data = self._command("SEARCH", f"UID {cursor + 1}:*")
        found = b" ".join(d for d in data if isinstance(d, bytes))
        return sorted(u for u in (int(x) for x in found.split()) if u > cursor)

    def sizes(self, uids: list[int]) -> dict[int, int]:
        if not uids:
            return {}
        typ, data = self._command("FETCH", _uid_set(uids), "(UID RFC822.SIZE)")
        sizes: dict[int, int] = {}
        for part in data:
            header = part[0] if isinstance(part, tuple) else part
            if not isinstance(header, bytes):
                continue
            uid, size = _UID.search(header), _SIZE.search(header)
            if uid and size:
                sizes[int(uid.group(1))] = int(size.group(1))
        return sizes

    def fetch(self, uids: list[int]) -> dict[int, bytes]:
        """The raw messages, read with BODY.PEEK[] (no flag changes)."""
        if not uids:
            return {}
        typ, data = self._command("FETCH", _uid_set(uids), "(UID BODY.PEEK[])")
        found: dict[int, bytes] = {}
        pending: bytes | None = None
        for part in data:
            if isinstance(part, tuple) and len(part) == 2:
                header, body = part
                uid = _UID.search(header)
                if uid:
                    found[int(uid.group(1))] = body
                    pending = None
                else:
                    pending = body  # the UID comes after the literal
            elif isinstance(part, bytes) and pending is not None:
                uid = _UID.search(part)
                if uid:
                    found[int(uid.group(1))] = pending
                pending = None
        return found

    def announced_new_mail(self) -> bool:
        """Whether the server announced new mail (an untagged EXISTS) alongside the answers
        to our own commands since the last EXAMINE, and forgets it. The server tells a
        session of a new message once: mail that arrived during a catch-up is announced in
        the middle of its FETCH answers, never again in the IDLE after it."""
        imap = self._conn
        _typ, data = imap.response("EXISTS")  # pops it
        return any(item is not None for item in data or [])

    def mark_seen(self, uids: list[int]) -> None:
        """The after-store action `seen` (run only on stored messages)."""
        if uids:
            self._command("STORE", _uid_set(uids), "+FLAGS.SILENT", "(\\Seen)")

    def move(self, uids: list[int], target: str) -> None:
        """The after-store action `move:FOLDER`: MOVE (RFC 6851), else COPY, \\Deleted and
        UID EXPUNGE (UIDPLUS), which expunges only these messages."""
        if not uids:
            return
        if "MOVE" in self.capabilities:
            self._command("MOVE", _uid_set(uids), quote_folder(target))
            return
        if "UIDPLUS" not in self.capabilities:
            raise ImapFailure(Classified(Category.PERMANENT, "imap_move_unsupported"))
        self._command("COPY", _uid_set(uids), quote_folder(target))
        self._command("STORE", _uid_set(uids), "+FLAGS.SILENT", "(\\Deleted)")
        self._command("EXPUNGE", _uid_set(uids))

    def _command(self, command: str, *args: str) -> tuple[str, list[object]]:
        imap = self._conn
        try:
            typ, data = imap.uid(command, *args)
        except Exception as exc:
            raise ImapFailure(classify_imap(exc)) from None
        if typ != "OK":
            raise ImapFailure(classify_imap(imaplib.IMAP4.error(_first(data))))
        return typ, list(data)

    # --- IDLE (RFC 2177) ----------------------------------------------------------------------
    def idle_start(self) -> None:
        imap = self._conn
        try:
            tag = imap._new_tag()  # imaplib has no IDLE before Python 3.14
            imap.send(tag + b" IDLE\r\n")
            line = imap.readline()
            while line.startswith(b"* ") and not line.startswith(b"* BYE"):
                # News the server sends before its continuation: it would not come again.
                self._idle_news = True
                line = imap.readline()
            if not line.startswith(b"+"):
                raise imaplib.IMAP4.error("idle_refused")
            self._idle_tag = tag
        except ImapFailure:
            raise
        except Exception as exc:
            raise ImapFailure(classify_imap(exc)) from None

    def idle_wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the server to say something in IDLE (new mail,
        expunge, BYE); True if it did. A BYE or a closed socket raises (reconnect)."""
        imap = self._conn
        if self._idle_news:
            self._idle_news = False
            return True
        sock = imap.sock
        try:
            pending = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
            if not pending:
                readable, _, _ = select.select([sock], [], [], timeout)
                if not readable:
                    return False
            line = imap.readline()
        except (OSError, ValueError) as exc:
            raise ImapFailure(classify_imap(exc)) from None
        except imaplib.IMAP4.abort as exc:
            raise ImapFailure(classify_imap(exc)) from None
        if not line or line.startswith(b"* BYE"):
            raise ImapFailure(Classified(Category.TRANSIENT, "imap_connection_dropped"))
        return True

    def idle_done(self) -> None:
        """End IDLE and read up to its tagged answer (untagged news is dropped: the watcher
        asks for what is new by UID right after)."""
        imap, tag = self._conn, self._idle_tag
        if tag is None:
            return
        self._idle_tag = None
        try:
            imap.send(b"DONE\r\n")
            while True:
                line = imap.readline()
                if not line:
                    raise imaplib.IMAP4.abort("eof")
                if line.startswith(b"* BYE"):
                    raise imaplib.IMAP4.abort("bye")
                if line.startswith(tag + b" "):
                    imap.tagged_commands.pop(tag, None)
                    if not line[len(tag) + 1:].startswith(b"OK"):
                        raise imaplib.IMAP4.error("idle_failed")
                    return
        except Exception as exc:
            raise ImapFailure(classify_imap(exc)) from None


def _uid_set(uids: list[int]) -> str:
    return ",".join(str(u) for u in uids)


def _first(data: list[object] | list[bytes | None]) -> str:
    for item in data:
        if isinstance(item, bytes):
            return item.decode(errors="replace")
    return ""


def _untagged_int(imap: imaplib.IMAP4, name: str) -> int | None:
    typ, data = imap.response(name)
    for item in reversed(data or []):
        if isinstance(item, bytes) and item.strip().isdigit():
            return int(item.strip())
    return None


__all__ = ["Credential", "FolderState", "ImapFailure", "ImapFolderReader", "classify_imap",
           "message_id_of", "quote_folder", "xoauth2_string"]
