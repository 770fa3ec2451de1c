"""A writeup's HTML goes through nh3's allow-list (issue 55, D6 of review-2026-12-05): what a browser would decode into
a script URL, a URL of another scheme or an image from elsewhere never reaches a page, however it is spelled
(character references decimal or hex, with or without `;`, named ones, mixed case, whitespace and control characters
in the scheme, protocol-relative `//host`, a backslash for a slash); raw HTML an allow-list has no tag for is dropped.
Each URL is judged as a browser reads it: HTMLParser decodes the attribute as the browser's tokenizer does."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

from repro.publish.writeup import ATTRIBUTES, TAGS, URL_SCHEMES, render_writeup, sanitize_html

SCRIPT_URLS = [
    "javascript&#58;alert(1)",  # decimal, with ;
    "javascript&#58alert(1)",  # decimal, without ;
    "javascript&#x3A;alert(1)",  # hex
    "javascript&#X3a;alert(1)",
    "javascript&#x3aalert(1)",  # hex, without ; (ends at the first non-hex digit)
    "javascript&colon;alert(1)",  # a named reference
    "&#106;avascript:alert(1)",
    "&#x6A;&#x61;vascript:alert(1)",
    "JaVaScRiPt:alert(1)",
    "java&#9;script:alert(1)",  # a tab, which a browser removes from a URL
    "java&#10;script:alert(1)",
    "&#14;javascript:alert(1)",  # a control character, which a browser strips from a URL's ends
    "&#32;javascript:alert(1)",
    "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "DaTa&#58;text/html,x",
    "vbscript:msgbox(1)",
    "vbscript&#x3a;msgbox(1)",
    "file:///etc/passwd",
]
ELSEWHERE = [
    "//evil.example/x",  # protocol-relative: another host
    "&#47;/evil.example/x",
    "/\\evil.example/x",  # a browser reads the backslash as a slash
    "\\\\evil.example/x",
    "&#104;ttps://tracker.example/p.png",
    "HTTPS://tracker.example/p.png",
]


class Tags(HTMLParser):
    """Every start tag and its attributes, decoded as a browser decodes them."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def as_browser_reads(url: str) -> str:
    """WHATWG URL parsing's first steps: strip C0 controls and spaces at the ends, drop tabs and newlines, read a
    backslash as a slash."""
    url = url.strip("".join(map(chr, range(0x21))))
    return "".join(c for c in url if c not in "\t\n\r").replace("\\", "/")


def unsafe(html: str) -> list[str]:
    """What in html a browser would run, load or leave the page for, other than http(s)/mailto links."""
    found = []
    for tag, attrs in Tags(html).tags:
        if tag not in TAGS:
            found.append(f"<{tag}>")
        for name, value in attrs.items():
            if name not in ATTRIBUTES.get(tag, ()) and not (tag in ("th", "td") and name == "style"):
                found.append(f"<{tag} {name}>")
            if name not in ("href", "src") or value is None:
                continue
            url = as_browser_reads(value)
            scheme = urlsplit(url).scheme.lower()
            if url.startswith("//") or (scheme and scheme not in URL_SCHEMES):
                found.append(f"<{tag} {name}={value!r}>")
            if name == "src" and (scheme or url.startswith("//")):
                found.append(f"<{tag} src={value!r}> loads from elsewhere")
    return found


@pytest.mark.parametrize("url", SCRIPT_URLS + ELSEWHERE)
def test_a_markdown_link_a_browser_would_not_keep_loses_its_href(url):
    html = str(render_writeup(f"[x]({url}) and [ok](https://example.org/a)"))
    assert unsafe(html) == [], html
    assert '<a href="https://example.org/a">ok</a>' in html  # the safe link beside it kept as it was


@pytest.mark.parametrize("url", SCRIPT_URLS + ELSEWHERE)
def test_a_markdown_image_from_elsewhere_is_never_loaded(url):
    html = str(render_writeup(f"![pic]({url})"))
    assert unsafe(html) == [], (
        html
    )  # an image kept has a local src (`\\evil` in Markdown is an escaped `\evil`, a path)
    if url.startswith(("//", "&#47;", "/\\", "&#104;", "HTTPS:", "data:", "DaTa", "JaVa", "javascript&#58;")):
        assert "[image not embedded: pic]" in html and "<img" not in html, html


def test_a_local_image_and_the_links_writeups_use_are_kept():
    html = str(render_writeup("![heat](heatmap.png) [r](report.html#kv) [m](mailto:a@b.example) [h](http://x.example)"))
    assert '<img alt="heat" src="heatmap.png">' in html
    assert '<a href="report.html#kv">r</a>' in html and '<a href="mailto:a@b.example">m</a>' in html
    assert '<a href="http://x.example">h</a>' in html and unsafe(html) == []


RAW = [
    '<svg onload="alert(1)"><p>t</p></svg>',
    "<svg><script>alert(1)</script></svg>",
    '<img src=x onerror="alert(1)">',
    '<a href=" javascript:alert(1)">x</a>',
    '<a href="\x01javascript:alert(1)">x</a>',
    '<a href="java\tscript:alert(1)">x</a>',
    '<a href="java&#x09;script:alert(1)">x</a>',
    '<a href="javascript&#58;alert(1)" onclick="alert(1)" style="x" target="_blank">x</a>',
    "<a href='//evil.example'>x</a>",
    '<a href="/\\evil.example">x</a>',
    '<iframe src="https://evil.example"></iframe>',
    '<object data="x.swf"></object><embed src="x.swf">',
    '<form action="https://evil.example"><input name="a"><button formaction="javascript:alert(1)">b</button></form>',
    '<meta http-equiv="refresh" content="0;url=https://evil.example">',
    '<base href="https://evil.example/">',
    '<link rel="stylesheet" href="https://evil.example/x.css">',
    "<style>body{background:url(https://evil.example/p.png)}</style>",
    '<p style="background:url(https://evil.example/p.png)">t</p>',
    '<td style="position: fixed; top: 0">t</td>',
    '<code class="x language-sh">t</code>',
    '<math><mi xlink:href="javascript:alert(1)">x</mi></math>',
    '<img src="data:image/png;base64,iVBORw0KGgo=">',
    '<img srcset="https://evil.example/p.png 1x">',
    '<video poster="https://evil.example/p.png"></video>',
    "<!--<img src=x onerror=alert(1)>-->",
]


@pytest.mark.parametrize("raw", RAW)
def test_raw_html_the_allow_list_has_no_room_for_is_dropped(raw):
    html = sanitize_html(raw)
    assert unsafe(html) == [], html
    assert all("alert" not in str(value) for _, attrs in Tags(html).tags for value in attrs.values()), html
    assert "evil.example" not in html


def test_what_writeups_need_passes_through_unchanged():
    md = "# T\n\n| a | b |\n|:--|--:|\n| 1 | 2 |\n\n```sh\nmake site\n```\n\n> q\n\n- x\n\np\n\n1. y\n\n**b** *i* `c`\n\n---\n"
    html = str(render_writeup(md))
    assert '<th style="text-align: left;">a</th>' in html and '<td style="text-align: right;">2</td>' in html
    assert '<pre><code class="language-sh">make site\n</code></pre>' in html
    for tag in ("h1", "blockquote", "ul", "ol", "strong", "em", "code", "hr"):
        assert f"<{tag}>" in html, tag
