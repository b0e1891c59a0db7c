"""The deterministic, offline extractor (the default when no model is configured).

Sender from the headers (From, or Reply-To of a web-form notification); name from the
display name, a form field or the signature; company from a form field, the signature or
the sender's domain; intent from keywords; opt-out from multilingual phrases. Every value
comes with a verbatim quote from the minimised message as evidence.
"""

from __future__ import annotations

import re

from inboxcrm.schemas.extraction import (
    EVIDENCE_MAX_CHARS,
    VALUE_MAX_CHARS,
    ExtractedField,
    Extraction,
)

from . import signals
from .minimise import MinimisedMessage
from .route import header_identity
from .signals import words

RULES_VERSION = "rules-2026.11.1"

_NAME_WORD = r"[^\W\d_][^\W\d_'\u2019.-]*(?:[-'\u2019][^\W\d_]+)*\.?"
_PERSON_NAME = re.compile(rf"^{_NAME_WORD}(?: {_NAME_WORD}){{0,3}}$")
_NOT_A_NAME = re.compile(
    r"\b(?:team|sales|support|info|customer|service|services|no-?reply|newsletter|"
    r"notifications?|website|form|forms|admin|office|marketing|department|mailer|daemon|"
    r"system|the|via|inc|ltd|gmbh|llc|hello|contact|reply|wordpress|typeform|hubspot)\b",
    re.IGNORECASE,
)
_CLOSING = re.compile(
    r"^(?:best(?: regards| wishes)?|kind regards|warm regards|regards|many thanks|thanks|"
    r"thank you|thx|cheers|sincerely|yours(?: sincerely| truly)?|all the best|"
    r"mit freundlichen gru(?:ss|s)en|freundliche gru(?:ss|s)e|viele gru(?:ss|s)e|"
    r"beste gru(?:ss|s)e|liebe gru(?:ss|s)e|gru(?:ss|s)|lg|mfg|vg|cordialement|"
    r"bien (?:cordialement|a vous)|salutations|merci|bonne journee|saludos(?: cordiales)?|"
    r"un saludo|atentamente|gracias|atenciosamente|cumprimentos|abracos|obrigad[oa]|"
    r"cordiali saluti|distinti saluti|saluti|grazie|met vriendelijke groet(?:en)?|"
    r"vriendelijke groet(?:en)?|groeten|groet|mvg|dank je(?: wel)?|bedankt)[\s,.!-]*$"
)
_SIG_DELIMITER = re.compile(r"^-- ?$")
_COMPANY_SUFFIX = re.compile(
    r"\b(?:gmbh|ag|kg|ug|inc\.?|incorporated|ltd\.?|limited|llc|llp|plc|corp\.?|corporation|"
    r"co\.|s\.?a\.?|s\.?a\.?s\.?|sarl|s\.?l\.?|s\.?r\.?l\.?|s\.?p\.?a\.?|b\.?v\.?|n\.?v\.?|"
    r"lda\.?|ltda\.?|oy|ab|as|aps|pty)(?=$|[\s,.)])",
    re.IGNORECASE,
)
# One form line each: `[^\S\n]` (a space that is not a line break) keeps every attempt on
# its own line; `^\s*` let each line start scan across every blank line below it
# (quadratic in a run of blank lines).
_FORM_NAME = re.compile(
    r"^[^\S\n]*(?:full ?name|your name|name|nom|nom complet|nombre|nome|naam|"
    r"vor- und nachname)[^\S\n]*[:=][^\S\n]*(.{2,80}?)[^\S\n]*$",
    re.IGNORECASE | re.MULTILINE,
)
_FORM_COMPANY = re.compile(
    r"^[^\S\n]*(?:company(?: name)?|organi[sz]ation|firma|unternehmen|soci[eé]t[eé]|"
    r"entreprise|empresa|azienda|societ[aà]|bedrijf)[^\S\n]*[:=][^\S\n]*(.{2,80}?)"
    r"[^\S\n]*$",
    re.IGNORECASE | re.MULTILINE,
)
_AT_COMPANY = re.compile(
    r"\b(?:at|@|bei|chez|en|na|presso|bij)\s+([A-Z\u00c0-\u024f][\w&.\- ]{1,40}?)\s*$"
)
_TWO_LEVEL_SUFFIXES = words(
    "co.uk org.uk ac.uk gov.uk com.au net.au com.br net.br com.mx com.ar co.jp co.nz co.za "
    "com.tr com.cn com.es com.pt co.in com.sg com.hk co.kr com.co"
)


def _field(value: str | None, confidence: float, evidence: str | None) -> ExtractedField:
    if not value:
        return ExtractedField.empty()
    return ExtractedField(
        value=value[:VALUE_MAX_CHARS],
        confidence=confidence,
        evidence=(evidence or value)[:EVIDENCE_MAX_CHARS],
    )


def _clean_display_name(name: str) -> str:
    name = re.sub(r"\s+via\s+.*$", "", name.strip(), flags=re.IGNORECASE)
    name = name.strip().strip("\"'").strip()
    if "," in name:
        last, _, first = name.partition(",")
        if first.strip() and _PERSON_NAME.match(first.strip()) and _PERSON_NAME.match(last.strip()):
            return name  # "Doe, Jane": keep as written, it is the evidence
    return name


def plausible_person_name(name: str) -> bool:
    if not name or len(name) > 60 or "@" in name or any(ch.isdigit() for ch in name):
        return False
    if signals.looks_like_instruction(name) or _NOT_A_NAME.search(name):
        return False
    candidate = name.replace(",", " ")
    candidate = re.sub(r"\s+", " ", candidate).strip()
    return bool(_PERSON_NAME.match(candidate))


def _signature_lines(own_text: str) -> list[str]:
    lines = [line.strip() for line in own_text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines[-20:]


def _signature_name_and_company(own_text: str) -> tuple[str | None, str | None, str | None]:
    """(name, company, company line) from a closing formula or `-- ` signature."""
    lines = _signature_lines(own_text)
    start = None
    for i, line in enumerate(lines):
        if _SIG_DELIMITER.match(line) or _CLOSING.match(signals.fold(line)):
            start = i + 1
    if start is None:
        return None, None, None
    rest = [line for line in lines[start : start + 6] if line]
    name = None
    company = company_line = None
    for j, line in enumerate(rest):
        if name is None:
            # split on the separator, then strip: `\s*[|,]\s*` scanned every run of spaces
            # from each of its positions (quadratic in a line of spaces)
            candidate = re.split(r"[|,\u2022\u00b7]", line)[0].strip()
            if plausible_person_name(candidate):
                name = candidate
                continue
            if j == 0:
                break
        else:
            for piece in re.split(r"[|\u2022\u00b7]", line):
                piece = piece.strip()
                if "@" in piece or len(piece) > 80:
                    continue
                subpieces = [p.strip() for p in piece.split(", ")]
                for k, sub in enumerate(subpieces):
                    if not _COMPANY_SUFFIX.search(sub):
                        continue
                    if _COMPANY_SUFFIX.fullmatch(sub) and k > 0:
                        sub = f"{subpieces[k - 1]}, {sub}"
                    return name, sub, sub
                match = _AT_COMPANY.search(piece)
                if match and company is None:
                    company, company_line = match.group(1).strip(), piece
    return name, company, company_line


def _domain_company(domain: str) -> str | None:
    domain = domain.lower().strip(".")
    if domain in signals.FREEMAIL_DOMAINS:
        return None
    labels = domain.split(".")
    if len(labels) < 2:
        return None
    index = -3 if ".".join(labels[-2:]) in _TWO_LEVEL_SUFFIXES and len(labels) >= 3 else -2
    label = labels[index]
    if label.startswith("xn--"):
        try:
            label = label.encode("ascii").decode("idna")
        except (UnicodeError, ValueError):
            return None
    if len(label) < 2 or label in ("mail", "email", "www", "smtp", "mx"):
        return None
    return label[:1].upper() + label[1:]


def extract_rules(msg: MinimisedMessage) -> Extraction:
    """The rules extractor as a pure function."""
    identity = header_identity(msg)
    header_text = msg.header_text()

    # sender
    if identity.primary is not None:
        address = identity.primary.address
        several = len(msg.from_addrs) > 1 or msg.from_header_count > 1
        confidence = 0.6 if several else 0.95
        header_name = "Reply-To" if identity.source == "reply-to" else "From"
        header_value = msg.headers.get(header_name, "")
        evidence = address if address.lower() in header_value.lower() else header_value
        sender = _field(address, confidence, evidence)
    else:
        sender = ExtractedField.empty()

    # name
    name_field = ExtractedField.empty()
    if identity.primary is not None:
        display = _clean_display_name(identity.primary.name)
        domain_labels = signals.domain_part(identity.primary.address).split(".")
        if " " not in display and signals.fold(display) in domain_labels:
            display = ""  # "Globex <info@globex.example>" names a company, not a person
        if plausible_person_name(display):
            name_field = _field(display, 0.9, display)
    if name_field.value is None:
        match = _FORM_NAME.search(msg.own_text)
        if match and plausible_person_name(match.group(1).strip()):
            name_field = _field(match.group(1).strip(), 0.8, match.group(0).strip())
    sig_name, sig_company, sig_company_line = _signature_name_and_company(msg.own_text)
    if name_field.value is None and sig_name:
        confidence = 0.75 if " " in sig_name else 0.6
        name_field = _field(sig_name, confidence, sig_name)

    # company
    company_field = ExtractedField.empty()
    match = _FORM_COMPANY.search(msg.own_text)
    if match and "@" not in match.group(1) and not signals.looks_like_instruction(match.group(1)):
        company_field = _field(match.group(1).strip(), 0.8, match.group(0).strip())
    elif sig_company and not signals.looks_like_instruction(sig_company):
        company_field = _field(sig_company, 0.75, sig_company_line)
    elif identity.primary is not None and not identity.form_notification:
        domain = signals.domain_part(identity.primary.address)
        company = _domain_company(domain)
        if company and domain in header_text.lower():
            company_field = _field(company, 0.5, domain)

    # intent and opt-out
    subject_for_opt_out = "" if msg.forwarded else msg.subject
    opted_out = signals.opt_out_language(msg.own_text, subject_for_opt_out) is not None
    intent = signals.classify_intent(msg.body, msg.subject, opted_out)

    return Extraction(
        sender_email=sender,
        contact_name=name_field,
        company=company_field,
        intent=intent,
        possible_opt_out=opted_out,
        needs_human_review=False,
        sensitive_attribute=signals.sensitive_attribute(msg.own_text, subject_for_opt_out),
    )


class RulesExtractor:
    name = "rules"
    version = RULES_VERSION

    async def extract(self, message: MinimisedMessage) -> Extraction:
        return extract_rules(message)
