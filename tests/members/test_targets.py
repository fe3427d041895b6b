"""Which configured URLs are members and which are names to resolve, and the URL of a
discovered address. In process."""

from __future__ import annotations

from router.members.targets import configured, member_url
from router.origin import Origin
from router.pools import BASELINE, SPECULATIVE


def test_static_takes_every_url_as_it_stands() -> None:
    members, watches = configured(
        {SPECULATIVE: ["http://eagle3:30000"], BASELINE: ["http://10.0.0.9:30000"]}, "static"
    )
    assert members == [(SPECULATIVE, "http://eagle3:30000"), (BASELINE, "http://10.0.0.9:30000")]
    assert watches == []


def test_dns_resolves_names_and_keeps_addresses() -> None:
    members, watches = configured(
        {
            SPECULATIVE: ["http://eagle3.llm.svc.cluster.local:30000"],
            BASELINE: ["http://10.0.0.9:30000", "https://[fd00::2]:8443"],
        },
        "dns",
    )
    assert members == [(BASELINE, "http://10.0.0.9:30000"), (BASELINE, "https://[fd00::2]:8443")]
    (watch,) = watches
    assert (watch.pool, watch.name) == (SPECULATIVE, "eagle3.llm.svc.cluster.local")
    assert watch.member_url("10.1.2.3") == "http://10.1.2.3:30000"


def test_a_member_url_keeps_the_scheme_port_and_path() -> None:
    template = Origin.parse("https://engines.local/prefix/")
    assert member_url(template, "10.1.2.3") == "https://10.1.2.3:443/prefix"
    assert member_url(template, "fd00::1") == "https://[fd00::1]:443/prefix"
    assert Origin.parse(member_url(template, "fd00::1")).host == "fd00::1"
