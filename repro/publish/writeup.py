"""A writeup (`reports/<stem>.md`, a matrix's `<name>.md`) as HTML for a page: Markdown, then nh3's allow-list."""

from __future__ import annotations

import html
import re
from urllib.parse import urlsplit
from xml.etree.ElementTree import Element

import markdown
import nh3
from markdown.preprocessors import Preprocessor
from markdown.treeprocessors import Treeprocessor
from markupsafe import Markup

# What Python-Markdown makes of a writeup (with its tables and fenced_code extensions), and nothing else: a writeup
# that wants more says so in a change here. span is the "[image not embedded: …]" note below.
TAGS = frozenset(
    {"p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "em", "strong", "code", "pre", "blockquote", "ul", "ol",
     "li", "a", "img", "span", "table", "thead", "tbody", "tr", "th", "td"}
)  # fmt: skip
ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "code": {"class"}}
ALIGN = {f"text-align: {side};" for side in ("left", "right", "center")}  # a Markdown table's column alignment
URL_SCHEMES = frozenset({"http", "https", "mailto"})  # and relative URLs (no scheme), the writeups' own files
_LANGUAGE = re.compile(r"language-[A-Za-z0-9_+.-]{1,40}")  # a fenced block's class, as fenced_code writes it
_URL_STRIPPED = re.compile(r"[\t\n\r]")  # what a browser removes from a URL anywhere before it parses it
_URL_EDGES = "".join(map(chr, range(0x21)))  # and from its ends: C0 controls and space

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


def _as_browser_reads(url: str) -> str:
    """The URL as a browser parses it (WHATWG): ends stripped of controls and spaces, tabs and newlines removed
    anywhere, a backslash read as a slash (`/\\evil` is `//evil` to a browser)."""
    return _URL_STRIPPED.sub("", url.strip(_URL_EDGES)).replace("\\", "/")


def is_local_url(url: str) -> bool:
    """A URL that loads nothing from elsewhere: no scheme and no host (a path, `?query` or `#fragment`)."""
    read = _as_browser_reads(url)
    return not read.startswith("//") and not urlsplit(read).scheme


class _RemoteImagesAsText(Treeprocessor):
    """An image from elsewhere (a network request when the page opens) is shown as a note instead. Presentation
    only: the tree holds the URL with its character references as written, and nh3 (below) is what enforces."""

    def run(self, root: Element) -> None:
        for el in root.iter():
            if el.tag == "img" and not is_local_url(html.unescape(el.get("src", ""))):
                el.tag, el.text = "span", f"[image not embedded: {el.get('alt', '')}]"
                el.attrib.clear()


def _filter_attribute(tag: str, name: str, value: str) -> str | None:
    """nh3 hands this each allowed attribute with its character references already decoded, as a browser would;
    the URL schemes are nh3's check, this one refuses what nh3 calls relative and a browser does not."""
    if name == "href":
        return value if not _as_browser_reads(value).startswith("//") else None
    if name == "src":
        return value if is_local_url(value) else None  # an image may not load from elsewhere: pages work offline
    if name == "class":
        return value if _LANGUAGE.fullmatch(value) else None
    return value


_CLEANER = nh3.Cleaner(
    tags=set(TAGS),
    attributes={tag: set(names) for tag, names in ATTRIBUTES.items()},
    tag_attribute_values={"th": {"style": ALIGN}, "td": {"style": ALIGN}},
    attribute_filter=_filter_attribute,
    url_schemes=set(URL_SCHEMES),
    link_rel=None,  # no target="_blank" is ever allowed, so there is no opener to cut off
    strip_comments=True,
)


def sanitize_html(text: str) -> str:
    """HTML through nh3's allow-list: TAGS, ATTRIBUTES, http/https/mailto and relative links, local images only."""
    return _CLEANER.clean(text)


def render_writeup(text: str) -> Markup:
    """A Markdown writeup as HTML. Raw HTML in it is shown as text, not passed through; what Markdown makes of it
    goes through sanitize_html before a page shows it (a writeup travels in a kit someone sends)."""
    md = markdown.Markdown(extensions=["tables", "fenced_code"], output_format="html")
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    md.preprocessors.register(_ListsAfterParagraphs(md), "kvkit-lists", 25)
    md.treeprocessors.register(_RemoteImagesAsText(md), "kvkit-remote-images", 0)
    return Markup(sanitize_html(md.convert(text)))
