"""operator/naming.py: session ids, and DNS-1123 names that are valid and collision-free."""

from __future__ import annotations

import re

import pytest

from sandbox_workspace.operator.naming import (
    ANNOTATION_NAMES,
    NAMES_CURRENT,
    SESSION_PREFIX,
    dns_name,
    legacy_children,
    runtime_pod_name,
    runtime_secret_name,
    session_id_for,
    session_name,
    session_name_for,
    tenant_of,
    user_id_from_session_id,
    workspace_claim_name,
    workspace_name,
)

RFC1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
HASH_SUFFIX = re.compile(r"-[0-9a-f]{16}$")  # 64 bits


def assert_label(value: str) -> None:
    assert RFC1123_LABEL.match(value), value
    assert len(value) <= 63, value


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("a", id="one-char"),
        pytest.param("0", id="one-digit"),
        pytest.param("alice", id="word"),
        pytest.param("sb-session-u-0123456789", id="session-id"),
        pytest.param("a--b", id="double-dash-inside"),
        pytest.param("123abc", id="leading-digit"),
        pytest.param("abc-1234567", id="seven-hex-not-a-suffix"),
        pytest.param("abc-123456789", id="nine-hex-not-a-suffix"),
        pytest.param("abc-1234567g", id="eight-chars-not-all-hex"),
        pytest.param("a" * 63, id="x63"),
    ],
)
def test_valid_ids_pass_through_unchanged(value: str) -> None:
    assert dns_name(value) == value


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("User", id="uppercase"),
        pytest.param("ALICE", id="all-uppercase"),
        pytest.param("a_b", id="underscore"),
        pytest.param("a.b", id="dot"),
        pytest.param("user@example.com", id="email"),
        pytest.param("数据", id="cjk-only"),
        pytest.param("café", id="accent"),
        pytest.param("\u212a", id="kelvin-sign-lowercases-to-ascii"),
        pytest.param("İstanbul", id="dotted-capital-i"),
        pytest.param("😀", id="emoji"),
        pytest.param("\ud800", id="lone-surrogate"),
        pytest.param("", id="empty"),
        pytest.param("-", id="dash-only"),
        pytest.param("---", id="dashes-only"),
        pytest.param("-a", id="leading-dash"),
        pytest.param("a-", id="trailing-dash"),
        pytest.param("a b", id="space"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("../../etc", id="traversal"),
        pytest.param("a" * 64, id="x64"),
        pytest.param("a" * 500, id="x500"),
        pytest.param("ab-" * 30, id="dashes-at-truncation-point"),
        pytest.param("a" * 53 + "-" + "b" * 20, id="dash-right-before-cut"),
        pytest.param("abc-deadbeef", id="ends-like-a-hash"),
        pytest.param("deadbeef-deadbeef", id="hashes-all-the-way"),
        pytest.param("x-00000000", id="looks-like-empty-slug-output"),
    ],
)
def test_any_id_gives_a_valid_label(value: str) -> None:
    name = dns_name(value)
    assert_label(name)
    assert name != value
    assert HASH_SUFFIX.search(name), "a changed slug carries the hash suffix"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("abc-deadbeef", id="hex-suffix"),
        pytest.param("sb-session-u-01234567", id="session-id-ending-in-8-hex"),
        pytest.param("a" * 54 + "-0123abcd", id="x63-ending-in-hex"),
        pytest.param("sb-session-u-0123456789abcdef", id="ends-in-16-hex"),
    ],
)
def test_valid_ids_that_end_like_a_hash_are_hashed_again(value: str) -> None:
    assert RFC1123_LABEL.match(value) and len(value) <= 63
    name = dns_name(value)
    assert name != value
    assert_label(name)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param("User", "user", id="case"),
        pytest.param("USER", "User", id="case-both-changed"),
        pytest.param("a_b", "a-b", id="underscore-vs-dash"),
        pytest.param("a.b", "a-b", id="dot-vs-dash"),
        pytest.param("a.b", "a_b", id="dot-vs-underscore"),
        pytest.param("a--b", "a-b", id="double-dash-vs-dash"),
        pytest.param("a__b", "a_b", id="runs-collapse"),
        pytest.param("-a", "a", id="leading-dash"),
        pytest.param("数据", "数", id="unicode-both-empty-slugs"),
        pytest.param("", "x", id="empty-vs-x"),
        pytest.param("a" * 70 + "x", "a" * 70 + "y", id="long-differ-at-end"),
        pytest.param("a" * 64, "a" * 65, id="long-differ-in-length"),
        pytest.param("a" * 63, "a" * 64, id="x63-vs-x64"),
        pytest.param("abc-12345678", dns_name("abc-12345678"), id="id-vs-its-own-slug"),
        pytest.param("User", dns_name("User"), id="changed-id-vs-its-slug"),
        pytest.param("", dns_name(""), id="empty-vs-its-slug"),
        pytest.param("a" * 64, dns_name("a" * 64), id="long-vs-its-slug"),
    ],
)
def test_distinct_ids_never_collide(a: str, b: str) -> None:
    assert a != b
    assert dns_name(a) != dns_name(b)


def test_no_collisions_across_a_corpus() -> None:
    corpus = {
        *(f"{base}{sep}{n}" for base in ("u", "U", "user") for sep in "-_. " for n in range(50)),
        *("a" * n for n in range(1, 130)),
        *(dns_name(f"seed{n}") for n in range(50)),
        "",
        "-",
        "数据",
        "数",
    }
    names = {dns_name(v) for v in corpus}
    assert len(names) == len(corpus)
    for name in names:
        assert_label(name)


def test_dns_name_is_deterministic() -> None:
    for value in ("alice", "User_1", "数据", "a" * 100, ""):
        assert dns_name(value) == dns_name(value)
    assert dns_name("User") == "user-" + dns_name("User")[-16:]


@pytest.mark.parametrize(
    "user_id",
    [
        pytest.param("alice", id="plain"),
        pytest.param("u-0123456789", id="test-user"),
        pytest.param("User@Example.com", id="email"),
        pytest.param("数据", id="unicode"),
        pytest.param("sb-session-x", id="prefix-inside"),
    ],
)
def test_session_id_round_trip(user_id: str) -> None:
    session_id = session_id_for(user_id)
    assert session_id == f"sb-session-{user_id}"
    assert session_id.startswith(SESSION_PREFIX)
    assert user_id_from_session_id(session_id) == user_id


@pytest.mark.parametrize(
    "session_id",
    [
        pytest.param("sb-session-", id="prefix-only"),
        pytest.param("", id="empty"),
        pytest.param("alice", id="no-prefix"),
        pytest.param("SB-SESSION-alice", id="wrong-case"),
        pytest.param("xsb-session-alice", id="prefix-not-at-start"),
    ],
)
def test_user_id_from_foreign_session_id_is_none(session_id: str) -> None:
    assert user_id_from_session_id(session_id) is None


PAIRS = [
    ("default", "bob"),
    ("acme", "bob"),
    ("acme", "bob@acme"),
    ("acme-bob", "x"),
    ("acme", "bob-x"),
    ("a", "b-c"),
    ("a-b", "c"),
    ("Acme Corp", "数据"),
    ("t" * 128, "u" * 128),
]


@pytest.mark.parametrize(("tenant", "user_id"), PAIRS)
def test_a_tenants_session_id_reads_back_and_names_a_label(tenant: str, user_id: str) -> None:
    session_id = session_id_for(user_id, tenant)
    assert (tenant_of(session_id), user_id_from_session_id(session_id)) == (tenant, user_id)
    name = session_name(session_id)
    assert name == session_name_for(user_id, tenant)
    assert_label(name)


def test_the_default_tenant_keeps_sb_session_user_and_no_pair_shares_an_id() -> None:
    assert session_id_for("bob", "default") == session_id_for("bob") == "sb-session-bob"
    # A default-tenant user id that spells another tenant's session id stays apart.
    tricky = [("default", session_id_for("bob", "acme")), ("default", "bob@acme")]
    pairs = PAIRS + tricky
    ids = {session_id_for(u, t) for t, u in pairs}
    names = {session_name_for(u, t) for t, u in pairs}
    assert len(ids) == len(names) == len(pairs)


@pytest.mark.parametrize(
    "session_id",
    ["sb-tenant-", "sb-tenant-4-acme", "sb-tenant-4-acme-", "sb-tenant-04-acme-b",
     "sb-tenant-9-acme-b", "sb-tenant-x-acme-b", "sb-tenant-7-default-b"],
)  # fmt: skip
def test_malformed_tenant_session_ids_name_nothing(session_id: str) -> None:
    assert tenant_of(session_id) is None and session_name(session_id) is None


# -- collisions the 32-bit names had, and the names objects made with them keep -----------

# The review's pairs (security-2026-11-28 H1): each shared one name under the 32-bit hash.
TENANT = "3f2b9c1e-8a7d-4e2f-9b1c-0d5e6f7a8b9c"
SESSION_PAIR = ("PRobEuSeR._...___", "probeuSEr.__.....")
CONVERSATION_PAIR = (("alice@example.com", "chat-44515"), ("alicia@example.com", "chat-56618"))


def test_the_reviews_colliding_users_have_their_own_sessions_now() -> None:
    a, b = (session_id_for(u) for u in SESSION_PAIR)
    legacy = {dns_name(a, legacy=True), dns_name(b, legacy=True)}
    assert legacy == {"sb-session-probeuser-5c586116"}, "the pair collided under the old names"
    assert session_name(a) != session_name(b)
    assert HASH_SUFFIX.search(session_name(a))


def test_the_reviews_colliding_conversations_have_their_own_workspaces_now() -> None:
    (ua, ca), (ub, cb) = CONVERSATION_PAIR
    sa, sb = session_id_for(ua, TENANT), session_id_for(ub, TENANT)
    legacy_a = workspace_name(session_name(sa, legacy=True), ca, legacy=True)
    legacy_b = workspace_name(session_name(sb, legacy=True), cb, legacy=True)
    assert legacy_a == legacy_b, "the pair collided under the old names"
    assert workspace_name(session_name(sa), ca) != workspace_name(session_name(sb), cb)


def _birthday(names, count: int) -> tuple[str, str]:
    """Two of ``count`` generated ids that ``names`` maps to one name (the attack)."""
    seen: dict[str, str] = {}
    for n in range(count):
        user = f"user.{n}"
        name = names(user)
        if name in seen:
            return seen[name], user
        seen[name] = user
    raise AssertionError("no collision found")


def test_a_collision_constructed_against_the_old_names_misses_the_new_ones() -> None:
    # A long tenant id leaves 4 characters of the user id in the slug: only the hash
    # tells users apart. 32 bits fall to a birthday search of ~2^16 tries.
    def legacy(user: str) -> str:
        return session_name(session_id_for(user, TENANT), legacy=True)

    a, b = _birthday(legacy, 400_000)
    assert legacy(a) == legacy(b)
    assert session_name_for(a, TENANT) != session_name_for(b, TENANT)
    for child in (runtime_pod_name, runtime_secret_name, workspace_claim_name):
        assert child(session_name_for(a, TENANT)) != child(session_name_for(b, TENANT))


def test_children_of_colliding_long_session_names_differ_now() -> None:
    # Valid, unhashed session names of 54-63 characters: their claim names are hashed.
    # A collision found against the old claim names must miss the new ones.
    def legacy_claim(user: str) -> str:
        name = session_name_for("u" * 40 + user.replace(".", ""))
        assert len(name) > 53 and not HASH_SUFFIX.search(name)
        return workspace_claim_name(name, legacy=True)

    a, b = _birthday(legacy_claim, 400_000)
    names = [session_name_for("u" * 40 + u.replace(".", "")) for u in (a, b)]
    assert workspace_claim_name(names[0]) != workspace_claim_name(names[1])


@pytest.mark.parametrize(
    ("value", "legacy_name"),
    [
        pytest.param("sb-session-alice", "sb-session-alice", id="valid-unchanged"),
        pytest.param("sb-session-PRobEuSeR._...___", "sb-session-probeuser-5c586116", id="hashed"),
        pytest.param("x-0123456789abcdef", "x-0123456789abcdef", id="16-hex-was-kept"),
    ],
)
def test_legacy_names_are_exactly_the_old_ones(value: str, legacy_name: str) -> None:
    assert dns_name(value, legacy=True) == legacy_name


def test_a_current_name_never_equals_another_ids_legacy_name() -> None:
    ids = [f"sb-session-{u}" for u in ("alice", "Alice", "x-0123456789abcdef", "a" * 80)]
    legacy = {dns_name(v, legacy=True) for v in ids}
    for v in ids:
        current = dns_name(v)
        assert current not in legacy - {dns_name(v, legacy=True)}


def test_sessions_without_the_names_annotation_keep_legacy_children() -> None:
    assert legacy_children(None) and legacy_children({})
    assert not legacy_children({ANNOTATION_NAMES: NAMES_CURRENT})
    long_name = session_name_for("u" * 50)
    assert workspace_claim_name(long_name, legacy=True) != workspace_claim_name(long_name)
