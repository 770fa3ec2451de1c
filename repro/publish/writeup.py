"""A writeup (`reports/<stem>.md`, a matrix's `<name>.md`) as HTML for a page: Markdown, offline links only."""

from __future__ import annotations

from urllib.parse import urlsplit
from xml.etree.ElementTree import Element

import markdown
from markdown.treeprocessors import Treeprocessor
from markupsafe import Markup

_SAFE_SCHEMES = ("", "http", "https", "mailto")


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
    md.treeprocessors.register(_OfflineLinks(md), "kvkit-offline-links", 0)
    return Markup(md.convert(text))
