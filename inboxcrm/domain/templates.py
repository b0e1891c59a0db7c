"""Approved follow-up templates. A follow-up is only ever rendered from one of these; the
model never writes outgoing text."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    template_id: str
    subject: str
    text: str


TEMPLATES = {
    "ack-v1": Template(
        "ack-v1",
        "Thanks for your message",
        "Hello {greeting_name},\n\nthank you for getting in touch. We have received your "
        "message and a member of our team will reply shortly.\n\nBest regards\n",
    ),
}


def render(template_id: str, name: str | None) -> tuple[str, str]:
    template = TEMPLATES[template_id]
    greeting = (name or "").split(" ")[0] or "there"
    return template.subject, template.text.format(greeting_name=greeting)
