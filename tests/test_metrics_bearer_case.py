"""The metrics endpoint takes its bearer token under any case of the scheme's name (RFC 9110,
section 11.1: authentication schemes are case-insensitive), through a real server; the token itself
is still compared exactly."""

from __future__ import annotations

import pytest

from tests.test_metrics import TOKEN, Scraper, scraper  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "bEaReR"])
def test_the_token_is_accepted_whatever_the_case_of_the_scheme(scraper: Scraper, scheme: str) -> None:  # noqa: F811
    status, headers, body = scraper.get({"Authorization": f"{scheme} {TOKEN}"})
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=")
    assert "workhorse_enqueue_requests" in body

    for wrong in (f"{scheme} {TOKEN.upper()}", f"{scheme} {TOKEN[:-1]}", f"{scheme}{TOKEN}", f"{scheme}x {TOKEN}"):
        status, headers, body = scraper.get({"Authorization": wrong})
        assert (status, headers["www-authenticate"]) == (401, 'Bearer realm="workhorse-metrics"')
        assert "workhorse_" not in body
