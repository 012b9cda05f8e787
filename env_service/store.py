"""Open episodes of the service (their handles: the episodes live in worker processes), with idle expiry."""

from __future__ import annotations

import time
from collections.abc import Iterator

from env_service.workers import Handle


class EpisodeStore:
    def __init__(self, ttl_s: float, max_episodes: int) -> None:
        self.ttl_s = ttl_s
        self.max_episodes = max_episodes
        self._episodes: dict[str, Handle] = {}
        self.expired_total = 0

    def __len__(self) -> int:
        return len(self._episodes)

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self._episodes

    def __iter__(self) -> Iterator[Handle]:
        return iter(list(self._episodes.values()))

    def full(self) -> bool:
        return len(self._episodes) >= self.max_episodes

    def add(self, handle: Handle) -> None:
        self._episodes[handle.id] = handle

    def get(self, episode_id: str) -> Handle | None:
        episode = self._episodes.get(episode_id)
        if episode is not None:
            episode.last_access = time.monotonic()
        return episode

    def remove(self, episode_id: str) -> bool:
        return self._episodes.pop(episode_id, None) is not None

    def expire(self, now: float | None = None) -> list[Handle]:
        """Drop episodes idle for longer than the TTL; returns the dropped ones (their workers free them)."""
        now = time.monotonic() if now is None else now
        stale = [ep for ep in self._episodes.values() if now - ep.last_access > self.ttl_s]
        for ep in stale:
            del self._episodes[ep.id]
        self.expired_total += len(stale)
        return stale
