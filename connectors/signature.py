"""How costline signs what it POSTs to a webhook, as Slack and Stripe sign theirs.

HMAC-SHA256 with a shared secret over ``timestamp + "." + body``, sent as
``X-Costline-Timestamp`` (Unix seconds) and ``X-Costline-Signature: v1=<hex>``; the receiver
recomputes it and refuses a stale timestamp.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_VERSION = "v1"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``v1=<hex HMAC-SHA256 of timestamp.body>``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION}={digest.hexdigest()}"
