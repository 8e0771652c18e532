"""contract/quantity.py: sizes as bytes or Kubernetes quantities, one parser everywhere."""

from __future__ import annotations

import pytest

from sandbox_workspace.contract.quantity import parse_bytes


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(0, 0, id="zero-int"),
        pytest.param(1048576, 1048576, id="int"),
        pytest.param("1048576", 1048576, id="digits"),
        pytest.param("512Mi", 512 * 2**20, id="Mi"),
        pytest.param("1Gi", 2**30, id="Gi"),
        pytest.param("1.5Gi", 3 * 2**29, id="fraction-Gi"),
        pytest.param("64Ki", 65536, id="Ki"),
        pytest.param("2Ti", 2 * 2**40, id="Ti"),
        pytest.param("1Ei", 2**60, id="Ei"),
        pytest.param("500M", 500_000_000, id="M-decimal"),
        pytest.param("1k", 1000, id="k"),
        pytest.param("1G", 10**9, id="G"),
        pytest.param("1e9", 10**9, id="exponent"),
        pytest.param("1E3", 1000, id="exponent-upper"),
        pytest.param("+2Mi", 2 * 2**20, id="plus"),
        pytest.param(".5Ki", 512, id="leading-dot"),
        pytest.param("0.1", 1, id="fraction-rounds-up"),
        pytest.param(" 1Mi ", 2**20, id="whitespace"),
    ],
)
def test_parses(value: object, expected: int) -> None:
    assert parse_bytes(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(-1, id="negative-int"),
        pytest.param("-1Mi", id="negative"),
        pytest.param("1MB", id="MB-not-a-quantity"),
        pytest.param("1mi", id="lowercase-mi"),
        pytest.param("500m", id="milli"),
        pytest.param("", id="empty"),
        pytest.param("Mi", id="suffix-only"),
        pytest.param("1 Gi", id="inner-space"),
        pytest.param("1e99", id="huge-exponent"),
        pytest.param(True, id="bool"),
        pytest.param(1.5, id="float"),
        pytest.param(None, id="none"),
    ],
)
def test_refuses(value: object) -> None:
    with pytest.raises(ValueError, match=r"size|negative|range"):
        parse_bytes(value)
