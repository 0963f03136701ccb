"""mkdocs hooks of ``make docs``.

- The library's docstrings name objects with Sphinx roles (``:func:`ssd.x.y```), which mkdocstrings renders as the
  role's text before a code span: show the code span alone, without the role or its ``~``. A paragraph ending in
  reStructuredText's ``::`` (a literal block follows, rendered as code) ends in one colon.
- ``api/package.md`` lists the package root's public names from ``ssd._EXPORTS`` itself, each linked to where the
  API reference documents it, so the list cannot drift and a public name left undocumented fails the strict build.
"""

import re

import ssd

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):(<code>)~?")
LITERAL_BLOCK = re.compile(r"::</p>")
PUBLIC_NAMES = "<!-- public names -->"


def on_page_markdown(markdown, page, **kwargs):
    if PUBLIC_NAMES not in markdown:
        return markdown
    rows = [f"| [`ssd.{name}`][{module}.{name}] | `{module}` |" for name, module in ssd._EXPORTS.items()]
    return markdown.replace(PUBLIC_NAMES, "\n".join(["| name | defined in |", "|---|---|", *rows]))


def on_page_content(html, **kwargs):
    return LITERAL_BLOCK.sub(":</p>", ROLE.sub(r"\1", html))
