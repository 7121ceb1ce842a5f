"""The shared store's key names (`gateway.store.redis.keys`) and the migration's reading of the previous ones
(`gateway.store.redis.migration.new_name`): every tag well-formed whatever an id holds, no two ids sharing a tag,
and each previous name mapped to the new name of the same thing."""

from __future__ import annotations

import pytest

from gateway.store.redis.keys import Keys
from gateway.store.redis.migration import new_name


def _tag(name: str) -> str:
    """The part of `name` Redis Cluster hashes: between the first `{` and the next `}`."""
    start = name.index("{")
    return name[start + 1:name.index("}", start)]


@pytest.mark.parametrize("ident", ["batch_0af3", "alpha", "a}b", "{x}", "~alpha", "a:b", "é"])
def test_a_tag_is_well_formed_whatever_the_id(ident: str) -> None:
    k = Keys()
    for name in (k.batch(ident), k.journal(ident, 3), k.spend_owed(ident)):
        assert name.startswith("batchyard:{b:")
        assert _tag(name) == _tag(k.batch(ident))  # one batch: one slot
    for name in (k.quota(ident), k.spend(ident), k.files(ident, "batch"), k.rate(ident, "r:o}", 7),
                 k.idempotency(ident, "{any}")):
        assert _tag(name) == _tag(k.quota(ident))  # one team: one slot
    if "{" in ident or "}" in ident or ident.startswith("~"):
        assert _tag(k.batch(ident)) == "b:~" + ident.encode().hex()


def test_no_two_ids_share_a_tag() -> None:
    k = Keys()
    ids = ["a}b", "a", "~" + b"a}b".hex(), "a}", "b:~61"]
    assert len({_tag(k.batch(i)) for i in ids}) == len(ids)
    assert len({_tag(k.quota(i)) for i in ids}) == len(ids)
    assert _tag(k.batch("x")) != _tag(k.quota("x"))


def test_a_prefix_with_a_tag_of_its_own_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix"):
        Keys("{batchyard}:")


@pytest.mark.parametrize(("old", "new"), [
    ("batch:batch_1", Keys().batch("batch_1")),
    ("shards-done:batch_1", Keys().shards_done("batch_1")),
    ("journal:batch_1:12", Keys().journal("batch_1", 12)),
    ("results:batch_1", Keys().results_log("batch_1")),
    ("files:alpha", Keys().files("alpha")),
    ("files:alpha:batch_output", Keys().files("alpha", "batch_output")),
    ("batches:alpha", Keys().batches("alpha")),
    ("webhooks:alpha", Keys().webhooks("alpha")),
    ("spend:alpha", Keys().spend("alpha")),
    ("storage-pending:alpha", Keys().storage_pending("alpha")),
    ("rate:5:alpha:gpt:mini:1700000000", Keys().rate("alpha", "gpt:mini", 1700000000)),
    ("idempotency:5:alpha:key:with:colons", Keys().idempotency("alpha", "key:with:colons")),
    ("file:file-1", Keys().file("file-1")),
    ("active-batches", Keys().active),
    ("quota-at", Keys().quota_admitted_at),
    ("webhook:wh_1", Keys().webhook("wh_1")),
    ("stream:8:gpt-mini:5:alpha:batch_1", ""),
    ("ready:8:gpt-mini:alpha", ""),
    ("teams:gpt-mini", ""),
    ("streams:gpt-mini", ""),
    ("queued", ""),
])
def test_each_previous_name_maps_to_the_new_name_of_the_same_thing(old: str, new: str) -> None:
    assert new_name(old, Keys()) == new
