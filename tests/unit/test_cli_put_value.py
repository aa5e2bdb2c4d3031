"""`replog put`'s VALUE: JSON, else the text as a string, but text that opens like JSON and does
not parse is refused (exit 2, one line) instead of being stored as a string."""
from __future__ import annotations

import pytest

from node.cli import put_value


@pytest.mark.parametrize("text, value", [
    ('{"a": 1}', {"a": 1}), ("[1, 2]", [1, 2]), ('"quoted"', "quoted"), ("12", 12), ("null", None),
    ("hello", "hello"), ("1.2.3", "1.2.3"), ("not json", "not json"), ("", ""),
])
def test_json_or_plain_text(text, value):
    assert put_value(text, False) == value


@pytest.mark.parametrize("text", ["{bad", '{"a": 1,}', "[1, 2", '"unterminated', "  {x"])
def test_text_that_opens_like_json_and_does_not_parse_is_refused(text, capsys):
    with pytest.raises(SystemExit) as e:
        put_value(text, False)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("replog: error: VALUE is not valid JSON") and "--string" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["{bad", '{"a": 1}', "12", "hello"])
def test_string_stores_the_text_as_it_is(text):
    assert put_value(text, True) == text
