"""A writeup (`reports/<stem>.md`, a matrix's `<name>.md`) as HTML for a page: Markdown, offline links only."""

from __future__ import annotations

import re
from urllib.parse import urlsplit
from xml.etree.ElementTree import Element

import markdown
from markdown.preprocessors import Preprocessor
from markdown.treeprocessors import Treeprocessor
from markupsafe import Markup

_SAFE_SCHEMES = ("", "http", "https", "mailto")


_LIST_ITEM = re.compile(r"^ {0,3}(?:[-*+]|\d{1,3}[.)]) +\S")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


class _ListsAfterParagraphs(Preprocessor):
    """A list straight under a paragraph line starts a list, as GitHub reads it: Python-Markdown wants a blank line
    first and would otherwise run the items into the paragraph, so one is put there (never inside a code fence)."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fence, in_list = False, False
        for line in lines:
            if _FENCE.match(line):
                fence = not fence
            elif not fence:
                item = bool(_LIST_ITEM.match(line))
                if item and not in_list and out and out[-1].strip() and not out[-1].lstrip().startswith("|"):
                    out.append("")
                # a list goes on through its items and their continuation lines, and ends at a blank line
                in_list = item or (in_list and bool(line.strip()))
            out.append(line)
        return out


class _OfflineLinks(Treeprocessor):
    """Writeups may not load anything (an image from elsewhere is a network request) or link to script URLs."""

    def run(self, root: Element) -> None:
        for el in root.iter():
            if el.tag == "a" and urlsplit(el.get("href", "")).scheme.lower() not in _SAFE_SCHEMES:
                del el.attrib["href"]
            if el.tag == "img":
                src = urlsplit(el.get("src", ""))
                if src.scheme or src.netloc:
                    el.tag, el.text = "span", f"[image not embedded: {el.get('alt', '')}]"
                    el.attrib.clear()


def render_writeup(text: str) -> Markup:
    """A Markdown writeup as HTML. Writeups are ours, yet raw HTML in them is shown as text, not passed through."""
    md = markdown.Markdown(extensions=["tables", "fenced_code"], output_format="html")
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    md.preprocessors.register(_ListsAfterParagraphs(md), "kvkit-lists", 25)
    md.treeprocessors.register(_OfflineLinks(md), "kvkit-offline-links", 0)
    return Markup(md.convert(text))
