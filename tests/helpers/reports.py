"""Delivery reports as receiving MTAs write them: an RFC 3464 bounce and an RFC 5965 abuse
report about a follow-up the tenant's mailbox sent, for the fast and the stack tests."""

from __future__ import annotations


def _original(recipient: str, mailbox: str) -> str:
    return (f"From: Acme Sales <{mailbox}>\r\nTo: {recipient}\r\n"
            "Subject: Thanks for your message\r\nMessage-ID: <followup-1@acme.test>\r\n"
            "\r\nThanks for getting in touch.\r\n")


def dsn_bounce(recipient: str, *, mailbox: str = "sales@acme.test", status: str = "5.1.1",
               action: str = "failed") -> str:
    """A Postfix-style delivery status notification for `recipient`."""
    return (
        "From: MAILER-DAEMON@mx.example.net (Mail Delivery System)\r\n"
        f"To: {mailbox}\r\n"
        "Subject: Undelivered Mail Returned to Sender\r\n"
        "Auto-Submitted: auto-replied\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="B"\r\n'
        "\r\n--B\r\nContent-Type: text/plain\r\n\r\n"
        "This is the mail system. Your message could not be delivered.\r\n"
        "\r\n--B\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.example.net\r\n\r\n"
        f"Final-Recipient: rfc822; {recipient}\r\n"
        f"Action: {action}\r\nStatus: {status}\r\n"
        "Diagnostic-Code: smtp; 550 5.1.1 user unknown\r\n"
        "\r\n--B\r\nContent-Type: message/rfc822\r\n\r\n"
        f"{_original(recipient, mailbox)}"
        "\r\n--B--\r\n"
    )


def arf_complaint(recipient: str, *, mailbox: str = "sales@acme.test") -> str:
    """A feedback-loop abuse report: `recipient` marked our follow-up as spam."""
    return (
        "From: Feedback Loop <fbl@isp.example>\r\n"
        f"To: {mailbox}\r\n"
        "Subject: Abuse report\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=feedback-report; boundary="F"\r\n'
        "\r\n--F\r\nContent-Type: text/plain\r\n\r\nThis is an email abuse report.\r\n"
        "\r\n--F\r\nContent-Type: message/feedback-report\r\n\r\n"
        "Feedback-Type: abuse\r\nUser-Agent: fbl/1.0\r\nVersion: 1\r\n"
        f"Original-Rcpt-To: {recipient}\r\n"
        "\r\n--F\r\nContent-Type: message/rfc822\r\n\r\n"
        f"{_original(recipient, mailbox)}"
        "\r\n--F--\r\n"
    )
