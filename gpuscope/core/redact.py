"""Secrets out of command lines and URLs, before anything is shown, recorded or exported.

A service's command line often carries credentials (`--api-key`, `--token=...`, `password=...`,
`HF_TOKEN=...`, `https://user:pass@host`). Every command line gpuscope keeps passes through
`redact_command` first; there is no path that stores the raw one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

MASK = "***"

# Option names whose value is a secret: --api-key, --token, --password, --secret, --auth-token,
# --access-key, --hf-token, --private-key, --credentials ...
_SECRET_WORD = r"(?:api[-_]?key|token|passw(?:or)?d|passwd|secret|credentials?|auth(?:orization)?|access[-_]?key|private[-_]?key|pwd)"
_SECRET_OPTION = re.compile(rf"^-{{1,2}}(?:[\w-]*[-_])?{_SECRET_WORD}(?:[-_][\w-]*)?$", re.IGNORECASE)
# name=value pairs inside one argument: password=..., HF_TOKEN=..., OPENAI_API_KEY=..., --token=...
_SECRET_ASSIGNMENT = re.compile(
    rf"(?P<name>(?:^|(?<=[\s&;,?]))-{{0,2}}[\w.-]*?{_SECRET_WORD}[\w.-]*?|[A-Z0-9_]*_(?:TOKEN|KEY|SECRET|PASSWORD))(?P<sep>[=:])(?P<value>[^\s&;,]+)",
    re.IGNORECASE,
)
# "Authorization: Bearer xyz" / "Authorization=Basic xyz" / "Bearer xyz" inside an argument.
_AUTH_HEADER = re.compile(r"(?P<head>\b(?:authorization|proxy-authorization)\s*[:=]\s*)(?P<value>.+)$", re.IGNORECASE)
_BEARER = re.compile(r"(?P<head>\b(?:bearer|basic|token)\s+)(?P<value>[A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE)
# scheme://user:password@host -> scheme://user:***@host
_URL_CREDENTIALS = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]*:)(?P<value>[^/\s@]+)(?P<tail>@)", re.IGNORECASE)


def redact_text(text: str) -> str:
    """Mask secret values inside one piece of free text (an argument, a URL, a header)."""
    text = _URL_CREDENTIALS.sub(lambda m: m["head"] + MASK + m["tail"], text)
    header = _AUTH_HEADER.search(text)
    if header:
        return text[: header.start("value")] + MASK
    text = _SECRET_ASSIGNMENT.sub(lambda m: m["name"] + m["sep"] + MASK, text)
    return _BEARER.sub(lambda m: m["head"] + MASK, text)


def redact_args(args: Sequence[str]) -> list[str]:
    """Mask secrets in an argv list: values after secret options, and secrets inside arguments."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if _SECRET_OPTION.match(arg):
            out.append(arg)
            hide_next = True
            continue
        out.append(redact_text(arg))
    return out


def redact_command(args: Sequence[str] | str) -> str:
    """One printable, redacted command line from an argv list (or an already joined string)."""
    if isinstance(args, str):
        try:
            args = shlex.split(args)
        except ValueError:
            return redact_text(args)
    return " ".join(_quote(a) for a in redact_args(args))


def _quote(arg: str) -> str:
    # Quote only where a reader would otherwise misread the boundaries; keep masks readable.
    return shlex.quote(arg) if arg == "" or any(c.isspace() for c in arg) else arg
