"""Deterministic text signals shared by the rules extractor and the router: opt-out phrases
(en, de, fr, es, pt, it, nl), intent keywords, legal threats, instruction-like text
(prompt injection), addresses in text, role / no-reply mailboxes, free-mail domains.

All matching happens on `fold(text)`: Unicode compatibility-decomposed, accents and
zero-width / bidi characters removed, case-folded, whitespace collapsed. Patterns are
therefore written without accents, in lower case, with `ss` for `ß`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import cast

from inboxcrm.schemas.extraction import Intent

from .limits import cap_combining_runs

_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"',
                         "\u00b4": "'", "`": "'", "\u2013": "-", "\u2014": "-"})


def fold(text: str) -> str:
    if not text.isascii():  # ASCII is its own NFKD form and has no marks to drop
        decomposed = unicodedata.normalize("NFKD", cap_combining_runs(text))
        text = "".join(
            ch for ch in decomposed if unicodedata.category(ch) not in ("Mn", "Cf", "Me")
        )
    return re.sub(r"\s+", " ", text.translate(_QUOTES).casefold()).strip()


def words(text: str) -> frozenset[str]:
    """A set from whitespace-separated words."""
    return frozenset(text.split())


def phrases(text: str) -> frozenset[str]:
    """A set from `|`-separated phrases (line breaks ignored)."""
    return frozenset(p.strip() for p in text.replace("\n", " ").split("|") if p.strip())


def _compile(patterns: Iterable[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns))


# --------------------------------------------------------------------------- opt-out

OPT_OUT_PATTERNS: dict[str, tuple[str, ...]] = {
    "en": (
        r"\bunsubscribe me\b",
        r"\bplease unsubscribe\b",
        r"\b(?:i want|i'd like|i would like|i wish|i need) to (?:unsubscribe|opt[- ]?out)\b",
        r"\bopt me out\b",
        r"\bremove (?:me|my (?:e-?mail|address|details|data|contact)[a-z ]{0,20}) from\b",
        r"\b(?:take|get) me off\b",
        r"\b(?:stop|quit|cease) (?:e-?mailing|mailing|contacting|messaging|spamming|emailing|"
        r"sending (?:me )?(?:e-?mails|emails|messages|mail))\b",
        r"\b(?:do not|don't|dont|never) (?:contact|e-?mail|email|write to|message|call) me\b",
        r"\bno (?:more|further) (?:e-?mails|emails|messages|contact|marketing)\b",
        r"\bi (?:do not|don't|dont) want to (?:receive|get|hear)\b",
        r"\bnot interested[,.;! -]{1,3}(?:please )?(?:stop|remove|unsubscribe)\b",
        r"\bdelete my (?:e-?mail|address|data|contact details)\b",
    ),
    "de": (
        r"\b(?:abmelden|abbestellen|austragen|abmeldung)\b",
        r"\b(?:melden|tragen|nehmen) sie mich\b.{0,40}\b(?:ab|aus)\b",
        r"\bkeine (?:weiteren |weitere )?(?:e-?mails|mails|nachrichten|werbung|newsletter)\b"
        r"(?: mehr)?",
        r"\bnicht mehr (?:kontaktieren|anschreiben|anrufen|schreiben|mailen|zuschicken)\b",
        r"\b(?:loschen|entfernen) sie (?:mich|meine (?:e-?mail|adresse|daten))\b",
        r"\bwiderspreche\b.{0,60}\b(?:werbung|nutzung|kontakt)",
    ),
    "fr": (
        r"\b(?:desabonner|desinscrire|desabonnez|desinscrivez|desabonnement|desinscription)\b",
        r"\bne (?:me )?(?:contactez|ecrivez|envoyez) plus\b",
        r"\bne plus (?:me )?(?:contacter|recevoir|ecrire|envoyer)\b",
        r"\b(?:retirez|supprimez|enlevez|rayez)[- ]moi\b",
        r"\bje ne (?:veux|souhaite|desire) plus (?:recevoir|etre contacte)",
        r"\barretez de m'(?:envoyer|ecrire|contacter)",
    ),
    "es": (
        r"\bdar(?:me)? de baja\b",
        r"\bden(?:me)? de baja\b",
        r"\bbaja de (?:la|su|vuestra|esta) lista\b",
        r"\bno (?:me )?(?:contacten|contactes|envien|escriban|manden) mas\b",
        r"\bno quiero recibir\b",
        r"\belimin(?:en|ar|adme|enme|e)[a-z]* de (?:su|la|vuestra|esta|sus) (?:lista|base)",
        r"\bcancelar (?:mi |la )?suscripcion\b",
        r"\bdejen de (?:enviarme|escribirme|contactarme|mandarme)\b",
    ),
    "pt": (
        r"\bdescadastr(?:ar|e|em|o)\b",
        r"\bcancelar (?:a |minha )?(?:inscricao|assinatura)\b",
        r"\bnao (?:quero|desejo) (?:mais )?receber\b",
        r"\bremov(?:a|am|er)[- ]me\b",
        r"\bme remov(?:a|am|er|am)\b",
        r"\bparem de (?:me )?(?:enviar|mandar|contactar|contatar)\b",
        r"\bnao me (?:contactem|contatem|enviem|mandem) mais\b",
    ),
    "it": (
        r"\b(?:disiscriv\w*|cancellami|cancellatemi|disabbon\w*)\b",
        r"\bnon (?:voglio|desidero) piu ricevere\b",
        r"\brimuov(?:etemi|imi|ermi)\b",
        r"\bnon (?:mi )?(?:contattate|scrivete|inviate|mandate) piu\b",
        r"\bnon contattatemi piu\b",
        r"\bannulla(?:re)? (?:l')?iscrizione\b",
    ),
    "nl": (
        r"\b(?:afmelden|uitschrijven)\b",
        r"\bmeld (?:mij|me) af\b",
        r"\bschrijf (?:mij|me) uit\b",
        r"\bgeen (?:e-?mails|mails|berichten|nieuwsbrieven) meer\b",
        r"\bverwijder (?:mij|me|mijn (?:e-?mail|adres|gegevens))\b",
        r"\bniet meer (?:contacteren|mailen|benaderen|e-?mailen)\b",
        r"\bstop met (?:mailen|e-?mailen|sturen)\b",
    ),
}
OPT_OUT_SUBJECTS = phrases(
    """unsubscribe|remove|remove me|stop|opt out|opt-out|optout|unsubscribe me|abmelden|
    abbestellen|austragen|abmeldung|desabonner|desinscription|desabonnement|desinscrire|baja|
    darme de baja|dar de baja|descadastrar|descadastro|cancellami|disiscrivimi|disiscrizione|
    afmelden|uitschrijven|cancelar suscripcion"""
)
_OPT_OUT = {lang: _compile(p) for lang, p in OPT_OUT_PATTERNS.items()}
SOFT_OPT_OUT = _compile((
    r"\bnot interested\b", r"\bno interest\b",
    r"\bno,? thanks?\b(?! (?:needed|necessary|required))",
    r"\bnein,? danke\b", r"\bnon merci\b", r"\bno,? gracias\b", r"\bnao,? obrigad[oa]\b",
    r"\bno,? grazie\b", r"\bnee,? dank(?:je|u)\b", r"\bkein(?:e|en)? interesse\b",
    r"\bpas interesse", r"\bno (?:estoy|estamos) interesad[oa]s?\b",
    r"\bnao (?:tenho|temos) interesse\b", r"\bnon (?:sono|siamo) interessat[oi]\b",
    r"\bgeen interesse\b",
))
_OPT_OUT_LINE = re.compile(
    r"^(?:please |bitte |por favor |s'il vous plait |per favore |alstublieft )?"
    r"(?:unsubscribe|remove me|stop|opt out|abmelden|desabonner|baja|descadastrar|cancellami|"
    r"afmelden|uitschrijven)[.!]*(?: please| bitte| por favor)?[.!]*$"
)
_REPLY_PREFIX = re.compile(r"^(?:(?:re|aw|sv|antw|r|rif|wg|fwd?|tr|rv)\s*:\s*)+")


# A special category of personal data (GDPR art. 9, 10) disclosed in the writer's own text:
# a deterministic set of phrases, so the same message always routes the same way. A person
# reviews before anything about it is written or answered (`sensitive_attribute`).
SENSITIVE = _compile((
    r"\bmy (?:diagnosis|medical condition|disability|illness|medication|pregnancy)\b",
    r"\bdiagnosed with\b", r"\b(?:hiv|aids|cancer|diabetes|depression)\b",
    r"\bmy (?:religion|faith|sexual orientation|ethnicity|criminal record|trade union)\b",
    r"\bunion member(?:ship)?\b", r"\bcriminal (?:record|conviction)\b",
    r"\bmeine (?:diagnose|krankheit|behinderung|religion)\b",
))


def sensitive_attribute(own_text: str, subject: str) -> bool:
    """Does the writer's own text (or the subject) disclose a special category of personal
    data? Quoted and forwarded text does not count: it is not the writer's."""
    return bool(SENSITIVE.search(fold(subject + "\n" + own_text[:20000])))


def soft_opt_out(own_text: str, subject: str) -> bool:
    """"Not interested" and the like: not a request to be suppressed, but a follow-up would
    be wrong - a person decides."""
    return bool(SOFT_OPT_OUT.search(fold(subject + "\n" + own_text[:20000])))


def opt_out_language(own_text: str, subject: str) -> str | None:
    """The language of an opt-out request in the writer's own text or subject, or None."""
    folded_subject = _REPLY_PREFIX.sub("", fold(subject)).strip(" .!")
    if folded_subject in OPT_OUT_SUBJECTS:
        return "subject"
    body = fold(own_text[:20000])
    for text in (folded_subject, body):
        for lang, pattern in _OPT_OUT.items():
            if pattern.search(text):
                return lang
    for line in own_text[:20000].split("\n")[:60]:
        if _OPT_OUT_LINE.match(fold(line)):
            return "line"
    return None


# --------------------------------------------------------------------------- injection

INJECTION_PATTERNS: tuple[str, ...] = (
    r"\b(?:ignore|disregard|forget|override|bypass|skip) (?:all |any |the |your |these |those |"
    r"every )*(?:previous|prior|above|earlier|preceding|system|original|existing|other|"
    r"safety)? ?(?:instructions?|prompts?|rules|directions|guidelines|guardrails|"
    r"constraints|policies|checks)\b",
    r"\b(?:ignore|disregard|forget) (?:all |any |the |everything |of )*(?:previous|prior|above|"
    r"earlier|preceding)\b",
    r"\bsystem prompt\b",
    r"\b(?:developer|system|admin|god|jailbreak) (?:mode|message|override|instructions?)\b",
    r"\byou are (?:now )?(?:an? |the )?(?:ai|assistant|language model|llm|chatgpt|gpt|model|"
    r"bot|crm|email processing)",
    r"\b(?:ai|llm|assistant|model|bot|classifier|extractor|parser|agent)s?,? (?:you )?"
    r"(?:must|should|shall|will|need to|have to|are instructed)\b",
    r"\bnew (?:instructions?|rules|task|directive)\b",
    r"\binstructions? (?:for|to) (?:the |any )?(?:ai|assistant|model|system|bot|crm|llm|"
    r"classifier|extractor|automation)\b",
    r"\b(?:set|change|update|mark|classify|route|flag|record|label|treat)\b.{0,40}"
    r"\b(?:sender_email|contact_name|needs_human_review|possible_opt_out|routing|route|"
    r"confidence|intent|priority)\b.{0,20}\b(?:to|as|=)\b",
    r"\b(?:needs_human_review|possible_opt_out|sender_email|contact_name|canonical_email)\b",
    r"\"(?:route|intent|reasons?|extraction)\" ?:",
    r"\b(?:do not|don't|dont|never) (?:flag|review|escalate|mark|check|verify|validate)\b",
    r"<\|?(?:im_start|im_end|system|endoftext|assistant|user)\|?>",
    r"\[/?(?:inst|system|sys)\]",
    r"#{2,} ?(?:instruction|system|prompt)",
    r"\b(?:auto[- ]?approve|pre[- ]?approved?|approve this (?:contact|lead|message|email|"
    r"sender))\b",
    r"\b(?:bypass|skip|disable) (?:the )?(?:review|filter|check|validation|verification|"
    r"approval)\b",
    r"\b(?:override|overwrite|replace) (?:the )?(?:sender|contact|crm|record|email address|"
    r"rules|policy|identity)\b",
    r"\btreat (?:this|the) (?:email|message|sender) as\b",
    r"\b(?:as an? )?(?:large )?language model\b",
    r"\bprompt injection\b",
    r"\bignoriere (?:alle )?(?:vorherigen|bisherigen|obigen|vorigen) (?:anweisungen|befehle)",
    r"\bignore[zr]? (?:toutes )?les instructions (?:precedentes|ci-dessus|anterieures)",
    r"\bignora (?:todas )?las instrucciones (?:anteriores|previas)",
    r"\bignor[ea] (?:todas )?as instrucoes (?:anteriores|previas)",
    r"\bignora (?:tutte )?le istruzioni (?:precedenti|sopra)",
    r"\bnegeer (?:alle )?(?:vorige|eerdere|voorgaande) (?:instructies|opdrachten)",
)
_INJECTION = _compile(INJECTION_PATTERNS)
# `[^\S\n]*`, not `\s*`: from each line start, `^\s*` scanned every blank line below it.
_ROLE_LINE = re.compile(r"(?m)^[^\S\n]*(?:system|assistant|developer)[^\S\n]*:\s*\S")
_COMPACT_INJECTION = re.compile(
    r"(?:ignore|disregard|forget)(?:all|any|the|your|every|of)*(?:previous|prior|above|earlier|"
    r"preceding|system)|systemprompt|newinstructions|developermode|youarenowan?(?:ai|assistant)"
)
# Latin look-alikes from Cyrillic and Greek ("Іgnore" with a Cyrillic I).
_CONFUSABLES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i",
    "ј": "j", "ѕ": "s", "ԁ": "d", "ɡ": "g", "һ": "h", "ⅼ": "l", "ո": "n", "ԛ": "q",
    "ѵ": "v", "ԝ": "w", "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H",
    "О": "O", "Р": "P", "С": "C", "Т": "T", "Х": "X", "І": "I", "Ј": "J", "Ѕ": "S",
    "α": "a", "ο": "o", "ν": "v", "ι": "i", "κ": "k", "ρ": "p", "τ": "t", "υ": "u",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
})


def skeleton(text: str) -> str:
    """fold() after mapping Cyrillic / Greek look-alikes to Latin letters."""
    return fold(text.translate(_CONFUSABLES))


def looks_like_instruction(*texts: str) -> bool:
    """True if any text tries to instruct an automated system (prompt injection)."""
    for text in texts:
        if not text:
            continue
        sample = text[:30000]
        folded = skeleton(sample)
        if _INJECTION.search(folded) or _ROLE_LINE.search(sample.casefold()):
            return True
        if _COMPACT_INJECTION.search(re.sub(r"[\W_]+", "", folded)):
            return True
    return False


# --------------------------------------------------------------------------- legal / intent

_LEGAL = _compile((
    r"\b(?:my |our )?(?:lawyers?|attorneys?|solicitors?|legal counsel|legal department)\b",
    r"\blegal (?:action|steps|proceedings)\b",
    r"\b(?:sue|suing) (?:you|your)\b",
    r"\blawsuit\b",
    r"\bcease and desist\b",
    r"\b(?:small claims )?court\b",
    r"\b(?:report|complain)(?:ing)? (?:you |this )?to (?:the )?(?:data protection|ico|ftc|"
    r"authorit|regulator|cnil|aepd|garante)",
    r"\b(?:rechts)?anwalt\b", r"\banwaltlich", r"\bklage\b", r"\bgerichtlich",
    r"\bavocat\b", r"\bpoursuites? judiciaires?\b", r"\btribunal\b",
    r"\babogados?\b", r"\bdemanda judicial\b", r"\baccion(?:es)? legal(?:es)?\b",
    r"\badvogados?\b", r"\bprocesso judicial\b", r"\bacao judicial\b",
    r"\bavvocat[oi]\b", r"\bazione legale\b", r"\bvie legali\b",
    r"\badvocaat\b", r"\brechtszaak\b", r"\bjuridische stappen\b",
))


def legal_threat(text: str) -> bool:
    return bool(_LEGAL.search(fold(text[:30000])))


INTENT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "complaint": (
        r"\bcomplain(?:t|ts|ing)?\b", r"\bunacceptable\b", r"\bdisappointed\b",
        r"\bfrustrat(?:ed|ing)\b", r"\bterrible\b", r"\bawful\b", r"\bworst\b",
        r"\bfurious\b", r"\bangry\b", r"\brefund\b", r"\bcharged (?:me )?twice\b",
        r"\bscam\b", r"\bripped off\b", r"\bbeschwerde\b", r"\breklamation\b",
        r"\bunzufrieden\b", r"\bverargert\b", r"\bplainte\b", r"\breclamation\b",
        r"\binacceptable\b", r"\bmecontent", r"\bqueja\b", r"\breclamacion\b",
        r"\binaceptable\b", r"\breclamacao\b", r"\binaceitavel\b", r"\breclamo\b",
        r"\binaccettabile\b", r"\bklacht\b", r"\bonaanvaardbaar\b", r"\bteleurgesteld\b",
    ),
    "demo_request": (
        r"\bdemo\b", r"\bdemonstration\b", r"\bwalk ?-?through\b", r"\btrial\b",
        r"\b(?:schedule|book|set up|arrange) (?:a |an )?(?:call|meeting|session)\b",
        r"\bsee (?:it|the product) in action\b", r"\bvorfuhrung\b", r"\btestversion\b",
        r"\bdemonstracion\b", r"\bdemonstracao\b", r"\bdimostrazione\b",
        r"\bproefversie\b", r"\bessai gratuit\b", r"\bprueba gratuita\b",
    ),
    "pricing_request": (
        r"\bpric(?:e|es|ing)\b", r"\bquote\b", r"\bquotation\b", r"\bcosts?\b",
        r"\bhow much\b", r"\blicen[cs]e (?:fee|cost)s?\b", r"\bdiscount\b", r"\bbudget\b",
        r"\bpreis(?:e|liste)?\b", r"\bangebot\b", r"\bkosten\b", r"\bprix\b", r"\btarifs?\b",
        r"\bdevis\b", r"\bprecios?\b", r"\bcotizacion\b", r"\bpresupuesto\b",
        r"\bprecos?\b", r"\borcamento\b", r"\bprezz[oi]\b", r"\bpreventivo\b",
        r"\bprijs\b", r"\bprijzen\b", r"\bofferte\b",
    ),
    "support_request": (
        r"\bnot working\b", r"\bdoes ?n[o']?t work\b", r"\bdoesnt work\b", r"\berror\b",
        r"\bbug\b", r"\bbroken\b", r"\bcrash(?:es|ed|ing)?\b",
        r"\bcan(?:not|'t|t) (?:log ?in|sign ?in|access)\b", r"\bpassword reset\b",
        r"\b(?:technical|customer) support\b", r"\bsupport (?:ticket|request|team|case)\b",
        r"\bneed (?:some )?(?:help|support)\b", r"\btroubleshoot", r"\bhelp with\b",
        r"\bhilfe\b", r"\bfehler\b", r"\bfunktioniert nicht\b", r"\berreur\b",
        r"\bne fonctionne pas\b", r"\bayuda\b", r"\bno funciona\b", r"\bajuda\b",
        r"\bnao funciona\b", r"\baiuto\b", r"\berrore\b", r"\bnon funziona\b",
        r"\bstoring\b", r"\bwerkt niet\b",
    ),
    "partnership": (
        r"\bpartner(?:ship|ships|ing)?\b", r"\breseller\b", r"\baffiliate\b",
        r"\bcollaborat(?:e|ion)\b", r"\bco-?marketing\b", r"\bjoint venture\b",
        r"\bpartnerschaft\b", r"\bpartenariat\b", r"\bsocio comercial\b", r"\balianza\b",
        r"\bparceria\b", r"\bcollaborazione\b", r"\bsamenwerking\b", r"\bwederverkoper\b",
        r"\bdistribut(?:or|ion partner)\b",
    ),
    "product_question": (
        r"\bdoes (?:it|your|the)\b", r"\bcan (?:it|your|the|i|we)\b", r"\bis it possible\b",
        r"\bdo you (?:support|offer|have|provide)\b", r"\bfeatures?\b", r"\bintegrat",
        r"\bcompatib", r"\bunterstutzt\b", r"\bfonctionnalit", r"\bfuncionalidad",
        r"\bfuncionalidade", r"\bfunzionalit", r"\bfunctionaliteit", r"\bwould like to know\b",
        r"\binterested in\b", r"\bmore information\b", r"\bquestion about\b",
    ),
}
_INTENT = {intent: _compile(p) for intent, p in INTENT_KEYWORDS.items()}
INTENT_ORDER = ("complaint", "demo_request", "pricing_request", "support_request",
                "partnership", "product_question")


def classify_intent(text: str, subject: str, opted_out: bool) -> Intent:
    """Keyword intent, most specific first; a question falls back to product_question."""
    if opted_out:
        return "opt_out"
    folded = fold(subject + "\n" + text[:20000])
    for intent in INTENT_ORDER:
        if _INTENT[intent].search(folded):
            return cast(Intent, intent)
    if "?" in folded:
        return "product_question"
    return "other"


# --------------------------------------------------------------------------- addresses

# A local part starts where a run of local-part characters starts (the look-behind holds
# the whole class): otherwise every one of the 64 positions before an `@` was a start, each
# re-scanning the domain.
ADDRESS_IN_TEXT = re.compile(
    r"(?<![\w.!#$%&'*+/=?^`{|}~-])[\w.!#$%&'*+/=?^`{|}~-]{1,64}@"
    r"(?:[^\W_](?:[\w-]{0,62}[^\W_])?\.)+[^\W\d_]{2,63}(?![\w-])"
)
_OBFUSCATED = re.compile(
    r"(?<![\w.+-])([\w.+-]{1,64})\s*(?:\[at\]|\(at\)|\{at\}|\[@\]| @ )\s*([\w-]{1,63})\s*"
    r"(?:\[dot\]|\(dot\)|\{dot\}|\[\.\]| dot )\s*([a-z]{2,24})\b",
    re.IGNORECASE,
)


def addresses_in_text(text: str) -> list[str]:
    found = [m.group(0).rstrip(".") for m in ADDRESS_IN_TEXT.finditer(text[:50000])]
    found += [f"{a}@{b}.{c}" for a, b, c in _OBFUSCATED.findall(text[:50000])]
    out: list[str] = []
    for address in found:
        if address.lower() not in (a.lower() for a in out):
            out.append(address)
    return out[:50]


ROLE_LOCAL_PARTS = words(
    """info sales office contact contacts hello hi team admin administrator support help
    enquiries enquiry inquiries inquiry kontakt buero bureau contacto contato contatto vendas
    ventas ventes vertrieb verkauf marketing hr jobs careers billing accounts accounting finance
    mail general reception service services webmaster it desk helpdesk orders order booking
    bookings info-de info-fr secretariat sekretariat empfang recepcion"""
)
NOREPLY_LOCAL = re.compile(
    r"^(?:no-?reply|do-?not-?reply|donotreply|dont-?reply|noreply-\w+|\w*-noreply|"
    r"notifications?|notify|alerts?|mailer|forms?|webforms?|web-?form|wordpress|website|"
    r"typeform|jotform|formspree|hubspot|automated|auto|bounces?|system|robot)$"
)
FORM_LOCAL = re.compile(
    r"^(?:no-?reply|do-?not-?reply|donotreply|noreply-\w+|\w*-noreply|notifications?|forms?|"
    r"webforms?|web-?form|wordpress|website|typeform|jotform|formspree|contact-?form)$"
)
DAEMON_LOCAL = re.compile(r"^(?:mailer-daemon|postmaster|mail-daemon|mailerdaemon)$")

FREEMAIL_DOMAINS = words(
    """gmail.com googlemail.com yahoo.com yahoo.co.uk yahoo.de yahoo.fr yahoo.es yahoo.it
    ymail.com hotmail.com hotmail.de hotmail.fr hotmail.es hotmail.it hotmail.co.uk outlook.com
    outlook.de outlook.fr live.com live.de live.fr msn.com aol.com icloud.com me.com mac.com
    gmx.de gmx.net gmx.at gmx.ch gmx.com web.de t-online.de freenet.de posteo.de mailbox.org
    protonmail.com proton.me pm.me orange.fr wanadoo.fr free.fr laposte.net sfr.fr libero.it
    virgilio.it tiscali.it alice.it uol.com.br bol.com.br terra.com.br terra.es telefonica.net
    sapo.pt ziggo.nl kpnmail.nl planet.nl hetnet.nl home.nl zoho.com yandex.ru yandex.com
    mail.ru qq.com 163.com 126.com fastmail.com hey.com tutanota.com seznam.cz wp.pl o2.pl
    example.com example.org example.net"""
)


def local_part(address: str) -> str:
    return address.rpartition("@")[0].lower()


def domain_part(address: str) -> str:
    return address.rpartition("@")[2].lower().rstrip(".")


AUTO_REPLY_SUBJECT = re.compile(
    r"^(?:automatic reply|auto(?:matic)?[- ]?reply|auto[- ]?response|autoreply|"
    r"out of (?:the )?office|ooo\b|abwesenheitsnotiz|automatische antwort|"
    r"reponse automatique|absence du bureau|respuesta automatica|fuera de la oficina|"
    r"resposta automatica|ausente do escritorio|risposta automatica|fuori sede|"
    r"automatisch antwoord|afwezig\b)",
)


_OUT_OF_OFFICE_BODY = _compile((
    r"\b(?:i am|i'm|i will be) (?:currently )?(?:out of (?:the )?office|away from (?:the )?office|"
    r"on (?:annual |parental |sick )?leave|on vacation|on holiday)",
    r"\bthis is an automat(?:ic|ed) (?:reply|response|message)",
    r"\bich bin (?:derzeit |zurzeit |bis )?.{0,30}(?:nicht im buro|abwesend|im urlaub)",
    r"\bje suis (?:actuellement )?(?:absent|en conges)",
    r"\b(?:estoy|estare) (?:fuera de la oficina|de vacaciones|ausente)",
    r"\b(?:estou|estarei) (?:fora do escritorio|de ferias|ausente)",
    r"\bsono (?:attualmente )?(?:fuori (?:sede|ufficio)|in ferie|assente)",
    r"\bik ben (?:momenteel |tot )?.{0,30}(?:afwezig|op vakantie|niet op kantoor)",
))


def out_of_office_text(own_text: str) -> bool:
    """An auto-reply without the headers that say so (checked on short texts only)."""
    return len(own_text) < 1500 and bool(_OUT_OF_OFFICE_BODY.search(fold(own_text)))


def auto_reply_subject(subject: str) -> bool:
    return bool(AUTO_REPLY_SUBJECT.match(fold(subject)))
