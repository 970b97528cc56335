"""A model's degradation tiers as its config declares them, parsed once at load.

    parameters {
      key: "degrade_p99_ms"
      value: { string_value: "500: fallback=25% queue=16; 1000: fallback stale; 2000: rollback" }
    }

Each `;`-separated tier is a p99 threshold in milliseconds and the actions taken while the
model's recent p99 is past it. Each tier lists all of its actions (nothing is inherited from
the tier below), so what a tier does is read in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ACTIONS = ("fallback", "stale", "queue", "open_circuit", "rollback")


class TierSyntaxError(ValueError):
    """A `degrade_p99_ms` value that does not parse; the message names what is wrong."""


@dataclass(frozen=True, slots=True)
class Tier:
    number: int  # 1-based, in threshold order
    p99_s: float  # the model is in this tier (at least) while its p99 is past this
    fallback_share: float = 0.0  # of the requests, sent to fallback_model (0..1)
    stale: bool = False  # answer from cache entries past their TTL (degrade_stale_s)
    queue_limit: int = 0  # refuse (429) past this many queued requests; 0: no bound
    open_circuit: bool = False  # the circuit is held open: fallback or 503
    rollback: bool = False  # on entry, a slow canary or fresh promote is rolled back

    @property
    def all_away(self) -> bool:
        """No request reaches the primary but probes (which measure it)."""
        return self.open_circuit or self.fallback_share >= 1.0

    def describe(self) -> str:
        parts = []
        if self.fallback_share:
            parts.append(f"fallback {self.fallback_share:.0%}")
        if self.stale:
            parts.append("stale cache")
        if self.queue_limit:
            parts.append(f"queue {self.queue_limit}")
        if self.open_circuit:
            parts.append("circuit open")
        if self.rollback:
            parts.append("rollback")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class DegradePolicy:
    tiers: tuple[Tier, ...] = ()
    window_s: float = 10.0  # the p99's sliding window (degrade_window_s)
    min_requests: int = 20  # requests in the window before the p99 moves a tier
    release_ratio: float = 0.8  # a tier is left once the p99 is under threshold x this
    dwell_s: float = 10.0  # the least time in a tier before moving down
    probe_interval_s: float = 0.1  # while nothing else reaches the primary: one probe per
    stale_s: float = 300.0  # how long past its TTL a cache entry is kept for `stale`
    rollback_within_s: float = 600.0  # a promote this recent counts as fresh for `rollback`
    fallback_model: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.tiers)

    @property
    def uses_stale(self) -> bool:
        return any(t.stale for t in self.tiers)

    @property
    def uses_fallback(self) -> bool:
        return any(t.fallback_share for t in self.tiers)


def parse_tiers(text: str) -> tuple[Tier, ...]:
    """`"500: fallback=25% queue=16; 1000: fallback stale"` -> tiers, thresholds rising."""
    tiers: list[Tier] = []
    for number, part in enumerate((p for p in text.split(";") if p.strip()), start=1):
        threshold, colon, actions = part.partition(":")
        if not colon:
            raise TierSyntaxError(
                f"tier {number} '{part.strip()}' must be 'P99_MS: ACTION ...' "
                f"(actions: {', '.join(ACTIONS)})"
            )
        try:
            p99_ms = float(threshold)
        except ValueError:
            p99_ms = math.nan
        if not math.isfinite(p99_ms) or p99_ms <= 0:
            raise TierSyntaxError(
                f"tier {number}: the threshold '{threshold.strip()}' must be a number of "
                "milliseconds > 0"
            )
        if tiers and p99_ms <= tiers[-1].p99_s * 1000:
            raise TierSyntaxError(
                f"tier {number}: thresholds must rise from tier to tier ({p99_ms:g} ms is not "
                f"above tier {number - 1}'s {tiers[-1].p99_s * 1000:g} ms)"
            )
        tiers.append(_tier(number, p99_ms / 1000, actions.split()))
    if not tiers:
        raise TierSyntaxError("no tier given: expected 'P99_MS: ACTION ...; ...'")
    return tuple(tiers)


def _tier(number: int, p99_s: float, words: list[str]) -> Tier:
    if not words:
        raise TierSyntaxError(
            f"tier {number} ({p99_s * 1000:g} ms) has no action (actions: {', '.join(ACTIONS)})"
        )
    fields: dict[str, object] = {}
    for word in words:
        name, _, value = word.partition("=")
        if name not in ACTIONS:
            raise TierSyntaxError(
                f"tier {number}: unknown action '{word}' (actions: fallback, fallback=N%, "
                "stale, queue=N, open_circuit, rollback)"
            )
        if name in fields:
            raise TierSyntaxError(f"tier {number}: action '{name}' is given twice")
        if name == "fallback":
            fields[name] = _share(number, value) if value else 1.0
        elif name == "queue":
            if not value.isdigit() or int(value) < 1:
                raise TierSyntaxError(
                    f"tier {number}: 'queue' needs a bound, queue=N with N >= 1 requests"
                )
            fields[name] = int(value)
        elif value:
            raise TierSyntaxError(f"tier {number}: action '{name}' takes no value")
        else:
            fields[name] = True
    return Tier(
        number,
        p99_s,
        fallback_share=float(fields.get("fallback", 0.0)),  # type: ignore[arg-type]
        stale=bool(fields.get("stale", False)),
        queue_limit=int(fields.get("queue", 0)),  # type: ignore[call-overload]
        open_circuit=bool(fields.get("open_circuit", False)),
        rollback=bool(fields.get("rollback", False)),
    )


def _share(number: int, value: str) -> float:
    raw = value[:-1] if value.endswith("%") else value
    try:
        percent = float(raw)
    except ValueError:
        percent = math.nan
    if not value.endswith("%") or not 0 < percent <= 100:
        raise TierSyntaxError(
            f"tier {number}: 'fallback={value}' must be a share of the traffic, "
            "fallback=N% with 0 < N <= 100"
        )
    return percent / 100
