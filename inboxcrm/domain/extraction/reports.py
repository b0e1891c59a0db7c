"""Bounces and reports: what a mail administrator recognises before reading a message.

RFC 3464 delivery status notifications and RFC 5965 abuse reports (ARF) are parsed from
their machine-readable parts; everything else that looks like a bounce is handed to
`flufl.bounce`, the detector GNU Mailman runs on its bounce addresses. The result says
which kind of report this is and, for hard bounces and complaints, which addresses the
report is about (a suppression candidate once the caller has checked it was our mail).

Never raises on bad input. Addresses found here are personal data: they are kept in the
minimised record for the planner, never logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from email.message import Message
from email.utils import getaddresses
from typing import Literal

from flufl.bounce import all_failures
from pydantic import BaseModel, ConfigDict

from .limits import TooComplex, bounded_payload, parse_message
from .signals import DAEMON_LOCAL, fold, local_part

# flufl.bounce logs a detector's exception with its traceback; the detector's verdict is
# simply "no bounce" then, which this module handles: keep that out of the product's logs.
logging.getLogger("flufl.bounce").addHandler(logging.NullHandler())
logging.getLogger("flufl.bounce").propagate = False

ReportKind = Literal["dsn", "arf", "bounce", "delay"]
MAX_RECIPIENTS = 20
MAX_NOTIFICATION_CHARS = 20000

# Subjects only delivery systems write, in the languages of the MTAs seen in real mail.
BOUNCE_SUBJECT = re.compile(
    r"^(?:(?:re|fw|fwd)\s*:\s*)*(?:"
    r"undeliverable|undelivered mail|undeliverable mail|returned mail|mail delivery fail|"
    r"delivery (?:status notification|failure|has failed|failed|notification)|"
    r"failure notice|mail system error|non[- ]?delivery|delivery report|"
    r"nondeliverable|message not delivered|could not send message|"
    r"warning: could not send|mail could not be delivered|"
    r"non remis|non distribuable|unzustellbar|nicht zustellbar|"
    r"nao (?:foi possivel )?entregue|no se (?:pudo|puede) entregar|mensaje no entregado|"
    r"impossibile recapitare|niet bezorgd|onbestelbaar"
    r")",
)
# The senders of delivery reports (besides MAILER-DAEMON / postmaster, see signals).
REPORT_SENDER = re.compile(
    r"^(?:mdaemon|mail-?daemon|bounces?(?:[+-].*)?|mailer|mail-?delivery(?:-?subsystem)?|"
    r"microsoftexchange[0-9a-f]*|abuse|fbl|feedback|complaints?|arf|postmaster[+-].*)$"
)
_SES_NOTIFICATION = re.compile(r'"notificationType"\s*:\s*"(Bounce|Complaint)"')
_SES_ADDRESS = re.compile(r'"emailAddress"\s*:\s*"([^"\s]{3,320})"')
_SES_PERMANENT = re.compile(r'"bounceType"\s*:\s*"Permanent"')


class Report(BaseModel):
    """A machine-generated report about mail that was sent earlier."""

    model_config = ConfigDict(frozen=True)

    kind: ReportKind
    # dsn/bounce: addresses that failed permanently; arf: the complaining recipient(s)
    recipients: list[str] = []
    feedback_type: str | None = None  # arf: abuse, fraud, ...
    # only the detector saw a bounce; nothing in the headers says so: a person decides
    suspected: bool = False

    @property
    def suppresses(self) -> Literal["bounced", "complaint"] | None:
        """The suppression reason this report asks for, if any."""
        if not self.recipients or self.suspected:
            return None
        if self.kind == "arf":
            return "complaint"
        if self.kind in ("dsn", "bounce"):
            return "bounced"
        return None


MAX_HEADER_VALUES = 20
MAX_VALUE_CHARS = 2000  # of one header value read here (getaddresses is slow per character)


def _values(msg: Message, name: str) -> list[str]:
    """The first MAX_HEADER_VALUES values of a header, each cut at MAX_VALUE_CHARS."""
    try:
        values = msg.get_all(name, []) or []
    except Exception:  # a header object whose parsing fails
        return []
    return [str(v)[:MAX_VALUE_CHARS] for v in values[:MAX_HEADER_VALUES]]


def _value(msg: Message, name: str, default: str = "") -> str:
    values = _values(msg, name)
    return values[0] if values else default


def _addresses(values: list[str]) -> list[str]:
    out: list[str] = []
    for value in values[:MAX_HEADER_VALUES]:
        value = value[:MAX_VALUE_CHARS]
        # "rfc822; someone@example.com" (RFC 3464 address-type prefix)
        text = value.split(";", 1)[1] if ";" in value else value
        for _, address in getaddresses([text.strip()]):
            address = address.strip().strip("<>").lower()
            if "@" in address and len(address) <= 320 and address not in out:
                out.append(address)
    return out[:MAX_RECIPIENTS]


def _blocks(part: Message) -> list[Message]:
    payload = part.get_payload()
    if isinstance(payload, list):
        return [p for p in payload if isinstance(p, Message)]
    return []


def _dsn(part: Message) -> Report:
    """RFC 3464: per-recipient blocks; `Action: failed` with a 5.x.x status is hard."""
    hard: list[str] = []
    delayed = False
    for block in _blocks(part)[1:]:
        action = _value(block, "Action").strip().lower()
        status = _value(block, "Status").strip()
        if action == "failed" and status.startswith("5"):
            recipient = _value(block, "Final-Recipient") or _value(block, "Original-Recipient")
            hard += [a for a in _addresses([str(recipient or "")]) if a not in hard]
        elif action in ("delayed", "failed", "relayed", "expanded", "delivered"):
            delayed = delayed or action == "delayed"
    if hard:
        return Report(kind="dsn", recipients=hard[:MAX_RECIPIENTS])
    return Report(kind="delay" if delayed else "dsn")


def _original_recipients(msg: Message) -> list[str]:
    for part in msg.walk():
        ctype = part.get_content_type()
        if ctype in ("message/rfc822", "message/global"):
            inner = _blocks(part)
            if inner:
                return _addresses(_values(inner[0], "To"))
        if ctype == "text/rfc822-headers":
            raw = bounded_payload(part, MAX_NOTIFICATION_CHARS)
            if raw:
                text = raw.decode("utf-8", errors="replace")
                found = re.search(r"(?im)^to:(.*(?:\n[ \t].*)*)", text)
                if found:
                    return _addresses([found.group(1)])
    return []


def _arf(part: Message, msg: Message) -> Report:
    """RFC 5965: the feedback report names the original recipient; else the reported
    message's To."""
    fields = _blocks(part)
    block = fields[0] if fields else part
    feedback_type = _value(block, "Feedback-Type").strip().lower()[:100] or None
    recipients = _addresses(_values(block, "Original-Rcpt-To"))
    if not recipients:
        recipients = _original_recipients(msg)
    return Report(kind="arf", recipients=recipients, feedback_type=feedback_type)


def _from_local(msg: Message) -> str:
    with contextlib.suppress(Exception):
        pairs = getaddresses(_values(msg, "From")[:1])
        if pairs:
            return local_part(pairs[0][1])
    return ""


def looks_like_bounce(msg: Message) -> bool:
    """Header evidence of a delivery report (sender, subject, null reverse path)."""
    local = _from_local(msg)
    if DAEMON_LOCAL.match(local) or REPORT_SENDER.match(local):
        return True
    with contextlib.suppress(Exception):
        if BOUNCE_SUBJECT.match(fold(_value(msg, "Subject"))):
            return True
        return bool(re.fullmatch(r"\s*<\s*>\s*", _value(msg, "Return-Path", "x")))
    return False


def _ses(msg: Message) -> Report | None:
    """An Amazon SES notification delivered by mail (SNS): JSON in the body."""
    for part in msg.walk():
        if part.get_content_maintype() != "text":
            continue
        raw = bounded_payload(part, MAX_NOTIFICATION_CHARS)
        if not raw:
            continue
        text = raw.decode("utf-8", errors="replace")
        found = _SES_NOTIFICATION.search(text)
        if not found:
            continue
        with contextlib.suppress(ValueError):
            text = json.dumps(json.loads(text))  # unescape an SNS-wrapped "Message" once
        if found.group(1) == "Complaint":
            return Report(kind="arf", recipients=_addresses(_SES_ADDRESS.findall(text)),
                          feedback_type="abuse")
        permanent = bool(_SES_PERMANENT.search(text.replace('\\"', '"')))
        recipients = _addresses(_SES_ADDRESS.findall(text.replace('\\"', '"')))
        return Report(kind="bounce", recipients=recipients if permanent else [])
    return None


# What the heuristic bounce detectors read of a message (see detect_report).
MAX_HEURISTIC_BYTES = 64 * 1024
MAX_HEURISTIC_LINES = 1500
# flufl.bounce's per-line patterns backtrack: `,\s*(?P<addr>\S+@[^,]+),` (its LLNL detector,
# run on every line of every message) is cubic in a line of commas and `@`s (1.3 KB: 1.4 s),
# `\S+@\S+` quadratic. A delivery report's lines are short and name one or two addresses.
MAX_HEURISTIC_LINE = 200
MAX_HEURISTIC_ATS = 3
_BLANK_RUN = re.compile(rb"\n(?:[ \t\r]*+\n){2,}")


def _readable_line(line: bytes) -> bytes:
    line = line[:MAX_HEURISTIC_LINE]
    return b"" if line.count(b"@") > MAX_HEURISTIC_ATS else line


def heuristic_view(raw: bytes) -> bytes:
    """The top of `raw` the heuristic detectors read: at most MAX_HEURISTIC_BYTES and
    MAX_HEURISTIC_LINES lines (runs of blank lines squeezed; one blank line still ends the
    header block), each line cut at MAX_HEURISTIC_LINE bytes and left empty if it holds
    more than MAX_HEURISTIC_ATS `@`s: what flufl.bounce reads in linear time."""
    head = raw[:MAX_HEURISTIC_BYTES]
    if head.count(b"\n") >= MAX_HEURISTIC_LINES:
        head = _BLANK_RUN.sub(b"\n\n", head)
    lines = head.split(b"\n", MAX_HEURISTIC_LINES)[:MAX_HEURISTIC_LINES]
    if all(len(line) <= MAX_HEURISTIC_LINE and line.count(b"@") <= MAX_HEURISTIC_ATS
           for line in lines):
        return b"\n".join(lines)
    return b"\n".join(_readable_line(line) for line in lines)


def detect_report(msg: Message, raw: bytes = b"") -> Report | None:
    """The report this message is, or None for ordinary mail. Never raises.

    flufl.bounce's heuristic detectors run some 30 patterns over every line of every part:
    on a 6 MB message, or 100,000 blank lines, that is seconds. A bounce says what failed at
    the top (the returned original comes after), so they read only `heuristic_view(raw)`."""
    try:
        for part in msg.walk():
            ctype = part.get_content_type()
            if ctype in ("message/delivery-status", "message/global-delivery-status"):
                return _dsn(part)
            if ctype == "message/feedback-report":
                return _arf(part, msg)
        ses = _ses(msg)
        if ses is not None:
            return ses
        headers_say_bounce = looks_like_bounce(msg)
        view = heuristic_view(raw)
        scanned = msg if len(view) == len(raw) else parse_message(view)
        temporary, permanent = all_failures(scanned)
        recipients = _addresses([a.decode("utf-8", "replace") for a in sorted(permanent)])
        if headers_say_bounce:
            return Report(kind="bounce", recipients=recipients)
        if recipients or temporary:
            return Report(kind="bounce", recipients=recipients, suspected=True)
        return None
    except TooComplex:  # a prefix of a message within the limits: not expected
        return None
    except Exception:  # a detector on adversarial input: no report, the router decides
        return None
