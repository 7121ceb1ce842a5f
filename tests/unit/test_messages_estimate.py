"""A Messages line (`/v1/messages`) in a cost estimate: its text is its system prompt and its turns, and its
output is bounded by its `max_tokens`, as a chat line's is."""

from __future__ import annotations

from gateway.domain import Endpoint
from gateway.lines.tokens import Limit, TokenCounter, output_bound

BODY = {"model": "m", "max_tokens": 7, "system": [{"type": "text", "text": "abcd" * 3}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "efgh" * 5}]},
                     {"role": "assistant", "content": "ijkl"}]}


def test_a_messages_lines_text_is_its_system_prompt_and_turns() -> None:
    assert TokenCounter(Limit()).count(Endpoint.MESSAGES, BODY) == 3 + 5 + 1  # four bytes a token


def test_a_messages_lines_output_is_bounded_by_max_tokens() -> None:
    assert output_bound(Endpoint.MESSAGES, BODY, 9, Limit()) == 7
    assert output_bound(Endpoint.MESSAGES, BODY, 9, Limit(tokens=5)) == 5  # the model's own limit is lower
