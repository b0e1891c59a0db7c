"""SMTP mail adapter: stdlib `smtplib` run in a worker thread (`asyncio.to_thread`).

SMTP has no idempotency key and cannot be searched, so this adapter is `reconcilable =
False`: an attempt whose outcome is unknown (the connection dropped after the message data
was sent, or no final reply before the timeout) is classified UNKNOWN by the shared
classifier, and the outbox turns that into `ambiguous`: held for a person, never resent.

What it does to keep repeats harmless where it can:
- a deterministic `Message-ID: <{intent_id}@{sender domain}>`, so a person resolving an
  ambiguous item can search the mailbox/relay logs for it, and receivers that deduplicate
  by Message-ID see one message;
- everything before the DATA payload (connect, EHLO, STARTTLS, AUTH, MAIL, RCPT) cannot
  have delivered anything: a failure there is at worst transient (`sent=False`);
- a 4xx reply, even to the end of DATA, means the server did not take the message
  (RFC 5321 section 4.2.5): transient; 5xx: permanent (blocked);
- the delivery ends inside the send lease (`OutgoingEmail.deliver_by`): DATA starts only
  if all of its socket waits fit in the time left, each bounded to its share of it, so a
  thread that outlives its step cannot hand a message over after the lease ended (and an
  opt-out recorded after the lease always comes after any delivery).

Security: `starttls` (port 587, the default), `ssl` (implicit TLS, port 465) or `none`
(local relays and tests only). Certificates are verified with the system store.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.policy
import email.utils
import re
import smtplib
import socket
import ssl
import time
from email.message import EmailMessage
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from inboxcrm.adapters.base import (
    AdapterError,
    OutgoingEmail,
    SentEmail,
    SentRecord,
    Unverifiable,
)
from inboxcrm.adapters.errors import AddressRefused, Category, Classified, classify_exception
from inboxcrm.adapters.registry import (
    ConfigurationError,
    MailProvider,
    Secrets,
    register,
    secret_value,
)
from inboxcrm.adapters.transport import AddressGuard
from inboxcrm.platform import tracing
from inboxcrm.schemas.destinations import MailDestination, SecretRef

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings

Security = Literal["starttls", "ssl", "none"]
SECURITY_MODES: tuple[Security, ...] = ("starttls", "ssl", "none")
# Headers this adapter owns; the same names in OutgoingEmail.headers are ignored.
OWN_HEADERS = frozenset({"from", "to", "subject", "date", "message-id", "sender", "cc", "bcc",
                         "reply-to"})
_HEADER_NAME = re.compile(r"^[!-9;-~]{1,76}$")  # RFC 5322 field name: printable, no colon
_KEY = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# DATA is at most four socket waits: send the command, read its reply, send the message,
# read the final reply. Below this much time per wait the message is not handed over.
DATA_WAITS = 4
MIN_WAIT_SECONDS = 1.0


def message_id(idempotency_key: str, domain: str) -> str:
    """The deterministic Message-ID of one follow-up intent."""
    if not _KEY.match(idempotency_key):
        raise ValueError("idempotency key must be a UUID-like token")
    return f"<{idempotency_key}@{domain}>"


class SmtpMail:
    name = "smtp"
    reconcilable = False
    key_window_seconds: float | None = None

    def __init__(
        self,
        host: str,
        port: int,
        *,
        sender: str,
        security: str = "starttls",
        username: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
        local_hostname: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        guard: AddressGuard | None = None,
    ) -> None:
        if security not in SECURITY_MODES:
            raise ValueError(f"SMTP security must be one of {SECURITY_MODES}, got {security!r}")
        _sender_address(sender)
        self._host = host
        self._port = port
        self._sender = sender
        self._security = security
        self._username = username or None
        self._password = password or ""
        self._timeout = timeout
        self._local_hostname = local_hostname
        self._tls = tls_context or ssl.create_default_context()
        self._guard = guard

    @property
    def endpoint(self) -> str:
        """The relay this client submits to (no credentials): what a worker reports of its
        destinations (`Destinations.endpoints`)."""
        scheme = "smtps" if self._security == "ssl" else "smtp"
        return f"{scheme}://{self._host}:{self._port}"

    def where_to_look(self, idempotency_key: str) -> str:
        """An SMTP relay cannot be asked: its log (or the recipient's mailbox) is searched
        for the intent's deterministic Message-ID."""
        _, domain = _sender_address(self._sender)
        return (f"the mail log of {self._host}:{self._port}: a message with Message-ID "
                f"{message_id(idempotency_key, domain)} (SMTP cannot be searched)")

    def build(self, idempotency_key: str, message: OutgoingEmail) -> EmailMessage:
        """The RFC 5322 message for one intent. Raises ValueError on an unusable header."""
        sender = message.sender or self._sender
        _, domain = _sender_address(sender)
        msg = EmailMessage()
        msg["From"] = sender
        msg["To"] = message.to
        if message.reply_to:
            msg["Reply-To"] = message.reply_to
        msg["Subject"] = message.subject
        msg["Date"] = email.utils.formatdate(usegmt=True)
        msg["Message-ID"] = message_id(idempotency_key, domain)
        for name, value in message.headers.items():
            if name.lower() in OWN_HEADERS:
                continue
            if not _HEADER_NAME.match(name):
                raise ValueError("invalid header name")
            msg[name] = value  # the policy refuses CR/LF in values (no header injection)
        msg.set_content(message.text)
        if message.html is not None:
            msg.add_alternative(message.html, subtype="html")
        return msg

    async def send(self, idempotency_key: str, message: OutgoingEmail) -> SentEmail:
        try:
            msg = self.build(idempotency_key, message)
        except ValueError:
            # Nothing was sent; retrying the same content cannot help.
            raise AdapterError(Classified(Category.PERMANENT, "invalid_message")) from None
        envelope_from = _sender_address(message.sender or self._sender)[0]
        if not tracing.enabled():
            await asyncio.to_thread(self._deliver, msg, envelope_from, message.to,
                                    message.deliver_by)
        else:
            with tracing.destination_span("SMTP send", {"server.address": self._host,
                                                        "server.port": self._port}):
                await asyncio.to_thread(self._deliver, msg, envelope_from, message.to,
                                        message.deliver_by)
        return SentEmail(message_id=str(msg["Message-ID"]))

    async def read_sent(self, message_id: str) -> SentRecord | None:
        """A relay keeps no queryable record of what it accepted: the drift check reports
        SMTP follow-ups as unverifiable, never as present or missing."""
        raise Unverifiable("smtp_not_searchable")

    async def aclose(self) -> None:
        return None

    # --- the blocking part, in a worker thread ------------------------------------------
    def _connect(self) -> smtplib.SMTP:
        client: _GuardedSMTP
        if self._security == "ssl":
            client = _GuardedSMTPSSL(timeout=self._timeout, local_hostname=self._local_hostname,
                                     context=self._tls)
        else:
            client = _GuardedSMTP(timeout=self._timeout, local_hostname=self._local_hostname)
        client.guard = self._guard
        # What TLS checks the certificate against (smtplib sets it only in __init__).
        client._host = self._host  # type: ignore[attr-defined]
        code, reply = client.connect(self._host, self._port)
        if code != 220:
            client.close()
            raise smtplib.SMTPConnectError(code, reply)
        return client

    def _deliver(self, msg: EmailMessage, envelope_from: str, recipient: str,
                 deliver_by: float | None) -> None:
        needs_utf8 = not (envelope_from.isascii() and recipient.isascii())
        policy = email.policy.SMTPUTF8 if needs_utf8 else email.policy.SMTP
        payload = msg.as_bytes(policy=policy)
        options = ["SMTPUTF8", "BODY=8BITMIME"] if needs_utf8 else []
        sent = False  # True once the message data may have reached the server
        client: smtplib.SMTP | None = None
        delivered = False
        try:
            client = self._connect()
            client.ehlo_or_helo_if_needed()
            if self._security == "starttls":
                client.starttls(context=self._tls)
                client.ehlo()
            if self._username:
                client.login(self._username, self._password)
            code, reply = client.mail(envelope_from, options)
            if code != 250:
                raise smtplib.SMTPSenderRefused(code, reply, envelope_from)
            code, reply = client.rcpt(recipient)
            if code not in (250, 251):
                raise smtplib.SMTPRecipientsRefused({recipient: (code, reply)})
            _fit_data_into(client, deliver_by, self._timeout)
            sent = True
            code, reply = client.data(payload)
            if code != 250:
                raise smtplib.SMTPDataError(code, reply)
            delivered = True
        except (smtplib.SMTPException, OSError, AddressRefused) as exc:
            raise AdapterError(classify_exception(exc, sent=sent)) from None
        finally:
            if client is not None:
                # After a 250 to the data the message is the server's: a failing QUIT
                # changes nothing. Otherwise just drop the connection.
                with contextlib.suppress(smtplib.SMTPException, OSError):
                    if delivered:
                        client.quit()
                    else:
                        client.close()


def _sender_address(sender: str) -> tuple[str, str]:
    """The envelope address of a From header and its domain (the Message-ID's)."""
    address = email.utils.parseaddr(sender)[1]
    local, _, domain = address.rpartition("@")
    if not local or not domain:
        raise ValueError("the mail sender must contain an address (local@domain)")
    return address, domain


def _fit_data_into(client: smtplib.SMTP, deliver_by: float | None, timeout: float) -> None:
    """Bound DATA's socket waits so it ends by `deliver_by`; refuse (transient: nothing was
    handed over) when the time left is too short."""
    if deliver_by is None or client.sock is None:
        return
    wait = min(timeout, (deliver_by - time.monotonic()) / DATA_WAITS)
    if wait < MIN_WAIT_SECONDS:
        raise AdapterError(Classified(Category.TRANSIENT, "smtp_lease_too_short"))
    client.sock.settimeout(wait)


class _GuardedSMTP(smtplib.SMTP):
    """smtplib's client, connecting only to addresses a tenant's guard allows: the host is
    resolved here, every address checked, then one of them connected to (TLS still checks
    the certificate against the host name)."""

    guard: AddressGuard | None = None

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        if self.guard is None:
            plain: socket.socket = super()._get_socket(host, port, timeout)  # type: ignore[misc]
            return plain
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [str(info[4][0]) for info in infos]
        if not addresses or any(self.guard.refuses(host, a) for a in addresses):
            raise AddressRefused(f"{host} resolves to an internal address")
        return socket.create_connection((addresses[0], port), timeout, self.source_address)


class _GuardedSMTPSSL(smtplib.SMTP_SSL, _GuardedSMTP):
    """SMTP_SSL wraps the socket `_GuardedSMTP` connected (its `super()._get_socket`)."""


# --- the provider ----------------------------------------------------------------------------
class SmtpDestination(MailDestination):
    """A tenant's own SMTP submission server (`destinations.mail` with
    `"provider": "smtp"`)."""

    smtp_host: str | None = None
    smtp_port: int = Field(587, ge=1, le=65535)
    smtp_tls: Security = "starttls"
    smtp_username: str | None = None
    smtp_password: SecretRef | None = None

    # An SMTP server is the tenant's own: no provider documents it, so the operator must
    # allow its host (INBOXCRM_DESTINATION_HOSTS_ALLOWED).
    documented_hosts: ClassVar[tuple[str, ...]] = ()

    def endpoints(self) -> list[tuple[str, str]]:
        scheme = "smtp" if self.smtp_tls == "none" else "smtps"
        return [("smtp_host", f"{scheme}://{self.smtp_host}:{self.smtp_port}")]

    @model_validator(mode="after")
    def _complete(self) -> SmtpDestination:
        if not self.smtp_host:
            raise ValueError("an smtp destination needs smtp_host")
        return self


@register
class SmtpProvider(MailProvider[SmtpDestination]):
    name = SmtpMail.name
    destination = SmtpDestination
    no_sandbox_reason = ("the sandbox speaks HTTP only; the adapter's tests run it against "
                         "a real local SMTP server (aiosmtpd) in tests/test_adapters.py")
    no_conformance_reason = ("SMTP is a protocol (RFC 5321), not a service with an SDK to "
                             "conform to: aiosmtpd, a real server, is the counterpart")

    def from_settings(self, settings: Settings) -> SmtpMail:
        if not settings.smtp_host:
            raise ConfigurationError("INBOXCRM_SMTP_HOST is required for the smtp provider")
        return SmtpMail(
            settings.smtp_host, settings.smtp_port, sender=settings.mail_from,
            security=settings.smtp_tls, username=settings.smtp_username,
            password=secret_value(settings.smtp_password),
            timeout=settings.smtp_timeout_seconds)

    def from_destination(self, spec: SmtpDestination, settings: Settings,
                         secrets: Secrets) -> SmtpMail:
        assert spec.smtp_host is not None  # the destination requires it
        return SmtpMail(spec.smtp_host, spec.smtp_port, sender=settings.mail_from,
                        security=spec.smtp_tls, username=spec.smtp_username,
                        password=secrets.optional(spec.smtp_password, "smtp_password"),
                        timeout=settings.smtp_timeout_seconds, guard=secrets.guard)
