"""Cluster secrets: how strong a token is, and the TLS contexts of mutual TLS.

The handshake proves both sides hold the token by HMAC-SHA256 over fresh challenges, so the
token never crosses the wire, but anyone who connects sees one challenge and its answer and can
test guesses offline, as fast as they can compute HMACs. A token therefore needs as much entropy
as a key: :data:`MIN_TOKEN_BITS`. :func:`token_bits` estimates it from the token's length and the
classes of characters it uses, which is right for random tokens (``compass token``,
``secrets.token_hex``, ``openssl rand -hex 32``) and generous for words a person picked.

Mutual TLS: every worker has a certificate signed by the cluster's own CA and serves with it;
workers and clients verify each other against that CA alone (never the system's trust store).
A worker asks each connecting side for a certificate (``CERT_REQUIRED``): clients and peer
workers alike present theirs, so a worker's certificate must allow both server and client
authentication (or name no extended key usage). Host names are *not* checked by default:
workers are often addressed by IP, peers dial the address a worker advertises, and the cluster
CA is the trust boundary (every certificate it signs is a member, as every holder of the token
is). ``check_hostname=True`` checks the dialed host against the certificate's SANs as well.
"""

from __future__ import annotations

import math
import os
import secrets
import ssl
import string
from typing import NamedTuple

from compass.errors import ConfigError

__all__ = [
    "MIN_TOKEN_BITS",
    "TOKEN_ENV",
    "ClientToken",
    "check_token",
    "client_context",
    "client_token",
    "new_token",
    "server_context",
    "token_bits",
]

#: the environment variable the cluster token is read from when none is given: by the CLI
#: (``--token``), so by the workers it starts, and by :class:`~compass.Client`
TOKEN_ENV = "COMPASS_TOKEN"

#: entropy a token needs, in bits, to stand up to offline guessing
MIN_TOKEN_BITS = 128

_HEX_LOWER = frozenset("0123456789abcdef")
_HEX_UPPER = frozenset("0123456789ABCDEF")
# base64 and base64url's two extra characters (and padding): such tokens are ~6 bits a character
_BASE64_EXTRA = frozenset("+/-_=")


def _period(token: str) -> int:
    """Length of the shortest unit ``token`` repeats (``len(token)`` if it does not)."""
    n = len(token)
    for p in range(1, n // 2 + 1):
        if all(token[i] == token[i - p] for i in range(p, n)):
            return p
    return n


def token_bits(token: str) -> float:
    """An estimate of ``token``'s entropy in bits: length times bits per character.

    Bits per character are log2 of the alphabet its character classes imply: 4 for hex (one
    case), 3.3 for digits, 4.7 for one case of letters, 5.2 with digits, 6 for letters of both
    cases and digits (base64), 6.6 with other punctuation. A repeating token counts its
    repeating unit once (``"abab..."`` is as strong as ``"ab"``).
    """
    if not token:
        return 0.0
    chars = set(token)
    if chars <= _HEX_LOWER or chars <= _HEX_UPPER:
        alphabet = 10 if chars <= set(string.digits) else 16
    else:
        alphabet = 0
        if chars & set(string.ascii_lowercase):
            alphabet += 26
        if chars & set(string.ascii_uppercase):
            alphabet += 26
        if chars & set(string.digits):
            alphabet += 10
        other = {c for c in chars if c not in string.ascii_letters + string.digits}
        if other and other <= _BASE64_EXTRA:
            alphabet += len(_BASE64_EXTRA)
        elif other:
            alphabet += len(string.punctuation)
    return _period(token) * math.log2(max(alphabet, 2))


def check_token(token: str, *, allow_weak: bool = False) -> None:
    """Raise :class:`ConfigError` if ``token`` is estimated under :data:`MIN_TOKEN_BITS` bits
    (unless ``allow_weak``)."""
    if allow_weak:
        return
    bits = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise ConfigError(
            f"the cluster token is too weak: about {bits:.0f} bits of entropy by its length and "
            f"characters, and {MIN_TOKEN_BITS} are needed against offline guessing; make one "
            "with `compass token` (or pass --allow-weak-token on a trusted network)"
        )


def new_token() -> str:
    """A fresh random token of 256 bits (64 hex characters)."""
    return secrets.token_hex(32)


class ClientToken(NamedTuple):
    """The token a client presents (None: none), and where it came from, which an
    authentication error names: a user who set the variable in another shell learns it here."""

    value: str | None
    source: str


def client_token(token: str | None) -> ClientToken:
    """The token of a client given ``token``: that one (``""``: none, whatever the environment
    holds), or with None the environment's :data:`TOKEN_ENV`, as the CLI and the workers read
    it. Read when the client is made, never at import."""
    if token is not None:
        return ClientToken(token or None, "its token= argument" if token else 'token=""')
    found = os.environ.get(TOKEN_ENV)
    if found:
        return ClientToken(found, f"the {TOKEN_ENV} environment variable")
    return ClientToken(None, f"no token= given, and {TOKEN_ENV} is not set")


def _read_chain(context: ssl.SSLContext, cert: str, key: str) -> None:
    # OpenSSL's "not found" names neither file: look first
    for what, path in (("certificate", cert), ("key", key)):
        if not os.path.exists(path):
            raise ConfigError(f"TLS {what} file {path!r} not found")
    try:
        context.load_cert_chain(cert, key)
    except OSError as exc:
        if isinstance(exc, ssl.SSLError):
            raise ConfigError(
                f"could not load the TLS certificate {cert!r} with the key {key!r}: "
                f"{exc.reason or exc} (PEM files, the key matching the certificate)"
            ) from None
        raise ConfigError(f"cannot read TLS certificate {cert!r} or key {key!r}: {exc}") from None


def _read_ca(context: ssl.SSLContext, ca: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except FileNotFoundError:
        raise ConfigError(f"TLS CA file {ca!r} not found") from None
    except OSError as exc:
        if isinstance(exc, ssl.SSLError):
            raise ConfigError(
                f"could not load the TLS CA {ca!r}: {exc.reason or exc} (a PEM certificate)"
            ) from None
        raise ConfigError(f"cannot read TLS CA file {ca!r}: {exc}") from None


def server_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """A worker's listening context: serves ``cert``, requires a client certificate that ``ca``
    signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _read_chain(context, cert, key)
    _read_ca(context, ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(cert: str, key: str, ca: str, *, check_hostname: bool = False) -> ssl.SSLContext:
    """A connecting context (client, or worker dialing a peer): presents ``cert``, trusts only
    servers that ``ca`` signed; host names checked against SANs if ``check_hostname``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    _read_chain(context, cert, key)
    _read_ca(context, ca)
    return context
