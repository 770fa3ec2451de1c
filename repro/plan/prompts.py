"""The chat prompts the kit generates: filler texts and the one builder of a chat prompt spec."""

from __future__ import annotations

# The texts below are part of what every committed result was generated from: the engine child
# repeats the filler to reach the exact length, so changing a single byte changes every prompt.

# The acceptance suite's chunk-boundary probes.
BOUNDARY_FILLER = (
    "Release notes, section four. The scheduler keeps a queue of waiting requests and admits them "
    "when blocks are free; a cache hit lets it skip the prefill of the shared prefix, and the "
    "answer must not change because of that."
)
# The detection study's probes (reports/detection/detection-matrix.json), one picked per prompt name.
DETECTION_FILLERS = (
    (
        "Release notes, section four. The scheduler keeps a queue of waiting requests and admits them when "
        "blocks are free; a cache hit lets it skip the prefill of the shared prefix."
    ),
    (
        "Maintenance log. Pump B pressure drifted low at 03:14; the operator reset the valve and logged the "
        "reading. Cooling loop two reported a stale sensor value at 04:40."
    ),
    (
        "Meeting minutes. The team agreed to pin every dependency, to record provenance with each report, and "
        "to treat a missing counter as missing evidence rather than as zero."
    ),
)


def chat_spec(label: str, length: int, filler: str) -> dict:
    """A chat prompt of exactly `length` tokens: the engine child fills the user turn with `filler`, repeated and cut.

    `label` leads the system message, so prompts with different labels differ in their first
    block and no block- or chunk-granular cache can serve one from another.
    """
    return {
        "messages": [
            {"role": "system", "content": f"{label} probe. You are a careful assistant."},
            {"role": "user", "content": "Summarize these notes in one sentence.\n\n"},
        ],
        "length": length,
        "filler": filler,
    }
