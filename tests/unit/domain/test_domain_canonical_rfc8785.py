"""RFC 8785 (JCS) test vectors, and where the broker's number profile departs from them.

The rule, stated once in README "JSON shapes" > "Numbers": every JSON number must be
finite and, read as an IEEE-754 double (an integer without fraction or exponent: read
exactly), lie within ±(2^53-1); a non-zero number that would read as 0 is refused.
Within that range the bytes are RFC 8785's. RFC 8785 itself accepts every finite
double; its own note on Appendix B says values meant as integers SHOULD stay within
±(2^53-1), and its output for doubles between 2^53 and 1e21 is a run of integer digits
(2^68 -> ``295147905179352830000``) that a reader of exact integers (Python, Go's
json.Number, Java's BigDecimal) takes for a different number than the double. So the
broker keeps the stricter profile, and the RFC's ``values`` vector, which holds
``1E30``, is refused by rule rather than by accident.

Vectors: RFC 8785 sections 3.2.2-3.2.3 and Appendix B, and the input/output pairs its
reference implementation publishes (cyberphone/json-canonicalization, testdata/).
"""

from __future__ import annotations

import hashlib
import struct

import pytest

from effect_broker.domain.canonical import (
    MAX_SAFE_INTEGER,
    canonical_json,
    parse_json_strict,
)
from effect_broker.domain.errors import InvalidJsonError, NumberOutOfRangeError
from effect_broker.domain.keys import request_hash

# --- the published input/output pairs ----------------------------------------------

ARRAYS = '[\n  56,\n  {\n    "d": true,\n    "10": null,\n    "1": [ ]\n  }\n]\n'
STRUCTURES = (
    '{\n  "1": {"f": {"f": "hi","F": 5} ,"\\n": 56.0},\n  "10": { },\n'
    '  "": "empty",\n  "a": { },\n  "111": [ {"e": "yes","E": "no" } ],\n  "A": { }\n}\n'
)
FRENCH = (
    '{\n  "peach": "This sorting order",\n  "p\u00e9ch\u00e9": "is wrong according to '
    'French",\n  "p\u00eache": "but canonicalization MUST",\n'
    '  "sin":   "ignore locale"\n}\n'
)
UNICODE = '{\n  "Unnormalized Unicode":"A\\u030a"\n}\n'
WEIRD = (
    '{\n  "\\u20ac": "Euro Sign",\n  "\\r": "Carriage Return",\n  "\\u000a": "Newline",\n'
    '  "1": "One",\n  "\\u0080": "Control\\u007f",\n  "\\ud83d\\ude02": "Smiley",\n'
    '  "\\u00f6": "Latin Small Letter O With Diaeresis",\n'
    '  "\\ufb33": "Hebrew Letter Dalet With Dagesh",\n'
    '  "</script>": "Browser Challenge"\n}\n'
)
VALUES_STRING_AND_LITERALS = (
    '"string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",\n'
    '  "literals": [null, true, false]\n}\n'
)
VALUES = (
    '{\n  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, '
    "0.000000000000000000000000001],\n  " + VALUES_STRING_AND_LITERALS
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ARRAYS, b'[56,{"1":[],"10":null,"d":true}]'),
        (
            STRUCTURES,
            b'{"":"empty","1":{"\\n":56,"f":{"F":5,"f":"hi"}},"10":{},'
            b'"111":[{"E":"no","e":"yes"}],"A":{},"a":{}}',
        ),
        (
            FRENCH,
            b'{"peach":"This sorting order","p\xc3\xa9ch\xc3\xa9":"is wrong according to '
            b'French","p\xc3\xaache":"but canonicalization MUST","sin":"ignore locale"}',
        ),
        (UNICODE, b'{"Unnormalized Unicode":"A\xcc\x8a"}'),
        (
            WEIRD,
            b'{"\\n":"Newline","\\r":"Carriage Return","1":"One",'
            b'"</script>":"Browser Challenge","\xc2\x80":"Control\x7f",'
            b'"\xc3\xb6":"Latin Small Letter O With Diaeresis",'
            b'"\xe2\x82\xac":"Euro Sign","\xf0\x9f\x98\x82":"Smiley",'
            b'"\xef\xac\xb3":"Hebrew Letter Dalet With Dagesh"}',
        ),
    ],
    ids=["arrays", "structures", "french", "unicode", "weird"],
)
def test_given_an_rfc8785_vector_then_the_bytes_are_the_published_output(
    text: str, expected: bytes
) -> None:
    assert canonical_json(parse_json_strict(text)) == expected


def test_given_the_rfc8785_values_vector_then_1e30_is_refused_by_the_range_rule() -> None:
    # Given the RFC's "values" input, whose numbers include 1E30
    # When it is parsed, Then the refusal names that number's place and the range
    with pytest.raises(NumberOutOfRangeError) as caught:
        parse_json_strict(VALUES)
    assert caught.value.code == "number_out_of_range"
    assert caught.value.details == {"path": "$.numbers[1]"}
    assert str(caught.value) == (
        "number at $.numbers[1] is outside ±(2**53-1); money and big numbers travel "
        "as strings or minor-unit integers"
    )


def test_given_the_values_vector_without_1e30_then_the_rest_is_the_published_output() -> (
    None
):
    # Every other value of the vector (four numbers, the escapes, the literals) is
    # accepted and canonicalised exactly as the RFC's output shows.
    text = (
        '{\n  "numbers": [333333333.33333329, 4.50, 2e-3, 0.000000000000000000000000001],'
        "\n  " + VALUES_STRING_AND_LITERALS
    )
    assert canonical_json(parse_json_strict(text)) == (
        b'{"literals":[null,true,false],"numbers":[333333333.3333333,4.5,0.002,1e-27],'
        b'"string":"\xe2\x82\xac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )


# --- RFC 8785 Appendix B: number serialisation samples ------------------------------


def _double(bits: str) -> float:
    return float(struct.unpack(">d", bytes.fromhex(bits))[0])


ACCEPTED_SAMPLES = [
    ("0000000000000000", b"0"),
    ("8000000000000000", b"0"),  # minus zero
    ("0000000000000001", b"5e-324"),  # smallest positive double
    ("8000000000000001", b"-5e-324"),
    ("3eb0c6f7a0b5ed8c", b"9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", b"0.000001"),
    ("41b3de4355555553", b"333333333.3333332"),
    ("41b3de4355555554", b"333333333.33333325"),
    ("41b3de4355555555", b"333333333.3333333"),
    ("41b3de4355555556", b"333333333.3333334"),
    ("41b3de4355555557", b"333333333.33333343"),
    ("becbf647612f3696", b"-0.0000033333333333333333"),
    ("43143ff3c1cb0959", b"1424953923781206.2"),  # round to even
]

# Finite doubles RFC 8785 serialises but the broker refuses: beyond ±(2^53-1).
REFUSED_SAMPLES = [
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
]


@pytest.mark.parametrize(("bits", "expected"), ACCEPTED_SAMPLES)
def test_given_an_appendix_b_sample_in_range_then_it_serialises_as_the_rfc_says(
    bits: str, expected: bytes
) -> None:
    number = _double(bits)
    assert canonical_json(number) == expected
    # and the RFC's text of it reads back to the same bytes
    assert canonical_json(parse_json_strict(expected)) == expected


@pytest.mark.parametrize(("bits", "rfc_text"), REFUSED_SAMPLES)
def test_given_an_appendix_b_sample_beyond_2_pow_53_then_number_out_of_range(
    bits: str, rfc_text: str
) -> None:
    number = _double(bits)
    assert abs(number) > MAX_SAFE_INTEGER
    with pytest.raises(NumberOutOfRangeError):
        canonical_json({"n": number})
    # written as the RFC writes it, it is refused on parse too: the same rule
    with pytest.raises(NumberOutOfRangeError):
        parse_json_strict('{"n": ' + rfc_text + "}")


@pytest.mark.parametrize(
    ("bits", "name"), [("7fffffffffffffff", "NaN"), ("7ff0000000000000", "Infinity")]
)
def test_given_an_appendix_b_non_finite_sample_then_invalid_json(
    bits: str, name: str
) -> None:
    # RFC 8785 section 3.2.2.2: NaN and Infinity MUST cause an error.
    with pytest.raises(InvalidJsonError) as caught:
        canonical_json([_double(bits)])
    assert type(caught.value) is InvalidJsonError
    with pytest.raises(InvalidJsonError):
        parse_json_strict(f"[{name}]")


def test_given_the_doubles_next_to_the_bound_then_the_rule_reads_the_double() -> None:
    # 9007199254740991.4 reads as the double 2^53-1: accepted; .5 reads as 2^53 (ties
    # to even): refused. The rule is on the double read, as stated.
    assert canonical_json(parse_json_strict("9007199254740991.4")) == b"9007199254740991"
    with pytest.raises(NumberOutOfRangeError):
        parse_json_strict("9007199254740991.5")


# --- hashes of accepted inputs do not move ------------------------------------------

PINNED_REQUESTS = [
    # (arguments, canonical document, sha256 of it)
    (
        {"amount": 1000, "currency": "EUR"},
        b'{"arguments":{"amount":1000,"currency":"EUR"},"contract_name":"payments.charge",'
        b'"contract_version":"1","tool":"charge_card"}',
        "1498613a729c951ad1c0820f1dfb23b5006f39fa68505033c5c615eac87af6e9",
    ),
    (
        {"rate": 0.1, "big": 9007199254740991, "neg": -0.0, "one": 1.0, "tiny": 1e-27},
        b'{"arguments":{"big":9007199254740991,"neg":0,"one":1,"rate":0.1,"tiny":1e-27},'
        b'"contract_name":"payments.charge","contract_version":"1","tool":"charge_card"}',
        "10c5eaf8016e640498a45ebf160f6ae28f091b8aa45f66e3f60162b651e21983",
    ),
    (
        {"\u20ac": "\u00e9", "\U0001f602": [None, True], "a\nb": "\u000f"},
        b'{"arguments":{"a\\nb":"\\u000f","\xe2\x82\xac":"\xc3\xa9",'
        b'"\xf0\x9f\x98\x82":[null,true]},"contract_name":"payments.charge",'
        b'"contract_version":"1","tool":"charge_card"}',
        "6e097e824c065395767947b0003b1a4991a44926c692c5d3a5bb236bc8eaa63b",
    ),
]


@pytest.mark.parametrize(("arguments", "document", "digest"), PINNED_REQUESTS)
def test_given_a_previously_accepted_request_then_its_hash_is_unchanged(
    arguments: dict[str, object], document: bytes, digest: str
) -> None:
    # Ledger rows hold keyed hashes of these bytes: a change in canonical form would
    # turn every replay of an existing effect into a conflict.
    hashed = request_hash(
        tool="charge_card",
        arguments=arguments,
        contract_name="payments.charge",
        contract_version="1",
    )
    assert hashlib.sha256(document).hexdigest() == digest
    assert hashed.hex() == digest
