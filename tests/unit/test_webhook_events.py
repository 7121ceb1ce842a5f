"""Batch webhook events are OpenAI's to the byte: the `openai` SDK's own `webhooks.unwrap` verifies
our signature and parses each event kind into its typed event."""

from __future__ import annotations

import base64
import json
import time

import openai
import pytest
from openai import OpenAI
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
)

from gateway.domain import BatchStatus
from gateway.webhooks.events import ALL_EVENTS, EVENT_TYPES, event_ids, payload, signed_headers

SECRET = "whsec_" + base64.b64encode(b"a-32-byte-secret-for-the-tests!!").decode()
KINDS = {
    "batch.completed": BatchCompletedWebhookEvent,
    "batch.failed": BatchFailedWebhookEvent,
    "batch.cancelled": BatchCancelledWebhookEvent,
    "batch.expired": BatchExpiredWebhookEvent,
}


@pytest.mark.parametrize("event_type", ALL_EVENTS)
def test_the_sdk_unwraps_each_event_kind(event_type: str) -> None:
    webhook_id, event_id = event_ids("batch_abc", event_type)
    body = payload(event_id, event_type, 1_700_000_000, "batch_abc")
    headers = signed_headers(SECRET, webhook_id, int(time.time()), body)
    event = OpenAI(api_key="unused", webhook_secret=SECRET).webhooks.unwrap(body, headers)
    assert isinstance(event, KINDS[event_type])
    assert (event.type, event.id, event.created_at, event.data.id, event.object) == (
        event_type, event_id, 1_700_000_000, "batch_abc", "event")
    assert json.loads(body) == {"object": "event", "id": event_id, "type": event_type, "created_at": 1_700_000_000,
                                "data": {"id": "batch_abc"}}
    assert webhook_id.startswith("wh_") and event_id.startswith("evt_")
    assert headers["webhook-signature"].startswith("v1,") and headers["webhook-id"] == webhook_id


def test_a_secret_without_whsec_prefix_signs_with_its_bytes() -> None:
    body = payload("evt_1", "batch.completed", 1, "batch_1")
    headers = signed_headers("plain-secret", "wh_1", int(time.time()), body)
    assert OpenAI(api_key="unused").webhooks.unwrap(body, headers, secret="plain-secret").type == "batch.completed"


def test_a_wrong_secret_or_a_changed_body_does_not_verify() -> None:
    body = payload("evt_1", "batch.failed", 1, "batch_1")
    headers = signed_headers(SECRET, "wh_1", int(time.time()), body)
    hooks = OpenAI(api_key="unused").webhooks
    with pytest.raises(openai.InvalidWebhookSignatureError):
        hooks.unwrap(body, headers, secret="whsec_" + base64.b64encode(b"another").decode())
    with pytest.raises(openai.InvalidWebhookSignatureError):
        hooks.unwrap(body.replace(b"batch_1", b"batch_2"), headers, secret=SECRET)


def test_ids_are_derived_so_recording_twice_is_one_delivery() -> None:
    assert event_ids("batch_x", "batch.completed") == event_ids("batch_x", "batch.completed")
    assert event_ids("batch_x", "batch.completed") != event_ids("batch_x", "batch.expired")
    assert set(EVENT_TYPES) == {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.CANCELLED, BatchStatus.EXPIRED}
