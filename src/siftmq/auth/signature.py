"""RocketMQ 5's request signature: ``MQv2-HMAC-SHA1`` over the ``x-mq-date-time`` header.

The official clients send on every call (once per Telemetry stream)::

    authorization: MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                   Signature=<hex HMAC-SHA1(key=secret key, msg=x-mq-date-time)>
    x-mq-date-time: 20261125T101500Z

The Python client stamps its *local* time and still writes ``Z``, so the skew check accepts a
window around the broker's local and UTC clocks both. The signature is compared in constant time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from siftmq.auth.throttle import FailureThrottle

SCHEME: Final = "MQv2-HMAC-SHA1"
DATE_HEADER: Final = "x-mq-date-time"
MAX_HEADER_LENGTH: Final = 1024  # an authorization header longer than this is not one
_FIELDS: Final = re.compile(r"(\w+)=([^,\s]*)")
#: The one answer for an unknown user and a wrong signature alike (it says nothing of who exists).
INVALID: Final = "the credential or the signature is not valid"
#: checked against what an unknown user sent, so that it costs what a known user costs
UNKNOWN_USER_SECRET: Final = "siftmq-unknown-user"
#: How long a verified signature is taken again without checking (its date is to the second).
SIGNED_CACHE_S: Final = 1.0
SIGNED_CACHE_SIZE: Final = 4096  # remembered signatures (cleared when full)


#: For this long after a change of the users, a signature made with a secret the change replaced is
#: no guess: clients not yet given the new password would otherwise have the user's calls from their
#: address refused, the updated clients' too, for as long as they kept trying.
STALE_S: Final = 600.0

#: The reasons a call is not authenticated (the labels of the failure metric).
REASONS: Final = frozenset({"unsigned", "malformed", "invalid", "skew", "throttled"})


class SignatureError(ValueError):
    """Why a call is not authenticated (the text never says whether the user exists); ``reason`` is
    a short label for metrics: unsigned, malformed, invalid, skew."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SignedRequest:
    access_key: str
    signature: str
    date_time: str


def parse(authorization: str | None, date_time: str | None) -> SignedRequest:
    """The credential, signature and signed date of a call; raises :class:`SignatureError`."""
    if not authorization:
        raise SignatureError("the call is not signed (no authorization header)", "unsigned")
    if len(authorization) > MAX_HEADER_LENGTH or not authorization.startswith(SCHEME + " "):
        raise SignatureError(f"the authorization header is not {SCHEME}")
    fields = dict(_FIELDS.findall(authorization[len(SCHEME) + 1 :]))
    access_key, signature = fields.get("Credential", ""), fields.get("Signature", "")
    if not access_key or not signature:
        raise SignatureError("the authorization header has no credential or no signature")
    if fields.get("SignedHeaders", "").lower() != DATE_HEADER:
        raise SignatureError(f"the signature must cover {DATE_HEADER}")
    if not date_time:
        raise SignatureError(f"the call has no {DATE_HEADER} header")
    return SignedRequest(access_key, signature.lower(), date_time)


def _parse_date(text: str) -> dt.datetime:
    """``YYYYMMDDTHHMMSSZ`` (by hand: ``strptime`` costs more than the HMAC)."""
    if (
        len(text) != len("20261125T101500Z")
        or text[8] != "T"
        or text[15] != "Z"
        or not (text[:8] + text[9:15]).isdigit()
    ):
        raise SignatureError(f"{DATE_HEADER} is not YYYYMMDDTHHMMSSZ")
    try:
        return dt.datetime(
            int(text[:4]), int(text[4:6]), int(text[6:8]), int(text[9:11]), int(text[11:13]), int(text[13:15])
        )
    except ValueError as exc:
        raise SignatureError(f"{DATE_HEADER} is not a valid date and time") from exc


def sign(secret_key: str, date_time: str) -> str:
    """The hex HMAC-SHA1 the clients send for ``date_time``."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def verify(
    request: SignedRequest, secret_key: str, *, now: dt.datetime, skew_s: float, local_time: bool = False
) -> None:
    """Raise :class:`SignatureError` unless ``request`` is signed with ``secret_key`` within ``skew_s``
    of UTC — or, with ``local_time``, of the broker's local time too: the official Python client
    (5.1.2) stamps its local time as if it were UTC. Off by default: with it, on a broker whose zone
    is not UTC, a captured signature also works again as many hours later as the zone's offset."""
    if not hmac.compare_digest(sign(secret_key, request.date_time), request.signature):
        raise SignatureError(INVALID, "invalid")
    stamped = _parse_date(request.date_time)
    utc = now.astimezone(dt.UTC).replace(tzinfo=None)
    if abs((stamped - utc).total_seconds()) <= skew_s:
        return
    local = now.astimezone().replace(tzinfo=None)
    if abs((stamped - local).total_seconds()) <= skew_s:
        if local_time:
            return
        raise SignatureError(
            f"{DATE_HEADER} is the broker's local time, not UTC (the official Python client stamps its "
            "local time): run the client with TZ=UTC, or accept such stamps with auth_local_time_stamps",
            "skew",
        )
    raise SignatureError(f"{DATE_HEADER} is outside the allowed clock skew ({skew_s:.0f} s)", "skew")


class Verifier:
    """Who signed a call, against the users' secrets in force.

    A client signs every call of one second with the same date and signature, so a verified pair is
    remembered for :data:`SIGNED_CACHE_S` (successes only): the HMAC and the date parsing are paid
    once a second per client, not once a call. Used by the core's gate and by the gRPC front-ends
    (which refuse a bad signature before the call costs the core anything).
    """

    def __init__(
        self,
        secrets: Mapping[str, str],
        skew_s: float,
        *,
        local_time: bool = False,
        stale: Mapping[str, str] | None = None,
    ) -> None:
        self._secrets = secrets
        self.skew_s = skew_s
        self.local_time = local_time  # see verify()
        self._signed: dict[tuple[str, str], tuple[str, float]] = {}
        # wrong signatures per (address, access key): past throttle.FAILURES a minute that key's calls
        # from that address are refused unchecked (the password is the secret key: unbounded, ~800
        # guesses a second went through one connection)
        self._wrong = FailureThrottle()
        #: the secrets the last change of the users replaced (see STALE_S), and until when
        self._stale = stale or {}
        self._stale_until = time.monotonic() + STALE_S

    def who(self, authorization: str | None, date_time: str | None, peer: str = "") -> str:
        """The name of the user who signed; raises :class:`SignatureError`. ``peer``: the caller's
        address (without its port), whose wrong signatures are bounded per access key."""
        key = (authorization or "", date_time or "")
        now = time.monotonic()
        hit = self._signed.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        request = parse(authorization, date_time)
        guesser = (peer, request.access_key)
        wait = self._wrong.wait_s(guesser, now)
        if wait > 0:
            raise SignatureError(
                f"too many wrong signatures for this credential from {peer or 'this address'}: "
                f"try again in {wait:.0f} s",
                "throttled",
            )
        secret = self._secrets.get(request.access_key)
        try:
            if secret is None:
                sign(UNKNOWN_USER_SECRET, request.date_time)
                raise SignatureError(INVALID, "invalid")
            now_utc = dt.datetime.now(dt.UTC)
            verify(request, secret, now=now_utc, skew_s=self.skew_s, local_time=self.local_time)
        except SignatureError as exc:
            # a guess: not a clock off or a header malformed, nor a client's password before a change
            if exc.reason == "invalid" and not self._replaced(request, now):
                self._wrong.failed(guesser, now)
            raise
        if len(self._signed) >= SIGNED_CACHE_SIZE:
            self._signed.clear()
        self._signed[key] = (request.access_key, now + SIGNED_CACHE_S)
        return request.access_key

    def _replaced(self, request: SignedRequest, now: float) -> bool:
        """Whether ``request`` is signed with the secret its user had before the last change."""
        old = self._stale.get(request.access_key)
        if old is None or now >= self._stale_until:
            return False
        return hmac.compare_digest(sign(old, request.date_time), request.signature)


def peer_address(peer: str) -> str:
    """The address of a gRPC peer (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``), without its port."""
    if peer.startswith("ipv4:"):
        return peer[5:].rsplit(":", 1)[0]
    if peer.startswith("ipv6:"):
        return peer[5:].rsplit(":", 1)[0].strip("[]")
    return peer


def signature_headers(metadata: Iterable[tuple[str, str | bytes]] | None) -> tuple[str | None, str | None]:
    """The ``authorization`` and date headers of a call's metadata (text headers only)."""
    authorization = date_time = None
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            authorization = value
        elif key == DATE_HEADER and isinstance(value, str):
            date_time = value
    return authorization, date_time
