"""The dashboard's login: only our own pages may post it, the cookie holds a session id (never the key), the
session lives in the store (any replica reads it, logout ends it everywhere), and the cookie is `Secure` when
the request came over https as uvicorn sees it (a proxy `--forwarded-allow-ips` trusts included).

Real `batchyard serve` processes: embedded, and two API replicas over one redis-server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisServer
from tests.support.team_helpers import start_shared

KEY = "sk-team-a-secret"
TEAMS = [{"team_id": "team-a", "api_keys": [KEY]}]


def _login(gw: Gateway, key: str = KEY, **headers: str) -> httpx.Response:
    return gw.http("POST", "/ui/login", data={"api_key": key}, headers=headers, follow_redirects=False)


def _cookie(reply: httpx.Response) -> tuple[str, str]:
    """(the cookie's value, the whole Set-Cookie header)."""
    header = reply.headers["set-cookie"]
    name, _, rest = header.partition("=")
    assert name == "batchyard_session", header
    return rest.split(";", 1)[0], header


def _page(gw: Gateway, session: str) -> httpx.Response:
    return gw.http("GET", "/ui", headers={"Cookie": f"batchyard_session={session}"}, follow_redirects=False)


@pytest.fixture(scope="module")
def embedded(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("login") / "data"
    with start_gateway(gateway_config(upstream, teams=TEAMS), data, workers=0) as gw:
        yield gw


@pytest.mark.parametrize(("case", "headers"), [
    ("a foreign Origin", {"Origin": "https://evil.example"}),
    ("an opaque Origin (a page with no-referrer, a sandboxed frame)", {"Origin": "null"}),
    ("our host on another scheme", {"Origin": "https://127.0.0.1"}),
    ("a foreign Referer and no Origin", {"Referer": "https://evil.example/login.html"}),
    ("neither Origin nor Referer", {}),
])
def test_a_cross_site_login_is_refused(embedded: Gateway, case: str, headers: dict[str, str]) -> None:
    reply = _login(embedded, **headers)
    assert reply.status_code == 403, (case, reply.status_code)
    assert "set-cookie" not in reply.headers, case
    assert KEY not in reply.text


def test_a_same_origin_login_holds_a_session_id_and_logout_ends_it(embedded: Gateway) -> None:
    reply = _login(embedded, Origin=embedded.url)
    assert reply.status_code == 303 and reply.headers["location"] == "/ui"
    session, header = _cookie(reply)
    assert KEY not in header and len(session) >= 40  # a random id, not the key
    attributes = header.lower()
    assert "httponly" in attributes and "samesite=strict" in attributes and "path=/ui" in attributes
    assert "max-age=" in attributes and "secure" not in attributes  # plain http from a client
    page = _page(embedded, session)
    assert page.status_code == 200 and "team-a" in page.text and KEY not in page.text
    # a Referer of our own pages does as well as an Origin
    assert _login(embedded, Referer=embedded.url + "/ui/login").status_code == 303
    # a forged session id, or the key itself in the cookie, is no session
    assert _page(embedded, KEY).status_code == 303 and _page(embedded, "x" * 43).status_code == 303
    # a cross-site logout is refused and changes nothing
    forged = embedded.http("POST", "/ui/logout", headers={"Cookie": f"batchyard_session={session}",
                                                          "Origin": "https://evil.example"}, follow_redirects=False)
    assert forged.status_code == 403 and _page(embedded, session).status_code == 200
    out = embedded.http("POST", "/ui/logout", headers={"Cookie": f"batchyard_session={session}",
                                                       "Origin": embedded.url}, follow_redirects=False)
    assert out.status_code == 303
    again = _page(embedded, session)  # the id itself no longer opens anything, whatever the browser kept
    assert again.status_code == 303 and again.headers["location"] == "/ui/login"


def test_behind_a_tls_proxy_on_loopback_the_cookie_is_secure(embedded: Gateway) -> None:
    """uvicorn trusts 127.0.0.1 by default: its `X-Forwarded-Proto: https` makes the request https."""
    host = f"127.0.0.1:{embedded.port}"
    refused = _login(embedded, Origin=f"http://{host}", **{"X-Forwarded-Proto": "https"})
    assert refused.status_code == 403  # the page was served over https: an http origin is another site
    reply = _login(embedded, Origin=f"https://{host}", **{"X-Forwarded-Proto": "https"})
    assert reply.status_code == 303
    assert "secure" in _cookie(reply)[1].lower()


@pytest.mark.redis
@pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)
def test_a_session_opened_on_one_replica_is_read_by_another(
    upstream: Upstream, redis_server: RedisServer, tmp_path: Path,
) -> None:
    config = gateway_config(upstream, teams=TEAMS)
    # The second replica believes no proxy on this machine: a forwarded https is not https to it.
    with start_shared(config, tmp_path / "a", redis_server.url, with_worker=False) as first, \
            start_shared(config, tmp_path / "b", redis_server.url, with_worker=False,
                         args=("--forwarded-allow-ips", "10.9.9.9")) as second:
        reply = _login(first, Origin=first.url)
        session, _ = _cookie(reply)
        assert _page(second, session).status_code == 200
        stored = {k: redis_server.client().hgetall(k) for k in redis_server.client().keys("*session:*")}
        assert len(stored) == 1 and KEY not in str(stored) and session not in str(stored)
        untrusted = _login(second, Origin=second.url, **{"X-Forwarded-Proto": "https"})
        assert untrusted.status_code == 303 and "secure" not in _cookie(untrusted)[1].lower()
        out = second.http("POST", "/ui/logout", headers={"Cookie": f"batchyard_session={session}",
                                                         "Origin": second.url}, follow_redirects=False)
        assert out.status_code == 303
        assert _page(first, session).status_code == 303  # logged out on every replica
