"""The config's webhook settings as the sender reads them: each team's target, the retry policy."""

from __future__ import annotations

from collections.abc import Callable

from gateway.config.schema import Config
from gateway.webhooks.events import WebhookTarget
from gateway.webhooks.sender import RetrySchedule


def webhook_targets(config: Config) -> Callable[[str], WebhookTarget | None]:
    """team id -> where its events go (None: the team has no webhook, or is unknown)."""
    found = {
        team.team_id: WebhookTarget(team.webhook_url, team.webhook_secret.get_secret_value(),
                                    frozenset(team.webhook_events))
        for team in config.batch.teams
        if team.webhook_url is not None and team.webhook_secret is not None
    }
    return found.get


def retry_schedule(config: Config) -> RetrySchedule:
    settings = config.batch.webhooks
    return RetrySchedule(delays=tuple(settings.retry_delays_seconds), give_up_after=settings.give_up_after_seconds,
                         timeout=settings.timeout_seconds)


__all__ = ["retry_schedule", "webhook_targets"]
