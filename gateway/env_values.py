"""The values a config read from the environment (`os.environ/NAME`, `environment_variables`), kept so that
none of them is ever shown: whatever the key's name, such a value may be a secret (`max_active_batches:
os.environ/SEC` holding a key by mistake once put `got 'sk-live-…'` in `config check`, serve's log and its
exit message).

The loader `remember`s each value as it substitutes it; `ConfigError` and the log filter
(`gateway.log_safe`) pass their text through `redacted`. A value is hidden wherever it appears quoted
(`'…'`, as the messages echo one), and anywhere at all from `_BARE` characters on (a short value such as
`5` is hidden where it is quoted only, so that a message's other text stays readable).
"""

from __future__ import annotations

HIDDEN = "<hidden: set from the environment>"
_BARE = 8
_values: set[str] = set()


def remember(value: object) -> None:
    """A value the config took from the environment (a non-string is kept as its text)."""
    text = value if isinstance(value, str) else str(value)
    if text:
        _values.add(text)


def from_environment(value: object) -> bool:
    return isinstance(value, str) and value in _values


def redacted(text: str) -> str:
    """`text` with every remembered value in it hidden."""
    for value in sorted(_values, key=len, reverse=True):  # a value that holds another one hidden whole
        if len(value) >= _BARE:
            if value in text:
                text = text.replace(value, HIDDEN)
        else:
            for quoted in (repr(value), f'"{value}"'):
                if quoted in text:
                    text = text.replace(quoted, HIDDEN)
    return text


__all__ = ["HIDDEN", "from_environment", "redacted", "remember"]
