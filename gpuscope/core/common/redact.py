"""Secrets out of command lines, URLs, headers and messages, before anything is shown, recorded or exported.

A service's command line often carries credentials (`--api-key sk-...`, `--token="..."`,
`mysql -pPW`, `curl -u user:pw`, `HF_TOKEN=...`, `postgres://user:pw@host`, `?sig=...`). Every
command line gpuscope keeps passes through `redact_command` first, every URL or message that may
hold one through `redact_text`; there is no path that stores the raw one. Both return printable
text (see gpuscope.core.common.printable): a command line is someone else's text.

What is masked (README.md has the same table):
- the value of an option whose name ends with a secret word (`--api-key V`, `--token=V`,
  `-pass V`, `--client-secret V`), the whole value, spaces and all;
- `NAME=VALUE` and `NAME: VALUE` pairs whose name ends with one (`password=`, `AWS_SECRET_ACCESS_KEY=`,
  `X-Api-Key: `, JSON `"api_key": "..."`, query parameters `?sig=`, `&X-Amz-Signature=`, `&key=`);
- `Authorization:`/`Cookie:` header values, `Bearer`/`Basic` credentials;
- the password of `scheme://user:password@host` and of `user:password@host` (up to the last `@`);
- a few programs' own short options: `mysql -pPW`, `sshpass -p PW`, `redis-cli -a PW`,
  `curl -u user:PW` / `-b COOKIES`;
- tokens recognisable by their shape wherever they stand: GitHub (`ghp_`, `github_pat_`),
  GitLab (`glpat-`), OpenAI/Anthropic (`sk-`, `sk-proj-`), Slack (`xoxb-`), Hugging Face (`hf_`),
  AWS access key IDs (`AKIA`), Google API keys (`AIza`), npm, PyPI, Stripe, and JWTs (`eyJ...`).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence

from gpuscope.core.common.printable import printable

MASK = "***"

# A name is secret when its last word (split at - _ . and camelCase) is one of these ...
_SECRET_WORDS = frozenset({
    "key", "apikey", "token", "password", "passwd", "pass", "pw", "pwd", "passphrase", "secret",
    "credential", "credentials", "creds", "auth", "authorization", "jwt", "bearer", "cookie",
    "cookies", "signature", "sig", "passin", "passout",
})
# ... or ends with one of these without a separator (PGPASSWORD, MYTOKEN, clientsecret, apikey).
_SECRET_ENDINGS = ("password", "passwd", "passphrase", "secret", "token", "apikey", "accesskey",
                   "secretkey", "privatekey", "credentials", "cookie", "signature")
# A word before the secret word that makes it something else: --bos-token "</s>", --max-token 10.
_NOT_SECRET_AFTER = frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "special", "max", "min",
                               "num", "sort", "primary", "foreign", "partition"})
# Options that are switches, never followed by a value: --no-password, --ask-pass.
_SWITCH_PREFIXES = frozenset({"no", "ask"})
_NAME_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def is_secret_name(name: str) -> bool:
    """Whether an option, variable, header, parameter or JSON key name names a secret."""
    words = [w.lower() for w in _NAME_WORDS.findall(name)]
    while words and words[-1].isdigit():
        words.pop()  # TOKEN_2, key1
    if not words:
        return False
    if len(words) > 1 and words[-2] in _NOT_SECRET_AFTER:
        return False
    return words[-1] in _SECRET_WORDS or words[-1].endswith(_SECRET_ENDINGS)


# -- rules over free text ------------------------------------------------------------------------

# "Authorization: Bearer x", "Cookie: a=b; c=d": the rest of the header (to a quote or the end).
_HEADER = re.compile(r"(?P<head>\b(?:proxy-)?authorization\s*[:=]\s*|\b(?:set-)?cookie\s*[:=]\s*)(?P<value>[^\"'\n]+)",
                     re.IGNORECASE)
_BEARER = re.compile(r"(?P<head>\bbearer\s+)[A-Za-z0-9._~+/=-]+|(?P<basic>\bbasic\s+)(?=[A-Za-z0-9+/]*[A-Z0-9])[A-Za-z0-9+/]{8,}=*",
                     re.IGNORECASE)
# scheme://user:password@host -> scheme://user:***@host; the password runs to the last @ before
# the host (people do not percent-encode theirs).
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^/\s:@?#\"']*:)[^/\s?#\"']+@", re.IGNORECASE)
# user:password@host without a scheme (Go DSNs, --dsn=...), at the start of a word; not an image
# reference (repo:tag@sha256:...).
_USERINFO = re.compile(r"(?:^|(?<=[\s=(\"',]))(?P<head>[\w.%+~-]+:)[^\s/?#\"']+@(?!sha\d+:)(?=[A-Za-z0-9\[])")
# name=value / name: value / "name": "value", the name checked by is_secret_name.
_PAIR_NAME = re.compile(r"(?<![\w.-])(?P<q>[\"']?)(?P<name>-{0,2}[A-Za-z_][\w.-]*)(?P=q)(?P<sep>\s*[=:]\s*)")
_PAIR_VALUE = re.compile(r"\"(?:[^\"\\]|\\.)*\"?|'[^']*'?|[^\s&;,#\"']+")
# Tokens whose shape says what they are, wherever they stand: the prefix stays, as a hint.
_SHAPED_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_-])(?P<prefix>"
    r"gh[pousr]_(?=[A-Za-z0-9]{30})|github_pat_(?=\w{22})|glpat-(?=[\w-]{20})|sk-(?:proj-|ant-|svcacct-|admin-)?(?=[\w-]{20})"
    r"|(?:sk|rk)_(?:live|test)_(?=[A-Za-z0-9]{16})|xox[abposr]-(?=[A-Za-z0-9-]{10})|xapp-(?=[A-Za-z0-9-]{10})"
    r"|hf_(?=[A-Za-z0-9]{30})|npm_(?=[A-Za-z0-9]{30})|pypi-(?=[\w-]{50})|AIza(?=[\w-]{30})"
    r"|(?:AKIA|ASIA)(?=[0-9A-Z]{16})|eyJ(?=[\w-]{8,}\.eyJ[\w-]{8,}\.)"
    r")[\w.-]+"
)
# One shell word of free text: bare characters and quoted strings, an unclosed quote to the end.
_WORD = re.compile(r"(?:[^\s\"']|\"(?:[^\"\\]|\\.)*\"?|'[^']*'?)+")


def _masked(value: str) -> str:
    """MASK in place of a value, keeping the quotes around a quoted one (JSON stays JSON)."""
    if value[:1] in ("'", '"'):
        return value[0] + MASK + (value[0] if len(value) > 1 and value.endswith(value[0]) else "")
    return MASK


def _mask_pairs(text: str) -> str:
    out: list[str] = []
    pos = 0
    for m in _PAIR_NAME.finditer(text):
        if m.start() < pos or not is_secret_name(m["name"].lstrip("-")):
            continue
        value = _PAIR_VALUE.match(text, m.end())
        if value is None or (":" in m["sep"] and value.group().startswith("/")):
            continue  # name: /a/path is a mapping (a volume), not a secret
        out += [text[pos : m.end()], _masked(value.group())]
        pos = value.end()
    return "".join(out) + text[pos:] if out else text


def _redact(text: str) -> str:
    """Mask secrets in free text (an argument, a script given to `sh -c`, a URL, a message)."""
    text = _HEADER.sub(lambda m: m["head"] + MASK, text)
    text = _URL_CREDENTIALS.sub(lambda m: m["head"] + MASK + "@", text)
    text = _USERINFO.sub(lambda m: m["head"] + MASK + "@", text)
    # Credentials after a scheme word first: a secret name before it ("X-Auth: Bearer t") would
    # mask the scheme word and leave the token after it.
    text = _BEARER.sub(lambda m: (m["head"] or m["basic"]) + MASK, text)
    text = _mask_pairs(text)
    text = _SHAPED_TOKEN.sub(lambda m: m["prefix"] + MASK, text)
    if any(c.isspace() for c in text):
        text = _mask_option_values(text)
    return text


# -- rules over words (an argv, or the words of free text) -------------------------------------

ALL, USERINFO, ATTACHED = "all", "userinfo", "attached"  # how an option's value is masked
_MYSQL = {"-p": ATTACHED}  # -pPW; a lone -p asks for the password, --password V is the generic rule
_CURL = {"-u": USERINFO, "--user": USERINFO, "-U": USERINFO, "--proxy-user": USERINFO, "-b": ALL}
PROGRAM_OPTIONS = {
    **{name: _MYSQL for name in ("mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlcheck", "mysqlshow",
                                 "mysqlpump", "mysqlsh", "mariadb", "mariadb-dump", "mariadb-admin")},
    "sshpass": {"-p": ALL},
    "redis-cli": {"-a": ALL},
    "curl": _CURL,
}


def _mask_value(word: str, how: str) -> str:
    if how == USERINFO:
        user, colon, _ = word.partition(":")
        return user + colon + MASK if colon else word  # no password given: curl asks for it
    return MASK


def _option(word: str, program: str) -> tuple[str | None, str | None]:
    """(the word masked, if the word itself holds a secret; how to mask the next word, if it is one)."""
    if not word.startswith("-") or word in ("-", "--"):
        return None, None
    name, eq, value = word.partition("=")
    for option, how in PROGRAM_OPTIONS.get(program, {}).items():
        if name == option:
            if eq:
                return name + eq + _mask_value(value, how), None
            return None, None if how == ATTACHED else how
        if len(option) == 2 and word.startswith(option) and len(word) > 2:  # -pPW, -uuser:pw
            return option + _mask_value(word[2:], how), None
    bare = name.lstrip("-")
    if len(name) - len(bare) > 2 or len(bare) < 2 or not bare[0].isalpha():
        return None, None
    if not is_secret_name(bare) or _NAME_WORDS.findall(bare)[0].lower() in _SWITCH_PREFIXES:
        return None, None
    if eq:
        return name + "=" + MASK, None
    return None, ALL


def _program(word: str) -> str | None:
    name = os.path.basename(word.strip("\"'"))
    return name if name in PROGRAM_OPTIONS else None


def _mask_option_values(text: str) -> str:
    """The word rules over the words of free text: `sh -c "mysql -pPW db"`, `--api-key "a b"`."""
    out: list[str] = []
    pos = 0
    pending: str | None = None
    replacement: str | None
    program = ""
    for m in _WORD.finditer(text):
        word = m.group()
        if pending is not None:
            replacement, pending = _mask_value(word.strip("\"'"), pending), None
        else:
            program = _program(word) or program
            replacement, pending = _option(word, program)
        if replacement is not None and replacement != word:
            out += [text[pos : m.start()], replacement]
            pos = m.end()
    return "".join(out) + text[pos:] if out else text


_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_][\w.-]*)=")


def _redact_argv(args: Sequence[str]) -> list[str]:
    out: list[str] = []
    pending: str | None = None
    program = ""
    for arg in args:
        if pending is not None:
            out.append(_mask_value(arg, pending))
            pending = None
            continue
        program = _program(arg) or program
        masked, pending = _option(arg, program)
        if masked is None:
            assignment = _ASSIGNMENT.match(arg)  # NAME=VALUE (env, docker -e): the whole value, spaces too
            if assignment and is_secret_name(assignment["name"]):
                masked = assignment.group() + MASK
        out.append(masked if masked is not None else _redact(arg))
    return out


# -- the interface ------------------------------------------------------------------------------

def redact_text(text: str) -> str:
    """One piece of free text (an argument, a URL, a header, a message) with its secrets masked,
    as one printable line."""
    return printable(_redact(text))


def redact_args(args: Sequence[str]) -> list[str]:
    """An argv list with its secrets masked: values of secret options, secrets inside arguments."""
    return [printable(a) for a in _redact_argv(args)]


def redact_command(args: Sequence[str] | str) -> str:
    """One printable, redacted command line from an argv list (or an already joined string)."""
    if isinstance(args, str):
        try:
            args = shlex.split(joined := args)
        except ValueError:
            return redact_text(joined)
    return printable(" ".join(_quote(a) for a in _redact_argv(args)))


def _quote(arg: str) -> str:
    # Quote only where a reader would otherwise misread the boundaries; keep masks readable.
    return shlex.quote(arg) if arg == "" or any(c.isspace() for c in arg) else arg


# gpuscope's own credentials in its environment: a user name travels with its password.
_OWN_CREDENTIALS = frozenset({"GPUSCOPE_PROMETHEUS_USER"})


def without_own_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less gpuscope's own credentials (GPUSCOPE_PROMETHEUS_TOKEN, ..._USER, ..._PASSWORD,
    any GPUSCOPE_ variable with a secret name): a program gpuscope starts has no use for them."""
    return {name: value for name, value in environ.items()
            if not (name.startswith("GPUSCOPE_") and (name in _OWN_CREDENTIALS or is_secret_name(name)))}
