"""The http allow-list: host:port entries, and the one strict parse of a URL into the target checked and used."""

from __future__ import annotations

import pytest

from oven.control.config import ControlConfig
from oven.control.runtime.http_allow import AllowList, HttpRefused, Target

ALLOW = AllowList.parse("api.example, 127.0.0.1:8080, [::1]:9000, Tools.Example.:8443")


def test_entries_name_a_port_and_a_bare_host_means_its_schemes_default():
    assert ALLOW.check("http://api.example/v1?q=1#frag") == Target("http", "api.example", 80, "/v1?q=1")
    assert ALLOW.check("https://api.example") == Target("https", "api.example", 443, "/")
    assert ALLOW.check("http://api.example:80/") == Target("http", "api.example", 80, "/")
    with pytest.raises(HttpRefused, match=r"port 443 of 'api.example' is not on the server's http allow-list"):
        ALLOW.check("http://api.example:443/")  # 443 belongs to https
    with pytest.raises(HttpRefused, match="port 8080 of 'api.example'"):
        ALLOW.check("http://api.example:8080/")
    assert ALLOW.check("http://127.0.0.1:8080/x").port == 8080
    with pytest.raises(HttpRefused, match="port 80 of '127.0.0.1'"):
        ALLOW.check("http://127.0.0.1/x")
    with pytest.raises(HttpRefused, match="port 8081 of '127.0.0.1'"):
        ALLOW.check("http://127.0.0.1:8081/x")
    with pytest.raises(HttpRefused, match="host 'localhost' is not on the server's http allow-list"):
        ALLOW.check("http://localhost:8080/")


def test_names_compare_without_case_or_trailing_dot_and_ipv6_in_brackets():
    assert ALLOW.check("https://TOOLS.example.:8443/a").host == "tools.example"
    assert ALLOW.check("HTTP://API.Example./").host == "api.example"
    assert ALLOW.check("http://[0:0::1]:9000/") == Target("http", "::1", 9000, "/")
    with pytest.raises(HttpRefused, match=r"port 80 of '\[::1\]'"):
        ALLOW.check("http://[::1]/")
    with pytest.raises(HttpRefused, match=r"host '\[::ffff:7f00:1\]' is not on"):
        ALLOW.check("http://[::ffff:127.0.0.1]:8080/")  # the same machine, another spelling: refused, not guessed


@pytest.mark.parametrize("url, error", [
    ("http://api.example@127.0.0.1:8080/", "user info"),
    ("http://user:pass@api.example/", "user info"),
    ("http://127.0.0.1:8080\\@api.example/", "backslashes"),
    ("http://api.example/\r\nX-Injected: 1", "control characters"),
    (" http://api.example/", "spaces"),
    ("http://api.exämple/", "non-ASCII"),
    ("http://api.example:80:81/", "is not host, host:port"),
    ("http://api.example:/", "is not host, host:port"),
    ("http://api.example:+80/", "is not host, host:port"),
    ("http://%61pi.example/", "is not host, host:port"),
    ("http://[::1%25lo]:9000/", "is not host, host:port"),
    ("http://[::1:9000/", "does not parse"),
    ("http://[fe80::1::2]:9000/", "does not parse"),
    ("http://api..example/", "is not a host name"),
    ("http://api.example:0/", "outside 1..65535"),
    ("http://api.example:65536/", "outside 1..65535"),
    ("ftp://api.example/", "only http:// and https://"),
    ("http:api.example/", "only http:// and https://"),
    ("http:///path", "is not host, host:port"),
])
def test_odd_urls_are_refused_not_guessed(url, error):
    with pytest.raises(HttpRefused, match=error):
        ALLOW.check(url)


def test_the_host_checked_is_the_host_connected_to():
    """What other parsers read as the host behind '#@' or '?@' is path here; the check sees the real host."""
    with pytest.raises(HttpRefused, match="host 'evil.example' is not on"):
        ALLOW.check("http://evil.example#@api.example/")
    with pytest.raises(HttpRefused, match="host 'evil.example' is not on"):
        ALLOW.check("http://evil.example?@api.example/")


@pytest.mark.parametrize("entry", ["http://api.example", "api.example:0", "::1", "[::1]:x", "[fe80::1::2]", "a b",
                                   "*.example"])
def test_a_bad_entry_fails_the_config_naming_it(entry):
    with pytest.raises(ValueError, match=r"http_allow: .* (is not|outside)"):
        ControlConfig(http_allow=f"api.example, {entry}")
