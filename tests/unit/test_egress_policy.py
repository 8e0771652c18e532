"""The egress policy's pure decisions: host matching, IP literals, forbidden addresses."""

from __future__ import annotations

import ipaddress
import ssl

import pytest

from sandbox_workspace.egress.policy import (
    DEFAULT_FORBIDDEN,
    EgressPolicy,
    PolicyError,
    Rule,
    canonical_host,
    check_addresses,
    decide,
    forbidden_match,
    forbidden_networks,
    ip_literal,
)
from sandbox_workspace.egress.tls import NEED_MORE, NotClientHello, client_hello_sni

POLICY = EgressPolicy(
    (
        Rule.make("pypi.org"),
        Rule.make("*.pythonhosted.org"),
        Rule.make("api.example.com", ports=[8080], schemes=["http"]),
    )
)


@pytest.mark.parametrize(
    ("host", "port", "scheme", "allowed"),
    [
        ("pypi.org", 443, "https", True),
        ("PyPI.org.", 443, "https", True),  # one name, however spelled
        ("files.pythonhosted.org", 443, "https", True),
        ("a.b.pythonhosted.org", 443, "https", True),
        ("pythonhosted.org", 443, "https", False),  # *.suffix does not match the apex
        ("evilpythonhosted.org", 443, "https", False),  # nor a name merely ending alike
        ("pypi.org.evil.test", 443, "https", False),
        ("pypi.org", 80, "http", False),  # scheme
        ("pypi.org", 8443, "https", False),  # port
        ("api.example.com", 8080, "http", True),
        ("api.example.com", 443, "https", False),
    ],
)
def test_decide_by_host_port_scheme(host, port, scheme, allowed):
    assert decide(POLICY, scheme, host, port).allowed is allowed


def test_refusals_say_what_to_change():
    assert "evil.test is not in this session's egress policy (allowed: pypi.org" in (
        decide(POLICY, "https", "evil.test", 443).reason
    )
    assert "port 8443" in decide(POLICY, "https", "pypi.org", 8443).reason
    assert "http to pypi.org" in decide(POLICY, "http", "pypi.org", 80).reason
    assert "no egress policy" in decide(None, "https", "pypi.org", 443).reason
    assert decide(EgressPolicy(), "https", "pypi.org", 443).allowed is False  # deny by default


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "[::1]", "::ffff:169.254.169.254", "2130706433", "0x7f.1", "127.1"]
)
def test_ip_literals_are_never_allowed(host):
    assert ip_literal(host) is not None
    decision = decide(EgressPolicy((Rule.make("*.org"),)), "https", host, 443)
    assert not decision.allowed and "raw IP address" in decision.reason


def test_names_are_canonical_or_refused():
    assert canonical_host("Bücher.Example.") == "xn--bcher-kva.example"
    for bad in ("", "a..b", "a b.com", "x" * 64 + ".com"):
        with pytest.raises(PolicyError):
            canonical_host(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"host": "10.0.0.1"}, "not IP addresses"),
        ({"host": "a.*.com"}, "not a valid host name"),
        ({"host": "a.com", "ports": [0]}, "ports must be"),
        ({"host": "a.com", "ports": []}, "ports must be"),
        ({"host": "a.com", "schemes": ["ftp"]}, "schemes must be"),
    ],
)
def test_rule_validation(kwargs, message):
    with pytest.raises(PolicyError, match=message):
        Rule.make(**kwargs)


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",  # cloud metadata
        "10.96.0.1",
        "127.0.0.53",
        "::1",
        "fd00:ec2::254",  # the IPv6 metadata address
        "::ffff:169.254.169.254",  # IPv4-mapped
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b:1::a9fe:a9fe",  # local-use NAT64 prefix (RFC 8215)
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:f5fe:f5fe",  # Teredo, client 10.1.10.1 (obfuscated)
        "::a9fe:a9fe",  # IPv4-compatible (deprecated) 169.254.169.254
        "0.0.0.0",
    ],
)
def test_internal_addresses_are_forbidden(address):
    assert forbidden_match(ipaddress.ip_address(address), DEFAULT_FORBIDDEN) is not None


def test_public_addresses_pass_and_extra_ranges_apply():
    public = ipaddress.ip_address("151.101.0.223")
    assert forbidden_match(public, DEFAULT_FORBIDDEN) is None
    assert forbidden_match(public, forbidden_networks(["151.101.0.0/16"])) is not None
    with pytest.raises(PolicyError):
        forbidden_networks(["not-a-cidr"])


def test_one_internal_address_refuses_the_name():
    addresses = [ipaddress.ip_address("151.101.0.223"), ipaddress.ip_address("10.0.0.5")]
    checked = check_addresses("mixed.test", addresses, DEFAULT_FORBIDDEN)
    assert checked.addresses == [] and "10.0.0.5" in checked.refusal
    assert "does not resolve" in check_addresses("none.test", [], DEFAULT_FORBIDDEN).refusal


def client_hello(server_hostname: str | None) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = server_hostname is not None
    if server_hostname is None:
        ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_sni_of_a_real_client_hello():
    hello = client_hello("Files.PythonHosted.org")
    assert client_hello_sni(hello) == "files.pythonhosted.org"
    assert client_hello_sni(hello[:3]) is NEED_MORE
    assert client_hello_sni(hello[: len(hello) // 2]) is NEED_MORE


def test_sni_of_a_hello_split_over_two_records():
    body = client_hello("pypi.org")[5:]
    split = b"".join(
        b"\x16\x03\x01" + len(part).to_bytes(2) + part for part in (body[:40], body[40:])
    )
    assert client_hello_sni(split[:50]) is NEED_MORE
    assert client_hello_sni(split) == "pypi.org"


@pytest.mark.parametrize(
    "data",
    [b"GET / HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x00\x00", b"\x17\x03\x03\x00\x05hello"],
)
def test_not_a_client_hello(data):
    with pytest.raises(NotClientHello):
        client_hello_sni(data)


def test_hello_without_sni_is_refused():
    with pytest.raises(NotClientHello, match="no server name"):
        client_hello_sni(client_hello(None))
