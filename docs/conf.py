"""Sphinx configuration for the effect-broker docs site (Sphinx + MyST + Furo).

Why Sphinx and MyST: procrastinate, the job queue the broker runs on, documents itself
the same way; MyST reads the Markdown these pages were already written in; and
``sphinx-build -W -n`` turns every broken link, missing page and unresolved reference
into a failed build (``tests/unit/docs/test_docs_build.py`` and ``.ci/run`` run it so).
Reference pages that can be generated from the code are (``_ext/reference_pages.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "effect-broker"
author = "effect-broker developers"
copyright = "2026, effect-broker developers"

extensions = ["myst_parser", "reference_pages"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "reference/_generated", "benchmarks/*.json"]

# Heading anchors for [text](page.md#a-heading) links, as GitHub renders them.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
# Bare http(s) URLs in prose stay text; only explicit links are links.
myst_linkify_fuzzy_links = False

html_theme = "furo"
html_title = "effect-broker"
# The OpenAPI document, served next to the pages that describe it.
html_extra_path = ["reference/_generated/openapi.json"]

nitpicky = True
suppress_warnings: list[str] = []
