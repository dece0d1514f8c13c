"""Token strength: the estimate, the refusal, and `compass token`."""

from __future__ import annotations

import math
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from compass.errors import ConfigError
from compass.security import MIN_TOKEN_BITS, check_token, new_token, token_bits

ROOT = Path(__file__).resolve().parents[2]
HOOK_TOKEN = "hook-smoke-token-0123456789abcdef"  # what the repo's session hook starts with


@pytest.mark.parametrize(
    ("token", "bits"),
    [
        ("", 0.0),
        ("0123456789", 10 * math.log2(10)),  # digits only
        ("deadbeef" * 3 + "01234567", 32 * 4.0),  # hex: 4 bits a character
        ("DEADBEEF01234567", 16 * 4.0),  # upper-case hex too
        ("abcxyz", 6 * math.log2(26)),  # one case of letters
        ("right-token", 11 * math.log2(26 + 5)),  # '-' counts as base64url's alphabet
        ("Ab1" + "x" * 5, 8 * math.log2(62)),  # base64-ish: letters of both cases and digits
        ("Ab1!" + "x" * 4, 8 * math.log2(62 + 32)),  # other punctuation: printable ASCII
        (HOOK_TOKEN, len(HOOK_TOKEN) * math.log2(26 + 10 + 5)),
        ("a" * 40, 4.0),  # one repeated character: hex-like, counted once
        ("ab" * 20, 2 * 4.0),  # a repeating unit counts once
        ("xyz1" * 10, 4 * math.log2(36)),
    ],
)
def test_token_bits(token: str, bits: float) -> None:
    assert token_bits(token) == pytest.approx(bits)


@pytest.mark.parametrize(
    ("token", "strong"),
    [
        # random ones named by how they are made: the same test ids in every process of `-n`
        pytest.param(secrets.token_hex(16), True, id="token_hex(16)"),  # the README's: 128 bits
        pytest.param(secrets.token_hex(15), False, id="token_hex(15)"),
        # token_urlsafe(16), fixed: a random one lacks digits, '-' and '_' about 1 time in 100
        # (22 characters of 52 classes: 125 bits by the estimate), which made this flaky
        ("Qx3-kL9_pZr2TbW7yNc0aE", True),
        ("tcabSfjMYCLURmlDCMfapw", False),
        pytest.param(secrets.token_urlsafe(8), False, id="token_urlsafe(8)"),
        (HOOK_TOKEN, True),
        ("right-token", False),
        ("cluster-secret", False),
        ("correct horse battery staple", True),  # generous to phrases: ~164 bits by classes
        ("0" * 64, False),
    ],
)
def test_check_token(token: str, strong: bool) -> None:
    if strong:
        check_token(token)
    else:
        with pytest.raises(ConfigError, match=r"too weak.*`compass token`.*--allow-weak-token"):
            check_token(token)
    check_token(token, allow_weak=True)


def test_new_tokens_are_strong_and_fresh() -> None:
    tokens = {new_token() for _ in range(8)}
    assert len(tokens) == 8
    assert all(token_bits(t) >= 2 * MIN_TOKEN_BITS for t in tokens)


def _compass(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compass", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("COMPASS_")},
    )


def test_compass_token_prints_a_token_that_passes_the_check() -> None:
    done = _compass("token")
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert len(token) == 64 and set(token) <= set("0123456789abcdef")
    check_token(token)


def test_a_worker_with_a_weak_token_exits_2_with_one_line() -> None:
    done = _compass("worker", "start", "--token", "right-token", "--port", "0")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "too weak" in lines[0] and "about 54 bits" in lines[0]


def test_a_worker_on_a_non_loopback_address_needs_a_token() -> None:
    done = _compass("worker", "start", "--host", "0.0.0.0", "--port", "0")  # no COMPASS_*
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "bound to 0.0.0.0 needs a cluster token" in lines[0]
