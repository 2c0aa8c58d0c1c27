"""Month names of kernel log time stamps: glibc's abbreviations, every locale, with or without a dot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stream.inputs.parsers.kernel_times import MONTH_ABBREVIATIONS, month_number

LOCALES = Path("/usr/share/i18n/locales")


def glibc_months(locale: str, key: str) -> list[str]:
    text = (LOCALES / locale).read_text(encoding="utf-8", errors="replace")
    match = re.search(rf"^{key}\s+(.*?)(?=^\S)", text, re.S | re.M)
    assert match, (locale, key)
    found = re.findall(r'"([^"]*)"', match.group(1))
    return [re.sub(r"<U([0-9A-Fa-f]{4,8})>", lambda m: chr(int(m.group(1), 16)), v) for v in found]


@pytest.mark.parametrize("name", sorted(MONTH_ABBREVIATIONS))
def test_the_table_is_glibcs(name: str) -> None:
    locale, _, alt = name.partition(" ")
    if not (LOCALES / locale).exists():
        pytest.skip(f"glibc locale sources not installed here ({LOCALES / locale})")
    assert list(MONTH_ABBREVIATIONS[name]) == glibc_months(locale, "ab_alt_mon" if alt else "abmon")


@pytest.mark.parametrize("name", sorted(MONTH_ABBREVIATIONS))
def test_every_abbreviation_reads_as_its_month_in_any_case_with_or_without_the_dot(name: str) -> None:
    for number, month in enumerate(MONTH_ABBREVIATIONS[name], 1):
        for spelling in {month, month.rstrip("."), month.rstrip(".") + ".", month.upper(), month.lower()}:
            assert month_number(spelling) == number, (name, spelling)


def test_cjk_months_and_unknown_words() -> None:
    assert [month_number(f"{n}月") for n in (1, 10, 12)] == [1, 10, 12]
    assert month_number("12월") == 12
    assert month_number("13月") is None
    assert month_number("Foo") is None
    assert month_number("") is None
