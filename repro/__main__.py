"""`python -m repro COMMAND`: the kit's commands (verify, make-model, bench, ...)."""

from __future__ import annotations

import sys

from repro.errors import EXIT_USAGE

USAGE = """usage: python -m repro COMMAND [ARGS]

commands:
  verify ARGS        the verifier (same as python -m repro.verify_kv_reuse ARGS)
  make-model DIR     write the tiny Qwen3-architecture CPU model into DIR, print its SHA-256
  bench --model DIR  run the CPU acceptance and print wall time vs summed engine starts
  detection [--report PATH] [--site PATH]
                     run every planted fault x position x window and the no-fault controls on the
                     CPU engine; write the detection matrix and its page
  detection-site [--report PATH] [--site PATH]
                     render the detection matrix page from an existing report
  site [--reports DIR] [--out DIR]
                     render the static report site (default: reports/ into site/)
  issue-md REPORT [--out FILE]
                     the report as GitHub Markdown to paste into an upstream issue
  kit [--report PATH ...]
                     build dist/kvkit-<version>-<commit>.tar.gz to attach to an upstream issue
  kit-check [ARCHIVE] [--keep]
                     unpack the kit into a temporary directory and run its CPU self-test and tests there
"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else EXIT_USAGE
    cmd, rest = argv[0], argv[1:]
    if cmd == "verify":
        from repro.verify import main as verify_main

        return verify_main(rest)
    if cmd == "make-model":
        if len(rest) != 1:
            print("error: make-model needs exactly one directory", file=sys.stderr)
            return EXIT_USAGE
        from repro.tinymodel import make_tiny_model

        print(make_tiny_model(rest[0]))
        return 0
    if cmd == "bench":
        from repro.bench import main as bench_main

        return bench_main(rest)
    if cmd in ("detection", "detection-site"):
        from repro.detection import main as detection_main

        return detection_main(argv)
    if cmd == "site":
        from repro.publish.site import main as site_main

        return site_main(rest)
    if cmd == "issue-md":
        from repro.publish.issue_md import main as issue_md_main

        return issue_md_main(rest)
    if cmd in ("kit", "kit-check"):
        from repro.kit import main as kit_main

        return kit_main(argv)
    print(f"error: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
