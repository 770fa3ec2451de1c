"""Images in the engine child: the engine's multimodal settings and the prompt a probe's requests carry (its prompt
spec's "image", repro.plan.images).

Every arm, the baseline included, sends an image probe's token IDs with vLLM's multi_modal_data (the image, drawn
from its seed), multi_modal_uuids (a digest of its pixels: the identifier vLLM keys its blocks on and hands a
connector as the request's mm_features) and, where the probe gives processor settings, mm_processor_kwargs. vLLM
expands the prompt's one image placeholder into the image's tokens; the request's prompt_token_ids are then longer
than the probe's. A probe's tenant salt (its spec's "cache_salt", repro.plan.salts) goes in the same prompt.
"""

from __future__ import annotations

from repro.contract.job import Job
from repro.plan.images import image_uuid, pixels


def has_images(job: Job) -> bool:
    return any("image" in p.prompt for p in job.probes)


# vLLM's processor cache stays on (a small one): with it and prefix caching both off, vLLM 0.28 names every image by
# its request ("renderer0-mm-1-image-0", vllm/renderers/base.py _process_mm_uuids, overriding multi_modal_uuids), so
# a connector arm (prefix caching off) would key an image on nothing its content decides and never hit. The cache
# keeps processed pixels by identifier, which each image probe's is its own.
MM_PROCESSOR_CACHE_GB = 0.25


def mm_kwargs(job: Job) -> dict:
    """vLLM's multimodal keyword arguments for a job whose probes name images; {} for any other."""
    return (
        {"limit_mm_per_prompt": {"image": 1}, "mm_processor_cache_gb": MM_PROCESSOR_CACHE_GB} if has_images(job) else {}
    )


def prompt(ids: list[int], spec: dict):
    """vLLM's TokensPrompt for a probe's token IDs, with its image and its tenant salt (cache_salt, repro.plan.salts)
    where it names them."""
    from vllm import TokensPrompt

    image = spec.get("image")
    salt = {"cache_salt": spec["cache_salt"]} if spec.get("cache_salt") is not None else {}
    if image is None:
        return TokensPrompt(prompt_token_ids=ids, **salt)
    from PIL import Image

    extra = {"mm_processor_kwargs": dict(image["processor"])} if image.get("processor") else {}
    return TokensPrompt(
        prompt_token_ids=ids,
        multi_modal_data={"image": Image.fromarray(pixels(image))},
        multi_modal_uuids={"image": [image_uuid(image)]},
        **extra,
        **salt,
    )
