"""The local API key and the short-lived tokens the SDK exchanges it for.

The SDK sends ``X-API-Key``: the key itself (``tml-…``), or a token from
``/api/v1/auth/token``. Tokens are HS256 JWTs signed with a secret that lives only as long
as the server, so a restart invalidates them and the SDK exchanges its key again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time

TOKEN_LIFETIME_S = 3600
KEY_PREFIX = "tml-"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class KeyCheck:
    """Accepts the configured key or a token minted here; with no key, accepts anyone."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        self._secret = secrets.token_bytes(32)

    @property
    def required(self) -> bool:
        return self.api_key is not None

    def is_key(self, presented: str | None) -> bool:
        if self.api_key is None:
            return True
        return presented is not None and hmac.compare_digest(presented.encode(), self.api_key.encode())

    def mint(self) -> str:
        now = int(time.time())
        head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        body = _b64(json.dumps({"iss": "astrai", "iat": now, "exp": now + TOKEN_LIFETIME_S}).encode())
        return f"{head}.{body}.{self._sign(f'{head}.{body}')}"

    def _sign(self, signing_input: str) -> str:
        return _b64(hmac.new(self._secret, signing_input.encode(), hashlib.sha256).digest())

    def is_token(self, presented: str | None) -> bool:
        if presented is None or presented.count(".") != 2:
            return False
        head, body, sig = presented.split(".")
        if not hmac.compare_digest(sig, self._sign(f"{head}.{body}")):
            return False
        try:
            return float(json.loads(_unb64(body))["exp"]) > time.time()
        except (ValueError, KeyError, TypeError):
            return False

    def allows(self, presented: str | None) -> bool:
        return self.is_key(presented) or self.is_token(presented)
