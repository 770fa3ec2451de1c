"""Images in the engine child: the engine's multimodal settings and the prompt a probe's requests carry (its prompt
spec's "image", repro.plan.images).

Every arm, the baseline included, sends an image probe's token IDs with vLLM's multi_modal_data (the image, drawn
from its seed), multi_modal_uuids (a digest of its pixels: the identifier vLLM keys its blocks on and hands a
connector as the request's mm_features) and, where the probe gives processor settings, mm_processor_kwargs. vLLM
expands the prompt's one image placeholder into the image's tokens; the request's prompt_token_ids are then longer
than the probe's.
"""

from __future__ import annotations

from repro.contract.job import Job
from repro.plan.images import image_uuid, pixels


def has_images(job: Job) -> bool:
    return any("image" in p.prompt for p in job.probes)


def mm_kwargs(job: Job) -> dict:
    """vLLM's multimodal keyword arguments for a job whose probes name images; {} for any other. The processor's
    own cache is off: it would keep an image's processed pixels by identifier beside the KV under test."""
    return {"limit_mm_per_prompt": {"image": 1}, "mm_processor_cache_gb": 0} if has_images(job) else {}


def prompt(ids: list[int], spec: dict):
    """vLLM's TokensPrompt for a probe's token IDs, with its image where it names one."""
    from vllm import TokensPrompt

    image = spec.get("image")
    if image is None:
        return TokensPrompt(prompt_token_ids=ids)
    from PIL import Image

    extra = {"mm_processor_kwargs": dict(image["processor"])} if image.get("processor") else {}
    return TokensPrompt(
        prompt_token_ids=ids,
        multi_modal_data={"image": Image.fromarray(pixels(image))},
        multi_modal_uuids={"image": [image_uuid(image)]},
        **extra,
    )
