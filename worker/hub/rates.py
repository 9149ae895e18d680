"""Rates: how often a key (a worker id, or one key for all) may do a thing, as token
buckets.

A key may do it `burst` times at once, then `per_s` times a second on average. The
buckets kept are those of the keys that acted last, at most `keys` of them: past it
the one that acted longest ago is forgotten (it starts full again when it comes back,
which is where it would be by then unless it acted within `burst / per_s`). Each
check and each take is O(1), so a fleet of thousands saying Hello at once costs
nothing per Hello here.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

# The buckets kept at most, whatever the keys (each about 200 bytes).
KEYS: Final = 16_384


class Rate:
    def __init__(self, burst: float, per_s: float, keys: int = KEYS) -> None:
        self.burst = burst
        self.per_s = per_s
        self.keys = keys
        # key -> (tokens, when counted), the key that acted last at the end
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _tokens(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + max(0.0, now - at) * self.per_s)

    def wait_s(self, key: str, now: float) -> float:
        """0 when `key` may act now; else how long until it may."""
        tokens = self._tokens(key, now)
        if tokens >= 1:
            return 0.0
        return (1 - tokens) / self.per_s if self.per_s > 0 else float("inf")

    def take(self, key: str, now: float) -> None:
        """`key` acts now (it may: see wait_s)."""
        self._buckets[key] = (self._tokens(key, now) - 1, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.keys:
            self._buckets.popitem(last=False)

    def __len__(self) -> int:
        return len(self._buckets)
