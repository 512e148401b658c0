"""The docs name one charge by one operation key (issue 20: doctor flagged the docs'
own example keys). The tutorial's charge of order 42 and the SDK's examples for the
same order, tool and arguments must build the same key; two keys for one intent is
exactly what `doctor`'s "same arguments, many keys" finding warns about.
"""

from __future__ import annotations

import re

from effect_broker.keys import business_key
from tests.docs_pages import page, snippet


def test_the_tutorial_and_the_sdk_examples_key_order_42_alike() -> None:
    tutorial = page("docs/tutorial/first-hour.md")
    found = re.search(r'"operation_key": "([^"]+)", "tool": "charge_card",', tutorial)
    assert found is not None
    key = found.group(1)
    assert key == business_key("order", "42", "charge")
    lambda_key = re.search(r'key=lambda order, \*\*_: f"([^"]+)"', snippet("sdk-first"))
    assert lambda_key is not None
    assert lambda_key.group(1).format(order="42") == key
