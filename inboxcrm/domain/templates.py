"""A tenant's own words: follow-up templates per tenant and language (docs/architecture.md §5,
`policies/README.md`). A follow-up is only ever rendered from one of these; the model never
writes outgoing text.

Layout, in the tenant's policy folder:

    policies/<tenant>/templates/<name>.<lang>.subject   one line (required)
    policies/<tenant>/templates/<name>.<lang>.txt       the plain-text body (required)
    policies/<tenant>/templates/<name>.<lang>.html      an HTML body (optional)
    policies/<tenant>/templates/<name>.draft.json       what a reviewer may edit (optional)

`<name>.draft.json` declares the limits of an edited draft of this template's follow-ups
(`{"max_chars": 1200, "keep": ["signature"]}`, docs/architecture.md §6, "Edited drafts"):
the template's author says how much of their words a reviewer may change. The policy
loader validates it (`inboxcrm.domain.policy.DraftLimits`); a rule's own `draft` can only
narrow it. Without the file, the template's follow-ups are editable only where the rule
declares `draft`.

Rendered by jinja2's `SandboxedEnvironment` with `StrictUndefined`: a template may use only
the documented fields (`FIELDS`); anything else, a syntax error, or a body that does not
show the opt-out link *and* the sender's postal address refuses to load, with a message
naming the file and what is wrong. The check renders each body with marker values (with and
without a first name), so a link hidden behind a condition does not pass.

Bounded by construction (the check runs at policy load, on the relay's and the workers'
event loops): a template is text, fields, `{% if %}` and expressions over them. Loops,
calls (`range`, methods), macros, assignments, includes and any filter outside
`SAFE_FILTERS` refuse to load before anything renders, so rendering is linear in the
template's size. What an expression can still grow is capped while it renders: `*`, `**`,
`+` and `~` refuse a result over `MAX_VALUE_CHARS` (a number over `MAX_NUMBER_BITS`), the
output over `MAX_RENDERED_CHARS`, and a render running past `RENDER_SECONDS`.

A template's `version` is a hash of every file of it (all languages): a changed word is a
new version, the follow-up rule's version stored with the intent derives from it
(`rule_version`), and the intent keeps the reference `<name>@<version>`. The sources of
that version are stored with the plan (`inboxcrm.store.templates`), so a send, its retries
and a reviewer's preview render the very words that were planned.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import json
import operator
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import StrictUndefined, TemplateError, meta, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment

# The fields a template may use. Nothing else reaches the renderer.
FIELDS: dict[str, str] = {
    "first_name": "the contact's first name, \"\" when unknown "
                  "(write {{ first_name or \"there\" }})",
    "company": "the contact's company, \"\" when unknown",
    "signature": "the tenant's signature (policy sender.signature)",
    "sender_name": "the display name of the tenant's From address",
    "opt_out_url": "the one-click opt-out link (required in every body)",
    "postal_address": "the sender's postal address (policy sender.postal_address; required "
                      "in every body)",
}
REQUIRED: dict[str, str] = {
    "opt_out_url": "the opt-out link ({{ opt_out_url }})",
    "postal_address": "the sender's postal address ({{ postal_address }})",
}
PARTS = ("subject", "txt", "html")
_FILE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_-]{0,63})\.(?P<lang>[a-z]{2,3}(?:-[a-z0-9]{1,8})?)"
                   r"\.(?P<part>subject|txt|html)$")
_DRAFT_FILE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_-]{0,63})\.draft\.json$")
MAX_DRAFT_FILE_BYTES = 4 * 1024
_LANG = re.compile(r"^[a-z]{2,3}(?:-[a-z0-9]{1,8})?$")
MAX_TEMPLATE_BYTES = 64 * 1024
MAX_SUBJECT_CHARS = 200
# Render limits (see the module's docstring): one value, one number, one rendered part, and
# the wall-clock time of one render.
MAX_VALUE_CHARS = 16 * 1024
MAX_NUMBER_BITS = 256
MAX_RENDERED_CHARS = 256 * 1024
RENDER_SECONDS = 1.0
# Filters that never grow their input by more than a constant (none pads, repeats or joins).
SAFE_FILTERS = frozenset({"capitalize", "count", "d", "default", "e", "escape", "first",
                          "last", "length", "lower", "string", "striptags", "title", "trim",
                          "truncate", "upper", "wordcount"})
# What a template may not contain, and how the refusal says it.
_UNBOUNDED: tuple[tuple[type[nodes.Node], str], ...] = (
    (nodes.For, "a {% for %} loop"),
    (nodes.Call, "a call (a function such as range(), or a method)"),
    (nodes.Macro, "a {% macro %}"),
    (nodes.CallBlock, "a {% call %} block"),
    (nodes.FilterBlock, "a {% filter %} block"),
    (nodes.Assign, "a {% set %}"),
    (nodes.AssignBlock, "a {% set %} block"),
    (nodes.With, "a {% with %} block"),
    (nodes.Block, "a {% block %}"),
    (nodes.Extends, "an {% extends %}"),
    (nodes.Include, "an {% include %}"),
    (nodes.Import, "an {% import %}"),
    (nodes.FromImport, "an {% import %}"),
    (nodes.ExprStmt, "a {% do %}"),
)
_MARK = {"opt_out_url": "https://unsubscribe.invalid/OPT-OUT-MARK",
         "postal_address": "POSTAL-ADDRESS-MARK"}


class TemplateRefused(ValueError):
    """A template file that must not be used. The message names the file and the problem."""


@dataclass(frozen=True)
class LanguageSource:
    """One language of a template: its three parts as written."""

    subject: str
    text: str
    html: str | None = None


@dataclass(frozen=True)
class Rendered:
    subject: str
    text: str
    html: str | None


@dataclass(frozen=True)
class Template:
    """A validated template: every language it has, and the version of all of them."""

    name: str
    languages: Mapping[str, LanguageSource]
    version: str
    # The draft limits `<name>.draft.json` declares, as written (validated by the policy).
    draft: Mapping[str, Any] | None = None

    @property
    def ref(self) -> str:
        """What the intent stores: the name and the version of the words."""
        return f"{self.name}@{self.version}"

    def sources(self) -> dict[str, Any]:
        """The template as stored with a plan (`from_sources` reads it back)."""
        stored: dict[str, Any] = {
            "name": self.name,
            "languages": {lang: {"subject": s.subject, "text": s.text, "html": s.html}
                          for lang, s in sorted(self.languages.items())}}
        if self.draft is not None:
            stored["draft"] = dict(self.draft)
        return stored

    def language_for(self, wanted: Iterable[str], default: str) -> str:
        """The first wanted language the template has (`de-AT` also matches `de`), else the
        tenant's default, else the template's first language."""
        for raw in wanted:
            lang = raw.strip().lower()
            for candidate in (lang, lang.split("-", 1)[0]):
                if candidate in self.languages:
                    return candidate
        if default in self.languages:
            return default
        return sorted(self.languages)[0]


@dataclass(frozen=True)
class Fields:
    """The values of `FIELDS` for one follow-up."""

    first_name: str
    company: str
    signature: str
    sender_name: str
    opt_out_url: str
    postal_address: str

    def as_context(self) -> dict[str, str]:
        return {"first_name": self.first_name, "company": self.company,
                "signature": self.signature, "sender_name": self.sender_name,
                "opt_out_url": self.opt_out_url, "postal_address": self.postal_address}


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with every `~` concatenation passed through the
    environment's size check (jinja has no hook for it, unlike the binary operators)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat(")
        super().visit_Concat(node, frame)
        self.write(")")


def _too_large(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value.bit_length() > MAX_NUMBER_BITS
    return isinstance(value, str | list | tuple) and len(value) > MAX_VALUE_CHARS


class BoundedEnvironment(SandboxedEnvironment):
    """The sandbox with size limits on what an expression makes: `*`, `**` and `+` are
    checked before they run (a string times a number, a power), their results and every
    `~` after."""

    intercepted_binops = frozenset({"*", "**", "+"})
    code_generator_class = _BoundedCodeGenerator

    def call_binop(self, context: Context, op: str, left: Any, right: Any) -> Any:
        if op == "**" and isinstance(left, int) and isinstance(right, int) and (
                right > 0 and left.bit_length() * right > MAX_NUMBER_BITS):
            raise SecurityError(f"the power is over the render limit of {MAX_NUMBER_BITS} "
                                "bits")
        if op == "*":
            for seq, times in ((left, right), (right, left)):
                if (isinstance(seq, str | list | tuple) and isinstance(times, int)
                        and len(seq) * times > MAX_VALUE_CHARS):
                    raise SecurityError("a repeated string is over the render limit of "
                                        f"{MAX_VALUE_CHARS} characters")
            if (isinstance(left, int) and isinstance(right, int)
                    and left.bit_length() + right.bit_length() > MAX_NUMBER_BITS + 1):
                raise SecurityError(f"a product is over the render limit of "
                                    f"{MAX_NUMBER_BITS} bits")
        result = _OPERATORS[op](left, right)
        if _too_large(result):
            raise SecurityError(f"a value is over the render limit of {MAX_VALUE_CHARS} "
                                "characters")
        return result

    def bounded_concat(self, value: Any) -> Any:
        if _too_large(value):
            raise SecurityError(f"a joined value is over the render limit of "
                                f"{MAX_VALUE_CHARS} characters")
        return value


_OPERATORS = {"*": operator.mul, "**": operator.pow, "+": operator.add}


def _environment(html: bool) -> BoundedEnvironment:
    return BoundedEnvironment(undefined=StrictUndefined, autoescape=html,
                              keep_trailing_newline=True)


def bounded_render(compiled: Any, context: Mapping[str, str]) -> str:
    """One render within the limits: the output streamed and cut off past
    MAX_RENDERED_CHARS, and past RENDER_SECONDS (a template that passed the load check is
    linear in its size; this is the second wall)."""
    deadline = time.monotonic() + RENDER_SECONDS
    parts: list[str] = []
    size = 0
    chunks: Iterator[str] = compiled.generate(context)
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_RENDERED_CHARS:
            raise SecurityError(f"the output is over the render limit of "
                                f"{MAX_RENDERED_CHARS} characters")
        if time.monotonic() > deadline:
            raise SecurityError(f"rendering took over the limit of {RENDER_SECONDS:g} s")
        parts.append(chunk)
    return "".join(parts)


def _refuse_unbounded(parsed: nodes.Template, where: str) -> None:
    """Refuse, before anything renders, what could make a render's work grow beyond the
    template's own size: loops, calls, macros, assignments, includes, unlisted filters."""
    for kind, what in _UNBOUNDED:
        for found in parsed.find_all(kind):
            raise TemplateRefused(
                f"template {where}: {what} at line {found.lineno} is not allowed: a "
                "template is text, the documented fields, {% if %} and simple expressions "
                "(policies/README.md, \"Templates\")")
    for used in parsed.find_all(nodes.Filter):
        if used.name not in SAFE_FILTERS:
            raise TemplateRefused(
                f"template {where}: the filter {used.name!r} at line {used.lineno} is not "
                f"allowed (allowed: {', '.join(sorted(SAFE_FILTERS))})")


_TEXT_ENV = _environment(False)
_HTML_ENV = _environment(True)


def version_of(name: str, languages: Mapping[str, LanguageSource],
               draft: Mapping[str, Any] | None = None) -> str:
    """The hash of every file of the template. The draft limits count only when declared, so
    a template without them keeps the version it had before they existed."""
    words: dict[str, Any] = {"name": name, "languages": {
        lang: [s.subject, s.text, s.html] for lang, s in sorted(languages.items())}}
    if draft is not None:
        words["draft"] = dict(draft)
    canonical = json.dumps(words, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def rule_version(rule_id: str, version: int, template: Template) -> int:
    """The follow-up rule's version as the intent key stores it (`(event_id, rule_id,
    rule_version)`): derived from the rule's own number and its template's words, so a
    changed template is a new rule version. A positive 31-bit integer (the column's type)."""
    return derived_rule_version(rule_id, version, template.version)


def derived_rule_version(rule_id: str, version: int, template_version: str) -> int:
    """`rule_version` from the template's version string (what an intent's `<name>@<version>`
    reference keeps), so a stored version can be traced back to the rule's number."""
    digest = hashlib.sha256(f"{rule_id}:{version}:{template_version}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF or 1


def planned_rule_number(rule_id: str, stored: int, template_ref: str, *, below: int
                        ) -> int | None:
    """The rule's own `version` (1 to `below - 1`) an intent's stored `rule_version` was
    derived from with the words `template_ref` names, or None (planned under `below` or a
    later number). The stored version is a hash, not ordered: this is how "planned under an
    older version than V" is answered (`inboxcrm report rule-change`)."""
    template_version = template_ref.rpartition("@")[2]
    for number in range(1, below):
        if derived_rule_version(rule_id, number, template_version) == stored:
            return number
    return None


def _check(source: str, where: str, *, html: bool, part: str) -> None:
    """Refuse a part that does not compile, uses an undocumented field, or (a body) does not
    show the opt-out link and the postal address."""
    env = _HTML_ENV if html else _TEXT_ENV
    try:
        parsed = env.parse(source)
    except TemplateError as exc:
        line = getattr(exc, "lineno", None)
        raise TemplateRefused(f"template {where}: does not compile"
                              f"{f' (line {line})' if line else ''}: {exc.message}") from None
    _refuse_unbounded(parsed, where)
    unknown = sorted(meta.find_undeclared_variables(parsed) - set(FIELDS))
    if unknown:
        raise TemplateRefused(f"template {where}: uses {', '.join(unknown)}, which is not a "
                              f"documented field (allowed: {', '.join(FIELDS)})")
    compiled = env.from_string(parsed)
    for first_name in ("Ada", ""):
        context = {"first_name": first_name, "company": "", "signature": "",
                   "sender_name": "Sender", **_MARK}
        try:
            out = bounded_render(compiled, context)
        except TemplateError as exc:
            raise TemplateRefused(f"template {where}: cannot render: {exc.message}") from None
        if part == "subject":
            if "\n" in out.strip() or not out.strip():
                raise TemplateRefused(f"template {where}: the subject must be one non-empty "
                                      "line")
            continue
        missing = [what for key, what in REQUIRED.items() if _MARK[key] not in out]
        if missing:
            raise TemplateRefused(
                f"template {where}: missing {' and '.join(missing)}"
                + ("" if first_name else " when the first name is unknown")
                + "; a commercial follow-up must carry both")


def build(name: str, languages: Mapping[str, LanguageSource], where: str,
          draft: Mapping[str, Any] | None = None) -> Template:
    """A validated template from its sources (`where` names it in messages)."""
    if not languages:
        raise TemplateRefused(f"template {where}: no language")
    for lang, source in languages.items():
        if not _LANG.match(lang):
            raise TemplateRefused(f"template {where}: {lang!r} is not a language tag")
        _check(source.subject, f"{where}/{name}.{lang}.subject", html=False, part="subject")
        _check(source.text, f"{where}/{name}.{lang}.txt", html=False, part="body")
        if source.html is not None:
            _check(source.html, f"{where}/{name}.{lang}.html", html=True, part="body")
    return Template(name, dict(languages), version_of(name, languages, draft),
                    None if draft is None else dict(draft))


def _read_draft_file(path: Path) -> dict[str, Any]:
    """`<name>.draft.json` as a JSON object (its fields are the policy loader's to check)."""
    if path.stat().st_size > MAX_DRAFT_FILE_BYTES:
        raise TemplateRefused(f"template {path}: larger than {MAX_DRAFT_FILE_BYTES} bytes")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TemplateRefused(f"template {path}: not a readable JSON file: {exc}") from None
    if not isinstance(value, dict):
        raise TemplateRefused(f"template {path}: must be a JSON object, e.g. "
                              '{"max_chars": 1200, "keep": ["signature"]}')
    return value


def load_templates(directory: Path) -> dict[str, Template]:
    """Every template in a tenant's `templates/` folder, validated ({} when there is none).
    Raises TemplateRefused naming the file."""
    if not directory.is_dir():
        return {}
    found: dict[str, dict[str, dict[str, str]]] = {}
    drafts: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        draft_file = _DRAFT_FILE.match(path.name)
        if draft_file is not None:
            drafts[draft_file["name"]] = _read_draft_file(path)
            continue
        match = _FILE.match(path.name)
        if match is None:
            raise TemplateRefused(f"template {path}: the name must be <name>.<lang>.subject|txt"
                                  "|html or <name>.draft.json (lower case), e.g. ack.en.txt")
        if path.stat().st_size > MAX_TEMPLATE_BYTES:
            raise TemplateRefused(f"template {path}: larger than {MAX_TEMPLATE_BYTES} bytes")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateRefused(f"template {path}: cannot read: {exc}") from None
        parts = found.setdefault(match["name"], {}).setdefault(match["lang"], {})
        parts[match["part"]] = text
    orphans = sorted(drafts.keys() - found.keys())
    if orphans:
        name = orphans[0]
        raise TemplateRefused(f"template {directory}/{name}.draft.json: there is no template "
                              f"{name!r} (no {name}.<lang>.subject and .txt beside it)")
    templates: dict[str, Template] = {}
    for name, by_lang in found.items():
        languages: dict[str, LanguageSource] = {}
        for lang, parts in by_lang.items():
            for required in ("subject", "txt"):
                if required not in parts:
                    raise TemplateRefused(
                        f"template {directory}/{name}.{lang}.{required}: missing (each "
                        "language needs a .subject and a .txt)")
            subject = parts["subject"].strip()
            if len(subject) > MAX_SUBJECT_CHARS:
                raise TemplateRefused(f"template {directory}/{name}.{lang}.subject: longer "
                                      f"than {MAX_SUBJECT_CHARS} characters")
            languages[lang] = LanguageSource(subject, parts["txt"], parts.get("html"))
        templates[name] = build(name, languages, str(directory), drafts.get(name))
    return templates


def from_sources(sources: Mapping[str, Any]) -> Template:
    """A stored template (`Template.sources`), checked again as it is read."""
    try:
        name = str(sources["name"])
        languages = {str(lang): LanguageSource(str(p["subject"]), str(p["text"]),
                                               None if p.get("html") is None else str(p["html"]))
                     for lang, p in dict(sources["languages"]).items()}
        draft = sources.get("draft")
        if draft is not None and not isinstance(draft, Mapping):
            raise TypeError("draft")
    except (KeyError, TypeError, ValueError, AttributeError):
        raise TemplateRefused("stored template: malformed") from None
    return build(name, languages, f"stored:{name}", draft)


@lru_cache(maxsize=512)
def _compiled(source: str, html: bool) -> Any:
    """A template source compiled once (jinja2 compiles `from_string` on every call; a
    compiled template renders safely from any coroutine)."""
    return (_HTML_ENV if html else _TEXT_ENV).from_string(source)


def render(template: Template, lang: str, fields: Fields) -> Rendered:
    """Subject, text and HTML of one follow-up in `lang` (one of the template's)."""
    source = template.languages[lang]
    context = fields.as_context()
    subject = bounded_render(_compiled(source.subject, False), context)
    text = bounded_render(_compiled(source.text, False), context)
    html = (bounded_render(_compiled(source.html, True), context)
            if source.html is not None else None)
    return Rendered(" ".join(subject.split()), text, html)


def first_name(name: str | None) -> str:
    """The first word of the contact's name, as the greeting uses it ("" when unknown)."""
    return (name or "").strip().split(" ")[0] if name and name.strip() else ""


def message_languages(head: bytes | str | None) -> list[str]:
    """The languages the inbound message names, read from its head (`languages_named`).
    [] when it names none (or was purged)."""
    if not head:
        return []
    parser = email.parser.BytesHeaderParser(policy=email.policy.compat32)
    raw = head.encode("utf-8", "replace") if isinstance(head, str) else head
    try:
        headers = parser.parsebytes(raw)
    except (ValueError, TypeError):
        return []
    return languages_named(headers.get("Content-Language"), headers.get("Accept-Language"))


def languages_named(content_language: object, accept_language: object) -> list[str]:
    """The languages a message names: `Content-Language`, then `Accept-Language` (quality
    order), as lower-case tags; [] when it names none. Extraction stores them (in its work
    pool, under the work budget), so the send never parses the message again."""
    wanted: list[str] = []
    for tag in str(content_language or "").split(","):
        tag = tag.strip().lower()
        if _LANG.match(tag):
            wanted.append(tag)
    ranked: list[tuple[float, int, str]] = []
    for index, item in enumerate(str(accept_language or "").split(",")[:20]):
        tag, _, params = item.strip().lower().partition(";")
        quality = 1.0
        if params.strip().startswith("q="):
            try:
                quality = float(params.strip()[2:])
            except ValueError:
                quality = 0.0
        if _LANG.match(tag) and quality > 0:
            ranked.append((-quality, index, tag))
    wanted += [tag for _, _, tag in sorted(ranked)]
    return wanted


def reply_languages(stored: list[str] | None, head: bytes | None) -> list[str]:
    """The languages to answer in: as extraction stored them, else (for an item extracted
    before migration 041) as read from the head of its message."""
    return list(stored) if stored is not None else message_languages(head)
